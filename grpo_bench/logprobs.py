"""Per-token log-probs of chosen labels and the GRPO loss over them, with selectable backends.

    torch    the reference: log_softmax(logits.float()).gather(label), which writes an (N, V)
             fp32 tensor; the loss is the registry's functions composed, as the trainer does
    chunked  row-chunked torch (kernels/chunked.py): same numbers, O(rows * V) extra memory;
             the loss has nothing to chunk and runs the torch composition
    triton   the Triton kernels (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)
    auto     triton when the tensors are on CUDA and Triton imports, chunked otherwise

Every backend is differentiable and returns fp32 log-probs for logits of any float dtype
and any leading shape (..., V). Labels must lie in [0, V): there is no ignore index, pad
positions are handled by the loss mask.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from . import registry
from .config import BACKENDS
from .kernels import check_triton
from .kernels.chunked import _LOG_FLOOR, chunked_logprobs
from .kernels.linear import fused_linear_logprobs


@lru_cache(maxsize=1)
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_backend(backend: str, *tensors: Tensor) -> str:
    """The concrete backend ('torch', 'chunked' or 'triton') that `backend` means for these tensors."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "auto":
        return "triton" if _has_triton() and all(t.is_cuda for t in tensors) else "chunked"
    if backend == "triton":
        check_triton(*tensors)
    return backend


def selective_log_softmax(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[..., label] in fp32; logits (..., V), labels (...) -> (...).

    TRL's name and argument order; row-chunked, so no (N, V) fp32 tensor is ever made.
    """
    return chunked_logprobs(logits, labels)[0]


def _torch_logprobs(logits: Tensor, labels: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    lp = torch.log_softmax(logits.float(), dim=-1)
    out = lp.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    # the floor keeps p * log p at 0, not 0 * -inf, for -inf logits; it only moves values with p == 0
    ent = -(lp.exp() * lp.clamp(min=_LOG_FLOOR)).sum(-1) if with_entropy else None
    return out, ent


def token_logprobs(logits: Tensor, labels: Tensor, backend: str = "auto",
                   with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """logits (..., V), labels (...) -> (fp32 log p(label) (...), entropy (...) or None)."""
    b = resolve_backend(backend, logits)
    if b == "torch":
        return _torch_logprobs(logits, labels, with_entropy)
    if b == "chunked":
        return chunked_logprobs(logits, labels, with_entropy)
    from .kernels.logprob import triton_logprobs
    return triton_logprobs(logits, labels, with_entropy)


def linear_logprobs(hidden: Tensor, weight: Tensor, labels: Tensor, backend: str = "auto",
                    with_entropy: bool = False, bias: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """log-probs of labels under the LM head: hidden (..., H), weight (V, H), bias (V) -> (...).

    torch materialises hidden @ W^T; chunked and triton never hold more than a chunk of it.
    """
    b = resolve_backend(backend, hidden, weight)
    if b == "torch":
        return _torch_logprobs(F.linear(hidden, weight, bias), labels, with_entropy)
    return fused_linear_logprobs(hidden, weight, labels, with_entropy, bias, use_triton=b == "triton")


def grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, deltas: Tensor, mask: Tensor, *,
              loss: str, kl: str | None, kl_coef: float, aggregate: str, clip_low: float, clip_high: float,
              max_len: int | None = None, backend: str = "auto", return_stats: bool = False):
    """aggregate(loss(logp, old, deltas, mask) + kl_coef * kl(logp, ref), mask) -> scalar.

    logp, old_logp, ref_logp, mask (..., T); deltas (...). kl_coef == 0 (or kl None) means
    no KL term, and ref_logp may then be None. The gradient flows to logp only. With
    return_stats, also a dict of detached scalars: loss/policy (the policy term alone,
    same aggregation), clip/frac (share of unmasked tokens whose clipped term wins the min;
    GSPO's is its sequence ratio) and, with a KL term, kl/value (its token mean).
    """
    loss_fn = registry.get("loss", loss)  # unknown names fail here, listing the valid ones
    agg_fn = registry.get("aggregate", aggregate)
    use_kl = kl is not None and kl_coef != 0
    kl_fn = registry.get("kl", kl) if use_kl else None
    if use_kl and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp")
    b = resolve_backend(backend, logp)
    if b == "triton":
        from .kernels.loss import LossSpec, fused_grpo_loss
        spec = LossSpec(loss, kl if use_kl else None, kl_coef if use_kl else 0.0, aggregate,
                        clip_low, clip_high, max_len)
        if backend == "triton" or spec.fusable():  # auto falls back for parts the kernel lacks
            value, stats = fused_grpo_loss(logp, old_logp, ref_logp if use_kl else None, deltas, mask, spec)
            return (value, stats) if return_stats else value

    pol = loss_fn(logp, old_logp, deltas, mask, clip_low=clip_low, clip_high=clip_high)
    per_token = pol + kl_coef * kl_fn(logp, ref_logp) if use_kl else pol
    value = agg_fn(per_token, mask, max_len=max_len)
    if not return_stats:
        return value
    with torch.no_grad():
        stats = _torch_stats(pol, logp, old_logp, ref_logp, deltas, mask, loss, kl_fn, agg_fn,
                             clip_low, clip_high, max_len)
    return value, stats


def _torch_stats(pol, logp, old_logp, ref_logp, deltas, mask, loss, kl_fn, agg_fn,
                 clip_low, clip_high, max_len) -> dict[str, Tensor]:
    on = mask > 0
    n = mask.sum().clamp(min=1)

    def token_mean(x: Tensor) -> Tensor:
        return torch.where(on, x, torch.zeros_like(x)).sum() / n

    stats = {"loss/policy": agg_fn(pol, mask, max_len=max_len)}
    if loss in ("clipped", "gspo"):
        if loss == "gspo":
            lr = torch.where(on, logp - old_logp, torch.zeros_like(logp))
            ratio = (lr.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)).exp().expand_as(logp)
        else:
            ratio = (logp - old_logp).exp()
        adv = deltas.unsqueeze(-1).expand_as(ratio)
        clipped = ((adv > 0) & (ratio > 1 + clip_high)) | ((adv < 0) & (ratio < 1 - clip_low))
        stats["clip/frac"] = token_mean(clipped.to(logp.dtype))
    else:
        stats["clip/frac"] = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if kl_fn is not None:
        stats["kl/value"] = token_mean(kl_fn(logp, ref_logp))
    return {k: v.detach() for k, v in stats.items()}
