"""What a task gives the trainer: a population of P runs of one task, stacked on a leading axis.

A task is registered on the "task" axis with a dataclass that its YAML section
(`task: {name: ..., ...}`) is checked against, and is built as
`cls(task_config, run_configs)`: one task config, and the run configs of the P members
that train together (the same task and shapes; their seeds and numbers may differ).
Every tensor it hands the trainer has the population axis first. A member's numbers
never depend on the other members: its random draws come from streams named by its own
seed (grpo_bench/numerics/rng.py), and every per-member computation has the shapes it would have
alone. P = 1 is a single run, through the same code.

A member's own failure (its reward raising on one of its prompts, a non-finite reward) must
not end the others: a task runs such code member by member through `guarded`, which records
the exception in `task.failed` (member index -> exception) and goes on with a stand-in;
the trainer takes `failed` after each call and fails those members alone, as each would
have failed alone.

The trainer (grpo_bench/engine/trainer.py) only ever calls the methods of `Task` below (and reads
`outcomes`, where a task has them);
everything model- or data-specific, the reference policy included, lives in the task.
A task config has a `generation_budget` property: the most tokens a response may have.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn


@dataclass
class Rollout:
    """One draw of an epoch for P runs: G sampled responses for each of B prompts per run, scored."""

    prompts: Any                 # task-specific: a (P, B, ...) tensor or a list of P lists of B items
    responses: Tensor            # (P, B, G, T) sampled token ids; T is fixed by the task (its budget)
    mask: Tensor                 # (P, B, G, T) 1.0 on response tokens that count, 0.0 on padding / after EOS
    rewards: Tensor              # (P, B, G) total reward: the weighted sum of components
    finished: Tensor | None = None   # (P, B, G) bool: ended with EOS within the budget; None = all did
    lengths: Tensor | None = None    # (P, B, G) tokens generated, EOS included; None = from the mask
    extra: dict[str, Any] = field(default_factory=dict)      # (P, B, ...) tensors logprobs() needs again
    metrics: dict[str, Tensor] = field(default_factory=dict)  # (P,) per member, e.g. {"reward/correct": ...}
    components: Tensor | None = None  # (P, B, G, C) raw score of each of the task's C reward functions, in their order
    sampler_logp: Tensor | None = None  # (P, B, G, T) the sampler's own log-probs of its tokens; None: the policy sampled

    def __post_init__(self):
        if self.finished is None:
            self.finished = torch.ones(self.rewards.shape, dtype=torch.bool, device=self.rewards.device)
        if self.lengths is None:
            self.lengths = self.mask.sum(-1)

    def replace(self, **changes) -> "Rollout":
        return dataclasses.replace(self, **changes)

    def take(self, idx: Tensor) -> "Rollout":
        """For each member p, the groups idx[p] (a (P, B') index tensor), in that order."""
        def pick(x):
            if isinstance(x, Tensor):
                i = idx.to(x.device).view(*idx.shape, *[1] * (x.dim() - 2)).expand(*idx.shape, *x.shape[2:])
                return x.gather(1, i)
            return [[member[i] for i in row] for member, row in zip(x, idx.tolist())]
        return self.replace(prompts=pick(self.prompts), responses=pick(self.responses), mask=pick(self.mask),
                            rewards=pick(self.rewards), finished=pick(self.finished), lengths=pick(self.lengths),
                            extra={k: pick(v) for k, v in self.extra.items()},
                            components=None if self.components is None else pick(self.components),
                            sampler_logp=None if self.sampler_logp is None else pick(self.sampler_logp))

    @staticmethod
    def cat(parts: list["Rollout"]) -> "Rollout":
        """Several draws of one population as one rollout: their groups side by side on the group axis (dim 1)."""
        def join(xs):
            if isinstance(xs[0], Tensor):
                return torch.cat(xs, 1)
            return [[item for x in member for item in x] for member in zip(*xs)]
        first = parts[0]
        return first.replace(
            prompts=join([p.prompts for p in parts]), responses=join([p.responses for p in parts]),
            mask=join([p.mask for p in parts]), rewards=join([p.rewards for p in parts]),
            finished=join([p.finished for p in parts]), lengths=join([p.lengths for p in parts]),
            extra={k: join([p.extra[k] for p in parts]) for k in first.extra}, metrics={},
            components=None if first.components is None else join([p.components for p in parts]),
            sampler_logp=None if first.sampler_logp is None else join([p.sampler_logp for p in parts]))


def device_for(name: str, task_cls, cuda: bool | None = None, cores: int | None = None) -> str:
    """The device a run's `device` means here. `auto` is cuda where a GPU is and it does the task's work faster
    than this machine's CPU workers would: the task's measured `gpu_replaces_cores` (runs per GPU-minute over
    runs per CPU-core-minute at the default population, scripts/gpu_population.py) exceeds the cores here."""
    if name != "auto":
        return name
    cuda = torch.cuda.is_available() if cuda is None else cuda
    cores = (os.cpu_count() or 1) if cores is None else cores
    replaces = getattr(task_cls, "gpu_replaces_cores", None)
    return "cuda" if cuda and replaces is not None and replaces > cores else "cpu"


def guarded(failed: dict[int, Exception], member: int, fn, stand_in):
    """fn() for member `member`; if it raises, the exception is that member's failure (the first one kept)
    and `stand_in` is returned, so the other members' call goes on with numbers that no one will use."""
    try:
        return fn()
    except Exception as e:
        failed.setdefault(member, e)
        return stand_in


class Task(Protocol):
    policy: nn.Module  # its parameters with requires_grad are what the optimiser trains, each (P, ...)
    failed: dict[int, Exception]  # members whose own call raised since the trainer last took them (`guarded`)

    def rollout(self, epoch: int, draw: int, group_size: int, sampler: nn.Module | None = None) -> Rollout:
        """Draw each member's prompts and sample group_size responses each (no grad), scored. `draw`
        counts the rollouts of this epoch (a filter that drops groups asks for more); member p's
        prompts and sampling noise come from the streams rng.stream(seed_p, ..., epoch, draw).
        `sampler`: a copy of the policy (other weights, another dtype) that samples instead of it;
        its own log-probs of what it sampled come back in Rollout.sampler_logp."""

    def logprobs(self, rollout: Rollout, reference: bool = False) -> tuple[Tensor, Tensor | None]:
        """Per-token log pi(response token) (P, B, G, T) under the policy (with grad unless under
        no_grad) or the reference policy, plus per-token entropy (P, B, G, T) or None."""

    def mix_reference(self, weights: list[float]) -> None:
        """reference_p <- w_p * policy_p + (1 - w_p) * reference_p (1: a copy; 0: unchanged)."""

    def retire(self, member: int, prompts: Any) -> None:
        """Member `member` never draws these prompts (some of its rollout's `prompts`) again: a curriculum
        filter's decision. Raises RuntimeError when nothing would be left to draw."""

    def greedy_rewards(self, rollout: Rollout) -> Tensor:
        """(P, B) reward of the policy's greedy response to each prompt of the rollout (ReMax's baseline)."""

    def sum_pi_squared(self, rollout: Rollout) -> Tensor:
        """(P, B, G, T) sum over the vocabulary of pi(v | prefix)^2 at each response position, under the
        policy (no grad, the sampling temperature): asked only for a delta part that needs "sum_pi_sq"
        (the Optimal Token Baseline); an LM computes it without the (N, T, V) logits."""

    def reference_rewards(self, rollout: Rollout, n: int) -> Tensor:
        """(P, B, n) rewards of n responses sampled from the reference policy for each prompt of the
        rollout (no grad): asked only for a delta part that needs "ref_rewards" (A*-PO's V*)."""

    def evaluate(self, mid_run: bool = False) -> list[dict[str, float]]:
        """Held-out metrics per member (e.g. {"eval/accuracy": 0.3}); {} if the task has none. mid_run: an
        evaluation between the first and the last, which a task may make cheaper (the LM's eval_subset); a
        task without the parameter is called without it. A task that keeps each held-out problem's outcome
        sets `outcomes` here: per member, {"greedy": [0/1 per problem], "k_correct": [right samples of k
        per problem] or None}, problem j being the j-th of its held-out list; the trainer takes them after
        each call."""

    def keep(self, idx: list[int]) -> None:
        """Only the members at idx go on (the others failed): narrow every per-member tensor."""
