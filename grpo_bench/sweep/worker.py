"""The worker API: what every executor runs in a worker process, and how runs are grouped into populations.

Compatible runs (the same task, shapes and parts; seeds and numbers free) train together
as a population in one process (engine.trainer.train_population), up to `--population N`
members. Both executors (sweep/runner.py's local pool, sweep/cluster.py's Ray tasks) run the
same `train_group` in a worker and send each run's result, (resolved config, metric rows, summary,
per-problem held-out outcomes), back to the sweep's process, which alone writes run directories. Local
workers die with that process (SIGTERM, or PR_SET_PDEATHSIG where it is SIGKILLed).
"""
from __future__ import annotations

import ctypes
import math
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass


from ..config.run import RunConfig, load_includes, resolve_run, run_dict


# (resolved config, rows of (step, metric, value), summary, rows of (step, problem, greedy, k_correct)); the
# last is empty for a task that keeps no per-problem outcomes, and a result made by hand may leave it off
Result = tuple[dict, list, dict, list]


@dataclass
class RunSpec:
    run_id: str
    variant: str
    values: dict
    seed: int
    config: dict  # raw run dict, seed included: the user's words, for the record
    resolved: RunConfig | None = None
    """The run's config resolved once, by the plan; what the worker, the population key and the hash use.
    A spec made by hand (tests) resolves its `config` here."""

    def __post_init__(self):
        if self.resolved is None:
            self.resolved = resolve_run(self.config, self.run_id)

    def __reduce__(self):
        # to a spawned worker or a Ray task: a part or task of the user's own (include) lives in a module that
        # process has not loaded yet, so the includes load before the resolved config unpickles
        return _rebuild, (self.run_id, self.variant, self.values, self.seed, self.config, pickle.dumps(self.resolved))


def _pin_if_asked() -> None:
    if os.environ.get("GRPO_BENCH_CPU_PIN"):  # set by `run` (its workers inherit it): the same bits on any CPU
        from ..numerics import cpu
        cpu.pin()


def _rebuild(run_id: str, variant: str, values: dict, seed: int, config: dict, resolved: bytes) -> RunSpec:
    # before the includes: registering a user's part probes it (a computation), and MKL's path is fixed by the
    # process's first one, so a pin after it is too late (examples/my_variant's runs were unpinned)
    _pin_if_asked()
    load_includes(config.get("include"), run_id)
    return RunSpec(run_id, variant, values, seed, config, pickle.loads(resolved))


# summary columns that say how a run was scheduled, not what it gave. A run's numbers are the same, to the
# bit, in a population of any size and on either executor; on another device or thread count they may not be
# (collect says so when one directory mixes them).
SCHEDULE = ("wall_s", "population", "executor", "device", "threads")


def train_group(specs: list[RunSpec], threads: int = 1, executor: str = "local", progress=None) -> list[Result]:
    """Train runs as one population in this process; never raises for a run that fails. Every executor calls this.

    The runs must share a population key (see populations()); each gets its own result,
    failed or not: a non-finite loss or its own reward's error ends only its own run, an error
    outside training all of them. Each summary records how it was scheduled (SCHEDULE). progress: (queue, key)
    or a callable; after each epoch it gets (key, members that trained it) put on it, or is called with them.
    """
    import torch

    from ..engine.trainer import train_population

    _pin_if_asked()
    # the same thread count in every kind of worker: it changes reduction order, so the bits
    torch.set_num_threads(threads)
    cfgs = [s.resolved for s in specs]
    cfg_dicts = [run_dict(c) for c in cfgs]
    rows: list[list] = [[] for _ in specs]
    kept: list[list] = [[] for _ in specs]   # per-problem outcomes
    t0 = time.perf_counter()
    try:
        if isinstance(progress, tuple):
            queue, key = progress
            queue = queue or _EPOCHS   # None: this pool worker's own (_die_with_parent)
            tick = (lambda n: queue.put((key, n))) if queue is not None else None  # noqa: E731
        else:
            tick = progress
        ends = train_population(cfgs, rows, on_epoch=tick, outcomes=kept)
    except Exception as e:  # recorded, not raised: one bad population must not end the sweep
        ends = [e] * len(specs)
        tb = traceback.format_exc(limit=-3)
    wall = round((time.perf_counter() - t0) / len(specs), 3)  # the population's time, shared by its runs
    results = []
    for spec, cfg_dict, run_rows, run_kept, out in zip(specs, cfg_dicts, rows, kept, ends):
        summary = {"run": spec.run_id, "variant": spec.variant, **spec.values, "seed": spec.seed}
        if isinstance(out, BaseException):
            trace = tb if "tb" in locals() else "".join(traceback.format_exception(out, limit=-3))
            summary |= {"status": "failed", "error": f"{type(out).__name__}: {out}".splitlines()[0], "traceback": trace}
        else:
            summary |= {"status": "ok", "error": ""} | out
        summary |= {"wall_s": wall, "population": len(specs), "executor": executor, "device": cfgs[0].device,
                    "threads": threads}
        results.append((cfg_dict, run_rows, summary, run_kept))
    return results


def population_key(spec: RunSpec) -> str:
    """Runs with the same key can train as one population: same task, shapes and parts; seeds and numbers free."""
    from ..engine.recipe import Recipe

    return Recipe.from_config(spec.resolved).structure()


def populations(todo: list[RunSpec], size: int, workers: int = 1) -> list[list[RunSpec]]:
    """Compatible runs in populations of at most `size`, in plan order, split evenly (32 runs at size 24: 16 + 16),
    into at least `workers` populations and a multiple of them where the runs allow, so no worker idles;
    the largest first."""
    groups: dict[str, list[RunSpec]] = {}
    for spec in todo:
        groups.setdefault(population_key(spec), []).append(spec)
    counts = {k: math.ceil(len(g) / size) for k, g in groups.items()}
    # at least one population per worker, and a multiple of the workers where the runs allow:
    # three populations on two workers would leave one worker idle for a third of the sweep
    while sum(counts.values()) < len(todo) and (sum(counts.values()) < workers or sum(counts.values()) % workers):
        k = max(counts, key=lambda k: len(groups[k]) / counts[k])  # split the largest populations first
        counts[k] += 1
    out = []
    for k, g in groups.items():
        n = counts[k]
        bounds = [round(i * len(g) / n) for i in range(n + 1)]
        out += [g[a:b] for a, b in zip(bounds, bounds[1:])]
    return sorted(out, key=len, reverse=True)  # the largest first: no long population starts last


def failed_result(spec: RunSpec, error: str, tb: str = "", population: int = 1, executor: str = "local",
                  threads: int = 1) -> Result:
    """The record of a run that never returned (its worker raised outside training, or kept dying), with how it
    was scheduled (SCHEDULE) as every other run's: the population it was sent in, executor, device, threads."""
    cfg = spec.resolved
    if cfg.device == "auto":  # what it would have trained on, as a finished run records
        from ..engine.trainer import auto_device
        cfg.device = auto_device(cfg)
    summary = {"run": spec.run_id, "variant": spec.variant, **spec.values, "seed": spec.seed,
               "status": "failed", "error": error.splitlines()[0] if error else "failed", "traceback": tb,
               "wall_s": float("nan"), "population": population, "executor": executor, "device": cfg.device,
               "threads": threads}
    return run_dict(cfg), [], summary, []


class WorkerLost(RuntimeError):
    pass


PR_SET_PDEATHSIG = 1  # linux/prctl.h


_EPOCHS = None  # in a pool worker: the queue its populations report their epochs on (local_results)


def _die_with_parent(parent: int, epochs=None) -> None:
    """Worker initializer: the kernel SIGKILLs this worker when its parent dies, even by SIGKILL, which no
    handler in the parent can see (its workers, ~450 MB each, and the resource tracker would live on).
    epochs: the queue for progress, handed over here because a pool's tasks cannot carry one."""
    global _EPOCHS
    _EPOCHS = epochs
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took hold
            os._exit(1)


# What one population may hold in memory by default; --population N overrides the size it gives.
MEMORY_BUDGET = 2 << 30


MAX_POPULATION = 64


def default_population(todo: list[RunSpec]) -> int:
    """Members per population that fit MEMORY_BUDGET at the task's own estimate of a member's bytes, at most 64
    and at most what the task says is worth stacking (task.population_cap)."""
    if not todo:
        return 1
    from .. import registry
    from ..config.run import task_name

    cfg = todo[0].resolved
    task = registry.get("task", task_name(cfg))
    return max(1, min(MAX_POPULATION, MEMORY_BUDGET // max(task.member_bytes(cfg), 1), task.population_cap(cfg)))
