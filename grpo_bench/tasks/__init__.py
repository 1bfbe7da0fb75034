"""What a task gives the trainer.

A task is registered on the "task" axis with a dataclass that its YAML section
(`task: {name: ..., ...}`) is checked against, and is built as
`cls(task_config, run_config)`. The trainer (grpo_bench/trainer.py) only ever
calls the methods of `Task` below; everything model- or data-specific, the
reference policy included, lives in the task. A task config has a
`generation_budget` property: the most tokens a response may have.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class Rollout:
    """One epoch's data: G sampled responses for each of B prompts, scored."""

    prompts: Any                 # task-specific: a (B, ...) tensor or a list of B items
    responses: Tensor            # (B, G, T) sampled token ids
    mask: Tensor                 # (B, G, T) 1.0 on response tokens that count, 0.0 on padding / after EOS
    rewards: Tensor              # (B, G) total reward: the weighted sum of components
    finished: Tensor | None = None   # (B, G) bool: ended with EOS within the budget; None = all did
    lengths: Tensor | None = None    # (B, G) tokens generated, EOS included; None = from the mask
    extra: dict[str, Any] = field(default_factory=dict)    # (B, ...) tensors logprobs() needs again (input ids, ...)
    left_pad: dict[str, Any] = field(default_factory=dict)  # extra tensors padded on the left, and with what
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. reward components: {"reward/correct": 0.4}
    components: Tensor | None = None  # (B, G, C) raw score of each of the task's C reward functions, in their order

    def __post_init__(self):
        if self.finished is None:
            self.finished = torch.ones(self.rewards.shape, dtype=torch.bool, device=self.rewards.device)
        if self.lengths is None:
            self.lengths = self.mask.sum(-1)

    def replace(self, **changes) -> "Rollout":
        return dataclasses.replace(self, **changes)

    def select(self, idx: Tensor) -> "Rollout":
        """The groups at idx (a (B,) bool mask or indices), in that order."""
        idx = idx.nonzero().squeeze(-1) if idx.dtype == torch.bool else idx
        pick = lambda x: x[idx.to(x.device)] if isinstance(x, Tensor) else [x[i] for i in idx.tolist()]  # noqa: E731
        return self.replace(prompts=pick(self.prompts), responses=pick(self.responses), mask=pick(self.mask),
                            rewards=pick(self.rewards), finished=pick(self.finished), lengths=pick(self.lengths),
                            extra={k: pick(v) for k, v in self.extra.items()},
                            components=None if self.components is None else pick(self.components))

    @staticmethod
    def cat(parts: list["Rollout"]) -> "Rollout":
        """Groups of several rollouts of one task as one rollout; responses padded to the longest."""
        t = max(p.responses.shape[-1] for p in parts)

        def right(x: Tensor) -> Tensor:
            return F.pad(x, (0, t - x.shape[-1]))

        def join(key: str, xs: list) -> Any:
            if not isinstance(xs[0], Tensor):
                return [item for x in xs for item in x]
            if key in parts[0].left_pad:
                width = max(x.shape[1] for x in xs)
                xs = [F.pad(x, (width - x.shape[1], 0), value=parts[0].left_pad[key]) for x in xs]
            return torch.cat(xs)

        first = parts[0]
        return first.replace(
            prompts=join("prompts", [p.prompts for p in parts]),
            responses=torch.cat([right(p.responses) for p in parts]), mask=torch.cat([right(p.mask) for p in parts]),
            rewards=torch.cat([p.rewards for p in parts]), finished=torch.cat([p.finished for p in parts]),
            lengths=torch.cat([p.lengths for p in parts]),
            extra={k: join(k, [p.extra[k] for p in parts]) for k in first.extra},
            components=None if first.components is None else torch.cat([p.components for p in parts]))


class Task(Protocol):
    policy: nn.Module  # its parameters with requires_grad are what the optimiser trains

    def rollout(self, epoch: int, group_size: int, gen: torch.Generator) -> Rollout:
        """Draw prompts, sample group_size responses each (no grad), score them. Called again
        within an epoch when a filter drops groups; each call draws new prompts from `gen`."""

    def logprobs(self, rollout: Rollout, reference: bool = False) -> tuple[Tensor, Tensor | None]:
        """Per-token log pi(response token) (B, G, T) under the policy (with grad unless
        under no_grad) or the reference policy, plus per-token entropy (B, G, T) or None."""

    def mix_reference(self, weight: float) -> None:
        """reference <- weight * policy + (1 - weight) * reference (1: a copy of the policy)."""

    def retire(self, prompts: Any) -> None:
        """Never draw these prompts (a rollout's `prompts`, selected) again: a curriculum filter's
        decision. Raises RuntimeError when nothing would be left to draw."""

    def greedy_rewards(self, rollout: Rollout) -> Tensor:
        """(B,) reward of the policy's greedy response to each prompt of the rollout (ReMax's baseline)."""

    def evaluate(self, gen: torch.Generator) -> dict[str, float]:
        """Held-out metrics (e.g. {"eval/accuracy": 0.3}); {} if the task has none."""
