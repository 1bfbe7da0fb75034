"""Numbers in README.md and docs/ that come from committed results are held to those files here.

A table of mean ± std over seeds is recomputed from its directory's summary.csv; a sweep's
"N s for M runs" from its sweep.json. `python tests/test_doc_numbers.py` prints every held table as
it should read, to paste after a rerun.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]

# (page, results directory, [(column header, summary.csv column)]): the tables the pages show
TABLES = [
    ("README.md", "loss_modes", [("final rollout reward", "final/reward"),
                                 ("held-out exact-sort accuracy", "final/eval/accuracy")]),
    *[("docs/results.md", d, [("final reward", "final/reward"), ("held-out accuracy", "final/eval/accuracy")])
      for d in ("delta_modes", "kl_estimators", "ref_refresh")],
]
SWEEP = re.compile(r"\[report\]\((?:\.\./)?results/([\w-]+)/REPORT\.md\); (\d+) s for (\d+) runs")


def table(directory: str, columns: list[tuple[str, str]]) -> str:
    s = pd.read_csv(ROOT / "results" / directory / "summary.csv")
    s = s[s.status == "ok"]
    variants = json.loads((ROOT / "results" / directory / "ablation.json").read_text())["variants"]
    lines = ["| variant | " + " | ".join(h for h, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for v in variants:
        rows = s[s.variant == v]
        cells = [f"{rows[c].mean():.3f} ± {rows[c].std(ddof=1):.3f}" for _, c in columns]
        lines.append(f"| `{v}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@pytest.mark.parametrize("page, directory, columns", TABLES, ids=[f"{p}:{d}" for p, d, _ in TABLES])
def test_a_result_table_on_a_page_is_its_summary(page, directory, columns):
    assert table(directory, columns) in (ROOT / page).read_text(), \
        f"{page}'s {directory} table is not its summary.csv's; `python tests/test_doc_numbers.py` prints it"


def test_a_sweep_time_on_a_page_is_its_sweep_json():
    seen = 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name, secs, runs in SWEEP.findall(page.read_text()):
            sweep = json.loads((ROOT / "results" / name / "sweep.json").read_text())
            assert (int(secs), int(runs)) == (round(sweep["wall_s"]), sweep["runs"]), (page.name, name, sweep)
            seen += 1
    assert seen >= 4  # README's arithmetic_lora and the three toy sweeps of docs/results.md (the main job rewrites loss_modes')


BEYOND = re.compile(r"results/([\w-]+)/REPORT\.md\)[^*]*?Beyond seed noise \(final reward\): (\d+) of (\d+) pairs", re.S)


def test_docs_count_of_pairs_beyond_seed_noise_is_the_reports():
    """docs/results.md's "Beyond seed noise (final reward): k of n pairs" is what the directory's REPORT.md says in
    its final-reward section (both are recomputed after a rerun; the page was typed)."""
    found = BEYOND.findall((ROOT / "docs/results.md").read_text())
    assert len(found) >= 3
    for directory, k, n in found:
        report = (ROOT / "results" / directory / "REPORT.md").read_text()
        section = report.split("## Differences in final reward", 1)[1].split("\n## ", 1)[0]
        assert f"Beyond seed noise: {k} of {n}" in section, directory


def test_readme_names_the_recipes_with_the_highest_held_out_accuracy():
    """README's recipes sentence names the two variants with the highest mean held-out accuracy and their means,
    as results/recipes/summary.csv has them (the pinned rerun swapped the first two)."""
    s = pd.read_csv(ROOT / "results/recipes/summary.csv")
    top = s[s.status == "ok"].groupby("variant")["final/eval/accuracy"].mean().sort_values(ascending=False)
    (a, x), (b, y) = list(top.items())[:2]
    assert f"(highest held-out accuracy: `{a}` {x:.3f}, then `{b}` {y:.3f};" in (ROOT / "README.md").read_text()


# README's arithmetic_lora table: (column header, summary.csv column, cell from mean and std)
LORA = [("held-out greedy accuracy", "final/eval/accuracy", lambda m, s: f"{m:.3f} ± {s:.3f}"),
        ("gain over the start (points)", "final/eval/accuracy_gain", lambda m, s: f"{100 * m:+.1f} ± {100 * s:.1f}"),
        ("pass@8", "final/eval/pass@k", lambda m, s: f"{m:.3f}"),
        ("mean@8", "final/eval/mean@k", lambda m, s: f"{m:.3f}"),
        ("final length (tokens)", "final/response/length", lambda m, s: f"{m:.1f}")]


def _means(directory: str, column: str) -> pd.Series:
    s = pd.read_csv(ROOT / "results" / directory / "summary.csv")
    return s[s.status == "ok"].groupby("variant")[column].agg(["mean", "std"])


def test_readme_arithmetic_lora_table_is_its_summary():
    readme = (ROOT / "README.md").read_text()
    header = "| variant | " + " | ".join(h for h, _, _ in LORA) + " |"
    rows = readme[readme.index(header):].split("\n\n", 1)[0].splitlines()[2:]
    cells = {re.match(r"\| `([\w-]+)`", r).group(1): [c.strip() for c in r.strip().strip("|").split("|")[1:]]
             for r in rows}
    order = json.loads((ROOT / "results/arithmetic_lora/ablation.json").read_text())["variants"]
    assert list(cells) == order
    stats = {column: _means("arithmetic_lora", column) for _, column, _ in LORA}
    for v in order:
        assert cells[v] == [cell(*stats[column].loc[v]) for _, column, cell in LORA], v


def test_readme_prose_numbers_are_the_files():
    """The sentences around README's two tables: the toy's accuracies in percent, the LM start's accuracy from
    its manifest, the default recipe's gain and how far apart the working recipes end."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    toy = _means("loss_modes", "final/eval/accuracy")["mean"]
    assert f"clipped GRPO converges to {100 * toy['loss=clipped']:.1f}% exact-sort accuracy" in readme
    assert f"naive REINFORCE on stale samples stalls near {100 * toy['loss=naive']:.1f}%" in readme
    start = json.loads((ROOT / "tasks/arithmetic_scratchpad/manifest.json").read_text())["heldout_greedy_accuracy"]
    assert f"from a shipped checkpoint at {100 * start:.1f}% greedy accuracy on 1000 held-out problems" in readme
    lm = _means("arithmetic_lora", "final/eval/accuracy")
    gain = _means("arithmetic_lora", "final/eval/accuracy_gain")
    assert f"The default recipe gains {100 * gain.loc['grpo', 'mean']:.0f} points with a seed spread under 1 point" \
        in readme and gain.loc["grpo", "std"] < 0.01
    working = lm["mean"].drop(["lr_too_high", "one_prompt"])
    assert f"The working recipes end within {100 * (working.max() - working.min()):.1f} points of each other" in readme



def test_readme_what_stands_out_is_the_findings_and_the_starts():
    """'What stands out': the not-exercised count is the sum over README's claims table, countdown's batch std
    spread is the diagnostic FINDINGS reads, and the sentence on the second start is its manifest, the two
    summaries, compare's variance table and FINDINGS' count of orderings holding on both starts."""
    from grpo_bench.analysis import mechanism

    text = (ROOT / "README.md").read_text()
    readme = " ".join(text.split())
    table = "\n".join(line for line in text.splitlines() if line.startswith("| ["))
    idle = sum(int(n) for n in re.findall(r"(\d+) not exercised", table))
    assert f"What stands out: {idle} orderings are *not exercised*" in readme
    d = ROOT / "results/gpu/adv_norm_countdown"
    cv = mechanism.read(mechanism.metrics_table(d), {"metric": "reward/std", "reduce": "cv", "variant": "a"},
                        "batch_std_token", "no_std_token")
    assert f"batch std against none on countdown, whose batch std varies by {cv:.0%} over a run" in readme
    greedy = {s: json.loads((ROOT / f"tasks/arithmetic_scratchpad{s}/manifest.json").read_text())["heldout_greedy_accuracy"]
              for s in ("", "_seed1", "_seed2")}
    assert (f"from seeds 1 and 2 ({100 * greedy['_seed1']:.1f}% and {100 * greedy['_seed2']:.1f}% greedy against "
            f"{100 * greedy['']:.1f}%)") in readme
    ends = {s: _means(f"kl_gradients_lm{s}", "final/eval/accuracy").loc["none", "mean"] for s in ("", "_seed1", "_seed2")}
    share = re.search(r"^\| `none` \| 3 \| [\d.]+ \| [\d.]+ \| (\d+)% \|",
                      (ROOT / "results/starts_kl_gradients_lm/COMPARE.md").read_text(), re.M).group(1)
    assert (f"default GRPO ends at {ends['_seed1']:.3f} and {ends['_seed2']:.3f} against {ends['']:.3f}, the start "
            f"{share}% of its variance") in readme
    findings = (ROOT / "results/FINDINGS.md").read_text()
    section = {c: findings.split(f"\n## {c}\n", 1)[1].split("\n## ", 1)[0] for c in ("kl_gradients", "sampler_mismatch")}
    held = {c: section[c].count("lm: on 3 of 3 starts") for c in section}
    # "hold on all three" is said of every ordering tested on the three starts, so none may hold on fewer
    assert held == {c: len(re.findall(r"lm: on \d of 3 starts", section[c])) for c in section}
    assert (f"the {held['kl_gradients']} orderings of kl_gradients and the {held['sampler_mismatch']} of "
            "sampler_mismatch that hold on lm hold on all three") in readme

def test_reproduce_sh_times_the_start_sweeps_from_their_sweep_json():
    """scripts/reproduce.sh's seconds for the sweeps on other starts are their sweep.json's wall_s, and its
    core-hours per setting the range of wall x workers over them."""
    text = " ".join((ROOT / "scripts/reproduce.sh").read_text().replace("#", " ").split())
    named = re.findall(r"(\w+_lm_seed\d+):? (?:took )?([\d,]+) s", text)
    assert {d for d, _ in named} == {p.name for p in (ROOT / "results").glob("*_lm_seed*")}
    hours = []
    for d, seconds in named:
        sweep = json.loads((ROOT / "results" / d / "sweep.json").read_text())
        assert int(seconds.replace(",", "")) == round(sweep["wall_s"]), d
        hours.append(sweep["wall_s"] * int(sweep["where"].split()[1]) / 3600)
    lo, hi = re.search(r"each about ([\d.]+)-([\d.]+) core-hours", text).groups()
    assert (float(lo), float(hi)) == (round(min(hours), 1), round(max(hours), 1))

if __name__ == "__main__":
    for page, directory, columns in TABLES:
        sweep = json.loads((ROOT / "results" / directory / "sweep.json").read_text())
        print(f"{page}: {directory} ({round(sweep['wall_s'])} s for {sweep['runs']} runs)\n{table(directory, columns)}\n",
              file=sys.stdout)
