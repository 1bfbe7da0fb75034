"""Helpers shared by the parts: masked reductions and group centring."""
from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    # where, not multiply: inf * 0 on a padded token would poison the sum
    z = torch.where(mask > 0, x, torch.zeros_like(x))
    return z.sum() if dim is None else z.sum(dim, keepdim=keepdim)


def masked_mean(x: Tensor, mask: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Mean over unmasked entries; 0 where there are none."""
    n = (mask > 0).to(x.dtype)
    n = n.sum() if dim is None else n.sum(dim, keepdim=keepdim)
    return masked_sum(x, mask, dim, keepdim) / n.clamp(min=1)


def flat_groups(rewards: Tensor) -> Tensor:
    """(B, 1) True where every reward of the group is equal: such a group carries no signal."""
    return (rewards == rewards[..., :1]).all(dim=-1, keepdim=True)


def zero_flat(rewards: Tensor, out: Tensor) -> Tensor:
    # A float mean of equal rewards can differ from each of them in the last bit, which
    # a division by a tiny std would blow up into a spurious advantage: equal is zero.
    return torch.where(flat_groups(rewards), torch.zeros_like(out), out)


def centre(rewards: Tensor) -> Tensor:
    """r - group mean, exactly 0 for a group of equal rewards."""
    return zero_flat(rewards, rewards - rewards.mean(dim=-1, keepdim=True))


def bcast(deltas: Tensor, like: Tensor) -> Tensor:
    """Deltas on every token: (B, G) spread over T, or per-token deltas (B, G, T) as they are."""
    if deltas.dim() == like.dim():
        return deltas
    return deltas.unsqueeze(-1).expand_as(like)  # (B, G) -> (B, G, T)


def seq_deltas(deltas: Tensor, mask: Tensor) -> Tensor:
    """One delta per response (B, G): per-token deltas (B, G, T) become their mean over the
    response's tokens (verl's geo_mean takes the sequence advantage so); (B, G) ones are returned."""
    if deltas.dim() < mask.dim():
        return deltas
    return masked_mean(deltas, mask, dim=-1)
