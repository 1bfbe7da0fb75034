"""Run an ablation: every variant x seed, on a local process pool or a Ray cluster, resumable.

Layout under the output directory (results/<ablation>/ by default):

    ablation.json          what was run: name, axes, variant order, seeds, source file
    runs/<run_id>/         one finished run: config.yaml, metrics.csv, summary.json
    metrics.csv            long table: run, variant, <axes>, seed, step, metric, value
    summary.csv            one row per run: status, error, wall_s, final/* metrics
    *.png, REPORT.md       drawn from the two CSVs by grpo_bench.report
    .lock                  held (flock) by the sweep writing here; the kernel drops it when that process dies

Both executors run the same `train_one` in a worker and send its result, a
(resolved config, metric rows, summary) triple, back to this process, which alone
writes run directories. A run directory appears by an atomic rename of a finished
temporary directory, so a sweep killed at any moment leaves either a whole run or
nothing that counts. The run id holds a hash of the resolved config: a changed
config is a new run.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import fcntl
import json
import multiprocessing as mp
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from tqdm import tqdm

from . import trackers
from .config import Ablation, ConfigError, config_hash, resolve_run, run_dict

Result = tuple[dict, list, dict]  # (resolved config, rows of (step, metric, value), summary)


@dataclass
class RunSpec:
    run_id: str
    variant: str
    values: dict
    seed: int
    config: dict  # raw run dict, seed included; resolved again in the worker


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", label).strip("_")[:80] or "base"


def plan(abl: Ablation) -> list[RunSpec]:
    specs = []
    for label, values, raw in abl.variants:
        for seed in abl.seeds:
            cfg = dict(raw, seed=seed)
            h = config_hash(resolve_run(cfg, abl.source))
            flat = {k: v if isinstance(v, (str, int, float, bool, type(None))) else json.dumps(v) for k, v in values.items()}
            specs.append(RunSpec(f"{_slug(label)}-s{seed}-{h}", label, flat, seed, cfg))
    return specs


def finished(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / "summary.json").read_text())["status"] == "ok"
    except (OSError, ValueError, KeyError):
        return False


def train_one(spec: RunSpec, threads: int = 1) -> Result:
    """Train one run in this process; never raises for a run that fails. Every executor calls this."""
    import torch

    from .trainer import train

    # the same thread count in every kind of worker: it changes reduction order, so the bits
    torch.set_num_threads(threads)
    cfg = resolve_run(spec.config, spec.run_id)
    cfg_dict = run_dict(cfg)
    rows: list = []
    summary = {"run": spec.run_id, "variant": spec.variant, **spec.values, "seed": spec.seed}
    t0 = time.perf_counter()
    try:
        final = train(cfg, rows=rows)
        summary |= {"status": "ok", "error": ""} | final
    except Exception as e:  # recorded, not raised: one bad run must not end the sweep
        tb = traceback.format_exc(limit=-3)
        summary |= {"status": "failed", "error": f"{type(e).__name__}: {e}".splitlines()[0], "traceback": tb}
    summary["wall_s"] = round(time.perf_counter() - t0, 3)
    return cfg_dict, rows, summary


def failed_result(spec: RunSpec, error: str, tb: str = "") -> Result:
    """The record of a run that never returned (its worker raised outside training, or kept dying)."""
    summary = {"run": spec.run_id, "variant": spec.variant, **spec.values, "seed": spec.seed,
               "status": "failed", "error": error.splitlines()[0] if error else "failed", "traceback": tb,
               "wall_s": float("nan")}
    return run_dict(resolve_run(spec.config, spec.run_id)), [], summary


def write_run(out: Path, spec: RunSpec, result: Result) -> None:
    cfg_dict, rows, summary = result
    runs = out / "runs"
    tmp = runs / f".{spec.run_id}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.yaml").write_text(yaml.safe_dump(cfg_dict, sort_keys=False))
    pd.DataFrame(rows, columns=["step", "metric", "value"]).to_csv(tmp / "metrics.csv", index=False)
    (tmp / "summary.json").write_text(json.dumps(summary, indent=1))
    final = runs / spec.run_id
    if final.exists():  # an earlier failed attempt; a finished one is never re-run
        shutil.rmtree(final)
    os.replace(tmp, final)


# ------------------------------------------------------------------ output directory


def lock_out(out: Path):
    """Create `out` and hold its lock for this process's lifetime; ConfigError if unusable or held."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / ".lock", "a+")
    except OSError as e:
        raise ConfigError("--out", str(out), f"cannot create or write the output directory: {e.strerror or e}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise ConfigError("--out", str(out), f"another sweep (pid {holder}) is writing here; "
                          "wait for it to end or choose another --out") from None
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        lock.close()
        raise ConfigError("--out", str(out), f"output directory is not writable: {e.strerror or e}") from None
    return lock


# ------------------------------------------------------------------------- executors


class WorkerLost(RuntimeError):
    pass


def local_results(todo: list[RunSpec], workers: int, threads: int) -> Iterator[tuple[RunSpec, Result]]:
    """Runs on a pool of `workers` processes here, in completion order."""
    if workers == 1:
        for s in todo:
            yield s, train_one(s, threads)
        return
    # spawn, not fork: the parent may hold threads (tqdm, torch) that fork would copy half-alive
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(train_one, s, threads): s for s in todo}
        try:
            for fut in cf.as_completed(futures):
                spec = futures[fut]
                try:
                    result = fut.result()
                except cf.process.BrokenProcessPool:
                    raise WorkerLost("a worker process died (killed, or out of memory?)") from None
                except Exception as e:  # raised outside training (train_one records what training raises)
                    result = failed_result(spec, f"{type(e).__name__}: {e}", traceback.format_exc(limit=-3))
                yield spec, result
        finally:  # Ctrl-C or a lost worker: drop what has not started
            for f in futures:
                f.cancel()


def run_ablation(abl: Ablation, out: Path, executor: str = "local", workers: int | None = None,
                 threads: int | None = None, address: str | None = None, max_retries: int = 3,
                 progress: bool = True, log_to: tuple[str, ...] = ()) -> pd.DataFrame:
    """Run what is not finished yet and collect everything; bad --out or a busy one is a ConfigError.
    `log_to` names experiment trackers (grpo_bench.trackers) that each finished run is also logged to."""
    if executor == "ray":
        from . import cluster
        cluster.check_installed()
    trackers.check_installed(log_to)
    lock = lock_out(out)
    try:
        specs = plan(abl)
        meta = {"name": abl.name, "source": abl.source, "description": abl.description, "axes": abl.axes,
                "variants": [label for label, _, _ in abl.variants], "seeds": abl.seeds,
                "runs": [s.run_id for s in specs], "claim": abl.claim, "setting": abl.setting}
        _atomic_write(out / "ablation.json", json.dumps(meta, indent=1))
        todo = [s for s in specs if not finished(out / "runs" / s.run_id)]
        skipped = len(specs) - len(todo)
        threads = threads or max(1, int(abl.resources["cpus"]))
        on_ray = executor == "ray" and bool(todo)  # nothing left to run: no cluster to join
        with contextlib.ExitStack() as stack:
            track = stack.enter_context(contextlib.closing(trackers.Trackers(log_to, out, abl.name)))
            if on_ray:
                session = stack.enter_context(cluster.connect(address, exclude=out))
                where = session.describe
            else:
                workers = max(1, min(workers or (os.cpu_count() or 1) // threads or 1, len(todo) or 1))
                where = lambda: f"local: {workers} worker{'s' * (workers > 1)}"  # noqa: E731
            bar = stack.enter_context(tqdm(total=len(specs), initial=skipped, desc=f"{abl.name} [{where()}]",
                                           unit="run", disable=not progress, dynamic_ncols=True))
            if skipped:
                bar.write(f"{skipped} of {len(specs)} runs already finished in {out}; running the other {len(todo)}", file=sys.stderr)
            if on_ray:
                results = session.results(todo, threads, abl.resources, max_retries,
                                          log=lambda msg: bar.write(msg, file=sys.stderr))
            else:
                results = local_results(todo, workers, threads)
            started = time.perf_counter()
            with contextlib.closing(results):
                for spec, result in results:
                    write_run(out, spec, result)
                    track.log(result)
                    bar.set_description(f"{abl.name} [{where()}]", refresh=False)  # a cluster grows and shrinks
                    _report(bar, result[2])
            if todo:  # how long this sweep took, where: FINDINGS.md quotes it
                _atomic_write(out / "sweep.json", json.dumps({
                    "wall_s": round(time.perf_counter() - started, 1), "runs": len(todo), "skipped": skipped,
                    "where": where(), "threads": threads, "cpus": os.cpu_count(), "cpu": cpu_name(),
                    "load_avg_end": round(os.getloadavg()[0], 2), "command": " ".join(sys.argv[1:])}, indent=1))
        return collect(out)
    finally:
        lock.close()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def _report(bar, summary: dict) -> None:
    bar.update(1)
    if summary["status"] != "ok":
        bar.write(f"run {summary['run']} failed: {summary['error']}", file=sys.stderr)
    else:
        bar.set_postfix_str(f"last: {summary['variant']} seed {summary['seed']} reward {summary.get('final/reward', float('nan')):.3f}")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _atomic_csv(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    df.to_csv(tmp, index=False)
    os.replace(tmp, path)


def collect(out: Path) -> pd.DataFrame:
    """Gather the runs of this ablation's current plan into metrics.csv and summary.csv."""
    meta = json.loads((out / "ablation.json").read_text())
    summaries, frames = [], []
    for run_id in meta["runs"]:
        d = out / "runs" / run_id
        try:
            s = json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            continue  # never ran (sweep interrupted)
        s.pop("traceback", None)
        summaries.append(s)
        m = pd.read_csv(d / "metrics.csv")
        if len(m):
            ids = {k: s.get(k) for k in ["run", "variant", *meta["axes"], "seed"]}
            frames.append(m.assign(**ids)[[*ids, "step", "metric", "value"]])
    summary = pd.DataFrame(summaries)
    metrics = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run", "variant", *meta["axes"], "seed", "step", "metric", "value"])
    _atomic_csv(metrics, out / "metrics.csv")
    _atomic_csv(summary, out / "summary.csv")
    return summary
