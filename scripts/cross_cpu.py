"""results/cross_cpu.csv: committed runs rerun on another processor, compared value for value.

    python scripts/cross_cpu.py SWEEP [SWEEP ...] [--seeds N] [--root results]

The CPU pin (docs/reliability.md) promises that a run gives the same bits on every x86-64 server.
This script tests the promise on whatever machine it runs on: for each committed sweep it reruns the
first N seeds of every variant with the sweep's own command (sweep.json), in a scratch directory,
and compares each rerun run with the committed one of the same run id (the id digests the whole
config, so a rerun with another config would not be compared at all):

    made_on, rerun_on     the processors (sweep.json's cpu_model; "cpu" where the sweep predates it)
    values                logged per-step values compared (every metric but the clocks, time/*)
    values_differ         how many of them differ in any bit (NaN equals NaN)
    differ_metrics        which metrics those are
    new_metrics           metrics the rerun logged that the committed sweep never did (added to the code
                          since): nothing to compare them with, so neither counted nor compared
    answers, answers_differ   held-out answers compared (outcomes.parquet: every problem of every
                          evaluation) and how many differ
    final_accuracy        the committed run's final held-out accuracy, to say what was at stake
    changed_metrics       metrics whose code changed after the sweep was made (CHANGED, read from git history):
                          the committed values came from the old code, which another processor need not
                          reproduce, so they are compared but not counted in values_differ
    changed_differ, changed_max_ulps   how many of those values differ, and by how many units in the last
                          place at most (of float32 where both values are float32 numbers)

A row replaces the row of the same sweep, processor, variant and seed. docs/reliability.md quotes the
counts (tests/test_doc_numbers.py holds them).
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from grpo_bench.store.rundir import cpu_model  # noqa: E402

COLUMNS = ["sweep", "made_on", "rerun_on", "variant", "seed", "values", "values_differ", "differ_metrics",
           "new_metrics", "answers", "answers_differ", "final_accuracy", "changed_metrics", "changed_differ",
           "changed_max_ulps"]
KEY = ["sweep", "rerun_on", "variant", "seed"]
# metrics whose computation changed after committed sweeps were made, by the commit that changed it. 4b7c644: the
# spread diagnostics took torch's CPU sqrt, MKL's vector math, one unit off for about a tenth of values and
# differently so on each vendor even under the pin; they now take a correctly rounded root. A sweep made before
# it holds values no processor running today's code reproduces, so they cannot speak for the pin
CHANGED = {"4b7c644": ("response/length_cv", "response/length_prompt_cv", "reward/group_std_cv")}


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def changed_since(made: Path) -> set[str]:
    """The metrics of CHANGED whose change the sweep's committed metrics.parquet predates. A sweep git does not
    know (made with today's code, or no git here) has every metric compared and counted."""
    last = _git("log", "-1", "--format=%H", "--", str(made / "metrics.parquet")).stdout.strip()
    if not last:
        return set()
    return {m for commit, metrics in CHANGED.items()
            if _git("merge-base", "--is-ancestor", commit, last).returncode == 1 for m in metrics}


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in units in the last place: of float32 where both are float32 numbers (the metrics are logged
    from float32 tensors), else of float64."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    f32 = (a.astype(np.float32).astype(float) == a) & (b.astype(np.float32).astype(float) == b)
    unit = np.where(f32, np.spacing(np.abs(a).astype(np.float32)).astype(float), np.spacing(np.abs(a)))
    return np.abs(a - b) / unit


def rerun_command(command: str, seeds: int, out: Path) -> list[str]:
    """The sweep's own command with its seeds, workers, output and progress replaced."""
    args = shlex.split(command)
    if not args or args[0] != "run":
        raise SystemExit(f"error: sweep.json: command: expected 'run …', got {command!r}")
    kept, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("--seeds", "--workers", "--out", "--population"):
            skip = True
            continue
        if a.split("=")[0] in ("--seeds", "--workers", "--out", "--population") or a == "--no-progress":
            continue
        kept.append(a)
    return ["run", *kept, "--seeds", str(seeds), "--workers", "2", "--no-progress", "--out", str(out)]


def compare(made: Path, rerun: Path, changed: set[str] = frozenset()) -> list[dict]:
    """One row per rerun run: how many of its logged values and held-out answers differ from the committed run's;
    the `changed` metrics' differences are counted apart (changed_differ), with their size."""
    m0, m1 = pd.read_parquet(made / "metrics.parquet"), pd.read_parquet(rerun / "metrics.parquet")
    runs = sorted(set(m1["run"]))
    missing = sorted(set(runs) - set(m0["run"]))
    if missing:
        raise SystemExit(f"error: {made}: the rerun made runs the sweep does not hold (another config?): {missing[:3]}")
    keys = ["run", "step", "metric"]
    m0 = m0[m0["run"].isin(runs) & ~m0["metric"].str.startswith("time/")]
    m1 = m1[~m1["metric"].str.startswith("time/")]
    # a metric no committed run logged was added to the code after the sweep: no bits to compare. One the
    # committed run logged and the rerun did not is still a difference (below)
    added = m1["metric"].isin(set(m1["metric"]) - set(m0["metric"]))
    new_metrics = m1[added].groupby("run")["metric"].agg(lambda m: " ".join(sorted(set(m))))
    m1 = m1[~added]
    both = m0.merge(m1, on=keys, how="outer", suffixes=("_0", "_1"), indicator=True)
    a, b = both["value_0"].to_numpy(float), both["value_1"].to_numpy(float)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    both["differ"] = ~same | (both["_merge"] != "both")
    o0 = pd.read_parquet(made / "outcomes.parquet") if (made / "outcomes.parquet").exists() else None
    o1 = pd.read_parquet(rerun / "outcomes.parquet") if (rerun / "outcomes.parquet").exists() else None
    summary = pd.read_csv(made / "summary.csv").set_index("run")
    rows = []
    for run in runs:
        r = both[both["run"] == run]
        apart = r["metric"].isin(changed)
        chg, r = r[apart], r[~apart]
        chg_differ = chg[chg["differ"]]
        variant, seed = summary.loc[run, "variant"], int(summary.loc[run, "seed"])
        answers = answers_differ = 0
        if o0 is not None and o1 is not None:
            k = ["run", "step", "problem"]
            x = o0[o0["run"] == run].merge(o1[o1["run"] == run], on=k, how="outer", suffixes=("_0", "_1"),
                                           indicator=True)
            answers = len(x)
            bad = x["_merge"] != "both"
            for c in ("greedy", "k_correct"):
                bad |= ~((x[f"{c}_0"] == x[f"{c}_1"]).fillna(False) | (x[f"{c}_0"].isna() & x[f"{c}_1"].isna()))
            answers_differ = int(bad.sum())
        acc = summary.loc[run].get("final/eval/accuracy", np.nan)
        rows.append({"variant": variant, "seed": seed, "values": len(r), "values_differ": int(r["differ"].sum()),
                     "differ_metrics": " ".join(sorted(set(r.loc[r["differ"], "metric"]))),
                     "new_metrics": new_metrics.get(run, ""),
                     "answers": answers, "answers_differ": answers_differ,
                     "final_accuracy": None if pd.isna(acc) else round(float(acc), 4),
                     "changed_metrics": " ".join(sorted(set(chg["metric"]))), "changed_differ": len(chg_differ),
                     "changed_max_ulps": float(ulps(chg_differ["value_0"], chg_differ["value_1"]).max())
                     if len(chg_differ) else 0.0})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweeps", nargs="+", metavar="SWEEP", help="a directory name under ROOT, e.g. adv_norm_countdown")
    p.add_argument("--seeds", type=int, default=1, help="rerun seeds 0..N-1 of every variant (default 1)")
    p.add_argument("--root", default=str(ROOT / "results"))
    args = p.parse_args(argv)
    root = Path(args.root)
    here = cpu_model()
    table = root / "cross_cpu.csv"
    text = {"differ_metrics": str, "new_metrics": str, "changed_metrics": str}
    old = pd.read_csv(table, dtype=text).reindex(columns=COLUMNS) if table.exists() else pd.DataFrame(columns=COLUMNS)
    for c in text:   # a column the table predates reads back as NaN floats
        old[c] = old[c].astype(object).fillna("")
    old = old.fillna({"changed_differ": 0, "changed_max_ulps": 0.0}).astype({"changed_differ": int})
    new = []
    for name in args.sweeps:
        made = root / name
        meta = json.loads((made / "sweep.json").read_text())
        made_on = meta.get("cpu_model") or meta["cpu"]
        with tempfile.TemporaryDirectory(prefix="cross_cpu_") as tmp:
            out = Path(tmp) / name
            cmd = [sys.executable, "-m", "grpo_bench", *rerun_command(meta["command"], args.seeds, out)]
            print(" ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, cwd=ROOT, check=True)
            for row in compare(made, out, changed_since(made)):
                new.append({"sweep": name, "made_on": made_on, "rerun_on": here, **row})
                print(f"  {row['variant']} seed {row['seed']}: {row['values_differ']} of {row['values']} values, "
                      f"{row['answers_differ']} of {row['answers']} answers differ; changed since the sweep: "
                      f"{row['changed_differ']} ({row['changed_max_ulps']:g} ulps at most)", flush=True)
    new = pd.DataFrame(new, columns=COLUMNS)
    keep = old.merge(new[KEY], on=KEY, how="left", indicator=True)
    old = old[(keep["_merge"] == "left_only").to_numpy()]
    pd.concat([old, new]).sort_values(KEY).to_csv(table, index=False)
    print(f"wrote {table}")


if __name__ == "__main__":
    main()
