"""Policy losses: per-token loss to minimise, and where each clip cut in.

    fn(logp, old_logp (B, G, T), deltas (B, G) or (B, G, T), mask (B, G, T), *, params)
        -> (per-token loss (B, G, T), {region: bool (B, G, T)})

Deltas are one per response, or one per token from a token-level delta part (optimal_token_baseline,
gtpo): every loss takes either, and gives the same numbers for per-token deltas that are
constant over each response as for the response's delta (tests/test_parts_v4.py).
A loss registered with needs=("ref_logp",) is handed the reference policy's log-probs in
the place of old_logp (A*-PO regresses log pi / pi_ref).

Masking happens in the aggregation, so a token-level loss never reads the mask;
sequence-level ones (GSPO, GMPO, VESPO) and batch-level ones (Clip-Cov, KL-Cov) use it
for their means. A sequence-level loss puts its sequence's value on every token of the
sequence, so a per-sequence mean over tokens returns it exactly.

Regions are the tokens whose gradient (or importance weight) a clip changed: "low"
(negative advantage, ratio below the trust region), "high" (positive advantage, ratio
above it), and loss-specific ones ("dual", "cap", "cov"). The trainer logs the share of
unmasked tokens in each, and their union as clip/frac.

Aliases, exact and tested: TRL's two-sided clip (`delta`, INTELLECT-2) is dual_clip with
clip_c = delta; verl's `vanilla` is dual_clip with clip_c = 3; verl's `gpg` loss is
naive; TRL's `luspo` is gspo with aggregate seq_mean_token_sum.
"""
from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor

from ..registry import Fraction, NonNegative, Positive, Range, register
from .common import bcast, masked_mean, masked_sum, seq_deltas

Regions = dict[str, Tensor]
AboveOne = Annotated[float, Range(1, None, lo_open=True)]
OptionalFraction = Annotated[float | None, Range(0, 1, lo_open=True, hi_open=True)]


def _ppo(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Regions]:
    """-min(ratio * A, clip(ratio, 1 - low, 1 + high) * A) and the tokens where the clip wins."""
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    loss = -torch.minimum(ratio * adv, _clamp(ratio, lo, hi) * adv)
    return loss, {"low": (adv < 0) & (ratio < lo), "high": (adv > 0) & (ratio > hi)}


def _clamp(x: Tensor, lo, hi) -> Tensor:
    """x.clamp(lo, hi) where either bound may be a number or a 0-d tensor (a population member's own)."""
    return x.clamp(min=lo).clamp(max=hi)  # the same values and gradient as clamp(lo, hi)


def _full(like: Tensor, value) -> Tensor:
    """full_like(like, value) for a number or a 0-d tensor (a population member's own parameter)."""
    return torch.zeros_like(like) + value  # 0 + v is v exactly, in like's dtype


def seq_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """(B, G, 1) masked mean over the response of log pi - log pi_old: GSPO's log s_i."""
    return masked_mean(logp - old_logp, mask, dim=-1, keepdim=True)


@register("loss", "naive")
def naive(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor) -> tuple[Tensor, Regions]:
    """-log pi * A: REINFORCE; ignores old_logp, so extra inner steps are off-policy.

    Source: Williams (1992); nanochat chat_rl; verl policy_loss=gpg (GPG, Chu et al., 2025).
    """
    return -logp * bcast(deltas, logp), {}


@register("loss", "unclipped")
def unclipped(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor) -> tuple[Tensor, Regions]:
    """-ratio * A with ratio = exp(logp - old_logp): importance-weighted, no trust region.

    Source: the surrogate of TRPO/PPO without its constraint (Schulman et al., 2015, 2017).
    """
    return -torch.exp(logp - old_logp) * bcast(deltas, logp), {}


@register("loss", "clipped")
def clipped(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
            clip_low: Fraction = 0.2, clip_high: Positive = 0.2) -> tuple[Tensor, Regions]:
    """PPO/GRPO: -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A); clip_high > clip_low is DAPO's clip-higher.

    Source: PPO (Schulman et al., 2017); GRPO (Shao et al., 2024); DAPO (Yu et al., 2025); TRL loss_type grpo/bnpo/dr_grpo/dapo (epsilon, epsilon_high).
    """
    return _ppo(torch.exp(logp - old_logp), bcast(deltas, logp), clip_low, clip_high)


@register("loss", "dual_clip")
def dual_clip(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
              clip_low: Fraction = 0.2, clip_high: Positive = 0.2,
              clip_c: AboveOne = 3.0) -> tuple[Tensor, Regions]:
    """PPO clip plus a cap: with A < 0 the loss never exceeds -A * clip_c (no gradient past the cap).

    Equals TRL's two-sided clip -min(min(ratio, delta) * A, clip(ratio) * A) with delta = clip_c.

    Source: Dual-clip PPO (Ye et al., 2020, arXiv 1912.09729); verl policy_loss=vanilla (clip_ratio_c=3); TRL delta (INTELLECT-2, 2025).
    """
    adv = bcast(deltas, logp)
    base, regions = _ppo(torch.exp(logp - old_logp), adv, clip_low, clip_high)
    cap = -adv * clip_c
    dual = (adv < 0) & (base > cap)
    return torch.where(dual, cap, base), regions | {"dual": dual}


@register("loss", "gspo")
def gspo(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
         clip_low: Fraction = 3e-4, clip_high: Positive = 4e-4) -> tuple[Tensor, Regions]:
    """GSPO: PPO clip on the sequence ratio s = exp(mean token log-ratio), in its GSPO-token form.

    Source: GSPO (Zheng et al., 2025, arXiv 2507.18071; clip 3e-4 / 4e-4); verl policy_loss=gspo; TRL importance_sampling_level="sequence".
    """
    seq = seq_log_ratio(logp, old_logp, mask)                           # (B, G, 1)
    # every token carries the value of s; the gradient of a sequence's token mean is
    # then exactly GSPO's sequence gradient s * A * mean_t grad log pi_t
    token_log_ratio = seq.detach() + logp - logp.detach()
    return _ppo(torch.exp(token_log_ratio), bcast(deltas, logp), clip_low, clip_high)


@register("loss", "gmpo")
def gmpo(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
         clip_low: Positive = 0.4, clip_high: Positive = 0.4) -> tuple[Tensor, Regions]:
    """GMPO: -A * geometric mean of token ratios, each log-ratio clipped to [-clip_low, clip_high] (sign-aware).

    Source: Geometric-Mean Policy Optimization (Zhao et al., 2025, arXiv 2507.20673; clip e^-0.4, e^0.4); verl policy_loss=geo_mean.
    """
    adv = bcast(deltas, logp)
    lr = logp - old_logp
    sgn = torch.sign(adv)
    # the clipped log-ratio wins the min only where it lowers the objective: PPO's rule in log space
    lr_min = sgn * torch.minimum(sgn * lr, sgn * _clamp(lr, -clip_low, clip_high))
    ratio = torch.exp(masked_mean(lr_min, mask, dim=-1, keepdim=True))  # (B, G, 1)
    # per-token deltas: the sequence's mean delta, as verl's geo_mean takes it
    loss = (-seq_deltas(deltas, mask).unsqueeze(-1) * ratio).expand_as(logp)
    return loss, {"low": (adv < 0) & (lr < -clip_low), "high": (adv > 0) & (lr > clip_high)}


@register("loss", "cispo")
def cispo(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
          clip_low: OptionalFraction = None, clip_high: Positive = 4.0) -> tuple[Tensor, Regions]:
    """CISPO: -sg(clip(ratio, 1 - clip_low, 1 + clip_high)) * A * log pi; every token keeps a gradient.

    clip_low null: no lower bound, as MiniMax-M1 and ScaleRL use it. TRL's epsilon_high = 5.0
    (its recommended epsilon_max, a cap on the ratio itself) is clip_high = 4.0 here.

    Source: MiniMax-M1 (2025, arXiv 2506.13585); ScaleRL (Khatri et al., 2025); verl policy_loss=cispo; TRL loss_type=cispo.
    """
    ratio = torch.exp(logp - old_logp)
    lo = 0.0 if clip_low is None else 1.0 - clip_low
    hi = 1.0 + clip_high
    weight = _clamp(ratio, lo, hi).detach()
    return -weight * bcast(deltas, logp) * logp, {"low": ratio < lo, "high": ratio > hi}


@register("loss", "dro")
def dro(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
        tau: Positive = 0.1) -> tuple[Tensor, Regions]:
    """-log pi * A + tau/2 * (log pi - log pi_old)^2: REINFORCE with a quadratic pull towards the old policy.

    verl requires dro_beta (it has no default); 0.1 is this suite's.

    Source: Kimi k1.5 (2025, arXiv 2501.12599), its mirror-descent loss as verl implements it; verl policy_loss=dro (dro_beta = tau).
    """
    return -(logp * bcast(deltas, logp) - 0.5 * tau * (logp - old_logp).square()), {}


@register("loss", "topr")
def topr(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
         positive_weight: NonNegative = 1.0, negative_weight: NonNegative = 1.0) -> tuple[Tensor, Regions]:
    """TOPR: -A log pi on positive responses (no importance weight), -sg(min(ratio, 1)) A log pi on the rest.

    Positive means delta > 0 (ROLL splits by score > 0): with 0/1 rewards and a group-centred
    delta the two agree wherever the loss has a gradient. Region "cap": the negative tokens
    whose ratio the taper cut to 1.

    Source: Tapered Off-Policy REINFORCE (Le Roux et al., 2025, arXiv 2503.14286, eq. 8); ROLL pg_variant=topr (topr_positive_weight, topr_negative_weight).
    """
    adv = bcast(deltas, logp)
    ratio = torch.exp(logp - old_logp)
    pos = adv > 0
    weight = torch.where(pos, _full(adv, positive_weight), negative_weight * ratio.clamp(max=1.0).detach())
    # a zero-advantage token is neither side: no taper acts on it (nor is it clipped in any loss's regions)
    return -weight * adv * logp, {"cap": (adv < 0) & (ratio > 1.0)}


@register("loss", "sapo")
def sapo(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
         tau_pos: Positive = 1.0, tau_neg: Positive = 1.05) -> tuple[Tensor, Regions]:
    """SAPO: -f(ratio) * A with the soft gate f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau by the sign of A.

    The gate's slope is 1 at r = 1 (the policy gradient) and decays smoothly away from it.

    Source: Soft Adaptive Policy Optimization (Gao et al., 2025, arXiv 2511.20347); verl policy_loss=sapo; TRL loss_type=sapo.
    """
    adv = bcast(deltas, logp)
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))  # as verl and TRL: exp overflow would give 0 * inf
    tau = torch.where(adv > 0, _full(adv, tau_pos), _full(adv, tau_neg))
    return -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv, {}


@register("loss", "vespo")
def vespo(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
          k_pos: NonNegative = 2.0, lambda_pos: NonNegative = 3.0,
          k_neg: NonNegative = 3.0, lambda_neg: NonNegative = 2.0) -> tuple[Tensor, Regions]:
    """VESPO: -sg(phi(w)) * A * log pi, phi(w) = e^lambda w^k e^(-lambda w) on the sequence weight w = prod of token ratios.

    Source: VESPO (Shen et al., 2026, arXiv 2602.10693); TRL loss_type=vespo (same clamps).
    """
    floor = math.log(1e-8)
    seq = masked_sum((logp - old_logp).clamp(-20.0, 20.0), mask, dim=-1, keepdim=True)
    log_w = seq.clamp(floor, 20.0).detach()                              # (B, G, 1)
    pos = bcast(deltas, logp) >= 0
    k = torch.where(pos, _full(log_w, k_pos), _full(log_w, k_neg))
    lam = torch.where(pos, _full(log_w, lambda_pos), _full(log_w, lambda_neg)).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return -phi * bcast(deltas, logp) * logp, {}


def _dppo(logp: Tensor, old_logp: Tensor, deltas: Tensor, valid: Tensor, clip_c: float) -> tuple[Tensor, Regions]:
    adv = bcast(deltas, logp)
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    weight = ratio.clamp(max=clip_c).detach()
    keep = valid.detach().to(logp.dtype)
    loss = -adv * weight * logp * keep
    return loss, {"low": (adv <= 0) & ~valid, "high": (adv > 0) & ~valid, "cap": valid & (ratio > clip_c)}


@register("loss", "dppo_tv")
def dppo_tv(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
            clip_low: Positive = 0.2, clip_high: Positive = 0.2, clip_c: Positive = 20.0) -> tuple[Tensor, Regions]:
    """DPPO-Binary-TV: truncated-IS policy gradient, tokens dropped where pi - pi_old leaves [-clip_low, clip_high].

    The trust region is on the probability difference (a binary total variation), not the ratio.

    Source: Rethinking the Trust Region in LLM RL, DPPO (2026, arXiv 2602.04879); verl policy_loss=dppo_tv.
    """
    adv = bcast(deltas, logp)
    diff = torch.exp(logp) - torch.exp(old_logp)
    valid = torch.where(adv > 0, diff <= clip_high, diff >= -clip_low)
    return _dppo(logp, old_logp, deltas, valid, clip_c)


@register("loss", "dppo_kl")
def dppo_kl(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
            clip_low: Positive = 0.2, clip_high: Positive = 0.2, clip_c: Positive = 20.0) -> tuple[Tensor, Regions]:
    """DPPO-Binary-KL: as dppo_tv, with the binary KL(pi_old || pi) of the sampled token's probability as the divergence.

    Source: DPPO (2026, arXiv 2602.04879); verl policy_loss=dppo_kl.
    """
    adv = bcast(deltas, logp)
    p, q = torch.exp(logp), torch.exp(old_logp)
    bkl = q * (old_logp - logp) + (1 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
    valid = torch.where(adv > 0, (bkl <= clip_high) | (p <= q), (bkl <= clip_low) | (p >= q))
    return _dppo(logp, old_logp, deltas, valid, clip_c)


@register("loss", "a2po", needs=("ref_logp",))
def a2po(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
         beta2: Positive = 1e-3) -> tuple[Tensor, Regions]:
    """A*-PO: (beta2 * log pi(y) / pi_ref(y) - A)^2, the implicit reward regressed onto the optimal advantage (delta a2po).

    Registered needs=("ref_logp",): the trainer hands it the reference policy's log-probs in
    the place of old_logp. log pi(y) / pi_ref(y) is the sum over the response's tokens; the
    response's value sits on each of its tokens, so seq_mean_token_mean gives TRL's mean
    over responses. A regression, not a surrogate: no ratio to pi_old, no clip.

    Source: A*-PO (Brantley et al., 2025, arXiv 2505.20686); TRL experimental A2POTrainer.compute_loss (beta2 1e-3).
    """
    implicit = beta2 * masked_sum(logp - old_logp, mask, dim=-1, keepdim=True)      # (B, G, 1)
    return (implicit - seq_deltas(deltas, mask).unsqueeze(-1)).square().expand_as(logp), {}


def _token_cov(logp: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """(A - mean A) * (log pi - mean log pi) per token, means over the unmasked tokens."""
    return (adv - masked_mean(adv, mask)) * (logp.detach() - masked_mean(logp.detach(), mask))


@register("loss", "clip_cov", per_member="draws a data-dependent number of random tokens (nonzero, randperm, .item())")
def clip_cov(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
             clip_low: Fraction = 0.2, clip_high: Positive = 0.2, clip_cov_ratio: Fraction = 2e-4,
             clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0) -> tuple[Tensor, Regions]:
    """Clip-Cov: PPO clip, and a random clip_cov_ratio share of tokens with covariance in (lb, ub) lose their gradient.

    Draws from torch's global generator (seeded per run).

    Source: The Entropy Mechanism of RL for Reasoning LMs (Cui et al., 2025, arXiv 2505.22617); verl policy_loss=clip_cov.
    """
    adv = bcast(deltas, logp)
    loss, regions = _ppo(torch.exp(logp - old_logp), adv, clip_low, clip_high)
    on = mask > 0
    cov = _token_cov(logp, adv, mask)
    candidates = on & ~regions["low"] & ~regions["high"] & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    idx = candidates.reshape(-1).nonzero().squeeze(-1)
    n = max(int(clip_cov_ratio * on.sum().item()), 1)
    chosen = idx[torch.randperm(idx.numel(), device=idx.device)[:n]]
    cut = torch.zeros(on.numel(), dtype=torch.bool, device=on.device)
    cut[chosen] = True
    cut = cut.view_as(on)
    return torch.where(cut, torch.zeros_like(loss), loss), regions | {"cov": cut}


@register("loss", "kl_cov", per_member="takes the top share of the member's unmasked tokens: a data-dependent count (.item())")
def kl_cov(logp: Tensor, old_logp: Tensor, deltas: Tensor, mask: Tensor, *,
           kl_cov_ratio: Fraction = 2e-4, ppo_kl_coef: NonNegative = 1.0) -> tuple[Tensor, Regions]:
    """KL-Cov: -ratio * A, plus ppo_kl_coef * |log ratio| on the top kl_cov_ratio share of tokens by covariance.

    Source: The Entropy Mechanism of RL for Reasoning LMs (Cui et al., 2025); verl policy_loss=kl_cov.
    """
    adv = bcast(deltas, logp)
    lr = logp - old_logp
    loss = -adv * torch.exp(lr)
    on = mask > 0
    cov = _token_cov(logp, adv, mask).masked_fill(~on, -math.inf)
    n = max(1, int(on.sum().item() * kl_cov_ratio))
    top = cov.reshape(-1).topk(min(n, int(on.sum().item())) if on.any() else 0).indices
    hit = torch.zeros(on.numel(), dtype=torch.bool, device=on.device)
    hit[top] = True
    hit = hit.view_as(on)
    return torch.where(hit, loss + ppo_kl_coef * lr.abs(), loss), {"cov": hit}

