"""Sample filters: which responses and tokens a rollout's update learns from.

    fn(batch: Batch, *, params) -> Batch

A filter returns a changed copy of the batch. What it may change says what it does:
`rewards` (shaping), `mask` (tokens leave the loss and its normaliser), `gate` (tokens
keep their place in the normaliser but their policy term loses its gradient), `keep`
(groups to drop and draw again, up to `max_draws` rollouts per epoch), `retire` (prompts
the task must never draw again: a curriculum's state lives in the task's prompt stream,
the filter only decides). Its `stage`
says when it runs: "rollout" once per rollout before the deltas, "step" at every
gradient step, when the current policy's entropy is known. Filters run in the order
the run config lists them; the trainer logs the share of tokens (or groups) each removed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor

from ..registry import PositiveInt, Probability, Range, register
from .common import flat_groups

OptionalLength = Annotated[int | None, Range(1)]


@dataclass(frozen=True)
class Batch:
    """One rollout as the filters see it."""

    rewards: Tensor                 # (B, G) total reward of each response
    mask: Tensor                    # (B, G, T) 1.0 on tokens that count in the loss and its normaliser
    lengths: Tensor                 # (B, G) tokens generated (EOS included), before any filter
    finished: Tensor                # (B, G) bool: ended with EOS within the budget (False: truncated)
    max_len: int                    # the generation budget
    entropy: Tensor | None = None   # (B, G, T) current policy's entropy (step stage only)
    gate: Tensor | None = None      # (B, G, T) 1.0 where the policy term keeps its gradient
    keep: Tensor | None = None      # (B,) bool: groups to keep; the others are drawn again
    max_draws: int = 1              # rollouts the trainer may draw per epoch to replace dropped groups
    retire: Tensor | None = None    # (B,) bool: prompts the task's stream must not draw again
    components: Tensor | None = None  # (B, G, C) raw score of each reward function (GDPO's input)

    def replace(self, **changes) -> "Batch":
        return dataclasses.replace(self, **changes)


@register("filter", "dynamic_sampling", stage="rollout", needs_group=True,
          per_member="the trainer draws replacement groups until the batch is full: members would need different rollouts")
def dynamic_sampling(batch: Batch, *, max_draws: PositiveInt = 4) -> Batch:
    """Drop groups whose rewards are all equal (no signal) and draw again until the batch is full, up to max_draws rollouts.

    When the cap is reached the batch is filled with dropped groups and the metric
    filter/dynamic_sampling/capped says so.

    Source: DAPO dynamic sampling (Yu et al., 2025); verl algorithm.filter_groups (max_num_gen_batches).
    """
    return batch.replace(keep=~flat_groups(batch.rewards).squeeze(-1), max_draws=max_draws)


@register("filter", "mask_truncated", stage="rollout")
def mask_truncated(batch: Batch) -> Batch:
    """Responses cut off by the budget (no EOS) leave the loss entirely.

    Source: DAPO overlong filtering (Yu et al., 2025); TRL mask_truncated_completions=True.
    """
    return batch.replace(mask=batch.mask * batch.finished.unsqueeze(-1).to(batch.mask.dtype))


@register("filter", "overlong_punish", stage="rollout")
def overlong_punish(batch: Batch, *, cache: PositiveInt = 4, max_len: OptionalLength = None) -> Batch:
    """Soft overlong punishment: reward += clip((max_len - cache - |o|) / cache, -1, 0).

    Zero up to max_len - cache tokens, then linear down to -1 at max_len (null: the task's
    generation budget).

    Source: DAPO soft overlong punishment (Yu et al., 2025), L_max = max_len, L_cache = cache.
    """
    budget = batch.max_len if max_len is None else max_len
    if cache >= budget:
        raise ValueError(f"overlong_punish: cache ({cache}) must be below the length budget ({budget})")
    penalty = ((budget - cache - batch.lengths.to(batch.rewards.dtype)) / cache).clamp(-1.0, 0.0)
    return batch.replace(rewards=batch.rewards + penalty)


@register("filter", "top_entropy", stage="step",
          per_member="a quantile over the member's unmasked tokens (boolean indexing, a Python if on tensor values)")
def top_entropy(batch: Batch, *, rho: Probability = 0.2) -> Batch:
    """Only the top-rho share of tokens by the policy's entropy carry policy gradient; the rest still count in the normaliser.

    Source: Beyond the 80/20 Rule (Wang et al., 2025, arXiv 2506.01939; rho = 0.2); TRL top_entropy_quantile.
    """
    on = batch.mask > 0
    if batch.entropy is None or not on.any():
        return batch
    # compare in one dtype: an fp32 threshold of fp64 entropies would drop the minimum at rho = 1 (quantile
    # takes fp32 or fp64 only)
    ent = batch.entropy.to(torch.promote_types(batch.entropy.dtype, torch.float32))
    threshold = torch.quantile(ent[on], 1.0 - rho)
    gate = ((ent >= threshold) & on).to(batch.mask.dtype)
    return batch.replace(gate=gate if batch.gate is None else batch.gate * gate)


@register("filter", "zero_variance", stage="rollout", needs_group=True)
def zero_variance(batch: Batch) -> Batch:
    """Groups whose rewards are all equal leave the loss and its normaliser; nothing is drawn again.

    Every group-centred delta gives such a group 0 already: what changes is the normaliser
    (token_mean divides by fewer tokens) and the batch's effective size.

    Source: ScaleRL (Khatri et al., 2025, arXiv 2510.13786) zero-variance filtering; DAPO's dynamic sampling without its refill.
    """
    flat = flat_groups(batch.rewards).unsqueeze(-1)                          # (B, 1, 1)
    return batch.replace(mask=torch.where(flat, torch.zeros_like(batch.mask), batch.mask))


@register("filter", "no_positive_resample", stage="rollout", needs_group=True)
def no_positive_resample(batch: Batch, *, threshold: Probability = 0.9, pass_reward: float = 1.0) -> Batch:
    """Prompts whose pass rate reaches threshold are never drawn again (the task retires them); this batch still learns from them.

    A response passes when its reward is at least pass_reward (1.0: a fully correct answer
    on both tasks). List it first: shaping filters change the rewards it reads.

    Source: ScaleRL (Khatri et al., 2025, arXiv 2510.13786) no-positive-resampling (pass rate >= 0.9).
    """
    passed = (batch.rewards >= pass_reward).to(batch.rewards.dtype).mean(-1)   # (B,)
    retire = passed >= threshold
    return batch.replace(retire=retire if batch.retire is None else batch.retire | retire)
