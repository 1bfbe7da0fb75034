"""results/cpu_reruns.csv: how close each LM run rerun under the CPU pin came to the native-path run it replaced.

    python scripts/rerun_bits.py [RESULTS]

The committed LM results were made on an AMD EPYC's native paths, before the CPU pin (commit e481cca);
some settings were rerun since under the pin (to score every evaluation on all problems), on an Intel
Xeon and on an AMD EPYC (Zen 4). For each results directory whose sweep is not the one committed before
the pin (another wall time), that pre-pin version is read from git history, and each run whose config
is the same (the evaluation subset aside) is compared, (variant, seed) to (variant, seed), on its
logged per-step metrics:

    cpu              the processor of the rerun (sweep.json)
    training_bits    whether a continuous quantity of training (ratio/max, loss/policy, grad/norm)
                     differs anywhere: the two code paths' arithmetic differing in its last bits
    samples_from     the first rollout at which something the samples decide differs (reward/mean,
                     response/length, reward/zero_std_frac, response/finished), empty if none
                     does: every sample drawn was the same, so is every final reward, accuracy, length
    final_before, final_after   the final held-out accuracy (final/eval/accuracy) of both

docs/statistics.md and docs/reliability.md quote its counts (tests/test_doc_numbers.py holds them).
Needs the clone's history (git log, git show).
"""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "AMD EPYC"
PIN = "e481cca"  # the commit that pinned the CPU paths: what was committed before it took the native ones
CONTINUOUS = ("ratio/max", "loss/policy", "grad/norm")
SAMPLED = ("reward/mean", "response/length", "reward/zero_std_frac", "response/finished")
COLUMNS = ["setting", "before_commit", "cpu", "variant", "seed", "training_bits", "samples_from", "final_before",
           "final_after"]


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True).stdout


def before_commit(d: Path) -> str | None:
    """The last commit before the pin that holds d's sweep, if d has been rerun since (another wall time)."""
    rel = d.relative_to(ROOT).as_posix()
    commits = git("log", "--format=%h", "-n", "1", f"{PIN}^", "--", f"{rel}/sweep.json").decode().split()
    if not commits:
        return None
    sweep = json.loads(git("show", f"{commits[0]}:{rel}/sweep.json"))
    now = json.loads((d / "sweep.json").read_text())
    if sweep.get("wall_s") == now.get("wall_s") or not sweep.get("cpu", "").startswith(BEFORE):
        return None
    return commits[0]


def same_config(a: dict, b: dict) -> bool:
    """The same training: what the rerun changed on purpose (every evaluation on all problems) and `device`
    (its default went from cpu to auto, which is the CPU on a machine without a GPU) aside."""
    strip = lambda c: {**{k: v for k, v in c.items() if k != "device"},  # noqa: E731
                       "task": {k: v for k, v in c["task"].items() if k != "eval_subset"}}
    return strip(a) == strip(b)


def compare(d: Path, commit: str) -> list[dict]:
    rel = d.relative_to(ROOT).as_posix()
    old_spec = json.loads(git("show", f"{commit}:{rel}/ablation.json"))
    new_spec = json.loads((d / "ablation.json").read_text())
    variants = [v for v in new_spec["variants"] if v in old_spec["configs"]
                and same_config(old_spec["configs"][v], new_spec["configs"][v])]
    old = pd.read_parquet(io.BytesIO(git("show", f"{commit}:{rel}/metrics.parquet")))
    new = pd.read_parquet(d / "metrics.parquet")
    both = old.merge(new, on=["variant", "seed", "step", "metric"], suffixes=("_before", "_after"))
    both = both[both.variant.isin(variants)]
    moved = both[both.value_before != both.value_after]
    finals = {}
    for tag, table in (("before", pd.read_csv(io.BytesIO(git("show", f"{commit}:{rel}/summary.csv")))),
                       ("after", pd.read_csv(d / "summary.csv"))):
        finals[tag] = {(r.variant, int(r.seed)): r["final/eval/accuracy"] for _, r in table.iterrows()}
    cpu = json.loads((d / "sweep.json").read_text())["cpu"]
    rows = []
    for (variant, seed), _ in both.groupby(["variant", "seed"]):
        mine = moved[(moved.variant == variant) & (moved.seed == seed)]
        sampled = mine[mine.metric.isin(SAMPLED)]
        inner = new_spec["configs"][variant]["inner_steps"]
        rows.append({"setting": d.name, "before_commit": commit, "cpu": cpu, "variant": variant, "seed": int(seed),
                     "training_bits": "differ" if mine.metric.isin(CONTINUOUS).any() else "same",
                     "samples_from": "" if sampled.empty else int(sampled.step.min()) // inner + 1,
                     "final_before": finals["before"][(variant, int(seed))],
                     "final_after": finals["after"][(variant, int(seed))]})
    return rows


def main(results: Path) -> Path:
    rows = []
    for sweep in sorted(results.glob("*/sweep.json")):
        if (sweep.parent / "outcomes.parquet").exists() and (commit := before_commit(sweep.parent)):
            rows += compare(sweep.parent, commit)
    out = results / "cpu_reruns.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT / "results"))
