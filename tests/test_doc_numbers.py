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
    # a cell whose every ordering is apart reads "not exercised here (eval accuracy, final: 1 of 1 orderings)"
    idle = sum(int(n) for n in re.findall(r"(\d+) not exercised", table)) + \
        sum(int(n) for n in re.findall(r"not exercised here \([^:|]*: (\d+) of \d+ orderings\)", table))
    assert f"What stands out: {idle} orderings are *not exercised*" in readme
    d = ROOT / "results/adv_norm_countdown"   # the CPU rerun FINDINGS judges
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
    slow, fast = (_means(f"aggregation_spell_backward{s}", "final/eval/accuracy")["mean"] for s in ("_slow", ""))
    tok, seq, prompt = slow["token_mean"], slow["seq_mean"], slow["prompt_mean"]
    assert (f"the token mean ends {tok - seq:.3f} above the per-response mean ({tok:.3f} against {seq:.3f}), the prompt "
            f"mean {prompt - seq:.3f} above it, where at lr 1e-3 all end within 0.01") in readme
    assert fast.max() - fast.min() < 0.01
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

def test_reproduce_sh_times_the_slow_spell_backward_sweeps_from_their_sweep_json():
    text = " ".join((ROOT / "scripts/reproduce.sh").read_text().replace("#", " ").split())
    named = dict(re.findall(r"(\w+_spell_backward_slow) ([\d,]+) s", text))
    assert set(named) == {p.name for p in (ROOT / "results").glob("*_spell_backward_slow")}
    for d, seconds in named.items():
        assert int(seconds) == round(json.loads((ROOT / "results" / d / "sweep.json").read_text())["wall_s"]), d


def test_reproduce_sh_times_every_setting_rerun_with_full_evaluations():
    """Each claim's lm, countdown, spell_backward or lm_wide setting that scores every evaluation on all its
    problems (a rerun of one made when mid-run evaluations scored 250) is timed in reproduce.sh by its
    sweep.json's wall_s."""
    sys.path.insert(0, str(ROOT))
    from grpo_bench.config.ablation import ablation_settings, load_ablation
    text = " ".join((ROOT / "scripts/reproduce.sh").read_text().replace("#", " ").split())
    sentence = text.split("rerun with every evaluation on all 1,000 problems", 1)[1].split(" have not been rerun", 1)[0]
    named = dict(re.findall(r"(\w+_(?:lm|lm_wide|countdown|spell_backward)) ([\d,]+) s", sentence))
    full = set()
    for f in sorted((ROOT / "ablations").glob("*.yaml")):
        for s in set(ablation_settings(f) or []) & {"lm", "lm_wide", "countdown", "spell_backward"}:
            if (ROOT / "results" / f"{f.stem}_{s}").is_dir():
                task = load_ablation(f, setting=s).configs[0].task
                if getattr(task, "eval_subset", 0) in (0, getattr(task, "eval_size", 0)):
                    full.add(f"{f.stem}_{s}")
    assert set(named) == full
    for d, seconds in named.items():
        assert int(seconds.replace(",", "")) == round(json.loads((ROOT / "results" / d / "sweep.json").read_text())["wall_s"]), d


def test_reproduce_sh_sums_a_resumed_sweeps_runs_from_its_summary():
    """sweep.json times the last invocation only: the clause of a sweep resumed across sessions says how many of
    its runs that was, and what all its runs' own wall times sum to (summary.csv), in core-hours too."""
    text = " ".join((ROOT / "scripts/reproduce.sh").read_text().replace("#", " ").split())
    resumed = re.findall(r"(\w+) [\d,]+ s for the last (\d+) of its (\d+) runs .*?own wall times sum to ([\d,]+) s, "
                         r"([\d.]+) core-hours", text)
    assert resumed, "no resumed sweep's clause in reproduce.sh"
    for d, last, total, secs, hours in resumed:
        sweep = json.loads((ROOT / "results" / d / "sweep.json").read_text())
        wall = pd.read_csv(ROOT / "results" / d / "summary.csv").wall_s
        assert (int(last), int(total)) == (sweep["runs"], len(wall)) and sweep["runs"] + sweep["skipped"] == len(wall)
        assert (int(secs.replace(",", "")), float(hours)) == (round(wall.sum()), round(wall.sum() / 3600, 1)), d
        assert f"{round(wall.min())}-{round(wall.max())} s a run" in text, d


def test_rerun_bits_in_the_docs_are_results_cpu_reruns():
    """statistics.md and reliability.md say how close the Intel Xeon reruns came to the AMD EPYC runs from
    results/cpu_reruns.csv (scripts/rerun_bits.py): runs compared, those that drew every sample the same,
    the rollouts where the others first differed and the most a final accuracy moved."""
    import pandas as pd
    t = pd.read_csv(ROOT / "results/cpu_reruns.csv")
    words = dict(enumerate("no one two three four five six seven eight nine ten".split()))
    moved = t[t.samples_from.notna()]
    assert (t.training_bits == "differ").all()     # "in each of the runs ... differ from the first update"
    # every setting rerun with full evaluations on the Xeon that has an AMD version is in it
    assert set(t.setting) >= {"kl_gradients_lm", "entropy_control_spell_backward", "ref_policy_lm"}
    want = [f"of the {len(t)} runs", f"{len(t) - len(moved)} drew every sample",
            f"in {words.get(len(moved), len(moved))} a sample first differed at rollout "
            f"{int(moved.samples_from.min())}-{int(moved.samples_from.max())}",
            f"moved by at most {(moved.final_after - moved.final_before).abs().max():.3f}"]
    for doc in ("docs/statistics.md", "docs/reliability.md"):
        text = " ".join((ROOT / doc).read_text().split())
        for phrase in want:
            assert phrase in text.replace("each of the", "of the"), (doc, phrase)


def test_cross_cpu_in_the_docs_is_results_cross_cpu():
    """reliability.md's count of committed runs rerun on another processor (scripts/cross_cpu.py) and of the values
    and held-out answers that came out different is results/cross_cpu.csv's."""
    t = pd.read_csv(ROOT / "results/cross_cpu.csv")
    text = " ".join((ROOT / "docs/reliability.md").read_text().split())
    for phrase in (f"{len(t)} runs of {t.sweep.nunique()} sweeps",
                   f"{int(t.values_differ.sum()):,} of {int(t['values'].sum()):,} logged values",
                   f"{int(t.answers_differ.sum()):,} of {int(t.answers.sum()):,} held-out answers",
                   # metrics whose code changed after their sweep was made, compared apart
                   f"There {int(t.changed_differ.sum()):,} values differ, each by at most "
                   f"{t.changed_max_ulps.max():g} units in the last place"):
        assert phrase in text, phrase
    amd = t[t.rerun_on.str.startswith("AuthenticAMD") & t.made_on.str.startswith("Intel")]   # the other way
    assert (f"against the {amd.sweep.nunique()} LM sweeps made on the Intel Xeon" in text and
            f"{len(amd)} runs, {int(amd.values_differ.sum())} of {int(amd['values'].sum()):,} compared values and "
            f"{int(amd.answers_differ.sum())} of {int(amd.answers.sum()):,} held-out answers" in text)
    # each Intel generation's reruns of AMD-made sweeps, in its own paragraph that names the generation
    for cpu, g in t[t.rerun_on.str.startswith("GenuineIntel")].groupby("rerun_on"):
        model = cpu.split()[-1]
        assert f"(family 6, model {model})" in text, cpu
        assert (f"{len(g)} runs of {g.sweep.nunique()} sweeps, {int(g.values_differ.sum())} of {int(g['values'].sum()):,} "
                f"logged values (every metric but the clocks) and {int(g.answers_differ.sum())} of "
                f"{int(g.answers.sum()):,} held-out answers differ" in text), cpu
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "same bit for bit on any x86-64 CPU" in readme and "results/cross_cpu.csv" in readme
    assert t.values_differ.sum() == 0 == t.answers_differ.sum()


def test_spell_backward_slow_margins_come_from_their_separate_run():
    """The spell_backward_slow setting's margins (adv_norm, aggregation: accuracy; length_bias: incorrect length)
    follow their task's rules at the end of that budget (rollout 15 at lr 1e-4) in the separate default-GRPO run
    results/spell_backward_grpo_lr1e-4, which scripts/reproduce.sh remakes with its recorded command."""
    import yaml

    from grpo_bench.config.ablation import load_ablation
    from grpo_bench.store.metrics import odds_margin

    d = ROOT / "results/spell_backward_grpo_lr1e-4"
    command = json.loads((d / "sweep.json").read_text())["command"]
    assert f"grpo_bench {command}" in " ".join((ROOT / "scripts/reproduce.sh").read_text().replace("\\\n", "").split())
    m = pd.read_parquet(d / "metrics.parquet")
    abl = load_ablation(ROOT / "ablations/adv_norm.yaml", setting="spell_backward_slow")
    steps = sorted(m[m.metric == "eval/accuracy"].step.unique())
    end = steps[abl.configs[0].epochs // abl.configs[0].eval_every]   # the evaluation after its last rollout
    assert "--set lr=0.0001" in command and abl.configs[0].lr == 0.0001
    p = m[(m.metric == "eval/accuracy") & (m.step == end)].value.mean()
    for claim in ("adv_norm", "aggregation"):
        margin = yaml.safe_load((ROOT / f"ablations/{claim}.yaml").read_text())["claim"]["margin"]
        assert margin["spell_backward_slow"] == odds_margin(p), claim
    # length_bias: 1/15 of the incorrect completions' length over the budget's last 10% of rollouts (2 of 15 here)
    length = m[(m.metric == "response/length_incorrect") & (m.step > end - 4) & (m.step <= end)]
    runs = length.groupby("run").value.mean().mean()
    margin = yaml.safe_load((ROOT / "ablations/length_bias.yaml").read_text())["claim"]["margin"]
    assert margin["spell_backward_slow"] == round(runs / 15, 1)
    page = " ".join((ROOT / "docs/statistics.md").read_text().split())
    assert (f"±{odds_margin(p):.3f} at its rollout-15 accuracy of {p:.3f} for `adv_norm` and `aggregation`, "
            f"{round(runs / 15, 1):g} tokens, 1/15 of {runs:.1f}, for `length_bias`") in page


if __name__ == "__main__":
    for page, directory, columns in TABLES:
        sweep = json.loads((ROOT / "results" / directory / "sweep.json").read_text())
        print(f"{page}: {directory} ({round(sweep['wall_s'])} s for {sweep['runs']} runs)\n{table(directory, columns)}\n",
              file=sys.stdout)


def test_findings_notes_on_spell_backward_slow_are_its_summaries():
    """FINDINGS_notes' paragraph on spell_backward before its ceiling: the headroom run's curve, the three
    claims' means, each from its summary.csv or metrics.parquet."""
    notes = " ".join((ROOT / "results/FINDINGS_notes.md").read_text().split())
    section = notes.split("**Before the ceiling: `spell_backward_slow`.**")[1].split("**")[0]
    m = pd.read_parquet(ROOT / "results/spell_backward_grpo_lr1e-4/metrics.parquet")
    curve = m[m.metric == "eval/accuracy"].groupby("step").value.mean()
    at = [curve.iloc[i] for i in (1, 2, 3)]
    assert f"{at[0]:.2f}, {at[1]:.2f} and {at[2]:.2f} at rollouts 5, 10 and 15; {curve.iloc[-1]:.3f} at 30" in section
    assert f"where it stands at {at[2]:.3f}" in section
    agg = _means("aggregation_spell_backward_slow", "final/eval/accuracy")["mean"]
    tok, seq, prompt = agg["token_mean"], agg["seq_mean"], agg["prompt_mean"]
    assert f"the token mean ends {tok - seq:.3f} above the per-response mean ({tok:.3f} against {seq:.3f})" in section
    assert f"prompt-level mean {prompt - seq:.3f} above it" in section
    adv = _means("adv_norm_spell_backward_slow", "final/eval/accuracy")["mean"]
    token = adv[["no_std_token", "group_std_token", "batch_std_token"]]
    assert token.max() - token.min() <= 0.004 and "within 0.004" in section
    length = _means("length_bias_spell_backward_slow", "final/response/length_incorrect")["mean"]
    assert (f"end {length['dr_grpo'] - length['grpo']:.1f} tokens shorter than Dr. GRPO's "
            f"({length['grpo']:.1f} against {length['dr_grpo']:.1f}") in section


def _findings_cells(claim: str, ordering: str) -> dict[str, str]:
    """A claim's row of one ordering in the committed FINDINGS.md (held to the results by test_findings), by
    column heading up to its first colon."""
    text = (ROOT / "results/FINDINGS.md").read_text()
    section = text.split(f"\n## {claim}\n")[1].split("\n## ")[0]
    head = next(line for line in section.splitlines() if line.startswith("| ordering |"))
    row = next(line for line in section.splitlines() if line.startswith(f"| `{ordering}` |"))
    return dict(zip([h.split(":")[0].strip() for h in head.strip("|").split(" | ")], row.strip("|").split(" | ")))


def test_findings_notes_on_dynamic_sampling_at_equal_samples_are_the_findings():
    """The notes' equal-samples readings of dynamic sampling (read on the problems every evaluation scored, since
    2026-11-29) are FINDINGS' cells, in points."""
    notes = " ".join((ROOT / "results/FINDINGS_notes.md").read_text().split())

    def delta(cells: dict, column: str) -> float:
        cell = cells[column]
        assert "final at equal samples drawn (both read at 3,840)" in cell, column
        return 100 * float(re.search(r"Δ ([-+][0-9.]+)", cell).group(1))

    token = _findings_cells("dapo_ladder", "dynamic_sampling > token_level")
    grpo = _findings_cells("dapo_ladder", "dynamic_sampling > grpo")
    wide, countdown, small = (delta(token, c) for c in ("arithmetic LM (lm_wide)", "reasoning-gym LM (countdown)",
                                                         "arithmetic LM (lm)"))
    assert (f"(−{-countdown:.1f} countdown, −{-small:.1f} small and −{-wide:.1f} wide, each on all 1,000 problems "
            "since their reruns" in notes)
    assert all("(1,000 problems" in token[f"{t} LM ({s})"] for t, s in (("arithmetic", "lm"), ("arithmetic", "lm_wide"),
                                                                         ("reasoning-gym", "countdown")))
    assert all("**equivalent within ±0.035**" in c["reasoning-gym LM (countdown)"] for c in (token, grpo))
    assert "equivalent within ±0.035 on countdown" in notes and "equivalent within ±0.035), a change of" in notes
    assert f"it ends level with GRPO (−{-delta(grpo, 'arithmetic LM (lm)'):.1f} points, equivalent within ±0.027)" in notes
    assert "**equivalent within ±0.027**" in grpo["arithmetic LM (lm)"]
    assert f"on countdown 5.9 where it is {-delta(grpo, 'reasoning-gym LM (countdown)'):.1f}" in notes
    assert f"the same reading puts it {-delta(grpo, 'arithmetic LM (lm_acts)'):.1f} points below GRPO" in notes


def test_findings_notes_on_what_would_not_act_before_the_ceiling_are_the_headroom_runs_logs():
    """Why policy_losses, entropy_control and dapo_ladder did not run on spell_backward_slow: default GRPO's
    diagnostics over its first 15 rollouts in the headroom run (every logged step of every seed)."""
    notes = " ".join((ROOT / "results/FINDINGS_notes.md").read_text().split())
    m = pd.read_parquet(ROOT / "results/spell_backward_grpo_lr1e-4/metrics.parquet")
    m = m[m.step < 30]   # 15 rollouts of 2 steps
    at = lambda k: m[m.metric == k].value   # noqa: E731
    entropy = at("entropy")
    assert at("clip/frac").max() == 0 and "no token reaches either side of PPO's clip" in notes
    assert (f"above the adaptive controller's 0.2 target at {(entropy > 0.2).mean():.0%} of its steps "
            f"(lowest {entropy.min():.3f})") in notes
    assert f"{at('response/finished').mean():.2%} of responses finish" in notes
    assert f"{at('reward/zero_std_frac').mean():.1%} of groups have all-equal rewards" in notes


def test_findings_notes_on_a_lagging_sampler_before_the_ceiling_are_its_summaries():
    """sampler_mismatch on spell_backward_slow against spell_backward: finals from summary.csv, the KL from
    FINDINGS' mechanism lines."""
    notes = " ".join((ROOT / "results/FINDINGS_notes.md").read_text().split())
    fast = _means("sampler_mismatch_spell_backward", "final/eval/accuracy")["mean"]
    slow = _means("sampler_mismatch_spell_backward_slow", "final/eval/accuracy")["mean"]
    assert f"collapses spell_backward ({fast['none_k16']:.3f} against fresh {fast['fresh']:.3f})" in notes
    assert f"cost nothing ({slow['none_k16']:.3f} against {slow['fresh']:.3f}, equivalent within ±0.031)" in notes
    cells = _findings_cells("sampler_mismatch", "fresh > none_k16")
    kl = {c: re.search(r"mismatch/kl on `none_k16` ([0-9.]+)", cells[c]).group(1)
          for c in ("reasoning-gym LM (spell_backward)", "reasoning-gym LM (spell_backward_slow)")}
    assert "**equivalent within ±0.031**" in cells["reasoning-gym LM (spell_backward_slow)"]
    assert (f"KL {float(kl['reasoning-gym LM (spell_backward_slow)']):.2g} nats a token where it was "
            f"{kl['reasoning-gym LM (spell_backward)']}") in notes
    k4 = _findings_cells("sampler_mismatch", "fresh > none_k4")["reasoning-gym LM (spell_backward_slow)"]
    assert k4.startswith("**not exercised**: mismatch/kl on `none_k4` 0.000149") and "(KL 0.00015)" in notes


def test_the_fp32_head_notes_quote_the_head_gap_csv_and_the_runs():
    """FINDINGS_notes' fp32_head paragraph: the gaps at each start are scripts/head_gap.py's (its CSV), and the
    arithmetic LM's are the runs' own mismatch/k3 (per run the mean over steps, then over seeds, as the
    mechanism rule reads it)."""
    notes = " ".join((ROOT / "results/FINDINGS_notes.md").read_text().split())
    para = notes[notes.index("**fp32_head —"):notes.index("**Starts:")]
    gap = pd.read_csv(ROOT / "results/smollm2_start/head_gap.csv")
    amd = gap[gap.machine.str.startswith("AMD")].set_index(["preset", "arm"])["mismatch/k3"]
    for key in [("smollm2_countdown_warm", "bf16_head"), ("smollm2_arithmetic", "bf16_head")]:
        assert f"{amd[key]:.2e}" in para, key
    # the rest are the first machine's rows (an Intel Xeon); a gap measured again elsewhere is added, not replaced
    gap = gap.drop_duplicates(["preset", "arm"]).set_index(["preset", "arm"])["mismatch/k3"]
    for key in [("countdown", "bf16_head"), ("spell_backward", "bf16_head"), ("smollm2_arithmetic", "bf16_head"),
                ("smollm2_arithmetic", "fp32_head"), ("smollm2_arithmetic", "bf16_sampler"),
                ("smollm2_arithmetic", "fp16_sampler"), ("arithmetic_scratchpad", "bf16_sampler"),
                ("arithmetic_scratchpad", "fp16_sampler")]:
        assert f"{gap[key]:.2e}" in para, key
    m = pd.read_parquet(ROOT / "results/fp32_head_lm/metrics.parquet")
    k3 = m[m.metric == "mismatch/k3"].groupby(["variant", "run"]).value.mean().groupby("variant").mean()
    assert f"gap of {k3['bf16_head']:.2e} nats" in para and f"cuts it to {k3['fp32_head']:.2e}" in para
    acc = pd.read_csv(ROOT / "results/fp32_head_lm/summary.csv").groupby("variant")["final/eval/accuracy"].mean()
    assert f"({acc['fp32_head']:.3f} against {acc['bf16_head']:.3f})" in para
    # SmolLM2 on the H200: the same rule's gap per variant, the paired accuracy difference, fp16's own mismatch/kl
    gpu = ROOT / "results/gpu"
    m = pd.read_parquet(gpu / "fp32_head_smollm2/metrics.parquet")
    k3 = m[m.metric == "mismatch/k3"].groupby(["variant", "run"]).value.mean().groupby("variant").mean()
    assert f"leaves {k3['bf16_head']:.2e} nats a token over training, the fp32 head {k3['fp32_head']:.2e}" in para
    s = pd.read_csv(gpu / "fp32_head_smollm2/summary.csv").pivot(index="seed", columns="variant",
                                                                   values="final/eval/accuracy")
    assert f"accuracy moves by {(s.fp32_head - s.bf16_head).mean():+.3f}" in para
    m = pd.read_parquet(gpu / "sampler_mismatch_smollm2/metrics.parquet")
    kl = m[m.metric == "mismatch/kl"].groupby(["variant", "run"]).value.mean().groupby("variant").mean()
    assert f"fp16 half's gap, {kl['fp16']:.2e} (mismatch/kl)" in para
    assert (pd.read_csv(gpu / "sampler_mismatch_smollm2/summary.csv").query("variant == 'bf16'").status != "ok").all()


def test_statistics_counts_of_v3_plateau_rows_and_df_jumps_are_findings():
    """docs/statistics.md quotes two counts of rule_changes' replay (FINDINGS' v4 section); a rerun that moves
    them (the lm reruns on all 1,000 problems moved the plateau count 64 -> 58) must move the doc too."""
    findings = " ".join((ROOT / "results/FINDINGS.md").read_text().split())
    stats = " ".join((ROOT / "docs/statistics.md").read_text().split())
    plateau = re.search(r"rows at a plateau: (\d+) under v3", findings).group(1)
    jumps = re.search(r"In (\d+) crossed rows the seed term's estimate was negative", findings).group(1)
    assert f"of its {plateau} plateau rows" in stats
    assert f"that happened in {jumps} crossed rows of the committed results" in stats


def test_the_default_recipe_on_countdown_is_the_same_bits_in_three_sweeps():
    """countdown's default recipe ran under three names in three sweeps, two CPU generations and three sessions
    (sampler_mismatch's fresh, ref_policy's no_kl, adv_norm's group_std_seq); reliability.md says they are one run
    each seed: every logged value but the clocks and every held-out answer the same bits."""
    import pandas as pd
    same = {"sampler_mismatch_countdown": "fresh", "ref_policy_countdown": "no_kl", "adv_norm_countdown": "group_std_seq"}
    metrics, outcomes = {}, {}
    for d, v in same.items():
        m = pd.read_parquet(ROOT / "results" / d / "metrics.parquet").query("variant == @v")
        metrics[d] = m[~m.metric.str.startswith("time/")].astype({"metric": str})
        o = pd.read_parquet(ROOT / "results" / d / "outcomes.parquet").query("variant == @v")
        outcomes[d] = o.drop(columns=["run", "variant"]).sort_values(["seed", "step", "problem"]).reset_index(drop=True)
    shared = set.intersection(*(set(m.metric) for m in metrics.values()))
    assert {"loss/policy", "ratio/max", "grad/norm", "eval/accuracy"} <= shared
    key = ["seed", "step", "metric"]
    first, *others = [m[m.metric.isin(shared)][key + ["value"]].sort_values(key).reset_index(drop=True)
                      for m in metrics.values()]
    assert first.seed.nunique() == 10 and all(first.equals(m) for m in others)
    first, *others = outcomes.values()
    assert len(first) == 10 * 7 * 1000 and all(first.equals(o) for o in others)
    text = " ".join((ROOT / "docs/reliability.md").read_text().split())
    assert "(sampler_mismatch's `fresh`, ref_policy's `no_kl`, adv_norm's `group_std_seq`)" in text
    assert f"Their {first.seed.nunique()} seeds are the same bits" in text


def test_readme_findings_opening_says_where_each_gym_setting_ran():
    """'every claim but fp32_head also on both reasoning-gym tasks ... adv_norm and ref_policy on countdown at 10,
    first on an H100 and judged on their CPU reruns': the results directories and their sweeps say so."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    claims = {p.stem for p in (ROOT / "ablations").glob("*.yaml")} & {
        p.name.rsplit("_", 1)[0] for p in (ROOT / "results").glob("*_countdown")}
    gym = {c for c in claims if (ROOT / f"results/{c}_spell_backward").is_dir()}
    assert not (ROOT / "results/fp32_head_countdown").exists() and "fp32_head" not in gym and len(gym) == 9
    assert "every claim but `fp32_head` also on both reasoning-gym tasks" in readme
    toy = {c for c in {p.stem for p in (ROOT / "ablations").glob("*.yaml")} if (ROOT / f"results/{c}_sort").is_dir()}
    untestable = sorted(c for c in claims | {"fp32_head"} if c not in toy)
    assert (f"{len(toy)} of them on the toy too (20 seeds; the toy cannot test "
            f"`{untestable[0]}`, `{untestable[1]}` or `{untestable[2]}`)").replace("7 of", "seven of") in readme
    for c in ("adv_norm", "ref_policy"):
        meta = json.loads((ROOT / f"results/{c}_countdown/ablation.json").read_text())
        sweep = json.loads((ROOT / f"results/{c}_countdown/sweep.json").read_text())
        first = json.loads((ROOT / f"results/gpu/{c}_countdown/sweep.json").read_text())
        assert len(meta["seeds"]) == 10 and "gpu" not in sweep and sweep["cpu_paths"], c
        assert "H100" in first["gpu"], c
    assert ("`adv_norm` and `ref_policy` on countdown at 10, first on an H100 and judged on their CPU reruns" in readme)
