"""The GRPO parts: advantage ("delta") modes, policy losses, KL estimators, aggregations.

Pure tensor functions, registered under their YAML names. Shapes: B prompts,
G responses per prompt (the group), T response tokens. Losses are per token and
are to be minimised; masking happens in the aggregation, so a loss never has to
know which tokens count (GSPO excepted: its sequence ratio is a masked mean).

Conventions (see ../shared/seeds/README.md): the ratio is pi/pi_old =
exp(logp - old_logp), never a quotient of log-probs; with r = pi_ref/pi,
k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r, each an estimate of
KL(pi || pi_ref) under samples from pi.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .registry import register

# --------------------------------------------------------------------------- delta


@register("delta", "raw")
def raw(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """r: plain REINFORCE, no baseline."""
    return rewards.clone()


@register("delta", "centered")
def centered(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """r - group mean (nanochat, Dr. GRPO): unbiased baseline, scale kept."""
    return rewards - rewards.mean(dim=-1, keepdim=True)


@register("delta", "zscore")
def zscore(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """(r - mean) / (std + eps) within the group (GRPO); all-equal groups get 0."""
    # Unbiased std, as TRL and verl compute it; needs G >= 2.
    centred = rewards - rewards.mean(dim=-1, keepdim=True)
    out = centred / (rewards.std(dim=-1, keepdim=True) + eps)
    # Equal rewards carry no signal. Their float mean can differ from each reward
    # in the last bit, which eps would blow up into a spurious advantage.
    flat = (rewards == rewards[..., :1]).all(dim=-1, keepdim=True)
    return torch.where(flat, torch.zeros_like(out), out)


@register("delta", "rloo")
def rloo(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """r_i - mean of the other G-1 rewards (leave-one-out baseline)."""
    g = rewards.shape[-1]
    others = (rewards.sum(dim=-1, keepdim=True) - rewards) / (g - 1)
    return rewards - others


@register("delta", "max")
def best_only(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Only the best response(s) of a group keep their reward, the rest get 0."""
    best = rewards == rewards.max(dim=-1, keepdim=True).values
    return torch.where(best, rewards, torch.zeros_like(rewards))


# ---------------------------------------------------------------------------- loss


def _bcast(deltas: Tensor, like: Tensor) -> Tensor:
    return deltas.unsqueeze(-1).expand_as(like)  # (B, G) -> (B, G, T)


def _clipped_objective(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> Tensor:
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * adv, clipped * adv)


@register("loss", "naive")
def naive(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor | None = None, *,
          clip_low: float = 0.2, clip_high: float = 0.2) -> Tensor:
    """-log pi * delta: REINFORCE; ignores old_logp, so extra inner steps are off-policy."""
    return -logp * _bcast(deltas, logp)


@register("loss", "unclipped")
def unclipped(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor | None = None, *,
              clip_low: float = 0.2, clip_high: float = 0.2) -> Tensor:
    """-ratio * delta with ratio = exp(logp - old_logp): importance-weighted, no trust region."""
    return -torch.exp(logp - old_logp) * _bcast(deltas, logp)


@register("loss", "clipped")
def clipped(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor | None = None, *,
            clip_low: float = 0.2, clip_high: float = 0.2) -> Tensor:
    """PPO/GRPO: -min(ratio*delta, clip(ratio, 1-clip_low, 1+clip_high)*delta); clip_high > clip_low is DAPO."""
    return _clipped_objective(torch.exp(logp - old_logp), _bcast(deltas, logp), clip_low, clip_high)


@register("loss", "gspo")
def gspo(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor | None = None, *,
         clip_low: float = 0.2, clip_high: float = 0.2) -> Tensor:
    """GSPO: clipped sequence ratio exp(masked mean of token log-ratios), spread over the tokens."""
    m = torch.ones_like(logp) if mask is None else mask.to(logp.dtype)
    log_ratio = torch.where(m > 0, logp - old_logp, torch.zeros_like(logp))
    seq = log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)  # (B, G, 1)
    # GSPO-token form: every token carries the value of the sequence ratio, and the
    # gradient of a sequence's mean over tokens is exactly GSPO's sequence gradient.
    token_log_ratio = seq.detach() + logp - logp.detach()
    return _clipped_objective(torch.exp(token_log_ratio), _bcast(deltas, logp), clip_low, clip_high)


# ------------------------------------------------------------------------------ kl


@register("kl", "k1")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """log pi - log pi_ref: unbiased value, its gradient is zero in expectation."""
    return logp - ref_logp


@register("kl", "k2")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """(log pi - log pi_ref)^2 / 2: biased value, low variance; its gradient is that of KL."""
    return 0.5 * (logp - ref_logp) ** 2


@register("kl", "k3")
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """pi_ref/pi - 1 - log(pi_ref/pi): unbiased, always >= 0 (Schulman; GRPO paper)."""
    log_r = ref_logp - logp
    return torch.exp(log_r) - 1 - log_r


# ----------------------------------------------------------------------- aggregate


def _masked(per_token: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    m = mask.to(per_token.dtype)
    # where, not multiply: inf * 0 on a padded token would poison the sum
    return torch.where(m > 0, per_token, torch.zeros_like(per_token)), m


@register("aggregate", "token_mean")
def token_mean(per_token: Tensor, mask: Tensor, *, max_len: int | None = None) -> Tensor:
    """Mean over every unmasked token of the batch (DAPO): long responses weigh more."""
    x, m = _masked(per_token, mask)
    return x.sum() / m.sum().clamp(min=1)


@register("aggregate", "seq_mean_token_mean")
def seq_mean_token_mean(per_token: Tensor, mask: Tensor, *, max_len: int | None = None) -> Tensor:
    """Mean over each response's tokens, then over responses (the GRPO paper)."""
    x, m = _masked(per_token, mask)
    lengths = m.sum(-1)
    per_seq = x.sum(-1) / lengths.clamp(min=1)
    has_tokens = (lengths > 0).to(per_seq.dtype)
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1)


@register("aggregate", "seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(per_token: Tensor, mask: Tensor, *, max_len: int | None = None) -> Tensor:
    """Sum over each response's tokens / a constant (max_len, default T), mean over responses (Dr. GRPO)."""
    x, _ = _masked(per_token, mask)
    norm = per_token.shape[-1] if max_len is None else max_len
    return x.sum(-1).mean() / norm
