"""Schedules: the KL and entropy coefficients' controllers and the reference policy's updates.

    kl_ctrl     fn(coef, observed_kl, n_samples, *, params) -> the coefficient for the next rollout
    entropy_ctrl fn(coef, entropy, *, params) -> (state, applied): the controller's next state and
                the coefficient of the entropy bonus at the next gradient step; entropy is the
                last step's mean token entropy, or None before the first step
    ref_update  fn(epoch, *, params) -> w: the reference becomes w * policy + (1 - w) * reference
                before this epoch's rollout (0: no update, 1: a copy)

All are pure functions of numbers; the trainer keeps the state and the tasks apply the
mix to their weights (a state-dict lerp on the toy, the LoRA deltas on the LM task).
"""
from __future__ import annotations

from ..registry import NonNegative, PositiveInt, Positive, Probability, register


@register("kl_ctrl", "fixed")
def fixed(coef: float, observed_kl: float, n_samples: int) -> float:
    """beta stays kl_coef.

    Source: GRPO (Shao et al., 2024); verl kl_ctrl.type=fixed; TRL beta.
    """
    return coef


@register("kl_ctrl", "adaptive")
def adaptive(coef: float, observed_kl: float, n_samples: int, *,
             target: Positive = 0.1, horizon: Positive = 10000.0) -> float:
    """beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_samples / horizon after each rollout.

    observed_kl is the rollout's mean over responses of the per-token KL to the reference.

    Source: Ziegler et al. (2019, arXiv 1909.08593); verl kl_ctrl.type=adaptive (target_kl 0.1, horizon 10000).
    """
    error = min(max(observed_kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * n_samples / horizon)


@register("entropy_ctrl", "fixed")
def entropy_fixed(coef: float, entropy: float | None) -> tuple[float, float]:
    """The bonus's coefficient stays entropy_coef.

    Source: verl actor.entropy_coeff; TRL entropy_coef (use_adaptive_entropy=False).
    """
    return coef, coef


@register("entropy_ctrl", "adaptive")
def entropy_adaptive(coef: float, entropy: float | None, *, target: NonNegative = 0.2,
                     coef_min: NonNegative = 0.0, coef_max: NonNegative = 1.0,
                     delta: NonNegative = 0.005) -> tuple[float, float]:
    """After each step: coef += delta if entropy <= target else -= delta, within [coef_min, coef_max]; applied only while entropy <= target.

    Starts at entropy_coef and applies no bonus until the first step's entropy is known.

    Source: Skywork-OR1 (He et al., 2025, arXiv 2505.22312) adaptive entropy control; TRL use_adaptive_entropy (entropy_target 0.2, entropy_coef_min 0, entropy_coef_max 1, entropy_coef_delta 0.005).
    """
    if entropy is None:
        return coef, 0.0
    low = entropy <= target
    coef = min(coef + delta, coef_max) if low else max(coef - delta, coef_min)
    return coef, coef if low else 0.0


@register("ref_update", "frozen")
def frozen(epoch: int) -> float:
    """The reference stays the initial policy.

    Source: GRPO (Shao et al., 2024); TRL sync_ref_model=False.
    """
    return 0.0


@register("ref_update", "hard")
def hard(epoch: int, *, every: PositiveInt = 10) -> float:
    """The reference becomes a copy of the policy every `every` epochs (rollouts).

    Source: the iterative GRPO of DeepSeekMath (Shao et al., 2024), which resets the reference to the policy.
    """
    return 1.0 if epoch > 0 and epoch % every == 0 else 0.0


@register("ref_update", "soft")
def soft(epoch: int, *, every: PositiveInt = 1, alpha: Probability = 0.6) -> float:
    """ref <- alpha * policy + (1 - alpha) * ref every `every` epochs (rollouts).

    On a LoRA policy the mix is taken of the adapters' weight deltas and kept at the
    adapter's rank (the best rank-r approximation; exact when alpha is 1).

    Source: TR-DPO (Gorbatovski et al., 2024, arXiv 2404.09656); TRL sync_ref_model, ref_model_mixup_alpha (0.6), ref_model_sync_steps.
    """
    return alpha if epoch > 0 and epoch % every == 0 else 0.0
