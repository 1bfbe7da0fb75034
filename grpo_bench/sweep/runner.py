"""Run an ablation: every variant x seed, on a local process pool or a Ray cluster, resumable.

The plan (plan()) resolves each run's config once; the run id holds a hash of it, so a changed
config is a new run. Populations of compatible runs train in workers (sweep/worker.py); their
results come back here and only here are run directories written (store/rundir.py).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from ..errors import ConfigError
from ..config.ablation import Ablation, ablation_record
from ..config.run import config_hash, with_seed
from ..numerics import cpu as cpu_numerics
from ..store.rundir import _atomic_write, _read_json, check_run, collect, cpu_model, cpu_name, lock_out, meta_text, write_run
from . import trackers
from .sequential import run_sequential, sequential_orderings
from .worker import (Result, RunSpec, WorkerLost, _die_with_parent, default_population, failed_result, populations,
                     train_group)


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", label).strip("_")[:80] or "base"


def run_id(label: str, seed: int, config_hash: str) -> str:
    """Unique per (label, seed, config) whatever the label's characters: a slug that lost any of them
    ("α" and "β" both slug to `base`) gets a hash of the label after a `+`, which no slug holds. A label
    that is its own slug keeps the id it always had, so committed results still resume."""
    slug = _slug(label)
    if slug != label:
        slug += "+" + hashlib.sha256(label.encode()).hexdigest()[:8]
    return f"{slug}-s{seed}-{config_hash}"


def plan(abl: Ablation, seeds: list[int] | None = None) -> list[RunSpec]:
    """Every variant x seed (abl.seeds unless given) as a run."""
    from ..engine.trainer import auto_device  # torch: not at import, which `list` and `plot` share

    specs = []
    for (label, values, raw), variant_cfg in zip(abl.variants, abl.configs, strict=True):
        for seed in abl.seeds if seeds is None else seeds:
            cfg = dict(raw, seed=seed)
            resolved = with_seed(variant_cfg, seed)  # resolved once per variant, when the file loaded
            if resolved.device == "auto":
                # a CUDA run's numbers are not the CPU's (nor, in a population, the same run's alone): `auto`
                # becomes the device it means here in the config, so a results directory never mixes the two
                # and a CPU run's id is the same whether its file says cpu or auto
                cfg["device"] = resolved.device = auto_device(resolved)
            h = config_hash(resolved)
            flat = {k: v if isinstance(v, (str, int, float, bool, type(None))) else json.dumps(v) for k, v in values.items()}
            specs.append(RunSpec(run_id(label, seed, h), label, flat, seed, cfg, resolved))
    return specs


def check_out(out: Path, abl: Ablation) -> None:
    """ConfigError when `out` holds results this plan would drop from its summary and report: another
    ablation's, or runs of this one (a changed config, fewer seeds) that are not in the plan. Resuming,
    or growing the plan (more seeds, a higher --seeds auto cap), passes."""
    meta = _read_json(out / "ablation.json")
    if not meta:
        return
    listed = meta.get("runs")
    listed = [r for r in listed if isinstance(r, str)] if isinstance(listed, list) else []
    # results are its run directories, or, where only the tables are kept (results/ in git), summary.csv's rows
    try:
        rows = set(pd.read_csv(out / "summary.csv", usecols=["run"]).run.astype(str))
    except (OSError, ValueError):
        rows = set()
    runs = [r for r in listed if r in rows or (out / "runs" / r).is_dir()]
    if not runs:
        return
    how = "run again with --force to replace its summary and report with this plan's, or choose another --out"
    if meta.get("name") != abl.name:
        raise ConfigError(str(out), "--out", f"holds {len(runs)} runs of ablation {meta.get('name')!r}, not "
                          f"{abl.name!r}; not overwritten: {how}")
    planned = {s.run_id for s in plan(abl)}
    other = [r for r in runs if r not in planned]
    if other:
        raise ConfigError(str(out), "--out", f"holds {len(other)} of {len(runs)} runs that this plan does not have "
                          f"(a changed config or fewer seeds; e.g. {other[0]}); not overwritten: {how}")


def local_results(todo: list[list[RunSpec]], workers: int, threads: int,
                  tick=None) -> Iterator[tuple[RunSpec, Result]]:
    """Populations on a pool of `workers` processes here; each run's result as its population finishes.
    tick(population index, members): called here, in this process, after each epoch a population trains."""
    if workers == 1:
        for i, group in enumerate(todo):
            yield from zip(group, train_group(group, threads, progress=lambda n, i=i: tick(i, n)) if tick
                           else train_group(group, threads))
        return
    # spawn, not fork: the parent may hold threads (tqdm, torch) that fork would copy half-alive
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue() if tick else None

    def drain() -> None:
        while queue is not None and not queue.empty():
            tick(*queue.get())

    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_die_with_parent,
                                initargs=(os.getpid(), queue)) as pool:
        futures = {pool.submit(train_group, g, threads, "local", None if queue is None else (None, i)): g
                   for i, g in enumerate(todo)}
        try:
            pending = set(futures)
            while pending:  # wake twice a second for the epochs the workers report
                done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
                drain()
                yield from _finished(done, futures, threads)
        finally:  # Ctrl-C, SIGTERM or a lost worker: drop what has not started, end what has
            for f in futures:
                f.cancel()
            if not all(f.done() for f in futures):
                # nobody will collect these runs, and leaving the pool waits for them to finish
                for p in list((pool._processes or {}).values()):
                    p.kill()


def _finished(done, futures, threads: int) -> Iterator[tuple[RunSpec, Result]]:
    for fut in done:
        group = futures[fut]
        try:
            results = fut.result()
        except cf.process.BrokenProcessPool:
            raise WorkerLost("a worker process died (killed, or out of memory?)") from None
        except Exception as e:  # raised outside training (train_group records what training raises)
            results = [failed_result(s, f"{type(e).__name__}: {e}", traceback.format_exc(limit=-3), len(group),
                                     "local", threads) for s in group]
        yield from zip(group, results)


def run_ablation(abl: Ablation, out: Path, executor: str = "local", workers: int | None = None,
                 threads: int | None = None, address: str | None = None, max_retries: int = 3,
                 progress: bool = True, population: int | None = None, log_to: tuple[str, ...] = (),
                 sequential: bool = False, force: bool = False) -> pd.DataFrame:
    """Run what is not finished yet and collect everything; bad --out or a busy one is a ConfigError,
    and so is an `out` that holds another ablation's results or runs this plan does not have (its summary
    and report would be replaced by fewer or other runs) unless `force` (check_out).
    `log_to` names experiment trackers (grpo_bench.sweep.trackers) that each finished run is also logged to.
    `sequential` (`--seeds auto:N`): abl.seeds are candidates, run in batches of BATCH until every ordering
    the ablation asks is decided or all ran (run_sequential); sweep.json records why it stopped."""
    if executor == "ray":
        from . import cluster
        cluster.check_installed()
    trackers.check_installed(log_to)
    orderings = sequential_orderings(abl) if sequential else []  # a bad plan fails before --out is made
    lock = lock_out(out)
    try:
        if not force:
            check_out(out, abl)
        with contextlib.ExitStack() as stack:
            track = stack.enter_context(contextlib.closing(trackers.Trackers(log_to, out, abl.name)))
            session = None  # a Ray cluster, joined when a batch first has runs to do

            def execute(seeds: list[int], extra: dict, ran_here: int = 0) -> dict | None:
                """Run the variants x `seeds` not finished in `out`; what sweep.json records of it, None if all were.
                ran_here: runs of this plan that this sweep ran already (earlier batches); they are not 'skipped'."""
                nonlocal session
                specs = plan(abl, seeds)
                write_meta(out, abl, seeds, specs, extra)
                states = {s.run_id: check_run(out / "runs" / s.run_id) for s in specs}
                for rid, (state, why) in states.items():
                    if state == "damaged":
                        print(f"run {rid} is damaged ({why}); running it again", file=sys.stderr)
                todo = [s for s in specs if states[s.run_id][0] != "ok"]
                skipped = len(specs) - len(todo) - ran_here
                n_threads = threads or max(1, int(abl.resources["cpus"]))
                on_ray = executor == "ray" and bool(todo)  # nothing left to run: no cluster to join
                if on_ray and session is None:
                    session = stack.enter_context(cluster.connect(address, exclude=out))
                if on_ray:
                    where = session.describe
                else:
                    n_workers = max(1, min(workers or (os.cpu_count() or 1) // n_threads or 1, len(todo) or 1))
                    where = lambda: f"local: {n_workers} worker{'s' * (n_workers > 1)}"  # noqa: E731
                with tqdm(total=len(specs), initial=len(specs) - len(todo), desc=f"{abl.name} [{where()}]", unit="run",
                          # the count moves by epochs (_Progress): runs' worth of training, to the nearest run
                          bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]",
                          disable=not progress, dynamic_ncols=True) as bar:
                    if skipped:
                        bar.write(f"{skipped} of {len(specs)} runs already finished in {out}; running the other {len(todo)}", file=sys.stderr)
                    size = population or default_population(todo)
                    groups = populations(todo, size, 1 if on_ray else n_workers)
                    idle = (os.cpu_count() or 1) - len(groups) * n_threads
                    if not on_ray and threads is None and workers is None and idle > 0 and groups:
                        # a run's threads are fixed, not fitted to the machine: its last bits depend on them
                        bar.write(f"note: {len(groups)} population{'s' * (len(groups) > 1)} at {n_threads} torch "
                                  f"thread{'s' * (n_threads > 1)} each leave {idle} of {os.cpu_count()} cores idle; "
                                  f"--threads {n_threads + idle // len(groups)} would use them (the numbers then "
                                  "match other runs at that thread count to rounding, not to the bit)", file=sys.stderr)
                    if on_ray:
                        results = session.results(groups, n_threads, abl.resources, max_retries,
                                                  log=lambda msg: bar.write(msg, file=sys.stderr))
                    advance = _Progress(bar, groups)
                    if not on_ray:
                        results = local_results(groups, n_workers, n_threads, tick=advance.tick if progress else None)
                    started = time.perf_counter()
                    with contextlib.closing(results):
                        for spec, result in results:
                            write_run(out, spec, result)
                            track.log(result)
                            bar.set_description(f"{abl.name} [{where()}]", refresh=False)  # a cluster grows and shrinks
                            _report(bar, result[2], advance.finished(spec))
                if not todo:
                    return None
                # how long this sweep took, where: FINDINGS.md quotes it
                return {"wall_s": round(time.perf_counter() - started, 1), "runs": len(todo), "skipped": skipped,
                        "where": where(), "threads": n_threads, "populations": [len(g) for g in groups],
                        "cpus": os.cpu_count(), "cpu": cpu_name(), "cpu_model": cpu_model(),
                        "cpu_paths": cpu_numerics.state(),
                        **gpu_record(todo),
                        "load_avg_end": round(os.getloadavg()[0], 2), "command": " ".join(sys.argv[1:])}

            if sequential:
                run_sequential(abl, out, orderings, execute)
            else:
                record = execute(abl.seeds, {})
                if record:  # nothing ran: sweep.json stays the sweep's that did
                    _atomic_write(out / "sweep.json", json.dumps(record, indent=1))
        return collect(out)
    finally:
        lock.close()


def write_meta(out: Path, abl: Ablation, seeds: list[int], specs: list[RunSpec], extra: dict) -> None:
    """ablation.json: what is planned here now (collect and the report read it)."""
    meta = {"name": abl.name, "source": abl.source, "description": abl.description, "axes": abl.axes,
            "variants": [label for label, _, _ in abl.variants], "seeds": seeds,
            "runs": [s.run_id for s in specs], "claim": abl.claim, "setting": abl.setting,
            # where the runs train (cpu, cuda): results of two devices are not the same numbers
            "device": "/".join(sorted({str(s.config.get("device", "cpu")) for s in specs})) or "cpu",
            **ablation_record(abl)} | extra
    ids = meta["runs"]
    if len(set(ids)) < len(ids):  # two runs writing one directory would lose one of them
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(abl.source, "variants", f"two planned runs share the run id {dup!r}")
    _atomic_write(out / "ablation.json", meta_text(meta))


def gpu_record(specs: list[RunSpec]) -> dict:
    """{"gpu": its name} when the runs trained on CUDA (FINDINGS names the device each claim ran on)."""
    if not any(s.config.get("device") in ("cuda", "auto") for s in specs):
        return {}
    import torch
    return {"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}


class _Progress:
    """The bar counts runs, advanced by the epochs each population reports (a run of E epochs: 1/E an
    epoch), so the count and its ETA move with training instead of jumping when a population of 30
    finishes at once. A run's last share lands with its result, which also settles a run that failed early."""

    def __init__(self, bar, groups: list[list[RunSpec]]):
        self.bar = bar
        self.size = [len(g) for g in groups]
        self.epochs = [max(1, g[0].resolved.epochs) for g in groups]
        self.shown = [0.0] * len(groups)     # runs' worth shown for each population so far
        self.of = {s.run_id: i for i, g in enumerate(groups) for s in g}
        self.closed: set[int] = set()        # populations with a result in: their late ticks are dropped
        self.left = sum(self.size)
        self.end = bar.n + self.left         # where the bar stands once every result is in

    def tick(self, i: int, members: int) -> None:
        if i in self.closed:  # an epoch report read after its population's results: the bar would pass 100%
            return
        step = min(members / self.epochs[i], 0.99 * self.size[i] - self.shown[i])
        if step > 0:
            self.shown[i] += step
            self.bar.update(step)

    def finished(self, spec: RunSpec) -> float:
        """What is left of this run's share of the bar."""
        i = self.of.get(spec.run_id)
        if i is None:
            return 1.0
        self.closed.add(i)
        self.left -= 1
        if not self.left:  # float shares sum to a hair under the total: tqdm then draws the last cell unfilled
            return self.end - self.bar.n
        return 1.0 - self.shown[i] / self.size[i]


def _report(bar, summary: dict, amount: float) -> None:
    bar.update(amount)
    if summary["status"] != "ok":
        bar.write(f"run {summary['run']} failed: {summary['error']}", file=sys.stderr)
    else:
        bar.set_postfix_str(f"last: {summary['variant']} seed {summary['seed']} reward {summary.get('final/reward', float('nan')):.3f}")
