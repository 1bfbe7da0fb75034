"""KL estimators: per-token estimates of KL(pi || pi_ref) from the sampled tokens' log-probs.

    fn(logp, ref_logp, old_logp | None (B, G, T)) -> (B, G, T)

With samples from pi and r = pi_ref / pi: k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r
(Schulman, "Approximating KL divergence", 2020). Their values and their gradients differ:
in expectation on-policy, the gradient of k1 is 0, of k2 it is grad KL(pi || pi_ref) and of
k3 it is grad KL(pi_ref || pi) (tests/test_algos.py proves each on an exact categorical
distribution). The straight-through "+" variants keep an estimator's value and take k2's
gradient; k3_is multiplies k3 by the importance ratio pi / pi_old, which makes both its
value and its gradient those of KL(pi || pi_ref) when the samples come from pi_old.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..registry import register


def _st(value: Tensor, logp: Tensor, ref_logp: Tensor) -> Tensor:
    """value in the forward pass, k2's gradient in the backward pass."""
    k2_ = 0.5 * (logp - ref_logp) ** 2
    return k2_ - k2_.detach() + value.detach()


@register("kl", "k1")
def k1(logp: Tensor, ref_logp: Tensor, old_logp: Tensor | None = None) -> Tensor:
    """log pi - log pi_ref: unbiased value; its gradient is zero in expectation.

    Source: Schulman (2020); verl kl_penalty=kl/k1; the InstructGPT reward penalty.
    """
    return logp - ref_logp


@register("kl", "k2")
def k2(logp: Tensor, ref_logp: Tensor, old_logp: Tensor | None = None) -> Tensor:
    """(log pi - log pi_ref)^2 / 2: biased value, low variance; its gradient is that of KL(pi || pi_ref).

    Source: Schulman (2020); verl kl_penalty=mse/k2.
    """
    return 0.5 * (logp - ref_logp) ** 2


@register("kl", "k3")
def k3(logp: Tensor, ref_logp: Tensor, old_logp: Tensor | None = None) -> Tensor:
    """pi_ref/pi - 1 - log(pi_ref/pi): unbiased, always >= 0; its gradient is that of KL(pi_ref || pi).

    Source: Schulman (2020); GRPO (Shao et al., 2024); TRL beta > 0; verl kl_penalty=k3 (unclamped).
    """
    log_r = ref_logp - logp
    return torch.exp(log_r) - 1 - log_r


@register("kl", "low_var_kl")
def low_var_kl(logp: Tensor, ref_logp: Tensor, old_logp: Tensor | None = None) -> Tensor:
    """k3 with verl's clamps: log r to [-20, 20], the estimate to [-10, 10].

    Source: verl kl_penalty=low_var_kl (its default for GRPO's KL loss).
    """
    log_r = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(log_r) - log_r - 1).clamp(-10.0, 10.0)


@register("kl", "abs")
def abs_kl(logp: Tensor, ref_logp: Tensor, old_logp: Tensor | None = None) -> Tensor:
    """|log pi - log pi_ref|.

    Source: verl kl_penalty=abs.
    """
    return (logp - ref_logp).abs()


@register("kl", "k1+")
def k1_st(logp: Tensor, ref_logp: Tensor, old_logp: Tensor | None = None) -> Tensor:
    """k1's value with k2's gradient (straight-through): unbiased value and the gradient of KL(pi || pi_ref).

    Source: verl kl_penalty=k1+ ("+" suffix: straight-through to k2's gradient).
    """
    return _st(k1(logp, ref_logp), logp, ref_logp)


@register("kl", "k3+")
def k3_st(logp: Tensor, ref_logp: Tensor, old_logp: Tensor | None = None) -> Tensor:
    """k3's value with k2's gradient (straight-through).

    Source: verl kl_penalty=k3+ / low_var_kl+.
    """
    return _st(k3(logp, ref_logp), logp, ref_logp)


@register("kl", "k3_is")
def k3_is(logp: Tensor, ref_logp: Tensor, old_logp: Tensor | None = None) -> Tensor:
    """(pi / pi_old) * k3: importance-corrected k3, unbiased in value and gradient under samples from pi_old.

    Source: DeepSeek-V3.2 (2025, arXiv 2512.02556); TRL use_bias_correction_kl=True.
    """
    if old_logp is None:
        raise ValueError("k3_is needs old_logp, the log-probs of the policy that sampled")
    return torch.exp(logp - old_logp) * k3(logp, ref_logp)
