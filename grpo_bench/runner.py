"""Run an ablation: every variant x seed, on a local process pool or a Ray cluster, resumable.

Layout under the output directory (results/<ablation>/ by default):

    ablation.json          what was run: name, axes, variant order, seeds, source file
    runs/<run_id>/         one finished run: config.yaml, metrics.parquet, summary.json (with the
                           metrics file's row count and SHA-256: a damaged run is redone, never kept)
    metrics.parquet        long table: run, variant, <axes>, seed, step, metric, value
    summary.csv            one row per run: status, error, wall_s, final/* metrics
    sweep.json             the last sweep that ran something: its time and place; with --seeds auto, why
                           it stopped and each ordering's decision (run_sequential)
    *.png, REPORT.md       drawn from the two tables by grpo_bench.report

Metrics are Parquet (zstd; float64 values, dictionary-encoded names): a twentieth of the CSV
they replace. Directories written before that hold metrics.csv, which every reader still
takes.
    .lock                  held (flock) by the sweep writing here; the kernel drops it when that process dies

Compatible runs (the same task, shapes and parts; seeds and numbers free) train together
as a population in one process (trainer.train_population), up to `--population N`
members. Both executors run the same `train_group` in a worker and send each run's
result, a (resolved config, metric rows, summary) triple, back to this process, which
alone writes run directories. A run directory appears by an atomic rename of a finished
temporary directory, so a sweep killed at any moment leaves either a whole run or
nothing that counts; temporaries of dead processes are removed by the next sweep. The
run id holds a hash of the resolved config: a changed config is a new run. Local workers
die with this process (SIGTERM, or PR_SET_PDEATHSIG where this process is SIGKILLed).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import fcntl
import hashlib
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import yaml
from tqdm import tqdm

from . import metrics, trackers
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


def run_id(label: str, seed: int, config_hash: str) -> str:
    """Unique per (label, seed, config) whatever the label's characters: a slug that lost any of them
    ("α" and "β" both slug to `base`) gets a hash of the label after a `+`, which no slug holds. A label
    that is its own slug keeps the id it always had, so committed results still resume."""
    slug = _slug(label)
    if slug != label:
        slug += "+" + hashlib.sha256(label.encode()).hexdigest()[:8]
    return f"{slug}-s{seed}-{config_hash}"


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def plan(abl: Ablation, seeds: list[int] | None = None) -> list[RunSpec]:
    """Every variant x seed (abl.seeds unless given) as a run."""
    specs = []
    for label, values, raw in abl.variants:
        for seed in abl.seeds if seeds is None else seeds:
            cfg = dict(raw, seed=seed)
            resolved = resolve_run(cfg, abl.source)
            if resolved.device == "auto" and _cuda():
                # a CUDA run's numbers are not the CPU's (nor, in a population, the same run's alone):
                # `auto` on a GPU machine becomes `cuda` in the config, so its run id differs from the
                # CPU's and a results directory never mixes the two; a CPU machine's ids are unchanged
                cfg["device"] = "cuda"
                resolved = resolve_run(cfg, abl.source)
            h = config_hash(resolved)
            flat = {k: v if isinstance(v, (str, int, float, bool, type(None))) else json.dumps(v) for k, v in values.items()}
            specs.append(RunSpec(run_id(label, seed, h), label, flat, seed, cfg))
    return specs


# ------------------------------------------------------------------ run directories

METRICS_COLUMNS = ["step", "metric", "value"]
METRICS_FILE = "metrics.parquet"  # runs/<id>/ and the ablation's long table; metrics.csv before it


def metrics_table(df: pd.DataFrame) -> pd.DataFrame:
    """df with the dtypes metrics are stored in: names as categories, step and seed int64, value float64
    (float32 would hold only the values logged from fp32 tensors exactly, not times or means)."""
    df = df.copy()
    for c in df.columns:
        if c in ("step", "seed"):
            df[c] = df[c].astype("int64")
        elif c == "value":
            df[c] = df[c].astype("float64")
        elif not pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]):
            # names and text-valued axes; a column mixing numbers and text is text
            df[c] = df[c].map(lambda v: v if v is None or isinstance(v, str) else str(v), na_action="ignore")
            df[c] = df[c].astype("category")
    return df


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    metrics_table(df).to_parquet(path, engine="pyarrow", compression="zstd", index=False)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_metrics_file(path: Path) -> pd.DataFrame:
    """A metrics table, Parquet or (written before it) CSV; ValueError when it cannot be read whole."""
    if path.stat().st_size == 0:
        raise ValueError(f"{path.name} is empty (0 bytes)")
    if path.suffix == ".parquet":
        try:
            return pd.read_parquet(path, engine="pyarrow")
        except (OSError, ValueError, pa.ArrowException) as e:
            raise ValueError(f"{path.name} unreadable: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if path.read_bytes()[-1:] != b"\n":  # pandas ends every file it writes with one; a cut file does not
        raise ValueError(f"{path.name} is cut short (no final newline)")
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{path.name} unreadable: {str(e).splitlines()[0]}") from None


def _read_metrics(path: Path) -> pd.DataFrame:
    """A run's metrics file; ValueError when it is not a whole table of (int step, metric, number)."""
    m = read_metrics_file(path)
    if list(m.columns) != METRICS_COLUMNS:
        raise ValueError(f"{path.name} has columns {list(m.columns)}, expected {METRICS_COLUMNS}")
    if len(m) and not (pd.api.types.is_integer_dtype(m.step) and pd.api.types.is_numeric_dtype(m.value)):
        raise ValueError(f"{path.name} has a step or value that is not a number")
    return m


def check_run(run_dir: Path) -> tuple[str, str]:
    """(state, why) of a run directory: "missing" (never ran), "failed", "ok" (finished and verified), or
    "damaged" (its summary.json says ok but its files are not what it recorded, or cannot be read)."""
    if not run_dir.exists():
        return "missing", ""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        status = summary["status"]
    except FileNotFoundError:
        return "damaged", "no summary.json"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return "damaged", f"summary.json unreadable ({type(e).__name__})"
    if status != "ok":
        return "failed", summary.get("error", "")
    record = summary.get("metrics_file")
    try:
        if record is None:  # written before summaries held a checksum: whole and numeric is all we can check
            _read_metrics(run_dir / "metrics.csv")
            return "ok", ""
        path = run_dir / record["name"]
        if _sha256(path) != record["sha256"]:
            return "damaged", f"{record['name']} is not the file this run wrote (SHA-256 differs)"
    except FileNotFoundError as e:
        return "damaged", f"{Path(e.filename).name} is missing"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return "damaged", str(e) or type(e).__name__
    return "ok", ""


def finished(run_dir: Path) -> bool:
    """Whether a run directory holds a finished run whose files are the ones it wrote."""
    return check_run(run_dir)[0] == "ok"


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

    from .trainer import train_population

    # the same thread count in every kind of worker: it changes reduction order, so the bits
    torch.set_num_threads(threads)
    cfgs = [resolve_run(s.config, s.run_id) for s in specs]
    cfg_dicts = [run_dict(c) for c in cfgs]
    rows: list[list] = [[] for _ in specs]
    t0 = time.perf_counter()
    try:
        if isinstance(progress, tuple):
            queue, key = progress
            queue = queue or _EPOCHS   # None: this pool worker's own (_die_with_parent)
            tick = (lambda n: queue.put((key, n))) if queue is not None else None  # noqa: E731
        else:
            tick = progress
        outcomes = train_population(cfgs, rows, on_epoch=tick)
    except Exception as e:  # recorded, not raised: one bad population must not end the sweep
        outcomes = [e] * len(specs)
        tb = traceback.format_exc(limit=-3)
    wall = round((time.perf_counter() - t0) / len(specs), 3)  # the population's time, shared by its runs
    results = []
    for spec, cfg_dict, run_rows, out in zip(specs, cfg_dicts, rows, outcomes):
        summary = {"run": spec.run_id, "variant": spec.variant, **spec.values, "seed": spec.seed}
        if isinstance(out, BaseException):
            trace = tb if "tb" in locals() else "".join(traceback.format_exception(out, limit=-3))
            summary |= {"status": "failed", "error": f"{type(out).__name__}: {out}".splitlines()[0], "traceback": trace}
        else:
            summary |= {"status": "ok", "error": ""} | out
        summary |= {"wall_s": wall, "population": len(specs), "executor": executor, "device": cfgs[0].device,
                    "threads": threads}
        results.append((cfg_dict, run_rows, summary))
    return results


def train_one(spec: RunSpec, threads: int = 1) -> Result:
    """One run alone: a population of one."""
    return train_group([spec], threads)[0]


def population_key(spec: RunSpec) -> str:
    """Runs with the same key can train as one population: same task, shapes and parts; seeds and numbers free."""
    from .recipe import Recipe

    return Recipe.from_config(resolve_run(spec.config, spec.run_id)).structure()


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
    cfg = resolve_run(spec.config, spec.run_id)
    summary = {"run": spec.run_id, "variant": spec.variant, **spec.values, "seed": spec.seed,
               "status": "failed", "error": error.splitlines()[0] if error else "failed", "traceback": tb,
               "wall_s": float("nan"), "population": population, "executor": executor, "device": cfg.device,
               "threads": threads}
    return run_dict(cfg), [], summary


def write_run(out: Path, spec: RunSpec, result: Result) -> None:
    """runs/<run_id>/ whole, or nothing (OSError: a full or read-only disk leaves no temporary behind)."""
    cfg_dict, rows, summary = result
    runs = out / "runs"
    tmp = runs / f".{spec.run_id}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        (tmp / "config.yaml").write_text(yaml.safe_dump(cfg_dict, sort_keys=False))
        write_parquet(pd.DataFrame(rows, columns=METRICS_COLUMNS), tmp / METRICS_FILE)
        # what resume and collect check the metrics file against
        record = {"name": METRICS_FILE, "rows": len(rows), "sha256": _sha256(tmp / METRICS_FILE)}
        (tmp / "summary.json").write_text(json.dumps(summary | {"metrics_file": record}, indent=1))
        final = runs / spec.run_id
        if final.exists():  # an earlier failed or damaged attempt; a finished one is never re-run
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not e.filename:  # pandas' writers name no file
            raise OSError(e.errno, e.strerror, str(runs / spec.run_id)) from None
        raise


# ------------------------------------------------------------------ output directory


def lock_out(out: Path):
    """Create `out` and hold its lock for this process's lifetime; ConfigError if unusable or held."""
    if out.is_symlink() and not out.exists():  # mkdir says only "File exists"
        raise ConfigError("--out", str(out), f"is a symbolic link to {os.readlink(out)}, which does not exist; "
                          "create that directory or choose another --out")
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
    _remove_stale(out)
    return lock


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


def _remove_stale(out: Path) -> None:
    """Temporaries (`.<name>.tmp-<pid>`) whose process is gone: a sweep killed mid-write, or one that hit a
    full disk. A live pid's is left alone (`plot` writes REPORT.md this way without the lock)."""
    for p in [*out.glob(".*.tmp-*"), *(out / "runs").glob(".*.tmp-*")]:
        pid = p.name.rpartition(".tmp-")[2]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# ------------------------------------------------------------------------- executors


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


def _finished(done, futures, threads: int = 1) -> Iterator[tuple[RunSpec, Result]]:
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
    `log_to` names experiment trackers (grpo_bench.trackers) that each finished run is also logged to.
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
                        "cpus": os.cpu_count(), "cpu": cpu_name(), **gpu_record(todo),
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
            **metrics.ablation_record(abl)} | extra
    ids = meta["runs"]
    if len(set(ids)) < len(ids):  # two runs writing one directory would lose one of them
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(abl.source, "variants", f"two planned runs share the run id {dup!r}")
    _atomic_write(out / "ablation.json", json.dumps(meta, indent=1))


# ------------------------------------------------------------------ seeds on demand

BATCH = 5  # seeds per look of --seeds auto; fixed, so the looks (and the decisions) do not depend on --population
TIMING = ("wall_s", "runs", "skipped", "where", "threads", "populations", "cpus", "cpu", "gpu", "load_avg_end",
          "command")


def sequential_orderings(abl: Ablation) -> list[str]:
    """What --seeds auto decides: the claim's orderings, or every pair of variants ("a vs b") of a plain ablation."""
    if abl.claim:
        return list(abl.claim["expect"])
    labels = [label for label, _, _ in abl.variants]
    if len(labels) < 2:
        raise ConfigError("--seeds", "auto", f"{abl.source} has one variant: there is no ordering for more seeds "
                          "to decide; give a number of seeds")
    return [f"{a} vs {b}" for i, a in enumerate(labels) for b in labels[i + 1:]]


def decision_task(abl: Ablation) -> metrics.TaskInfo | None:
    """The declaration of the task the ablation's variants train (None when they train several)."""
    record = metrics.ablation_record(abl)["task"]
    return metrics.recorded_task({"task": record}) if record else None


def decision_column(summary: pd.DataFrame, abl: Ablation) -> str:
    """The summary column --seeds auto decides on: the claim's `metric`, else the task's verdict metric, the
    column FINDINGS.md judges. The one place this choice is made for the runner."""
    from .compare import resolve_column

    task = decision_task(abl)
    return resolve_column(summary, (abl.claim or {}).get("metric") or (task.verdict_metric if task else None),
                          abl.source)


def sequential_look(abl: Ablation, summary: pd.DataFrame, orderings: list[str], batches: list[list[int]]) -> dict:
    """The decision after the last of `batches` (stats.sequential_decision, replaying every earlier look)."""
    from . import stats

    seeds = [s for b in batches for s in b]
    looks = {"looks": [sum(map(len, batches[:k + 1])) for k in range(len(batches))], "seeds": seeds}
    failed = summary[summary.status != "ok"] if len(summary) else summary
    if len(failed):  # a seed missing from some variants would bias the pairs: fix the runs first
        return {"stopped": "failed", "reason": f"{len(failed)} of {len(summary)} runs failed (errors in summary.csv); "
                "run the same command again to redo them and go on", **looks}
    column = decision_column(summary, abl)
    margin, source = stats.claim_margin(abl.claim, abl.setting, column, decision_task(abl))
    ok = summary[summary[column].notna()]
    values = {v: dict(zip(map(int, g.seed), map(float, g[column]))) for v, g in ok.groupby("variant", sort=False)}
    # no margin: equivalence cannot be shown (TOST within +-0 never passes), only an ordering
    decision = stats.sequential_decision(values, orderings, margin or 0.0, len(abl.seeds), batches)
    decided = all(r["decided"] for r in decision["orderings"])
    return {"stopped": ("decided" if decided else "cap") if decision["done"] else None, "reason": decision["reason"],
            "metric": column, "margin": margin, "margin_source": source, "alpha": stats.ALPHA,
            "correction": f"O'Brien-Fleming-type alpha spending (Lan-DeMets) over the looks; each of the "
                          f"{len(orderings)} orderings at alpha / {len(orderings)} (Bonferroni)",
            **looks, "seeds_per_variant": {v: len(x) for v, x in values.items()},
            "orderings": [{k: r[k] for k in ("ordering", "decided", "outcome", "n", "look", "why")}
                          for r in decision["orderings"]]}


def run_sequential(abl: Ablation, out: Path, orderings: list[str], execute) -> None:
    """--seeds auto:N: abl.seeds in batches of BATCH; after each, the sequential decision; stop when it is done.

    Stateless like the decision: every batch is run (finished runs are skipped) and every look replayed
    from the first, so a resumed or re-run sweep makes the same looks and reaches the same decision.
    sweep.json and ablation.json's `sequential` are rewritten after every look."""
    batches = [abl.seeds[i:i + BATCH] for i in range(0, len(abl.seeds), BATCH)]
    setup = {"cap": len(abl.seeds), "batch": BATCH, "orderings": len(orderings)}
    before = _read_json(out / "ablation.json").get("sequential")
    if isinstance(before, dict) and before.get("cap") not in (None, setup["cap"]):
        # the looks already made spent alpha at fractions of the old cap: new fractions would spend it again
        raise ConfigError("--seeds", f"auto:{setup['cap']}", f"{out} was run with --seeds auto:{before['cap']}; "
                          f"resume it with auto:{before['cap']} (a new cap would test the same seeds at a family-wise "
                          "error above 0.05), or start a new --out")
    previous = _read_json(out / "sweep.json")
    timing = {k: previous[k] for k in TIMING if k in previous}  # the last sweep that ran something
    ran: list[dict] = []
    look: dict = {"stopped": None, "looks": [], "seeds": []}

    def record(look: dict) -> None:
        sweep = timing | {"sequential": setup} | look
        _atomic_write(out / "sweep.json", json.dumps(sweep, indent=1))
        meta = json.loads((out / "ablation.json").read_text())
        meta["sequential"] = setup | {k: look.get(k) for k in ("stopped", "reason", "metric")}
        _atomic_write(out / "ablation.json", json.dumps(meta, indent=1))

    try:
        for k in range(1, len(batches) + 1):
            seeds = [s for b in batches[:k] for s in b]
            did = execute(seeds, {"sequential": setup}, sum(r["runs"] for r in ran))
            if did:
                ran.append(did)
                n_ran = sum(r["runs"] for r in ran)
                # skipped: the runs of this look's plan finished before this sweep, each counted once (a sum
                # over the looks counted the first batches' again at every look)
                timing = did | {"wall_s": round(sum(r["wall_s"] for r in ran), 1), "runs": n_ran,
                                "skipped": len(seeds) * len(abl.variants) - n_ran,
                                "populations": [n for r in ran for n in r["populations"]]}
            look = sequential_look(abl, collect(out), orderings, batches[:k])
            record(look)
            print(f"{abl.name}: look {k} at {len(seeds)} seeds: {look['reason']}", file=sys.stderr)
            if look["stopped"]:
                return
    except BaseException as e:  # Ctrl-C, SIGTERM, a lost worker: say so; the next run resumes from the runs kept
        if isinstance(e, ConfigError):  # bad input, said in one line; not a state of the sweep
            raise
        with contextlib.suppress(Exception):
            record(look | {"stopped": "interrupted" if isinstance(e, KeyboardInterrupt) else "error",
                           "reason": f"{type(e).__name__} during batch {len(look['looks']) + 1}"})
        raise


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# What one population may hold in memory by default; --population N overrides the size it gives.
MEMORY_BUDGET = 2 << 30
MAX_POPULATION = 64


def default_population(todo: list[RunSpec]) -> int:
    """Members per population that fit MEMORY_BUDGET at the task's own estimate of a member's bytes, at most 64
    and at most what the task says is worth stacking (task.population_cap)."""
    if not todo:
        return 1
    from . import registry
    from .config import task_name

    cfg = resolve_run(todo[0].config, todo[0].run_id)
    task = registry.get("task", task_name(cfg))
    return max(1, min(MAX_POPULATION, MEMORY_BUDGET // max(task.member_bytes(cfg), 1), task.population_cap(cfg)))


def gpu_record(specs: list[RunSpec]) -> dict:
    """{"gpu": its name} when the runs trained on CUDA (FINDINGS names the device each claim ran on)."""
    if not any(s.config.get("device") in ("cuda", "auto") for s in specs):
        return {}
    import torch
    return {"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


class _Progress:
    """The bar counts runs, advanced by the epochs each population reports (a run of E epochs: 1/E an
    epoch), so the count and its ETA move with training instead of jumping when a population of 30
    finishes at once. A run's last share lands with its result, which also settles a run that failed early."""

    def __init__(self, bar, groups: list[list[RunSpec]]):
        self.bar = bar
        self.size = [len(g) for g in groups]
        self.epochs = [max(1, resolve_run(g[0].config, g[0].run_id).epochs) for g in groups]
        self.shown = [0.0] * len(groups)     # runs' worth shown for each population so far
        self.of = {s.run_id: i for i, g in enumerate(groups) for s in g}

    def tick(self, i: int, members: int) -> None:
        step = min(members / self.epochs[i], 0.99 * self.size[i] - self.shown[i])
        if step > 0:
            self.shown[i] += step
            self.bar.update(step)

    def finished(self, spec: RunSpec) -> float:
        """What is left of this run's share of the bar."""
        i = self.of.get(spec.run_id)
        return 1.0 if i is None else 1.0 - self.shown[i] / self.size[i]


def _report(bar, summary: dict, amount: float = 1.0) -> None:
    bar.update(amount)
    if summary["status"] != "ok":
        bar.write(f"run {summary['run']} failed: {summary['error']}", file=sys.stderr)
    else:
        bar.set_postfix_str(f"last: {summary['variant']} seed {summary['seed']} reward {summary.get('final/reward', float('nan')):.3f}")


def _atomic_write(path: Path, text: str) -> None:
    _atomic(path, lambda tmp: tmp.write_text(text))


def _atomic_csv(df: pd.DataFrame, path: Path) -> None:
    _atomic(path, lambda tmp: df.to_csv(tmp, index=False))


def _atomic_parquet(df: pd.DataFrame, path: Path) -> None:
    _atomic(path, lambda tmp: write_parquet(df, tmp))


def _atomic(path: Path, write) -> None:
    """path replaced whole by what write(tmp) writes, or left as it was (no temporary left on a full disk)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not e.filename:  # pandas' writers name no file
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


def _load_run(run_dir: Path) -> tuple[dict | None, pd.DataFrame | None, str]:
    """(summary without its bookkeeping, metrics, problem) of a run directory that exists; a damaged one
    gives what could be read and why the rest cannot be trusted."""
    state, why = check_run(run_dir)
    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None, None, why
    if not isinstance(s, dict):
        return None, None, why
    s.pop("traceback", None)
    record = s.pop("metrics_file", None)
    if state == "damaged":
        return s, None, why
    try:
        m = _read_metrics(run_dir / (record["name"] if record else "metrics.csv"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return s, None, str(e) or type(e).__name__
    if record and len(m) != record["rows"]:
        return s, None, f"{record['name']} has {len(m)} rows, summary.json says {record['rows']}"
    return s, m, ""


def _note_mixed_schedules(summary: pd.DataFrame) -> None:
    """One line on stderr when the finished runs here ran on different devices or thread counts: their
    numbers are not bitwise those of one schedule (stats.schedule_note; REPORT.md says it too)."""
    from . import stats

    if note := stats.schedule_note(summary):
        print(f"note: {note}", file=sys.stderr)


def collect(out: Path) -> pd.DataFrame:
    """Gather the runs of this ablation's current plan into metrics.parquet and summary.csv.

    A damaged run is said on stderr and counted as failed (its metrics left out), never as finished."""
    meta = json.loads((out / "ablation.json").read_text())
    summaries, frames = [], []
    for run_id in meta["runs"]:
        d = out / "runs" / run_id
        if not d.exists():
            continue  # never ran (sweep interrupted)
        s, m, problem = _load_run(d)
        if problem and s is not None and s.get("status") != "ok":
            print(f"run {run_id} failed and its metrics are damaged ({problem}); they are left out", file=sys.stderr)
        elif problem:
            print(f"run {run_id} is damaged ({problem}); counted as failed; run the sweep again to redo it",
                  file=sys.stderr)
            s = {"run": run_id, **(s or {}), "status": "failed", "error": f"damaged run directory: {problem}"}
        summaries.append(s)
        if m is not None and len(m):
            ids = {k: s.get(k) for k in ["run", "variant", *meta["axes"], "seed"]}
            frames.append(m.assign(**ids)[[*ids, "step", "metric", "value"]])
    summary = pd.DataFrame(summaries)
    _note_mixed_schedules(summary)
    metrics = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run", "variant", *meta["axes"], "seed", "step", "metric", "value"])
    _atomic_parquet(metrics, out / METRICS_FILE)
    (out / "metrics.csv").unlink(missing_ok=True)  # a CSV-era long table, now stale
    _atomic_csv(summary, out / "summary.csv")
    return summary
