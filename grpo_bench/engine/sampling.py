"""A population's rollouts: sampling through the rollout-stage filters, redrawing the groups they drop, and what
the samples looked like (reward/*, response/*); and the sampler, the policy's copy that draws them in another
precision or some updates behind (sampler.precision, sampler.staleness, sampler.head)."""
from __future__ import annotations

import collections
import copy

import torch
from torch import Tensor

from ..algos import Batch
from ..numerics import cpu as cpu_numerics
from ..tasks import Rollout


def per_member_parts(parts) -> bool:
    return any(b.per_member for b in parts)


def _cv(x: Tensor, dim: int) -> Tensor:
    """Population std over mean along dim (0 where the mean is 0)."""
    return x.std(dim, correction=0) / x.mean(dim).clamp(min=1e-12)


def _spreads(ro: Rollout, flat: Tensor) -> dict[str, Tensor]:
    """How unequal what the normalisations and aggregations weigh is, over the groups a loss sees (a group of equal
    rewards has advantage 0 under every delta): the mechanisms of length_bias, aggregation and adv_norm. Each is a
    coefficient of variation, so one threshold (a tenth) reads alike on every task; NaN for a member with no such
    group, which the metrics table leaves out as it does a missing value.
    - response/length_cv: of the counted lengths of all their responses (1/|o| against a constant, token against
      response mean);
    - response/length_group_cv: the mean over groups of it within the group (the prompt-level mean against the
      response mean);
    - response/length_prompt_cv: of the groups' token totals (the batch token mean against the prompt mean);
    - reward/group_std_cv: of the groups' reward std (group std against batch std)."""
    # float32 like every other logged metric: a float64's low mantissa bits would not compress in the table
    lengths = ro.mask.sum(-1).to(torch.float32)                          # (P, B, G): the tokens a loss weighs
    live = ~flat                                                          # (P, B)
    n = live.sum(1)
    nan = torch.full(n.shape, float("nan"), device=lengths.device)

    def over(values: Tensor, weights: Tensor) -> Tensor:                  # weighted mean and std along dim 1
        total = weights.sum(1).clamp(min=1)
        mean = (values * weights).sum(1) / total
        var = (((values - mean[:, None]) ** 2) * weights).sum(1) / total
        return cpu_numerics.sqrt(var) / mean.clamp(min=1e-12)   # MKL's sqrt differs by processor

    w = live[..., None].expand_as(lengths).float()
    per_group = _cv(lengths, -1)
    std = ro.rewards.float().std(-1, correction=0)
    out = {"response/length_cv": over(lengths.flatten(1), w.flatten(1)),
           "response/length_group_cv": (per_group * live).sum(1) / n.clamp(min=1),
           "response/length_prompt_cv": over(lengths.sum(-1), live.float()),
           "reward/group_std_cv": over(std, live.float())}
    return {k: torch.where(n > 0, v, nan) for k, v in out.items()}


def _rollout_metrics(ro: Rollout) -> dict[str, Tensor]:
    """What the policy's samples looked like, per member: on the first draw, before any filter."""
    r = ro.rewards.flatten(1)                                            # (P, B G)
    flat = (ro.rewards == ro.rewards[..., :1]).all(-1)                  # (P, B)
    return {"reward/mean": r.mean(1), "reward/std": r.std(1), "reward/zero_std_frac": flat.float().mean(1),
            "response/length": ro.lengths.float().flatten(1).mean(1), **_spreads(ro, flat), **ro.metrics}


def sample(task, pop, epoch: int, group_size: int, budget: int,
           sampler: torch.nn.Module | None = None) -> tuple[Rollout, dict[str, Tensor], dict[int, Exception]]:
    """Every member's batch for this epoch, through its rollout-stage filters, its sampling metrics, and the
    members whose own rollout raised (task.failed: a reward on one of its prompts), by index. `pop` is the
    trainer's Population (not imported: the trainer imports this module).

    A filter that marks groups as not kept (batch.keep) has them replaced, member by member,
    by groups of further draws, up to batch.max_draws draws; if the cap is reached the batch
    is filled with dropped groups in draw order and filter/capped is 1. A member's draw d
    is the same whether or not others needed it, so it draws exactly what it would alone; an error in
    a draw that a member did not need is not its failure, and a failed member needs no more draws.
    """
    filters = pop.head.stage("rollout")
    per_member = per_member_parts(filters)

    drops = {"any": False, "max_draws": 1}

    def run(ro: Rollout, draw: int):
        def fn(rewards, mask, lengths, finished, components, numbers):
            batch, m = pop.head.filter_rollout(Batch(rewards, mask, lengths, finished, budget, components=components),
                                               numbers, filters)
            if batch.keep is not None:
                drops.update(any=True, max_draws=batch.max_draws)
            no = torch.zeros(rewards.shape[0], dtype=torch.bool)
            keep = batch.keep if batch.keep is not None else ~no
            return batch.rewards, batch.mask, keep, no if batch.retire is None else batch.retire, m
        if not filters:
            return ro, None, {}
        rewards, mask, keep, retire, m = pop.map(fn, ro.rewards, ro.mask, ro.lengths, ro.finished, ro.components,
                                                 per_member=per_member, key=("rollout", epoch, draw))
        for i in retire.any(1).nonzero().flatten().tolist():  # a curriculum: the member's stream drops these prompts
            sel = retire[i].nonzero().flatten()
            task.retire(i, ro.prompts[i][sel] if isinstance(ro.prompts, Tensor) else [ro.prompts[i][j] for j in sel])
        # which groups to keep is bookkeeping beside the CPU's failed-member masks and draw counts, wherever the
        # rollout lives (on CUDA, `n_kept & ~_mask(...)` mixed devices and every dynamic_sampling run failed)
        return ro.replace(rewards=rewards, mask=mask), keep.cpu() if drops["any"] else None, m

    # a task that can sample with another copy of its policy takes it as `sampler`; others are never asked to
    draw = (lambda d: task.rollout(epoch, d, group_size)) if sampler is None else \
        (lambda d: task.rollout(epoch, d, group_size, sampler=sampler))
    first = draw(0)
    failed = take_failed(task)
    metrics = _rollout_metrics(first)
    ro, keep, fm = run(first, 0)
    metrics |= fm
    p, b = first.rewards.shape[:2]
    draws = torch.ones(p)
    max_draws = drops["max_draws"]
    if keep is not None:
        parts, keeps = [ro], [keep]
        n_kept = keep.sum(1)
        while ((n_kept < b) & ~_mask(failed, p)).any() and len(parts) < max_draws:
            need = (n_kept < b) & ~_mask(failed, p)
            more, more_keep, _ = run(draw(len(parts)), len(parts))
            for i, e in take_failed(task).items():
                if need[i]:
                    failed.setdefault(i, e)
            parts.append(more)
            keeps.append(more_keep & need.unsqueeze(1))  # a member that is full takes nothing more
            draws += need.float()
            n_kept = n_kept + keeps[-1].sum(1)
        allk = torch.cat(keeps, 1)                                       # (P, D B)
        order = torch.arange(allk.shape[1]).expand_as(allk)
        # the first B of each member: its kept groups in draw order, then the others in draw order. A member
        # short of B after its last draw was capped (it asked for every draw) or failed (whatever fills it is
        # never trained on), so the groups of draws it did not ask for, all later, are never its spares
        idx = torch.where(allk, order, order + allk.shape[1]).argsort(1)[:, :b]
        ro = Rollout.cat(parts).take(idx)
        metrics["filter/draws"] = draws
        metrics["filter/capped"] = (n_kept < b).float()
    metrics["samples/responses"] = draws * b * group_size
    return ro, metrics, failed


def take_failed(task) -> dict[int, Exception]:
    """The members whose own call on the task raised since the last look (task.failed), emptied."""
    failed = dict(getattr(task, "failed", None) or {})
    if failed:
        task.failed.clear()
    return failed


def _mask(failed: dict[int, Exception], p: int) -> Tensor:
    out = torch.zeros(p, dtype=torch.bool)
    out[list(failed)] = True
    return out


class Sampler:
    """The policy's copy that samples: in another precision and/or `staleness` optimizer updates old.

    It holds one copy of the policy module in the sampler's dtype (the base weights cast once)
    and the trainable parameters of the last `staleness` updates; before a rollout it loads the
    oldest of them (the initial ones until there have been that many updates).
    """

    DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

    def __init__(self, policy: torch.nn.Module, params: list[Tensor], cfg):
        self.model = copy.deepcopy(policy).to(self.DTYPES[cfg.precision]).eval()
        if cfg.head == "fp32":
            _fp32_head(self.model)
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]  # the policy's trainable ones
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.requires_grad_(False)
        self.history: collections.deque = collections.deque(maxlen=cfg.staleness + 1)
        self.updated(params)

    def updated(self, params: list[Tensor]) -> None:
        """After an optimizer step (and at the start): the policy's parameters now."""
        if self.history.maxlen > 1:
            self.history.append([p.detach().clone() for p in params])

    @torch.no_grad()
    def load(self, params: list[Tensor]) -> torch.nn.Module:
        """The sampler for this rollout, its weights those of `staleness` updates ago, in its dtype."""
        source = self.history[0] if self.history else params
        for dst, src in zip(self.params, source):
            dst.copy_(src)
        return self.model

    def keep(self, idx: list[int]) -> None:
        for m in self.model.modules():
            if hasattr(m, "keep"):  # a population's stacked module: the toy's policy, the LM's adapters
                m.keep(idx)
        named = dict(self.model.named_parameters())
        self.params = [named[n] for n in self.names]
        self.model.requires_grad_(False)
        self.history = collections.deque(([x[idx] for x in snap] for snap in self.history), maxlen=self.history.maxlen)


def _fp32_head(model: torch.nn.Module) -> None:
    """The sampler's LM head GEMM from upcast hidden states and weights (vLLM's head_dtype fp32): the
    logits lose the bf16 rounding that ScaleRL and MiniMax-M1 blame for the sampler-trainer gap."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):  # an adapter on the head would need its own fp32 path
        raise ValueError(f"sampler.head: fp32 needs a policy whose LM head is a plain linear layer, got "
                         f"{type(head).__name__}; valid: same")
    if hasattr(head, "upcast"):  # an LM task's head (MemberHead, grpo_bench/tasks/lm/stacked.py): per member on a CPU
        head.upcast = True
        return
    f = torch.nn.functional.linear
    head.forward = lambda x: f(x.float(), head.weight.float(), None if head.bias is None else head.bias.float())
