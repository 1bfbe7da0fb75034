"""What a task gives the trainer.

A task is registered on the "task" axis with a dataclass that its YAML section
(`task: {name: ..., ...}`) is checked against, and is built as
`cls(task_config, run_config)`. The trainer (grpo_bench/trainer.py) only ever
calls the methods of `Task` below; everything model- or data-specific, the
reference policy included, lives in the task.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn


@dataclass
class Rollout:
    """One epoch's data: G sampled responses for each of B prompts, scored."""

    prompts: Any                 # task-specific (token ids, strings, ...)
    responses: Tensor            # (B, G, T) sampled token ids
    mask: Tensor                 # (B, G, T) 1.0 on response tokens that count, 0.0 on padding / after EOS
    rewards: Tensor              # (B, G) total reward
    extra: dict[str, Any] = field(default_factory=dict)   # whatever logprobs() needs again (input ids, ...)
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. reward components: {"reward/correct": 0.4}


class Task(Protocol):
    policy: nn.Module  # its parameters with requires_grad are what the optimiser trains

    def rollout(self, epoch: int, group_size: int, gen: torch.Generator) -> Rollout:
        """Draw this epoch's prompts, sample group_size responses each (no grad), score them."""

    def logprobs(self, rollout: Rollout, reference: bool = False) -> tuple[Tensor, Tensor | None]:
        """Per-token log pi(response token) (B, G, T) under the policy (with grad unless
        under no_grad) or the reference policy, plus per-token entropy (B, G, T) or None."""

    def refresh_reference(self) -> None:
        """Make the reference policy a copy of the current policy."""

    def evaluate(self, gen: torch.Generator) -> dict[str, float]:
        """Held-out metrics (e.g. {"eval/accuracy": 0.3}); {} if the task has none."""
