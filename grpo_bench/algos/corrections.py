"""Off-policy corrections: what the sampler's own log-probs do to the policy term.

    fn(logp, old_logp, sampler_logp (B, G, T), deltas (B, G), mask (B, G, T), *, params)
        -> (weight (B, G, T), keep: bool (B, G, T), {region: bool (B, G, T)})

Three policies, in AReaL's decoupled view: the sampler pi_s that generated the tokens (an
inference engine in another precision, or weights k updates old), the old policy pi_old (the
trainer's weights when the rollout was scored; the loss's ratio is pi / pi_old) and the
current policy pi. The mismatch's importance ratio is rho = pi_old / pi_s =
exp(old_logp - sampler_logp), per token, or per sequence as the product over its tokens.

`weight` multiplies each token's policy term: 0 drops the term but the token stays in the
normaliser (TRL's and AReaL's masks, DeepSeek-V3.2's sequence mask). `keep` False takes the
token out of the loss mask and its normaliser (verl's rejection sampling, M2PO). Neither
carries gradient. Regions mark the tokens a correction changed ("truncated", "masked");
grpo_loss logs their share of the unmasked tokens as correction/<name>/<region>_frac.
Several corrections compose: their weights multiply, their keeps are and-ed.

Log-ratios are clamped to [-20, 20] before exp, as verl does (SAFETY_BOUND): TRL's modes
differ from these only for |log rho| > 20. Without a separate sampler the trainer passes
sampler_logp = old_logp: rho is 1 and only the parts that read the current policy (opsm,
m2po against=current) act, on the inner steps' drift. snis divides the IS weights by their
batch mean (self-normalised importance sampling).
"""
from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor

from ..registry import Choice, Part, Positive, Range, register
from .common import masked_mean, masked_sum, seq_deltas

Regions = dict[str, Tensor]
Out = tuple[Tensor, Tensor, Regions]
OptionalPositive = Annotated[float | None, Range(0, None, lo_open=True)]
Divergence = Annotated[str, Choice(("k1", "k2", "k3"))]
Level = Annotated[str, Choice(("token", "seq_sum", "seq_mean", "seq_max"))]
Against = Annotated[str, Choice(("old", "current"))]
SAFETY = 20.0


def _log(x):
    return torch.log(x) if isinstance(x, Tensor) else math.log(x)


def _outside(rho: Tensor, low, high) -> Tensor:
    out = torch.zeros_like(rho, dtype=torch.bool)
    if low is not None:
        out = out | (rho < low)
    if high is not None:
        out = out | (rho > high)
    return out


def _rho(log_rho: Tensor) -> Tensor:
    return torch.exp(log_rho.clamp(-SAFETY, SAFETY))


def _seq_log_rho(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """(B, G, T): each token carries its sequence's summed log-ratio log prod_t rho_t."""
    return masked_sum(old_logp - sampler_logp, mask, dim=-1, keepdim=True).expand_as(old_logp)


def _truncate(log_rho: Tensor, mask: Tensor, low, high) -> Out:
    rho = _rho(log_rho)
    weight = rho if low is None else rho.clamp(min=low)
    weight = weight if high is None else weight.clamp(max=high)
    return weight, torch.ones_like(mask, dtype=torch.bool), {"truncated": _outside(rho, low, high)}


def _mask(log_rho: Tensor, mask: Tensor, low, high) -> Out:
    rho = _rho(log_rho)
    out = _outside(rho, low, high)
    return torch.where(out, torch.zeros_like(rho), rho), torch.ones_like(mask, dtype=torch.bool), {"masked": out}


@register("correction", "token_tis")
def token_tis(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
              low: OptionalPositive = None, high: OptionalPositive = 2.0) -> Out:
    """Token-level truncated IS: each token's policy term times clamp(pi_old / pi_s, low, high).

    Source: Your Efficient RL Framework Secretly Brings You Off-Policy RL Training (Yao et al., 2025), TIS; verl rollout_is=token (rollout_is_threshold 2.0); TRL vllm_importance_sampling_mode=token_truncate (clip_min, clip_max).
    """
    return _truncate(old_logp - sampler_logp, mask, low, high)


@register("correction", "seq_tis")
def seq_tis(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
            low: OptionalPositive = None, high: OptionalPositive = 2.0) -> Out:
    """Sequence-level truncated IS: every token of a response times clamp(prod_t pi_old / pi_s, low, high).

    Source: verl rollout_is=sequence (rollout_is_threshold 2.0); TRL vllm_importance_sampling_mode=sequence_truncate.
    """
    return _truncate(_seq_log_rho(old_logp, sampler_logp, mask), mask, low, high)


@register("correction", "token_mis")
def token_mis(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
              low: OptionalPositive = 0.5, high: OptionalPositive = 5.0) -> Out:
    """Token-level masked IS (IcePop): weight pi_old / pi_s inside [low, high], 0 outside (the token stays in the normaliser).

    Source: IcePop (Ring-1T, 2025, arXiv 2510.18855; bounds 0.5, 5); verl rollout_is=token with rollout_is_threshold "0.5_5.0"; TRL vllm_importance_sampling_mode=token_mask.
    """
    return _mask(old_logp - sampler_logp, mask, low, high)


@register("correction", "seq_mis")
def seq_mis(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
            low: OptionalPositive = None, high: OptionalPositive = 3.0) -> Out:
    """Sequence-level masked IS: weight prod_t pi_old / pi_s inside [low, high], 0 outside.

    Source: TRL vllm_importance_sampling_mode=sequence_mask (its default, clip_max 3.0); verl rollout_is=sequence with a "low_high" threshold.
    """
    return _mask(_seq_log_rho(old_logp, sampler_logp, mask), mask, low, high)


@register("correction", "decoupled")
def decoupled(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
              cap: OptionalPositive = 5.0) -> Out:
    """Decoupled PPO: the loss's ratio pi / pi_old is the proximal one; this weights it by pi_old / pi_s, 0 above cap.

    The same function as token_mis with low null and high = cap (tested).

    Source: AReaL decoupled PPO (Fu et al., 2025, arXiv 2505.24298): behaviour policy = sampler, proximal = old; behav_imp_weight_cap 5 (now rejection_sampling action=mask, level=token).
    """
    return _mask(old_logp - sampler_logp, mask, None, cap)


Mode = Annotated[str, Choice(("truncate", "mask"))]
IsLevel = Annotated[str, Choice(("token", "sequence"))]


@register("correction", "snis", whole_batch=True)
def snis(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
         level: IsLevel = "token", mode: Mode = "truncate", low: OptionalPositive = None,
         high: OptionalPositive = 2.0) -> Out:
    """Self-normalised IS: the token (or sequence) IS weights, truncated or masked, divided by their batch mean.

    The weights are those of token_tis / seq_tis (mode truncate) or token_mis / seq_mis (mode
    mask) with the same low and high; their mean is over the batch's tokens (level token) or
    over its non-empty responses, one weight each (level sequence), and is left alone when it
    is not above 1e-8, as verl does. The mean is the whole batch's: the trainer takes every
    step on the whole rollout, as verl computes the weights once before its mini-batches.

    Source: verl rollout_is_batch_normalize (rollout_is token / sequence, rollout_is_threshold 2.0, "low_high" for mask).
    """
    fn = {("token", "truncate"): token_tis, ("sequence", "truncate"): seq_tis, ("token", "mask"): token_mis,
          ("sequence", "mask"): seq_mis}[(level, mode)]
    weight, keep, regions = fn(logp, old_logp, sampler_logp, deltas, mask, low=low, high=high)
    if level == "token":
        mean = masked_mean(weight, mask)
    else:
        seq = masked_mean(weight, mask, dim=-1)                                   # (B, G)
        has = (mask > 0).any(-1)
        mean = torch.where(has, seq, torch.zeros_like(seq)).sum() / has.sum().clamp(min=1)
    weight = torch.where(mean > 1e-8, weight / mean.clamp(min=1e-8), weight)
    return weight, keep, regions


def _divergence(name: str, log_ratio: Tensor) -> Tensor:
    """verl's token divergences of log_ratio = log pi_old - log pi_s (clamped): k1 = -log r, k2, k3."""
    lr = log_ratio.clamp(-SAFETY, SAFETY)
    if name == "k1":
        return -lr
    if name == "k2":
        return 0.5 * lr.square()
    return torch.exp(lr) - 1.0 - lr


def _per_sequence(stat: Tensor, level: str, mask: Tensor) -> Tensor:
    if level == "token":
        return stat
    if level == "seq_sum":
        seq = masked_sum(stat, mask, dim=-1, keepdim=True)
    elif level == "seq_mean":
        seq = masked_mean(stat, mask, dim=-1, keepdim=True)
    else:
        top = torch.where(mask > 0, stat, torch.full_like(stat, -math.inf)).amax(-1, keepdim=True)
        seq = torch.where(torch.isinf(top), torch.zeros_like(top), top)   # no token: 0, as verl
    return seq.expand_as(stat)


@register("correction", "rollout_rs")
def rollout_rs(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
               divergence: Divergence = "k3", level: Level = "seq_mean",
               low: OptionalPositive = None, high: Positive = 0.01) -> Out:
    """Rejection sampling: tokens (or whole responses) whose divergence from the sampler exceeds high leave the loss.

    k1 = log pi_s - log pi_old, k2 = (k1)^2 / 2, k3 = rho - 1 - log rho, at `level` token, or the
    sequence's sum, mean or max of it. k2, k3: keep when <= high. k1: keep when
    low <= exp(stat) <= high (low null: 1 / high), bounds on the ratio pi_s / pi_old as verl's.
    Rejected tokens leave the mask and its normaliser (verl's modified response_mask).

    Source: verl rollout_rs=<level>_<divergence> with rollout_rs_threshold (bypass_ppo_clip_k3_rs: seq_mean_k3, 0.01).
    """
    stat = _per_sequence(_divergence(divergence, old_logp - sampler_logp), level, mask)
    if divergence == "k1":
        lo = 1.0 / high if low is None else low
        keep = (stat >= _log(lo)) & (stat <= _log(high))
    else:
        keep = stat <= high
    return torch.ones_like(stat), keep, {"masked": ~keep}


@register("correction", "geo_mask")
def geo_mask(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
             low: Positive = 0.999, high: Positive = 1.001) -> Out:
    """Geometric-mean sequence mask: a response leaves the loss unless the geometric mean of pi_s / pi_old is in [low, high].

    rollout_rs with divergence k1 at level seq_mean (tested): length-normalised, so long
    responses are not rejected for their length alone.

    Source: verl RolloutCorrectionConfig.decoupled_geo_rs (rollout_rs=seq_mean_k1, threshold "0.999_1.001").
    """
    return rollout_rs(logp, old_logp, sampler_logp, deltas, mask, divergence="k1", level="seq_mean", low=low, high=high)


@register("correction", "opsm")
def opsm(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
         threshold: Positive = 0.5) -> Out:
    """Off-policy sequence masking: a response with A < 0 whose mean log pi_s - log pi exceeds threshold gets weight 0.

    The divergence is measured against the current policy (detached) at every step, so it
    also catches the drift of inner steps when there is no separate sampler.

    Source: DeepSeek-V3.2 (2025, arXiv 2512.02556, eq. 9, delta = threshold); TRL off_policy_mask_threshold (get_off_policy_mask).
    """
    kl = masked_mean(sampler_logp - logp.detach(), mask, dim=-1)                 # (B, G)
    drop = ((seq_deltas(deltas, mask) < 0) & (kl > threshold)).unsqueeze(-1).expand_as(logp)
    return (~drop).to(logp.dtype), torch.ones_like(drop), {"masked": drop}


@register("correction", "m2po")
def m2po(logp: Tensor, old_logp: Tensor, sampler_logp: Tensor, deltas: Tensor, mask: Tensor, *,
         threshold: Positive = 0.04, against: Against = "old") -> Out:
    """M2PO: the tokens with the largest (log rho)^2 leave the loss until the rest's mean (log rho)^2 is below threshold.

    log rho = log pi_old - log pi_s (against old, AReaL's behaviour vs proximal policy) or
    log pi - log pi_s (against current, detached: the paper's pi_theta). If no suffix gets
    below the threshold all but one token leave, as AReaL does. Masked over the whole batch; of
    tokens tied in (log rho)^2 the earlier leave first (a stable sort: the same tokens on every device).

    Source: Prosperity before Collapse, M2PO (Zheng et al., 2025, arXiv 2510.01161); AReaL actor.m2_threshold (0.04 in its gsm8k example).
    """
    log_rho = (old_logp if against == "old" else logp.detach()) - sampler_logp
    on = (mask > 0).reshape(-1)
    # unmasked tokens first, largest second moment first; masked ones sort last (-1 < any m2)
    m2 = torch.where(on, log_rho.square().reshape(-1), torch.full_like(on, -1.0, dtype=log_rho.dtype))
    ordered, order = torch.sort(m2, descending=True, stable=True)
    n = on.to(log_rho.dtype).sum()
    idx = torch.arange(m2.numel(), device=m2.device, dtype=log_rho.dtype)
    live = idx < n
    # mean of ordered[i:n]: the second moment left after masking the i largest
    # suffix sums from the end, as AReaL takes them (the masked tail adds exact zeros)
    suffix = torch.where(live, ordered, torch.zeros_like(ordered)).flip(0).cumsum(0).flip(0)
    below = live & (suffix / (n - idx).clamp(min=1) < threshold)
    first = torch.where(below.any(), below.to(torch.int64).argmax(), (n - 1).clamp(min=0).to(torch.int64))
    rank = torch.argsort(order)                                                   # position of each token
    keep = (rank >= first).view_as(log_rho)   # masked tokens rank last, at n or later: always kept
    return torch.ones_like(log_rho), keep, {"masked": ~keep}


def mismatch(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the sampler is from the trainer on the sampled tokens (detached scalars).

    mismatch/kl: KL(pi_s || pi_old) as the mean of log pi_s - log pi_old (k1, verl's
    rollout_corr/kl); mismatch/k3: the mean of rho - 1 - log rho (verl's k3_kl);
    mismatch/ratio_max, mismatch/ratio_min: the extreme token ratios rho (1 with no token).
    """
    with torch.no_grad():
        lr = (old_logp - sampler_logp).clamp(-SAFETY, SAFETY)
        on = mask > 0
        rho = torch.exp(lr)
        one = torch.ones((), dtype=rho.dtype, device=rho.device)
        top = torch.where(on, rho, torch.full_like(rho, -math.inf)).amax()
        bottom = torch.where(on, rho, torch.full_like(rho, math.inf)).amin()
        return {"mismatch/kl": masked_mean(-lr, mask), "mismatch/k3": masked_mean(rho - 1.0 - lr, mask),
                "mismatch/ratio_max": torch.where(on.any(), top, one),
                "mismatch/ratio_min": torch.where(on.any(), bottom, one)}


def compose(fixes: list[Part], logp: Tensor, old_logp: Tensor, sampler_logp: Tensor | None,
            deltas: Tensor, mask: Tensor) -> tuple[Tensor | None, Tensor, dict[str, Tensor]]:
    """Several corrections, each (registry entry, every parameter): (their weight, detached, or None without
    any; the mask with every token some correction did not keep removed; statistics).

    sampler_logp None: the trainer sampled itself, rho is 1. Statistics: mismatch() and
    correction/<name>/<region>_frac, shares of the tokens of the mask as given.
    """
    if not fixes:
        return None, mask, {}
    sampler = old_logp if sampler_logp is None else sampler_logp
    weight, keep, stats = None, torch.ones_like(mask, dtype=torch.bool), {}
    for entry, params in fixes:
        name = entry.name
        w, k, regions = entry.obj(logp, old_logp, sampler, deltas, mask, **params)
        weight = w if weight is None else weight * w
        keep = keep & k
        with torch.no_grad():
            stats |= {f"correction/{name}/{r}_frac": masked_mean(t.to(logp.dtype), mask) for r, t in regions.items()}
    return weight.detach(), torch.where(keep, mask, torch.zeros_like(mask)), stats | mismatch(old_logp, sampler, mask)
