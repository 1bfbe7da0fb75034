"""The GRPO loop, shared by every task: machinery, not a place to add parts.

It trains a *population*: P runs of one task that share every part and shape (seeds and
numbers may differ: learning rate, clip bounds, beta, ...), stacked on a leading axis in
one process. A single run is a population of one, through the same code (`train`).

Per epoch, for every member at once:
    reference update (Recipe.ref_weight)     when the run has a reference
    rollout -> rollout-stage filters         groups a filter drops are drawn again (up to its cap; sampling.py)
    old and reference log-probs, no grad     K = 1 takes the old ones from the gradient pass itself
    what the delta part needs, from the task greedy rewards, sum of pi^2, the reference's samples
    KL-in-reward penalty -> deltas           (Recipe.advantages)
    K inner steps: log-probs -> step-stage filters -> Recipe.loss -> per-member clip -> optimiser
    KL controller (Recipe.next_kl_coef)

The parts run on each member's own data: torch.func.vmap over the population axis, or
member by member for parts registered per_member (they cannot be vmapped). Adam, AdamW
and SGD are elementwise and the gradient norm is clipped per member (optim.py), so a
member's numbers are those it would have alone: tests/test_population.py holds every
metric row of a run inside a population of 8 equal, to the bit, to the same run alone.
A member whose loss goes non-finite, or whose own reward raises or is not finite on one of
its prompts (the task records it in task.failed), is recorded as failed with the error it
has alone; the others go on. A run's status never depends on its population.

With K = 1 the update is exactly on-policy: old log-probs are the detached log-probs of the
same forward pass, so the ratio is 1 to the last bit (as TRL does) even with dropout, and
no separate no-grad pass is paid for. With K > 1 they come from one no-grad pass in eval
mode before the first step.

Metrics are one flat namespace: reward/*, loss/*, kl/*, clip/*, ratio/*, filter/*,
samples/*, entropy, grad/norm, time/step_s, eval/*; final/* summarise a finished run.
reward/* describe the policy: they are taken on the epoch's first rollout, before any
filter. kl/seq, logged whenever there is a reference (kl_coef > 0 or kl_track), is the
same estimate for every variant: the mean over responses of the summed log-ratio
log pi_old - log pi_ref, unbiased for the sequence KL. kl/old is KL(pi_old || pi) estimated
as (ratio - 1) - log ratio on the tokens pi_old sampled (CleanRL's approx_kl): how far the
inner steps moved the policy. time/step_s is the population's wall time per step divided
by its members: what a step cost each run. A metric a member did not measure (no correct
answer to take a length of) is NaN in the population's tensors and absent from its rows.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import time

import torch
from torch import Tensor
from torch.func import vmap

from .. import registry
from ..numerics import rng
from ..algos import Batch, masked_mean
from ..algos.corrections import mismatch
from ..algos.deltas import Extra
from ..config.run import RunConfig, task_name
from ..store.metrics import tail as tail_metrics
from .graphs import StepGraph
from .optim import StackedOptimizer, clip_grad_norm, clip_limits
from .recipe import Recipe
from .sampling import Sampler, per_member_parts, take_failed, sample
from ..tasks import Rollout, device_for

Row = tuple[int, str, float]  # (step, metric, value)
Outcome = tuple[int, int, int, int | None]  # (step, problem, greedy right 0/1, right samples of k or None)


class NonFiniteLoss(FloatingPointError):
    pass


def build_task(cfgs: list[RunConfig]):
    return registry.get("task", task_name(cfgs[0]))(cfgs[0].task, cfgs)


class Population:
    """The recipes of P runs that train together: one structure, numbers per member."""

    def __init__(self, cfgs: list[RunConfig]):
        self.recipes = [Recipe.from_config(c) for c in cfgs]
        head = self.recipes[0]
        for r in self.recipes[1:]:
            if r.structure() != head.structure():
                raise ValueError("runs of one population must share every part and shape; only seeds and "
                                 f"numbers may differ ({r.cfg.seed} vs {head.cfg.seed})")
        self.head = head
        self.seeds = [c.seed for c in cfgs]
        self.kl_coef = [c.kl_coef for c in cfgs]
        keys = [k for k in head.numbers() if "." in k] + ["nll_coef"]   # the parts' float parameters, NLL's weight
        self.numbers = {k: torch.tensor([r.numbers()[k] for r in self.recipes]) for k in keys}  # (P,) fp32
        self.entropy = [(r.entropy_state, r.entropy_coef) for r in self.recipes]  # each controller's (state, coef)
        self._on_device: tuple = (None, None)  # (device, numbers there): copied once, not at every map

    def __len__(self) -> int:
        return len(self.recipes)

    def keep(self, idx: list[int]) -> None:
        self.recipes = [self.recipes[i] for i in idx]
        self.seeds = [self.seeds[i] for i in idx]
        self.kl_coef = [self.kl_coef[i] for i in idx]
        self.entropy = [self.entropy[i] for i in idx]
        self.numbers = {k: v[idx] for k, v in self.numbers.items()}
        self._on_device = (None, None)

    def map(self, fn, *args, per_member: bool, key: tuple = ()):
        """fn(*member_args, numbers=...) for every member, outputs stacked on a leading axis.

        args are (P, ...) tensors or None. vmapped unless per_member; member by member, each call
        sees torch's global generator seeded from its own seed and `key`, so a part that draws
        from it (clip_cov) draws the same numbers alone as in a population.
        """
        numbers = self.numbers
        device = next((a.device for a in args if isinstance(a, Tensor) and a.device.type != "cpu"), None)
        if device is not None:
            # vmap batches a (P,) tensor into one element per member, which is no longer the 0-dim CPU
            # scalar that CUDA ops accept beside CUDA tensors: numbers and coefficients go to the device
            if self._on_device[0] != device:
                self._on_device = (device, {k: v.to(device) for k, v in numbers.items()})
            numbers = self._on_device[1]
            args = tuple(a.to(device) if isinstance(a, Tensor) else a for a in args)
        if not per_member:
            dims = tuple(None if a is None else 0 for a in args)
            return vmap(lambda nums, *a: fn(*a, numbers=nums), in_dims=(0, *dims))(numbers, *args)
        outs = []
        for p in range(len(self)):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(rng.stream_seed(self.seeds[p], "part", *key))
                outs.append(fn(*[None if a is None else a[p] for a in args],
                               numbers={k: v[p] for k, v in numbers.items()}))
        return torch.utils._pytree.tree_map(lambda *xs: torch.stack(xs), *outs)


def _evaluate(task, mid_run: bool) -> list[dict[str, float]]:
    """task.evaluate(mid_run=True) between the first and the last evaluation, where the task takes the
    parameter; a task written before it had one evaluates as it always did."""
    if mid_run and "mid_run" in inspect.signature(task.evaluate).parameters:
        return task.evaluate(mid_run=True)
    return task.evaluate()


def _take_outcomes(task, p: int) -> list[dict | None]:
    """The per-problem outcomes of the task's last evaluation, per member (None: it keeps none), taken."""
    taken = getattr(task, "outcomes", None)
    if taken is None:
        return [None] * p
    task.outcomes = None  # never read twice: the next evaluation sets its own
    return taken


def _step_metrics(logp: Tensor, old_logp: Tensor, mask: Tensor, entropy: Tensor | None) -> dict[str, Tensor]:
    """One member's ratio range, drift from the sampler and entropy (vmapped over members)."""
    log_ratio = (logp - old_logp).detach()
    ratio = log_ratio.exp()
    on = mask > 0
    inf = torch.full_like(ratio, float("inf"))
    one = torch.ones((), dtype=ratio.dtype)
    m = {"ratio/max": torch.where(on.any(), torch.where(on, ratio, -inf).amax(), one),
         "ratio/min": torch.where(on.any(), torch.where(on, ratio, inf).amin(), one),
         "kl/old": masked_mean(torch.expm1(log_ratio) - log_ratio, mask)}
    if entropy is not None:
        m["entropy"] = masked_mean(entropy.detach(), mask)
    return m


def _rows(metrics: dict[str, Tensor | list | float], p: int) -> list[dict[str, float]]:
    """(P,) metric tensors (or lists) -> one {metric: float} per member, with one host sync."""
    tensors = {k: v for k, v in metrics.items() if isinstance(v, Tensor)}
    out = [{} for _ in range(p)]
    if tensors:
        table = _to_host([v.detach().double().reshape(p) for v in tensors.values()]).t().tolist()
        for d, row in zip(out, table):
            # NaN: not measured for this member (e.g. no correct answer to take a length of), as alone
            d.update((k, v) for k, v in zip(tensors, row) if v == v)
    for k, v in metrics.items():
        if not isinstance(v, Tensor):
            for d, x in zip(out, v if isinstance(v, list) else [v] * p):
                d[k] = float(x)
    return out


def _to_host(values: list[Tensor]) -> Tensor:
    """Equal-shaped tensors stacked on the CPU, with one device-to-host copy per device (not one per tensor)."""
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        by_device.setdefault(v.device, []).append(i)
    out: list = [None] * len(values)
    for idx in by_device.values():
        for i, v in zip(idx, torch.stack([values[i] for i in idx]).cpu()):
            out[i] = v
    return torch.stack(out)


def train(cfg: RunConfig, rows: list[Row] | None = None, outcomes: list[Outcome] | None = None) -> dict:
    """Train one run (a population of one); append (step, metric, value) rows to `rows` and its per-problem
    held-out outcomes to `outcomes`; return the final/* summary.

    `rows` is filled as training goes, so a caller still has the metrics of a run
    that raised half way.
    """
    rows = [] if rows is None else rows
    (result,) = train_population([cfg], [rows], outcomes=None if outcomes is None else [outcomes])
    if isinstance(result, BaseException):
        raise result
    return result


def auto_device(cfg: RunConfig, cuda: bool | None = None, cores: int | None = None) -> str:
    """cfg's device as it runs here (tasks.device_for: `auto` by the task's measured gpu_replaces_cores)."""
    return device_for(cfg.device, registry.get("task", task_name(cfg)), cuda, cores)


def train_population(cfgs: list[RunConfig], rows: list[list[Row]] | None = None,
                     on_epoch=None, outcomes: list[list[Outcome]] | None = None) -> list[dict | Exception]:
    """Train P runs as one population; rows[p] receives run p's metrics, outcomes[p] its per-problem held-out
    outcomes (where the task keeps them); returns each run's final/* summary, or the exception that ended it
    (a non-finite loss ends only its run).
    on_epoch(members): called after each epoch with how many members trained it (a progress bar's tick)."""
    rows = [[] for _ in cfgs] if rows is None else rows
    outcomes = [[] for _ in cfgs] if outcomes is None else outcomes
    for c in cfgs:
        c.device = auto_device(c)
    cfg = cfgs[0]
    pop = Population(cfgs)
    recipe = pop.head
    torch.manual_seed(rng.stream_seed(cfg.seed, "torch"))  # nothing per member may draw from it (see Population.map)
    task = build_task(cfgs)
    params = [p for p in task.policy.parameters() if p.requires_grad]
    opt = StackedOptimizer(params, cfg.optimizer, [c.lr for c in cfgs], [c.weight_decay for c in cfgs])
    sampler = Sampler(task.policy, params, cfg.sampler) if cfg.sampler.active else None
    max_norm = [c.max_grad_norm for c in cfgs]
    limit = clip_limits(max_norm, params[0].device)
    alive = list(range(len(cfgs)))            # which run each member is
    results: list = [None] * len(cfgs)
    budget = cfg.task.generation_budget
    loss_per_member = (per_member_parts([recipe.parts[a] for a in ("loss", "aggregate", "kl")])
                       or _triton(cfg))
    adv_per_member = per_member_parts([recipe.parts[a] for a in ("delta", "kl")])
    step_filters = recipe.stage("step")
    step_per_member = per_member_parts(step_filters)
    total_steps = cfg.epochs * cfg.inner_steps
    epoch_rewards: list[list[float]] = [[] for _ in cfgs]
    # per-rollout metrics declared `tail` (grpo_bench/store/metrics.py), summarised as final/<metric> over the
    # last 10% of epochs (final/reward is reward/mean's): what a claim naming a training metric is judged on
    tails: list[dict[str, list[float]]] = [{m: [] for m in tail_metrics(type(task))} for _ in cfgs]
    samples = torch.zeros(len(cfgs), dtype=torch.float64)  # responses drawn so far, per member alive
    # per epoch, (1 + tails, P) of reward/mean and the tail metrics, kept where they were computed and read
    # in one copy when the population changes and at the end: no host sync per epoch
    history: list[Tensor] = []
    ent_coef = None
    k_t = torch.zeros((), dtype=torch.long, device=params[0].device)  # the inner step, for a captured step to read
    # a CUDA graph of the inner step where it is static (RunConfig.cuda_graphs); dropped when a member fails
    graphable = (cfg.cuda_graphs and params[0].device.type in StepGraph.devices and getattr(task, "graphable", False)
                 and cfg.inner_steps > 1 and not step_filters and not loss_per_member and sampler is None
                 and not recipe.use_entropy)
    graph = None

    def log(step: int, per_member: list[dict[str, float]]) -> None:
        for m, d in zip(alive, per_member):
            rows[m].extend((step, k, v) for k, v in d.items())

    def evaluate(step: int, mid_run: bool = False) -> list[dict[str, float]]:
        """Held-out metrics of every member alive after it; a member whose own evaluation raised fails."""
        task.policy.eval()
        evals = _evaluate(task, mid_run)
        failed = take_failed(task)
        log(step, [{} if i in failed else d for i, d in enumerate(evals)])  # as alone: it raised before logging
        for i, member in enumerate(_take_outcomes(task, len(evals))):
            if member is not None and i not in failed:
                greedy = member["greedy"]
                k_correct = member["k_correct"] or [None] * len(greedy)
                outcomes[alive[i]].extend((step, j, g, c) for j, (g, c) in enumerate(zip(greedy, k_correct)))
        if failed:
            fail(list(failed), list(failed.values()))
        return [d for i, d in enumerate(evals) if i not in failed]

    def flush() -> None:
        """The epoch history of every member alive, from its device tensors to each run's lists."""
        if not history:
            return
        names = ["reward/mean", *tail_metrics(type(task))]
        for m, epochs in zip(alive, torch.stack(history).permute(2, 0, 1).tolist()):
            for row in epochs:
                epoch_rewards[m].append(row[0])
                for name, v in zip(names[1:], row[1:]):
                    if v == v:  # NaN: not measured this epoch
                        tails[m][name].append(v)
        history.clear()

    def fail(bad: list[int], errors: list[Exception]) -> None:
        nonlocal params, max_norm, limit, samples, graph
        flush()
        graph = None  # the population's shapes change: a new graph, captured after its warm-up
        for i, e in zip(bad, errors):
            results[alive[i]] = e
        idx = [i for i in range(len(alive)) if i not in bad]
        alive[:] = [alive[i] for i in idx]
        if idx:
            task.keep(idx)
            pop.keep(idx)
            opt.keep(idx)
            params = [p for p in task.policy.parameters() if p.requires_grad]
            opt.rebind(params)
            max_norm = [max_norm[i] for i in idx]
            limit = clip_limits(max_norm, params[0].device)
            samples = samples[idx]
            if sampler is not None:
                sampler.keep(idx)

    if cfg.eval_every:
        evaluate(0)  # the starting point of every eval curve
    for epoch in range(cfg.epochs):
        if not alive:
            break
        p = len(alive)
        cut = None
        if recipe.use_ref:
            w = [r.ref_weight(epoch) for r in pop.recipes]
            if any(w):
                task.mix_reference(w)
                # a low-rank reference (the LM's adapters) keeps a soft mix at its rank: how much that cut
                cut = getattr(task, "residual", None)
        t0 = time.perf_counter()
        task.policy.eval()  # sampling and old log-probs without dropout
        ro, epoch_metrics, failed = sample(task, pop, epoch, cfg.group_size, budget,
                                           None if sampler is None else sampler.load(params))
        if cut is not None:
            epoch_metrics["ref/mix_residual"] = torch.tensor(cut, dtype=torch.float64, device=params[0].device)
        ep = Epoch(ro, epoch_metrics, task.greedy_rewards(ro) if recipe.needs_greedy else None)
        failed |= {i: e for i, e in take_failed(task).items() if i not in failed}
        if failed:  # a member's own rollout raised (its reward, on its prompt): it fails, the others go on
            ep.keep([i for i in range(p) if i not in failed])
            fail(list(failed), list(failed.values()))
            if not alive:
                break
            p = len(alive)
        samples += ep.metrics.pop("samples/responses").double()
        task.policy.train()
        first = None
        with torch.no_grad():
            ep.ref_logp = task.logprobs(ep.ro, reference=True)[0] if recipe.use_ref else None
        if cfg.inner_steps == 1:
            first = task.logprobs(ep.ro)
            ep.old_logp, old_ent = first[0].detach(), None if first[1] is None else first[1].detach()
        else:
            with torch.no_grad():
                task.policy.eval()
                ep.old_logp, old_ent = task.logprobs(ep.ro)
                task.policy.train()
        extra = _extra(task, ep.ro, recipe, ep.old_logp, old_ent)
        if ep.ro.sampler_logp is not None:  # how far the sampler is from the trainer on what it sampled
            ep.metrics |= vmap(mismatch)(ep.old_logp, ep.ro.sampler_logp, ep.ro.mask)
        ep.kl_coef = torch.tensor(pop.kl_coef, dtype=torch.float64, device=params[0].device)

        def advantages(rewards, mask_, lengths_, finished_, components, old, ref, greedy_, beta, *more, numbers):
            x = Extra(mask_, *more) if recipe.extra_needs else None
            return recipe.advantages(Batch(rewards, mask_, lengths_, finished_, budget, components=components),
                                     old, ref, greedy_, kl_coef=beta, numbers=numbers, extra=x)

        ro = ep.ro
        ep.deltas, adv_metrics = pop.map(advantages, ro.rewards, ro.mask, ro.lengths, ro.finished, ro.components,
                                         ep.old_logp, ep.ref_logp, ep.greedy, ep.kl_coef, *extra,
                                         per_member=adv_per_member, key=("advantages", epoch))
        ep.observed = adv_metrics.pop("kl/observed", None)
        ep.metrics |= adv_metrics
        ep.metrics["samples/total"] = samples.clone()  # last, where the rows have always had it
        rollout_s = time.perf_counter() - t0
        nan = torch.full((p,), math.nan, dtype=torch.float64, device=ep.metrics["reward/mean"].device)
        history.append(torch.stack([ep.metrics[name].detach().double().reshape(p).to(nan.device)
                                    if name in ep.metrics else nan
                                    for name in ["reward/mean", *tail_metrics(type(task))]]))
        # a member's first non-finite loss this epoch, (step, value), noticed at the next host sync
        bad_step = torch.full((p,), -1, dtype=torch.long, device=params[0].device)
        bad_value = torch.zeros(p, dtype=torch.float64, device=params[0].device)
        if graph is None and graphable and alive:
            graph = StepGraph(None, shared=("k",))  # k_t: filled in place before every step
        if recipe.use_entropy or epoch == 0 or len(ent_coef) != p:  # only a controller or a failure changes it
            ent_coef = torch.tensor([c for _, c in pop.entropy], dtype=torch.float32, device=params[0].device)

        def check(k: int) -> list[int]:
            """Fail the members whose loss went non-finite by inner step k (one host read); their indices."""
            nonlocal p, bad_step, bad_value, ent_coef
            bad = (bad_step >= 0).nonzero().flatten().tolist()
            if bad:
                steps, vals = bad_step[bad].tolist(), bad_value[bad].tolist()
                fail(bad, [_raised(NonFiniteLoss(f"non-finite loss {v} at epoch {epoch}, inner step {k_}"))
                           for v, k_ in zip(vals, steps)])
                if alive:
                    keep = [i for i in range(p) if i not in bad]
                    ep.keep(keep)
                    bad_step, bad_value, ent_coef = bad_step[keep], bad_value[keep], ent_coef[keep]
                    p = len(alive)
            return bad

        for k in range(cfg.inner_steps):
            step = epoch * cfg.inner_steps + k
            t1 = time.perf_counter()
            ro = ep.ro
            graphed = graph is not None and first is None
            logp, entropy = (None, None) if graphed else first if first is not None else task.logprobs(ro)
            first = None
            gate, filter_metrics = None, {}
            if step_filters:
                def step_filter(rewards, mask_, lengths_, finished_, ent, numbers):
                    g, m = recipe.filter_step(Batch(rewards, mask_, lengths_, finished_, budget), ent, numbers)
                    return (torch.ones_like(mask_) if g is None else g), m
                gate, filter_metrics = pop.map(step_filter, ro.rewards, ro.mask, ro.lengths, ro.finished, entropy,
                                               per_member=step_per_member, key=("step", step))

            def loss_fn(logp_, old, ref, d, mask_, gate_, beta, ent, ent_coef, positive, sampled, numbers):
                return recipe.loss(logp_, old, ref, d, mask_, gate_, kl_coef=beta, numbers=numbers, entropy=ent,
                                   entropy_coef=ent_coef, positive=positive, sampler_logp=sampled)

            def update(ro_: Rollout, logp_: Tensor, entropy_: Tensor | None, gate_: Tensor | None, s: dict) -> tuple:
                """Loss, backward, clipping and the optimizer on the epoch's tensors `s`; a member's first non-finite
                loss (step, value) into s's bad_step and bad_value in place. No host sync: a CUDA graph replays it."""
                value_, stats_ = pop.map(loss_fn, logp_, s["old_logp"], s.get("ref_logp"), s["deltas"], ro_.mask,
                                         gate_, s["kl_coef"], entropy_ if recipe.use_entropy else None, s["ent_coef"],
                                         ro_.rewards > 0, ro_.sampler_logp, per_member=loss_per_member,
                                         key=("loss", step))
                finite = torch.isfinite(value_)
                # a member whose loss is not finite gives no gradient to the others, with no host sync to find it
                new = ~finite & (s["bad_step"] < 0)
                s["bad_step"].copy_(torch.where(new, s["k"], s["bad_step"]))
                s["bad_value"].copy_(torch.where(new, value_.detach().double(), s["bad_value"]))
                opt.zero_grad()
                torch.where(finite, value_, torch.zeros_like(value_)).sum().backward()
                gnorm_ = clip_grad_norm(params, limit)
                opt.step()
                return value_, stats_, gnorm_, logp_, entropy_, s["bad_step"], s["bad_value"]

            k_t.fill_(k)
            state = {"old_logp": ep.old_logp, "deltas": ep.deltas, "kl_coef": ep.kl_coef, "ent_coef": ent_coef,
                     "k": k_t, "bad_step": bad_step, "bad_value": bad_value}
            if recipe.loss_ref:
                state["ref_logp"] = ep.ref_logp
            if graph is not None and first is None:
                def captured(s: dict) -> tuple:  # the toy's log-probs read its prompts and responses only
                    ro_ = ep.ro.replace(prompts=s["prompts"], responses=s["responses"], mask=s["mask"],
                                        rewards=s["rewards"])
                    return update(ro_, *task.logprobs(ro_), None, s)
                graph.fn = captured
                state |= {"prompts": ro.prompts, "responses": ro.responses, "mask": ro.mask, "rewards": ro.rewards}
                value, stats, gnorm, logp, entropy, bad_step, bad_value = graph(state)
            else:
                value, stats, gnorm, logp, entropy, bad_step, bad_value = update(ro, logp, entropy, gate, state)
            if sampler is not None:
                sampler.updated(params)
            if recipe.use_entropy:  # each member's controller, from the mean entropy of its step
                stats["entropy/coef"] = ent_coef
                entropies = stats["loss/entropy"].tolist()
                pop.entropy = [r.next_entropy_coef(h, state) for r, (state, _), h in
                               zip(pop.recipes, pop.entropy, entropies)]
                ent_coef = torch.tensor([c for _, c in pop.entropy], dtype=torch.float32, device=params[0].device)
            dt = (time.perf_counter() - t1 + (rollout_s if k == 0 else 0.0)) / p

            # the end of each window: with log_every = K that is the most off-policy step
            logging = (step + 1) % cfg.log_every == 0 or step == total_steps - 1
            # a part run member by member may raise on a failed member's NaN: those look at every step
            synced = logging or recipe.use_entropy or loss_per_member or step_per_member
            bad = check(k) if synced or k == cfg.inner_steps - 1 else []
            if not alive:
                break
            if logging:
                if bad:  # a member whose loss went non-finite logs nothing of this step, as a run alone raises first
                    keep = [i for i in range(len(value)) if i not in bad]
                    value, logp, entropy, gnorm = value[keep], logp[keep], _pick(entropy, keep), gnorm[keep]
                    stats, filter_metrics = _pick(stats, keep), _pick(filter_metrics, keep)
                    ro = ep.ro
                if ep.rows is None:
                    ep.rows = _rows(ep.metrics, p)
                m = {"loss/total": value, **stats, "grad/norm": gnorm}
                m |= vmap(_step_metrics, in_dims=(0, 0, 0, None if entropy is None else 0))(
                    logp, ep.old_logp, ro.mask, entropy)
                if recipe.use_ref and "kl/value" not in stats:  # KL in the reward, or tracked only: still worth watching
                    with torch.no_grad():
                        m["kl/value"] = pop.map(lambda lp, ref, old, mk, numbers: recipe.kl_value(lp, ref, old, mk,
                                                                                                  numbers),
                                                logp, ep.ref_logp, ep.old_logp, ro.mask, per_member=adv_per_member,
                                                key=("kl", step))
                m |= filter_metrics
                step_rows = _rows(m | {"time/step_s": dt}, p)
                log(step, [{**s, **e, "epoch": float(epoch)} for s, e in zip(step_rows, ep.rows)])
        if not alive:
            break
        if cfg.kl_coef > 0:
            obs = ep.observed.tolist()
            n = int(ep.ro.mask.shape[1] * ep.ro.mask.shape[2])
            pop.kl_coef = [r.next_kl_coef(o, n, kl_coef=c) for r, o, c in zip(pop.recipes, obs, pop.kl_coef)]
        if cfg.eval_every and (epoch + 1) % cfg.eval_every == 0 and epoch + 1 < cfg.epochs:
            evaluate(step, mid_run=True)
        if on_epoch is not None:
            on_epoch(len(alive))

    flush()
    if alive:
        final_evals = evaluate(total_steps - 1)
        total_samples = dict(zip(alive, samples.tolist()))
        for m, evals in zip(alive, final_evals):
            rewards = epoch_rewards[m]
            tail = max(1, len(rewards) // 10)
            summary = {"final/reward": sum(rewards[-tail:]) / tail, "final/reward_first": rewards[0],
                       "final/samples": total_samples[m]}
            for name, values in tails[m].items():
                if values:  # a metric a task logs only some epochs (no correct answer yet) averages what it has
                    last = values[-max(1, len(values) // 10):]
                    summary[f"final/{name}"] = sum(last) / len(last)
            summary.update({f"final/{k}": v for k, v in evals.items()})
            results[m] = summary
    return results


def _extra(task, ro: Rollout, recipe: Recipe, old_logp: Tensor, old_ent: Tensor | None) -> tuple:
    """The fields after `mask` of the delta part's algos.deltas.Extra, (P, ...) each: what its needs
    asked for, None for the rest; () when it needs none of them."""
    needs = recipe.extra_needs
    if not needs:
        return ()
    if "entropy" in needs and old_ent is None:
        raise ValueError(f"delta {recipe.parts['delta'].name!r} needs the policy's entropy; the task gave none")
    with torch.no_grad():
        return (ro.responses if "ids" in needs else None, old_logp if "logp" in needs else None,
                old_ent if "entropy" in needs else None,
                task.sum_pi_squared(ro) if "sum_pi_sq" in needs else None,
                task.reference_rewards(ro, recipe.ref_samples) if "ref_rewards" in needs else None)


def _pick(x, idx: list[int]):
    """x (a (P, ...) tensor, a dict of them or None) at the members idx."""
    if isinstance(x, dict):
        return {k: _pick(v, idx) for k, v in x.items()}
    return None if x is None else x[idx]


def _raised(e: Exception) -> Exception:
    """e with the traceback of a raise here, as a run alone would have raised it."""
    try:
        raise e
    except Exception as caught:
        return caught


@dataclasses.dataclass
class Epoch:
    """One epoch's per-member values, member first: what a failing member must leave, all at once, so that
    no tensor of the survivors' epoch is forgotten when the population shrinks mid-epoch."""

    ro: Rollout
    metrics: dict[str, Tensor]                 # the rollout's metrics, then also the advantages'
    greedy: Tensor | None = None
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    deltas: Tensor | None = None
    kl_coef: Tensor | None = None
    observed: Tensor | None = None             # the KL the adaptive controller sees
    rows: list[dict[str, float]] | None = None  # the epoch's metrics, one dict per member

    def keep(self, idx: list[int]) -> None:
        pick = lambda x: x[idx] if isinstance(x, Tensor) else [x[i] for i in idx]  # noqa: E731
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Rollout):
                v = _narrow(v, idx)
            elif isinstance(v, dict):
                v = {k: pick(x) for k, x in v.items()}
            elif v is not None:
                v = pick(v)
            setattr(self, f.name, v)


def _narrow(ro: Rollout, keep: list[int]) -> Rollout:
    """The rollout of the members at `keep` only."""
    pick = lambda x: x[keep] if isinstance(x, Tensor) else [x[i] for i in keep]  # noqa: E731
    return ro.replace(prompts=pick(ro.prompts), responses=pick(ro.responses), mask=pick(ro.mask),
                      rewards=pick(ro.rewards), finished=pick(ro.finished), lengths=pick(ro.lengths),
                      extra={k: pick(v) for k, v in ro.extra.items()}, metrics={},
                      components=None if ro.components is None else pick(ro.components),
                      sampler_logp=None if ro.sampler_logp is None else pick(ro.sampler_logp))


def _triton(cfg: RunConfig) -> bool:
    """The fused Triton loss cannot be vmapped: on CUDA with it, the loss runs member by member."""
    return cfg.backend == "triton" or (cfg.backend == "auto" and cfg.device == "cuda")
