"""A policy loss of your own, registered from outside the package (see README, "Testing your own variant").

`python -m grpo_bench list --include examples/my_variant` shows it beside the shipped losses;
examples/my_variant/ablation.yaml runs it against DAPO's clip-higher and GSPO.
"""
import torch

from grpo_bench.registry import Positive, register


@register("loss", "soft_clip")
def soft_clip(logp, old_logp, deltas, mask, *, tau: Positive = 0.2):
    """-A * (1 + tau * tanh((ratio - 1) / tau)): a trust region that bends instead of cutting the gradient off.

    Source: an example of a user's own part (not a published method).
    """
    ratio = torch.exp(logp - old_logp)
    surrogate = 1 + tau * torch.tanh((ratio - 1) / tau)   # ratio near 1, saturating at 1 +- tau
    return -surrogate * deltas[..., None], {}
