"""The GRPO parts, one module per axis: the room where users add parts.

    deltas.py     advantage ("delta") modes: group, batch and length-weighted baselines, per-token ones
    losses.py     policy losses: REINFORCE, PPO clip and its variants, sequence-level ratios
    aggregate.py  how per-token losses become one scalar
    kl.py         KL estimators, straight-through and importance-corrected ones
    corrections.py off-policy corrections from the sampler's log-probs: TIS, MIS, rejection, OPSM, M2PO
    control.py    the KL and entropy coefficients' controllers, the reference policy's update schedule
    filters.py    sample filters: dynamic sampling, overlong shaping, truncation and entropy masks
    rewards.py    rule rewards with TRL's signature, per task, and how a task's reward mix is resolved

Adding a part is one decorated function in the module of its axis, plus its tests:

    @register("delta", "my_baseline", needs_group=True)
    def my_baseline(rewards, lengths=None, greedy=None, components=None, extra=None, *, eps: Positive = 1e-6):
        \"\"\"One line on what it does.

        Source: the paper, or the verl/TRL option it corresponds to.
        \"\"\"
        ...

Nothing outside this package names a part; what the rest of the code needs to know
about one (does it need a group, a greedy baseline, which stage a filter runs at) is
on its registration. Shapes: B prompts, G responses per prompt (the group), T tokens.

Conventions (see ../shared/seeds/README.md): the ratio is pi/pi_old = exp(logp - old_logp),
never a quotient of log-probs; with r = pi_ref/pi, k1 = -log r, k2 = (log r)^2 / 2,
k3 = r - 1 - log r, each an estimate of KL(pi || pi_ref) under samples from pi.
"""
from . import aggregate, control, corrections, deltas, filters, kl, losses, rewards  # noqa: F401  (registration)
from .common import masked_mean, masked_sum
from .filters import Batch

__all__ = ["Batch", "masked_mean", "masked_sum"]
