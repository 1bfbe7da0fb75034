"""A results directory: the one reader and writer of its files. Nothing here imports torch.

Layout under the output directory (results/<ablation>/ by default):

    ablation.json          what was run: name, axes, variant order, seeds, source file, the task's
                           declaration and each variant's resolved parts
    runs/<run_id>/         one finished run: config.yaml, metrics.parquet, summary.json (with the
                           metrics file's row count and SHA-256: a damaged run is redone, never kept),
                           outcomes.parquet where its task keeps per-problem held-out outcomes (the LM
                           tasks; its row count and SHA-256 recorded likewise)
    metrics.parquet        long table: run, variant, <axes>, seed, step, metric, value
    outcomes.parquet       each evaluation's outcome on each held-out problem: run, variant, seed, step,
                           problem (index into the task's held-out list), greedy (0/1), k_correct (how many
                           of the k pass@k samples are right; null without pass@k); absent for tasks without
    summary.csv            one row per run: status, error, wall_s, final/* metrics
    sweep.json             the last sweep that ran something: its time and place; with --seeds auto, why
                           it stopped and each ordering's decision (sweep/sequential.py)
    *.png, REPORT.md       drawn from the two tables by grpo_bench.analysis.report
    .lock                  held (flock) by the sweep writing here; the kernel drops it when that process dies

Metrics are Parquet (zstd 19; float64 values byte-stream-split, every other column dictionary-encoded;
the long table metric-major, outcomes step-major: half the bytes of run-major). A run directory
appears by an atomic rename of a finished temporary directory, so a sweep killed at any
moment leaves either a whole run or nothing that counts; temporaries of dead processes are
removed by the next sweep.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import yaml

from ..errors import ConfigError
from . import metrics


METRICS_COLUMNS = ["step", "metric", "value"]


METRICS_FILE = "metrics.parquet"  # runs/<id>/ and the ablation's long table
NO_RECORD = "summary.json records no metrics_file (its name, rows and SHA-256)"
OUTCOMES_FILE = "outcomes.parquet"  # runs/<id>/ and the ablation's, for tasks that keep per-problem outcomes
OUTCOME_COLUMNS = ["step", "problem", "greedy", "k_correct"]


def meta_text(meta: dict) -> str:
    """ablation.json's text: a key a line, each value compact (the resolved configs of every variant, indented
    a key a line, were a fifth of a committed results tree's JSON)."""
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in meta.items()) + "\n}"


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
            df[c] = df[c].map(str, na_action="ignore")
            df[c] = df[c].astype("category")
    return df


def _parquet(df: pd.DataFrame, path: Path) -> None:
    """df as Parquet, losslessly and about half the bytes of pandas' defaults (the committed results are
    mostly these tables): every column but `value` dictionary-encoded, `value` byte-stream-split (its
    float64s share their exponent and leading mantissa bytes, which zstd then finds), zstd at its top level
    (written once, read many times: the level costs writing time only)."""
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    names = [n for n in table.column_names if n != "value"]
    pq.write_table(table, path, compression="zstd", compression_level=19, use_dictionary=names,
                   use_byte_stream_split=["value"] if "value" in table.column_names else False)


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    _parquet(metrics_table(df), path)


def outcomes_table(df: pd.DataFrame) -> pd.DataFrame:
    """df with the dtypes outcomes are stored in, the smallest that hold them (an LM ablation of 30 runs holds
    about 210,000 rows): step and problem int32, greedy int8, k_correct nullable Int8 (Int16 past 127
    samples), run and variant categories, seed int64 as in every table."""
    df = df.copy()
    for c in df.columns:
        if c in ("step", "problem"):
            df[c] = df[c].astype("int32")
        elif c == "greedy":
            df[c] = df[c].astype("int8")
        elif c == "k_correct":
            k = pd.to_numeric(df[c]).astype("Float64")
            top = k.max()   # NA where pass@k never ran
            df[c] = k.astype("Int16" if pd.notna(top) and top > 127 else "Int8")
        elif c == "seed":
            df[c] = df[c].astype("int64")
        elif c in ("run", "variant"):
            df[c] = df[c].astype(str).astype("category")
    return df


def _write_outcomes(df: pd.DataFrame, path: Path) -> None:
    # step-major: one evaluation's outcomes on a problem sit together across runs, where they mostly agree
    _parquet(outcomes_table(df).sort_values(["step", "problem"], kind="stable", ignore_index=True), path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_metrics_file(path: Path) -> pd.DataFrame:
    """A Parquet metrics table; ValueError when it cannot be read whole."""
    if path.stat().st_size == 0:
        raise ValueError(f"{path.name} is empty (0 bytes)")
    try:
        return pd.read_parquet(path, engine="pyarrow")
    except (OSError, ValueError, pa.ArrowException) as e:
        raise ValueError(f"{path.name} unreadable: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


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
    if record is None:  # without the checksum nothing says its metrics are the ones it wrote
        return "damaged", NO_RECORD
    try:
        for rec in (record, summary.get("outcomes_file")):
            if rec is not None and _sha256(run_dir / rec["name"]) != rec["sha256"]:
                return "damaged", f"{rec['name']} is not the file this run wrote (SHA-256 differs)"
    except FileNotFoundError as e:
        return "damaged", f"{Path(e.filename).name} is missing"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return "damaged", str(e) or type(e).__name__
    return "ok", ""


def finished(run_dir: Path) -> bool:
    """Whether a run directory holds a finished run whose files are the ones it wrote."""
    return check_run(run_dir)[0] == "ok"


def write_run(out: Path, spec, result: tuple) -> None:
    """runs/<run_id>/ whole, or nothing (OSError: a full or read-only disk leaves no temporary behind).
    result: (config, metric rows, summary, outcome rows); without outcomes (none kept, or a result made by hand
    with the first three only) the run has no outcomes.parquet."""
    cfg_dict, rows, summary = result[:3]
    kept = result[3] if len(result) > 3 else []
    runs = out / "runs"
    tmp = runs / f".{spec.run_id}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        (tmp / "config.yaml").write_text(yaml.safe_dump(cfg_dict, sort_keys=False))
        write_parquet(pd.DataFrame(rows, columns=METRICS_COLUMNS), tmp / METRICS_FILE)
        # what resume and collect check the metrics file against
        record = {"metrics_file": {"name": METRICS_FILE, "rows": len(rows), "sha256": _sha256(tmp / METRICS_FILE)}}
        if kept:  # a task without per-problem outcomes leaves its runs' files as they were
            _write_outcomes(pd.DataFrame(kept, columns=OUTCOME_COLUMNS), tmp / OUTCOMES_FILE)
            record["outcomes_file"] = {"name": OUTCOMES_FILE, "rows": len(kept),
                                       "sha256": _sha256(tmp / OUTCOMES_FILE)}
        (tmp / "summary.json").write_text(json.dumps(summary | record, indent=1))
        final = runs / spec.run_id
        if final.exists():  # an earlier failed or damaged attempt; a finished one is never re-run
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not e.filename:  # pandas' writers name no file
            raise OSError(e.errno, e.strerror, str(runs / spec.run_id)) from None
        raise


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


def _remove_stale(out: Path) -> None:
    """Temporaries (`.<name>.tmp-<pid>`) whose process is gone: a sweep killed mid-write, or one that hit a
    full disk. A live pid's is left alone (`plot` writes REPORT.md this way without the lock)."""
    for p in [*out.glob(".*.tmp-*"), *(out / "runs").glob(".*.tmp-*")]:
        pid = p.name.rpartition(".tmp-")[2]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        # one that cannot go (gone already, another user's, a read-only mount) is left: the sweep goes on
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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


def _load_run(run_dir: Path) -> tuple[dict | None, pd.DataFrame | None, pd.DataFrame | None, str]:
    """(summary without its bookkeeping, metrics, outcomes or None, problem) of a run directory that exists; a
    damaged one gives what could be read and why the rest cannot be trusted."""
    state, why = check_run(run_dir)
    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None, None, None, why
    if not isinstance(s, dict):
        return None, None, None, why
    s.pop("traceback", None)
    record, kept = s.pop("metrics_file", None), s.pop("outcomes_file", None)
    if state == "damaged" or record is None:  # a failed run's summary is not checked for the record
        return s, None, None, why or NO_RECORD
    try:
        m = _read_metrics(run_dir / record["name"])
        o = None if kept is None else _read_outcomes(run_dir / kept["name"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return s, None, None, str(e) or type(e).__name__
    for rec, table in ((record, m), (kept, o)):
        if rec and len(table) != rec["rows"]:
            return s, None, None, f"{rec['name']} has {len(table)} rows, summary.json says {rec['rows']}"
    return s, m, o, ""


def _read_outcomes(path: Path) -> pd.DataFrame:
    """A run's outcomes file; ValueError when it is not a whole table of OUTCOME_COLUMNS."""
    o = read_metrics_file(path)
    if list(o.columns) != OUTCOME_COLUMNS:
        raise ValueError(f"{path.name} has columns {list(o.columns)}, expected {OUTCOME_COLUMNS}")
    return o


def _note_mixed_schedules(summary: pd.DataFrame) -> None:
    """One line on stderr when the finished runs here ran on different devices or thread counts: their
    numbers are not bitwise those of one schedule (schedule_note; REPORT.md says it too)."""
    if note := schedule_note(summary):
        print(f"note: {note}", file=sys.stderr)


def collect(out: Path) -> pd.DataFrame:
    """Gather the runs of this ablation's current plan into metrics.parquet and summary.csv, and their
    per-problem outcomes into outcomes.parquet where any run kept them.

    A damaged run is said on stderr and counted as failed (its metrics left out), never as finished."""
    meta = json.loads((out / "ablation.json").read_text())
    summaries, frames, kept = [], [], []
    for run_id in meta["runs"]:
        d = out / "runs" / run_id
        if not d.exists():
            continue  # never ran (sweep interrupted)
        s, m, o, problem = _load_run(d)
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
        if o is not None and len(o):
            kept.append(o.assign(run=s.get("run"), variant=s.get("variant"), seed=s.get("seed"))[
                ["run", "variant", "seed", *OUTCOME_COLUMNS]])
    summary = pd.DataFrame(summaries)
    _note_mixed_schedules(summary)
    metrics = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run", "variant", *meta["axes"], "seed", "step", "metric", "value"])
    # metric-major (runs in plan order, steps in order within each): one metric's values sit together and
    # compress to 0.55x of run-major; readers select by run and metric, never by position
    _atomic_parquet(metrics.sort_values("metric", kind="stable", ignore_index=True), out / METRICS_FILE)
    if kept:
        _atomic(out / OUTCOMES_FILE, lambda tmp: _write_outcomes(pd.concat(kept, ignore_index=True), tmp))
    else:  # none of this plan's runs kept outcomes: an earlier plan's file would be read as theirs
        (out / OUTCOMES_FILE).unlink(missing_ok=True)
    _atomic_csv(summary, out / "summary.csv")
    return summary


META_KEYS = {"name": str, "source": str, "variants": list, "seeds": list, "runs": list}


def read_meta(d: Path) -> dict:
    """d/ablation.json, checked; ConfigError naming the file when it is missing, not JSON or lacks a key."""
    path = d / "ablation.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(str(d), "<dir>", "not a results directory: no ablation.json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), "<file>", f"not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(meta, dict):
        raise ConfigError(str(path), "<root>", f"expected a mapping with {', '.join(META_KEYS)}")
    bad = [key for key, kind in META_KEYS.items() if not isinstance(meta.get(key), kind)]
    if bad:
        raise ConfigError(str(path), ", ".join(bad), "missing or of the wrong type; the runner writes "
                          + ", ".join(f"{k} ({t.__name__})" for k, t in META_KEYS.items()))
    task = meta.get("task")  # absent before results recorded their task, null when the variants train several
    if task is not None:
        keys = metrics.TASK_KEYS
        bad = [k for k, kind in keys.items() if not isinstance(task, dict) or not isinstance(task.get(k), kind)]
        if bad:
            raise ConfigError(str(path), "task" + (f".{bad[0]}" if isinstance(task, dict) else ""),
                              "missing or of the wrong type; the runner writes a mapping with "
                              + ", ".join(f"{k} ({t.__name__})" for k, t in keys.items()))
    metrics.remember(meta)
    return meta


def read_table(path: Path, columns: list[str], dtype: dict | None = None) -> pd.DataFrame:
    """A CSV the runner wrote, with at least `columns`; ConfigError when it is empty, cut short or unreadable.
    A lone newline is the table of no runs, which a sweep interrupted before its first run leaves."""
    data = path.read_bytes()
    if data == b"\n":
        return pd.DataFrame(columns=columns)
    if not data:
        raise ConfigError(str(path), "<file>", "empty (0 bytes): damaged; rerun the sweep to rewrite it")
    if not data.endswith(b"\n"):
        raise ConfigError(str(path), "<file>", "cut short (no final newline): damaged; rerun the sweep to rewrite it")
    try:
        df = pd.read_csv(path, dtype=dtype)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(str(path), "<file>", f"unreadable: {str(e).splitlines()[0]}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(str(path), "<columns>", f"no column {', '.join(missing)}; has {', '.join(map(str, df.columns))}")
    return df


def check_runs(out: Path, meta: dict, summary: pd.DataFrame, table: pd.DataFrame | None = None,
               partial: bool = True) -> None:
    """ConfigError when summary.csv (or the metrics table) holds runs that ablation.json does not plan (another
    sweep's), or, unless `partial`, lacks runs it plans (rows deleted, or a sweep not finished): its numbers
    would be read as this plan's, with fewer seeds or unpaired. Silent for an ablation.json without `runs`."""
    planned = meta.get("runs")
    if not isinstance(planned, list):
        return
    plan = set(map(str, planned))
    for path, runs in [(out / "summary.csv", summary.run), (metrics_path(out), None if table is None else table.run)]:
        if runs is None:
            continue
        other = sorted(set(map(str, runs.unique())) - plan)   # unique first: a metrics table has a million rows
        if other:
            raise ConfigError(str(path), "run", f"holds {len(other)} runs that ablation.json does not plan (e.g. "
                              f"{other[0]}): another sweep's results; rerun this ablation into its own --out")
    if not partial:
        missing = [r for r in planned if r not in set(summary.run.astype(str))]
        if missing:
            raise ConfigError(str(out / "summary.csv"), "run", f"has {len(planned) - len(missing)} of the "
                              f"{len(planned)} runs ablation.json plans (e.g. no {missing[0]}): rows deleted, or "
                              "the sweep has not finished; run its command again to finish and collect them")


def metrics_path(out: Path) -> Path | None:
    """The long metrics table of a results directory; None without one."""
    path = out / METRICS_FILE
    return path if path.is_file() else None


def load(out: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(ablation.json, summary.csv, the metrics table) of a results directory; ConfigError naming a bad file."""
    meta = read_meta(out)
    summary = read_table(out / "summary.csv", ["run", "variant", "status"])
    if summary.empty:
        summary = pd.DataFrame(columns=["run", "variant", "seed", "status", "error", "wall_s"])
    path = metrics_path(out)
    if path is None:
        raise ConfigError(str(out), "<dir>", "not a results directory: no metrics.parquet")
    columns = ["run", "variant", "step", "metric", "value"]
    try:
        table = read_metrics_file(path)
    except ValueError as e:
        raise ConfigError(str(path), "<file>", f"{e}: damaged; rerun the sweep to rewrite it") from None
    missing = [c for c in columns if c not in table.columns]  # before the cast, which needs them
    if missing:
        raise ConfigError(str(path), "<columns>", f"no column {', '.join(missing)}; has "
                          f"{', '.join(map(str, table.columns))}")
    table = table.astype({"run": "category", "variant": "category", "metric": "category"})
    if len(table) and not (pd.api.types.is_numeric_dtype(table.value) and pd.api.types.is_numeric_dtype(table.step)):
        raise ConfigError(str(path), "value", "holds a step or value that is not a number: damaged")
    check_runs(out, meta, summary, table)
    return meta, summary, table


def load_outcomes(out: Path) -> pd.DataFrame | None:
    """outcomes.parquet of a results directory, None where its runs kept none (a task without per-problem
    outcomes, or results from before them); ConfigError naming a damaged one."""
    path = out / OUTCOMES_FILE
    if not path.is_file():
        return None
    try:
        o = read_metrics_file(path)
    except ValueError as e:
        raise ConfigError(str(path), "<file>", f"{e}: damaged; rerun the sweep to rewrite it") from None
    missing = [c for c in ["run", "variant", "seed", *OUTCOME_COLUMNS] if c not in o.columns]
    if missing:
        raise ConfigError(str(path), "<columns>",
                          f"no column {', '.join(missing)}; has {', '.join(map(str, o.columns))}")
    return o


def finished_in_report(path: Path) -> int | None:
    """How many finished runs a REPORT.md written by `_markdown` reports; None without one."""
    try:
        found = re.search(r"; (\d+) runs finished, \d+ failed", path.read_text())
    except (OSError, UnicodeDecodeError):
        return None
    return int(found.group(1)) if found else None


def cpu_name() -> str:
    """The CPU a run or a build ran on, as results and manifests record it (the model name may hold colons)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "unknown CPU"


def cpu_model() -> str:
    """The processor's generation, which the model name may hide (these machines' read "AMD EPYC" on a Zen 4 and
    a Zen 5 alike) and which decides kernels the CPU pin does not reach (numpy's BLAS): "AuthenticAMD family 26
    model 2"; "" where /proc/cpuinfo does not say."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip():
                    break   # the first processor's block is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return ""
    if not {"vendor_id", "cpu family", "model"} <= fields.keys():
        return ""
    return f"{fields['vendor_id']} family {fields['cpu family']} model {fields['model']}"


def schedule_note(summary: pd.DataFrame) -> str:
    """'' when a summary's finished runs ran on one device at one thread count, else a sentence (REPORT.md's,
    and collect's on stderr) counting the runs of each: their numbers are not bitwise those of one schedule, so
    two variants that would tie exactly (not testable) can differ in the last bits. The population size and
    the executor never change a number (runner.SCHEDULE)."""
    cols = [c for c in ("device", "threads") if c in summary.columns]
    if not cols or "status" not in summary.columns:
        return ""
    # groupby leaves out a run whose schedule was not recorded (a missing key)
    counts = summary[summary.status == "ok"].groupby(cols, sort=True).size()
    if len(counts) < 2:
        return ""

    def kind(key) -> str:
        key = dict(zip(cols, key if isinstance(key, tuple) else (key,)))
        parts = [str(key["device"])] if "device" in key else []
        if "threads" in key:
            n = int(key["threads"])
            parts.append(f"{n} thread{'s' * (n != 1)}")
        return ", ".join(parts)

    kinds = "; ".join(f"{kind(k)}: {n} run{'s' * (n != 1)}" for k, n in counts.items())
    return (f"the finished runs here ran on different devices or thread counts ({kinds}); their numbers may differ "
            "in the last bits from one schedule's: variants that would tie exactly can differ by that much "
            "(population size and executor never change a number)")
