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

from ..numerics import rng
from ..algos import rewards as algos_rewards
from ..config.run import NEW_OPTION
from ..numerics.kernels.chunked import _LOG_FLOOR
from ..store.metrics import Metric
from ..registry import register
from . import Rollout, device_for, guarded

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
    reward_timeout: float = field(default=10.0, metadata=NEW_OPTION)
    """Seconds one call of a `module:function` reward may take (it scores one member's B x G responses, which
    the built-in rewards do in microseconds); past it that member fails with RewardTimeout. 0: no limit;
    the environment variable GRPO_BENCH_REWARD_TIMEOUT overrides it."""

    @property
    def generation_budget(self) -> int:
        return self.n  # every response has exactly n tokens

    def check(self, run_cfg) -> None:
        if self.n < 1:
            raise ValueError(f"n: must be >= 1, got {self.n}")
        if self.vocab < 2:
            raise ValueError(f"vocab: must be >= 2, got {self.vocab}")
        algos_rewards.check(self.rewards, "sort")
        if not self.reward_timeout >= 0:
            raise ValueError(f"reward_timeout: seconds >= 0 (0: no limit), got {self.reward_timeout}")
        if self.num_prompts < 1 or self.dim < 1 or self.eval_prompts < 1:
            raise ValueError("num_prompts: num_prompts, dim and eval_prompts must be >= 1")
        if self.prompts is not None:
            ok = len(self.prompts) > 0 and all(
                isinstance(p, list) and len(p) == self.n and all(isinstance(x, int) and 0 <= x < self.vocab for x in p)
                for p in self.prompts)
            if not ok:
                raise ValueError(f"prompts: expected null or a list of lists of {self.n} ints in [0, {self.vocab})")


class SortPolicy(nn.Module):
    """P independent toy policies stacked on a leading axis; every product is one bmm over members.

    Member p is an embedding E_p (V, D), one encode matrix per prompt position (stored as one
    (n D, D) matrix) and one decode matrix per output position (one (D, n D) matrix). Each
    member's products have the shapes they would have alone, so its numbers do not depend on P.
    """

    def __init__(self, vocab: int, n: int, dim: int, seeds: list[int]):
        super().__init__()
        emb, enc, dec = [], [], []
        for seed in seeds:
            g = rng.stream(seed, "init")
            emb.append(torch.randn(vocab, dim, generator=g))
            enc.append(torch.randn(n, dim, dim, generator=g).reshape(n * dim, dim) / math.sqrt(dim))
            dec.append(torch.randn(n, dim, dim, generator=g).permute(1, 0, 2).reshape(dim, n * dim) / math.sqrt(dim))
        self.embedding = nn.Parameter(torch.stack(emb))   # (P, V, D)
        self.encode = nn.Parameter(torch.stack(enc))      # (P, n D, D): position p's matrix in rows p D .. (p+1) D
        self.decode = nn.Parameter(torch.stack(dec))      # (P, D, n D): output q's matrix in columns q D .. (q+1) D
        self.n, self.dim = n, dim

    def forward(self, prompts: Tensor) -> Tensor:  # (P, B, n) -> logits (P, B, n, V)
        p, b, n = prompts.shape
        v, d = self.embedding.shape[1:]
        onehot = torch.nn.functional.one_hot(prompts, v).to(self.embedding.dtype).view(p, b * n, v)
        x = torch.bmm(onehot, self.embedding).view(p, b, n * d)                # (P, B, n D)
        h = torch.bmm(x, self.encode) / math.sqrt(n)                           # (P, B, D): every position summed
        y = torch.bmm(h, self.decode).view(p, b * n, d)                        # (P, B n, D)
        # Unscaled, as in the lecture, the logits start with std ~ sqrt(n * D): a nearly
        # deterministic policy (0.2 nats of entropy of a possible 1.6 at the defaults)
        # that has nothing left to explore. Scaled, it starts close to uniform.
        logits = torch.bmm(y, self.embedding.transpose(1, 2)) / math.sqrt(d)  # (P, B n, V)
        return logits.view(p, b, n, v)

    def keep(self, idx: list[int]) -> None:
        for name, param in list(self.named_parameters()):
            setattr(self, name, nn.Parameter(param.detach()[idx], requires_grad=param.requires_grad))  # a copy


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """probs (..., V), u (..., K) uniforms in [0, 1) -> (..., K) draws: the first v whose cumulative probability
    reaches u. An fp32 cumulative sum can end below 1, and a u above it would index V: it draws the last token."""
    return torch.searchsorted(probs.cumsum(-1), u).clamp(max=probs.shape[-1] - 1)


def _match(prompts: Tensor, responses: Tensor) -> Tensor:
    """Tensor form of rewards.match, in float64: prompts (..., n), responses (..., G, n) -> (..., G)."""
    target = prompts.sort(-1).values.unsqueeze(-2)
    return (responses == target).sum(-1).double() / prompts.shape[-1]


def _inclusion_order(prompts: Tensor, responses: Tensor) -> Tensor:
    """Tensor form of rewards.inclusion_order, in float64."""
    n = prompts.shape[-1]
    present = (prompts.unsqueeze(-2).unsqueeze(-1) == responses.unsqueeze(-2)).any(-1).sum(-1)  # (..., G)
    ordered = (responses[..., :-1] <= responses[..., 1:]).sum(-1)
    return (present + ordered).double() / (2 * n - 1)


# the built-in sort rewards on tensors: a population's B x G x P responses without a Python loop
TENSOR_REWARDS = {algos_rewards.match: _match, algos_rewards.inclusion_order: _inclusion_order}


def score(fns: dict, prompts: Tensor, responses: Tensor, failed: dict[int, Exception] | None = None,
          limit: float | None = None) -> tuple[Tensor, dict[str, Tensor], Tensor]:
    """prompts (P, ..., B, n), responses (P, ..., B, G, n) -> total rewards (P, ..., B, G), each reward's
    mean (P, ...), and the raw scores (P, ..., B, G, C) of the C reward functions (their weighted sum is the total).

    The weighted sum is taken in float64, in the order of the reward mapping, as
    rewards.combine sums it, then rounded to fp32 once. A `module:function` reward is called member by
    member (the leading axis): one that raises for member p, or scores it inf or NaN, records the error
    in `failed[p]` and scores it 0 (without `failed`, it raises); `limit`: each call's seconds (rewards.call).
    """
    *lead, g, n = responses.shape
    total = torch.zeros(responses.shape[:-1], dtype=torch.float64, device=responses.device)
    means, columns = {}, []
    for spec, (fn, weight) in fns.items():
        fast = TENSOR_REWARDS.get(fn)
        if fast is not None:
            scores = fast(prompts, responses)
        else:
            def member(p_prompts, p_responses):
                flat_p = [row for row in p_prompts.reshape(-1, n).tolist() for _ in range(g)]
                return algos_rewards.call(spec, fn, flat_p, p_responses.reshape(-1, n).tolist(), limit=limit,
                                          group=g)
            per = responses[0].shape[:-1].numel()
            rows = [member(prompts[i], responses[i]) if failed is None else
                    guarded(failed, i, lambda i=i: member(prompts[i], responses[i]), [0.0] * per)
                    for i in range(responses.shape[0])]
            scores = torch.tensor(rows, dtype=torch.float64, device=responses.device).view(responses.shape[:-1])
        total = total + weight * scores
        columns.append(scores)
        means[f"reward/{algos_rewards.metric_name(spec)}"] = scores.flatten(len(lead) - 1).mean(-1)
    return total.float(), means, torch.stack(columns, -1).float()


@register("task", "sort", config=SortConfig)
class SortTask:
    """Sort n integers with a non-autoregressive toy policy (CS336 lecture 17)."""

    label, short = "sorting toy", "toy"
    # `device: auto` (tasks.device_for): one H200 at the default population (64, no CUDA graphs) did the work of
    # this many CPU cores (results/gpu/population.csv, held by tests/test_runner.py), so 16 CPU workers outrun it
    gpu_replaces_cores = 4.45
    # The headline leads with the rollout reward (positions right: smoother than an exact sort, a 0/1 per
    # prompt), drawn beside the held-out exact-sort accuracy, what a converging run is converging to.
    main_metric = "final/reward"
    curves = ("reward/mean", "eval/accuracy")
    # Claims are judged on the greedy held-out reward: what the policy can do, not the sampled reward, which
    # mixes that with how much it still explores (an entropy bonus lowers it without teaching less).
    # Its margin follows from where the default recipe ends (metrics.odds_margin: odds of 1.2 at 0.939, 0.010),
    # fixed from these runs before their rerun on the pinned CPU path (which ends at 0.9398: docs/statistics.md).
    verdict_metric = "final/eval/reward"
    headroom = (0.060, 0.939, "the default recipe (z-score, PPO clip 0.2, per-response mean, no KL) on "
                "sort_converge, 600 rollouts x 10 steps, 20 seeds: results/dapo_ladder_sort `grpo`")
    # its log-probs read a rollout's prompts and responses only, so a captured training step (cuda_graphs,
    # engine/graphs.py) can read them from the graph's buffers
    graphable = True
    # parts that do the same on this task: every response has exactly n tokens (the budget), never cut off
    inert = {"aggregate": (("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "prompt_mean"),
                           "every toy response has exactly n tokens, so these aggregations are one average"),
             "filters": (("mask_truncated",), "no toy response is cut off, so overlong filtering removes nothing")}
    metrics = (
        Metric("eval/accuracy", label="held-out accuracy", summary="eval accuracy", range=(0, 1),
               higher_is_better=True),
        Metric("eval/reward", label="held-out reward", summary="eval reward", higher_is_better=True),
        Metric("reward/solved", range=(0, 1), higher_is_better=True),
    )

    def __init__(self, cfg: SortConfig, run_cfgs):
        run_cfgs = run_cfgs if isinstance(run_cfgs, list) else [run_cfgs]
        self.cfg = cfg
        self.seeds = [c.seed for c in run_cfgs]
        self.rewards = algos_rewards.check(cfg.rewards, "sort")
        self.device = torch.device(device_for(run_cfgs[0].device, type(self)))
        self.policy = SortPolicy(cfg.vocab, cfg.n, cfg.dim, self.seeds).to(self.device)
        self.reference = copy.deepcopy(self.policy).requires_grad_(False)
        self.fixed = None if cfg.prompts is None else torch.tensor(cfg.prompts, device=self.device)
        self.retired: list[set[tuple[int, ...]]] = [set() for _ in self.seeds]  # each member's curriculum
        self._ref_draws = 0  # reference_rewards calls so far: each draws from its own streams
        self.failed: dict[int, Exception] = {}
        self._seed_tensor = None  # the seeds on the device, for its random streams
        # The held-out set is the same for every seed, so eval numbers compare across runs.
        g = torch.Generator().manual_seed(12345)
        self.eval_set = torch.randint(0, cfg.vocab, (cfg.eval_prompts, cfg.n), generator=g).to(self.device)

    @staticmethod
    def member_bytes(run_cfg) -> int:
        """A generous estimate of one member's memory: parameters with their gradient, Adam moments and
        reference (x8), and the activations of one step (x8 for the backward's copies)."""
        c = run_cfg.task
        params = c.vocab * c.dim + 2 * c.n * c.dim * c.dim
        b = len(c.prompts) if c.prompts is not None else c.num_prompts
        acts = b * (run_cfg.group_size * c.n * 4 + c.n * (3 * c.dim + 2 * c.vocab))
        return 4 * 8 * (params + acts)

    @staticmethod
    def population_cap(run_cfg) -> int:
        return 1 << 30  # tiny products: the more members per bmm, the less overhead each pays

    @property
    def size(self) -> int:
        return len(self.seeds)

    def _device_streams(self) -> bool:
        """Draw from rng's counter-based streams on the device, every member in one batch (rng.device_paths);
        a member with retired prompts redraws from its CPU stream, so a curriculum keeps the CPU path."""
        return rng.device_paths(self.device) and not any(self.retired)

    @property
    def seed_tensor(self) -> Tensor:
        if self._seed_tensor is None:
            self._seed_tensor = torch.tensor(self.seeds, dtype=torch.int64, device=self.device)
        return self._seed_tensor

    def _prompts(self, epoch: int, draw: int) -> Tensor:
        cfg = self.cfg
        if self.fixed is not None:
            return self.fixed.expand(self.size, -1, -1)
        if self._device_streams():
            return rng.randint(self.seed_tensor, ("prompts", epoch, draw), (cfg.num_prompts, cfg.n), cfg.vocab)
        out = []
        for seed, retired in zip(self.seeds, self.retired):
            gen = rng.stream(seed, "prompts", epoch, draw)
            prompts = torch.randint(0, cfg.vocab, (cfg.num_prompts, cfg.n), generator=gen)
            while retired:  # redrawn from the same stream: without retirements the prompts are unchanged
                again = torch.tensor([tuple(p) in retired for p in prompts.tolist()])
                if not again.any():
                    break
                prompts[again] = torch.randint(0, cfg.vocab, (int(again.sum()), cfg.n), generator=gen)
            out.append(prompts)
        return torch.stack(out).to(self.device)

    def rollout(self, epoch: int, draw: int, group_size: int, sampler: nn.Module | None = None) -> Rollout:
        prompts = self._prompts(epoch, draw)                                    # (P, B, n)
        model = self.policy if sampler is None else sampler
        device_streams = self._device_streams()
        with torch.no_grad():
            # a low-precision sampler computes in its dtype; its logits are sampled from in fp32
            logits = model(prompts.to(self.device)).float()
            probs = torch.softmax(logits, dim=-1)                               # (P, B, n, V)
        b, n = probs.shape[1:3]
        # Inverse-CDF sampling with each member's own uniforms: two variants with the same seed and
        # similar policies draw similar responses (common random numbers). Drawn on the CPU, the same on
        # any device; or, on a GPU, from the device's counter-based streams (rng.device_paths).
        if device_streams:
            u = rng.uniform(self.seed_tensor, ("sample", epoch, draw), (b, n, group_size))
        else:
            probs = probs.cpu()
            u = torch.stack([torch.rand(b, n, group_size, generator=rng.stream(s, "sample", epoch, draw))
                             for s in self.seeds])                              # (P, B, n, G)
        responses = inverse_cdf(probs, u).permute(0, 1, 3, 2).to(self.device)  # (P, B, G, n)
        rewards, metrics, components = score(self.rewards, prompts, responses, self.failed, self.cfg.reward_timeout)
        solved = (responses == prompts.sort(-1).values.unsqueeze(2)).all(-1).float()
        metrics["reward/solved"] = solved.flatten(1).mean(-1)
        sampler_logp = None
        if sampler is not None:  # what the sampler itself gives its tokens, as an inference engine returns them
            lp = torch.log_softmax(logits, -1)                                  # (P, B, n, V)
            sampler_logp = lp.gather(-1, responses.transpose(2, 3)).transpose(2, 3)
        return Rollout(prompts=prompts, responses=responses, mask=torch.ones(responses.shape, device=self.device),
                       rewards=rewards, metrics=metrics, components=components, sampler_logp=sampler_logp)

    def retire(self, member: int, prompts: Tensor) -> None:
        """Member `member` never draws these prompts (N, n) again: a curriculum filter's decision."""
        if self.fixed is not None:
            raise RuntimeError("a prompt curriculum (no_positive_resample) needs a stream of random prompts "
                               "(task.prompts: null), not a fixed set")
        self.retired[member].update(map(tuple, prompts.tolist()))
        if len(self.retired[member]) >= self.cfg.vocab ** self.cfg.n:
            raise RuntimeError("every prompt is retired: nothing left to draw")

    def logprobs(self, rollout: Rollout, reference: bool = False) -> tuple[Tensor, Tensor | None]:
        model = self.reference if reference else self.policy
        # The G responses to a prompt share its per-position distributions: one log-softmax per
        # position, gathered at each sample (G times less softmax work than one row per token).
        lp = torch.log_softmax(model(rollout.prompts).float(), -1)           # (P, B, n, V)
        logp = lp.gather(-1, rollout.responses.transpose(2, 3)).transpose(2, 3)  # (P, B, G, n)
        if reference:
            return logp, None
        # the floor keeps p log p at 0, not 0 * -inf, where p underflows
        ent = -(lp.exp() * lp.clamp(min=_LOG_FLOOR)).sum(-1)                # (P, B, n)
        return logp, ent.unsqueeze(2).expand_as(logp)

    @torch.no_grad()
    def sum_pi_squared(self, rollout: Rollout) -> Tensor:
        """(P, B, G, n) sum_v pi(v)^2 of the policy at each position (the G responses share its distributions)."""
        s = torch.softmax(self.policy(rollout.prompts).float(), -1).square().sum(-1)   # (P, B, n)
        return s.unsqueeze(2).expand(rollout.responses.shape)

    @torch.no_grad()
    def reference_rewards(self, rollout: Rollout, n: int) -> Tensor:
        """(P, B, n) rewards of n responses the reference policy samples for each prompt, by inverse CDF
        with each member's own uniforms (its stream of such draws)."""
        self._ref_draws += 1
        probs = torch.softmax(self.reference(rollout.prompts).float(), -1)             # (P, B, npos, V)
        b, npos = probs.shape[1:3]
        if rng.device_paths(self.device):
            u = rng.uniform(self.seed_tensor, ("reference_samples", self._ref_draws), (b, npos, n))
        else:
            probs = probs.cpu()
            u = torch.stack([torch.rand(b, npos, n, generator=rng.stream(s, "reference_samples", self._ref_draws))
                             for s in self.seeds])                                   # (P, B, npos, n)
        return score(self.rewards, rollout.prompts, inverse_cdf(probs, u).permute(0, 1, 3, 2).to(self.device),
                     limit=self.cfg.reward_timeout)[0]

    @torch.no_grad()
    def mix_reference(self, weights: list[float]) -> None:
        for ref, pol in zip(self.reference.parameters(), self.policy.parameters()):
            w = torch.tensor(weights, dtype=ref.dtype, device=ref.device).view(-1, *[1] * (ref.dim() - 1))
            ref.lerp_(pol, w)  # ref + w (pol - ref); w = 1 copies exactly, w = 0 leaves it as it was

    @torch.no_grad()
    def greedy_rewards(self, rollout: Rollout) -> Tensor:
        greedy = self.policy(rollout.prompts).argmax(-1).unsqueeze(2)  # (P, B, 1, n)
        return score(self.rewards, rollout.prompts, greedy, self.failed, self.cfg.reward_timeout)[0].squeeze(2)

    @torch.no_grad()
    def evaluate(self) -> list[dict[str, float]]:
        out: dict[str, Tensor] = {}
        sets = {"eval": self.eval_set}
        if self.fixed is not None:
            sets["eval_train"] = self.fixed
        for prefix, prompts in sets.items():
            prompts = prompts.expand(self.size, -1, -1)
            greedy = self.policy(prompts).argmax(-1).unsqueeze(2)      # (P, B, 1, n)
            target = prompts.sort(-1).values.unsqueeze(2)
            out[f"{prefix}/accuracy"] = (greedy == target).all(-1).float().flatten(1).mean(-1)
            scores = score(self.rewards, prompts, greedy, self.failed, self.cfg.reward_timeout)[0]
            out[f"{prefix}/reward"] = scores.flatten(1).mean(-1)
        names, values = list(out), torch.stack(list(out.values()), 1).tolist()
        return [dict(zip(names, row)) for row in values]

    def keep(self, idx: list[int]) -> None:
        self.seeds = [self.seeds[i] for i in idx]
        self._seed_tensor = None
        self.retired = [self.retired[i] for i in idx]
        self.policy.keep(idx)
        self.reference.keep(idx)   # its parameters stay frozen: keep() copies requires_grad
