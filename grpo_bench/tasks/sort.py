"""The sorting toy of CS336 lecture 17 ("minimal GRPO"): output the prompt, sorted.

Prompt: n integers in [0, V). Response: n tokens, one per position, sampled
independently from a non-autoregressive policy (embedding, one encode matrix per
prompt position, one decode matrix per output position, logits against the
embedding table). Small enough that a 1000-step run takes about a second on a
CPU core, so design choices can be swept over many seeds.

Differences from the lecture notes: logits are scaled so that the initial
policy explores (see SortPolicy.forward); rewards are divided by their maximum so that
every reward lies in [0, 1] whatever n is; the reference policy is a state-dict
copy (nn.Module has no clone()); the "hard" setting (random prompts each epoch)
is a config, not a different task.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..algos import rewards as algos_rewards
from ..logprobs import token_logprobs
from ..registry import register
from . import Rollout

LECTURE_PROMPTS = [[1, 0, 2], [3, 2, 4], [1, 2, 3]]


@dataclass
class SortConfig:
    n: int = 3
    """Prompt (and response) length."""
    vocab: int = 5
    """V: prompt tokens are integers in [0, V)."""
    prompts: list | None = field(default_factory=lambda: [list(p) for p in LECTURE_PROMPTS])
    """Fixed training prompts (the lecture's three); null = draw num_prompts random prompts every epoch."""
    num_prompts: int = 16
    """B: random prompts drawn per epoch when `prompts` is null."""
    rewards: dict = field(default_factory=lambda: {"match": 1.0})
    """Reward -> weight (registry axis `reward`): match (fraction of positions equal to the sorted prompt), inclusion_order (prompt tokens present + adjacent pairs in order), or `module:function`."""
    dim: int = 16
    """Embedding width of the policy."""
    eval_prompts: int = 256
    """Held-out random prompts for greedy evaluation (the fixed prompts are evaluated too, when given)."""

    @property
    def generation_budget(self) -> int:
        return self.n  # every response has exactly n tokens

    def check(self, run_cfg) -> None:
        if self.n < 1:
            raise ValueError(f"n: must be >= 1, got {self.n}")
        if self.vocab < 2:
            raise ValueError(f"vocab: must be >= 2, got {self.vocab}")
        algos_rewards.check(self.rewards, "sort")
        if self.num_prompts < 1 or self.dim < 1 or self.eval_prompts < 1:
            raise ValueError("num_prompts: num_prompts, dim and eval_prompts must be >= 1")
        if self.prompts is not None:
            ok = len(self.prompts) > 0 and all(
                isinstance(p, list) and len(p) == self.n and all(isinstance(x, int) and 0 <= x < self.vocab for x in p)
                for p in self.prompts)
            if not ok:
                raise ValueError(f"prompts: expected null or a list of lists of {self.n} ints in [0, {self.vocab})")


class SortPolicy(nn.Module):
    def __init__(self, vocab: int, n: int, dim: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.encode = nn.Parameter(torch.randn(n, dim, dim) / math.sqrt(dim))
        self.decode = nn.Parameter(torch.randn(n, dim, dim) / math.sqrt(dim))

    def forward(self, prompts: Tensor) -> Tensor:  # (B, n) -> logits (B, n, V)
        n, d = self.encode.shape[:2]
        x = self.embedding(prompts)                                  # (B, n, D)
        h = torch.einsum("bpd,pde->be", x, self.encode) / math.sqrt(n)  # (B, D): every position summed
        y = torch.einsum("be,qed->bqd", h, self.decode)              # (B, n, D)
        # Unscaled, as in the lecture, the logits start with std ~ sqrt(n * D): a nearly
        # deterministic policy (0.2 nats of entropy of a possible 1.6 at the defaults)
        # that has nothing left to explore. Scaled, it starts close to uniform.
        return y @ self.embedding.weight.T / math.sqrt(d)            # (B, n, V)


def score(fns: dict, prompts: Tensor, responses: Tensor) -> tuple[Tensor, dict[str, float], Tensor]:
    """prompts (B, n), responses (B, G, n) -> total rewards (B, G), each reward's mean, and the
    raw scores (B, G, C) of the C reward functions (their weighted sum is the total)."""
    b, g, _ = responses.shape
    total, parts = algos_rewards.combine(fns, [p for p in prompts.tolist() for _ in range(g)],
                                         responses.reshape(b * g, -1).tolist())
    rewards = torch.tensor(total, dtype=torch.float32, device=responses.device).view(b, g)
    return (rewards, {f"reward/{k}": sum(v) / len(v) for k, v in parts.items()},
            algos_rewards.components(parts, b, g, responses.device))


@register("task", "sort", config=SortConfig)
class SortTask:
    """Sort n integers with a non-autoregressive toy policy (CS336 lecture 17)."""

    def __init__(self, cfg: SortConfig, run_cfg):
        self.cfg, self.backend = cfg, run_cfg.backend
        self.rewards = algos_rewards.check(cfg.rewards, "sort")
        self.device = torch.device(run_cfg.device)
        self.policy = SortPolicy(cfg.vocab, cfg.n, cfg.dim).to(self.device)
        self.reference = copy.deepcopy(self.policy).requires_grad_(False)
        self.fixed = None if cfg.prompts is None else torch.tensor(cfg.prompts, device=self.device)
        self.retired: set[tuple[int, ...]] = set()  # prompts a curriculum filter took out of the stream
        # The held-out set is the same for every seed, so eval numbers compare across runs.
        g = torch.Generator().manual_seed(12345)
        self.eval_set = torch.randint(0, cfg.vocab, (cfg.eval_prompts, cfg.n), generator=g).to(self.device)

    def rollout(self, epoch: int, group_size: int, gen: torch.Generator) -> Rollout:
        cfg = self.cfg
        if self.fixed is not None:
            prompts = self.fixed
        else:
            prompts = torch.randint(0, cfg.vocab, (cfg.num_prompts, cfg.n), generator=gen).to(self.device)
            while self.retired:  # redrawn from the same generator: without retirements the stream is unchanged
                again = torch.tensor([tuple(p) in self.retired for p in prompts.tolist()], device=self.device)
                if not again.any():
                    break
                prompts[again] = torch.randint(0, cfg.vocab, (int(again.sum()), cfg.n), generator=gen).to(self.device)
        with torch.no_grad():
            probs = torch.softmax(self.policy(prompts).float(), dim=-1).cpu()   # (B, n, V)
        b, n, v = probs.shape
        # sampled on the CPU with the run's generator: identical streams on any device
        draws = torch.multinomial(probs.reshape(b * n, v), group_size, replacement=True, generator=gen)
        responses = draws.reshape(b, n, group_size).permute(0, 2, 1).to(self.device)  # (B, G, n)
        rewards, metrics, components = score(self.rewards, prompts, responses)
        solved = (responses == prompts.sort(-1).values.unsqueeze(1)).all(-1).float()
        return Rollout(prompts=prompts, responses=responses, mask=torch.ones(responses.shape, device=self.device),
                       rewards=rewards, metrics=metrics | {"reward/solved": solved.mean().item()},
                       components=components)

    def logprobs(self, rollout: Rollout, reference: bool = False) -> tuple[Tensor, Tensor | None]:
        model = self.reference if reference else self.policy
        logits = model(rollout.prompts)                                 # (B, n, V)
        g = rollout.responses.shape[1]
        logits = logits.unsqueeze(1).expand(-1, g, -1, -1)              # (B, G, n, V)
        return token_logprobs(logits, rollout.responses, backend=self.backend, with_entropy=not reference)

    def retire(self, prompts: Tensor) -> None:
        """Never draw these prompts (N, n) again: a curriculum filter's decision (no_positive_resample)."""
        self.retired.update(map(tuple, prompts.tolist()))
        if self.fixed is not None:
            left = [p for p in self.fixed.tolist() if tuple(p) not in self.retired]
            if not left:
                raise RuntimeError("every fixed prompt is retired: nothing left to train on")
            self.fixed = torch.tensor(left, device=self.device)
        elif len(self.retired) >= self.cfg.vocab ** self.cfg.n:
            raise RuntimeError("every prompt is retired: nothing left to draw")

    @torch.no_grad()
    def mix_reference(self, weight: float) -> None:
        for ref, pol in zip(self.reference.parameters(), self.policy.parameters()):
            ref.lerp_(pol, weight)  # ref + w (pol - ref); w = 1 copies exactly

    @torch.no_grad()
    def greedy_rewards(self, rollout: Rollout) -> Tensor:
        greedy = self.policy(rollout.prompts).argmax(-1).unsqueeze(1)   # (B, 1, n)
        return score(self.rewards, rollout.prompts, greedy)[0].squeeze(1)

    @torch.no_grad()
    def evaluate(self, gen: torch.Generator) -> dict[str, float]:
        out = {}
        sets = {"eval": self.eval_set}
        if self.fixed is not None:
            sets["eval_train"] = self.fixed
        for prefix, prompts in sets.items():
            greedy = self.policy(prompts).argmax(-1).unsqueeze(1)       # (B, 1, n)
            target = prompts.sort(-1).values.unsqueeze(1)
            out[f"{prefix}/accuracy"] = (greedy == target).all(-1).float().mean().item()
            out[f"{prefix}/reward"] = score(self.rewards, prompts, greedy)[0].mean().item()
        return out
