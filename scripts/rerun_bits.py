"""results/cpu_reruns.csv: how close each LM run rerun on another processor came to the run it replaced.

    python scripts/rerun_bits.py [RESULTS]

The committed LM results were made on an AMD EPYC's native paths, before the CPU pin; some settings
were rerun since on an Intel Xeon under the pin (to score every evaluation on all problems). For
each results directory whose sweep.json names a processor other than the AMD one, the last
committed version made on the AMD EPYC is read from git history, and each run whose config is the
same (the evaluation subset aside) is compared, (variant, seed) to (variant, seed), on its logged
per-step metrics:

    training_bits    whether a continuous quantity of training (ratio/max, loss/policy, grad/norm)
                     differs anywhere: the two processors' arithmetic differing in its last bits
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
CONTINUOUS = ("ratio/max", "loss/policy", "grad/norm")
SAMPLED = ("reward/mean", "response/length", "reward/zero_std_frac", "response/finished")
COLUMNS = ["setting", "before_commit", "variant", "seed", "training_bits", "samples_from", "final_before",
           "final_after"]


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True).stdout


def before_commit(d: Path) -> str | None:
    """The last commit whose version of d's sweep was made on the AMD EPYC."""
    rel = d.relative_to(ROOT).as_posix()
    for commit in git("log", "--format=%h", "--", f"{rel}/sweep.json").decode().split():
        sweep = json.loads(git("show", f"{commit}:{rel}/sweep.json"))
        if sweep.get("cpu", "").startswith(BEFORE):
            return commit
    return None


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
    rows = []
    for (variant, seed), _ in both.groupby(["variant", "seed"]):
        mine = moved[(moved.variant == variant) & (moved.seed == seed)]
        sampled = mine[mine.metric.isin(SAMPLED)]
        inner = new_spec["configs"][variant]["inner_steps"]
        rows.append({"setting": d.name, "before_commit": commit, "variant": variant, "seed": int(seed),
                     "training_bits": "differ" if mine.metric.isin(CONTINUOUS).any() else "same",
                     "samples_from": "" if sampled.empty else int(sampled.step.min()) // inner + 1,
                     "final_before": finals["before"][(variant, int(seed))],
                     "final_after": finals["after"][(variant, int(seed))]})
    return rows


def main(results: Path) -> Path:
    rows = []
    for sweep in sorted(results.glob("*/sweep.json")):
        if json.loads(sweep.read_text()).get("cpu", BEFORE).startswith(BEFORE):
            continue
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
