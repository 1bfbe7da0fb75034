"""docs/statistics.md's numbers, recomputed from the files they describe, or from the code's fixed-seed simulations.

Each test builds the phrase the page prints and looks for it with whitespace collapsed (the text wraps), so a
rerun that moves a number fails here until the page says the new one. Numbers the page marks as measured once
and not kept are not held.
"""
import json
import math
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as st

from grpo_bench import stats as S
from grpo_bench.analysis import mechanism, quantities as Q, rule_changes
from grpo_bench.store.metrics import odds_margin
from test_stats import _crossed_d, crossed_null, null_experiments, simulate  # the simulations the page reports

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PAIRS = [(0, 1), (0, 2), (1, 2)]  # the three orderings of a simulated claim


PAGE = " ".join((ROOT / "docs/statistics.md").read_text().split())


def says(phrase: str, source: str):
    assert phrase in PAGE, f"docs/statistics.md should say {phrase!r} ({source})"


def ok(d: str) -> pd.DataFrame:
    s = pd.read_csv(RESULTS / d / "summary.csv")
    return s[s.status == "ok"]


def metrics(d: str) -> pd.DataFrame:
    return pd.read_parquet(RESULTS / d / "metrics.parquet")


def task(d: str) -> dict:
    return json.loads((RESULTS / d / "ablation.json").read_text())["task"]


def ends(d: str, variant: str, column: str) -> tuple[float, float, int]:
    """(the curve's mean at step 0, the final mean, seeds) of a default-recipe run: v3's margin was 5% of the rise."""
    runs = ok(d)[lambda s: s.variant == variant]
    m = metrics(d)
    start = m[(m.variant == variant) & (m.metric == column.removeprefix("final/")) & (m.step == 0)].value.mean()
    return start, runs[column].mean(), len(runs)


def pct(x: Decimal) -> str:  # the table's 3-decimal numbers are exact, so round their ratio half up as by hand
    return f"{(100 * x).quantize(Decimal(1), ROUND_HALF_UP)}%"


# (row label, verdict column, the claim directory whose ablation.json records the task's margin, the default-recipe
# run it was measured on, where the table says so ({now}: today's mean where it has moved since), the v3 sentence)
MARGINS = [
    ("sorting toy", "final/eval/reward", "dapo_ladder_sort", "dapo_ladder_sort",
     "`sort_converge`, {n} seeds; results/dapo_ladder_sort `grpo` before its rerun on the pinned CPU path, which ends "
     "at {now}", "on the toy"),
    ("arithmetic LM", "final/eval/accuracy", "dapo_ladder_lm", "arithmetic_lora", "results/arithmetic_lora `grpo`",
     "on the arithmetic LM"),
    ("countdown", "final/eval/accuracy", "dapo_ladder_countdown", "countdown_grpo", "results/countdown_grpo",
     "on countdown"),
    ("spell_backward", "final/eval/accuracy", "dapo_ladder_spell_backward", "spell_backward_grpo",
     "results/spell_backward_grpo", "on spell_backward"),
    ("arithmetic LM, wide start", "final/eval/accuracy", "dapo_ladder_lm_wide", "dapo_ladder_lm_wide",
     "results/dapo_ladder_lm_wide `grpo`", "on lm_wide"),
]


@pytest.mark.parametrize("label, column, claim_dir, measured, where, named", MARGINS, ids=[m[0] for m in MARGINS])
def test_a_margin_table_row_is_its_tasks_record_and_its_runs(label, column, claim_dir, measured, where, named):
    t = task(claim_dir)
    end = float(re.search(r"at the (\d\.\d+) its default recipe ends at", t["margin_rule"]).group(1))
    start, now, n = ends(measured, "grpo", column)
    if "{now}" not in where:
        assert f"{now:.3f}" == f"{end:.3f}", f"results/{measured}: the default recipe ends at {now:.3f}, not {end}"
    v3, v4 = round(0.05 * (now - start), 3), odds_margin(end)
    assert v4 == t["margin"], claim_dir
    left = 1 - Decimal(f"{end:.3f}")
    says(f"| {label} | `{column}` | {end:.3f} ({where.format(n=n, now=f'{now:.3f}')}) | {v3:.3f} | {v4:.3f} | "
         f"{pct(Decimal(f'{v4:.3f}') / left)} |", f"results/{measured}/summary.csv, metrics.parquet")
    says(f"{pct(Decimal(f'{v3:.3f}') / left)} {named}", f"v3's margin over the errors left, results/{measured}")


def test_claim_margins_and_their_sources():
    kl = ok("kl_gradients_countdown")[lambda s: s.variant == "none"]["final/kl/seq"]
    lo, hi = st.t.interval(0.95, len(kl) - 1, kl.mean(), kl.sem())
    says(f"countdown {0.05 * kl.mean():.3f}, whose own 95% interval is {0.05 * lo:.3f}–{0.05 * hi:.3f}",
         "5% of `none` in results/kl_gradients_countdown/summary.csv")
    v3 = rule_changes.V3_CLAIM_MARGIN["kl_gradients"]
    says(f"its toy and LM numbers ({v3['sort']:g}, {v3['lm']:g})", "rule_changes.V3_CLAIM_MARGIN")
    m = yaml.safe_load((ROOT / "ablations/length_bias.yaml").read_text())["claim"]["margin"]
    sb, cd = (ok(d)["final/response/length_incorrect"].mean() for d in ("spell_backward_grpo", "countdown_grpo"))
    assert m["lm"] == m["spell_backward"]
    says(f"{m['lm']:g} tokens of incorrect-answer length on the arithmetic LM and spell_backward, "
         f"1/{round(sb / m['spell_backward'])} of the {sb:.0f} that the default recipe's incorrect completions "
         f"reach in results/spell_backward_grpo, and {m['countdown']:g} on countdown, "
         f"1/{round(cd / m['countdown'])} of the {cd:.0f} they reach in results/countdown_grpo",
         "ablations/length_bias.yaml and the two summary.csv")


def test_findings_numbers_are_the_findings_files():
    findings = (RESULTS / "FINDINGS.md").read_text()
    cell = re.search(r'headline cell counts them apart: "([^"]+)"', PAGE).group(1)
    assert cell in " ".join(findings.split()), f"results/FINDINGS.md has no cell {cell!r}"
    lines = findings.splitlines()
    i = next(i for i, l in enumerate(lines) if l.startswith("| `token_level > soft_punish`"))
    header = next(lines[j] for j in range(i, 0, -1) if lines[j].startswith("| ordering |")).split(" | ")
    lm = lines[i].split(" | ")[next(k for k, h in enumerate(header) if h.startswith("arithmetic LM (lm):"))]
    diff = re.search(r"final: Δ ([+-]\d\.\d+)", lm).group(1)
    says(f"`token_level > soft_punish`, {diff} against {task('dapo_ladder_lm')['margin']:g}", "results/FINDINGS.md")
    rules = (RESULTS / "FINDINGS_rules.md").read_text()
    plateaus = re.search(r"rows at a plateau: (\d+) under v3", rules).group(1)
    says(f"of its {plateaus} plateau rows", "results/FINDINGS_rules.md")
    jump = rules.split("**The df jump", 1)[1].split("\n\n")[1].splitlines()[2:]
    dfs = sorted({int(r.split(" | ")[3].split(",")[0]) for r in jump})
    says(f"({', '.join(f'{d:,}' for d in dfs[:-1])} or {dfs[-1]:,}): that happened in {len(jump)} crossed rows",
         "results/FINDINGS_rules.md, The df jump")
    exact = next(l for l in rules.splitlines() if l.startswith("| exact |")).strip("| ").split(" | ")[-2:]
    assert exact == ["0", "0"] and "no verdict moved: step *exact*" in PAGE, f"FINDINGS_rules.md step exact: {exact}"
    d = yaml.safe_load((ROOT / "ablations/dapo_ladder.yaml").read_text())["claim"]["mechanism"]
    clip = mechanism.read(mechanism.metrics_table(RESULTS / "dapo_ladder_lm"), d["clip_higher > overlong_filter"],
                          "clip_higher", "overlong_filter")
    says(f"whose 0.2 upper clip binds on {100 * clip:.3f}% of tokens", "results/dapo_ladder_lm/metrics.parquet")


def test_curves_fits_and_seeds_are_the_results():
    start, now, _ = ends("dapo_ladder_sort", "grpo", "final/eval/reward")
    curves = Q.run_curves(RESULTS / "ref_policy_sort", "eval/reward")
    rose = Q.second_half_move(curves, "frozen", [s for v, s in curves if v == "frozen"])
    says(f"the toy's frozen reference rose {rose:.4f} with δ {0.05 * (now - start):.3f}", "results/ref_policy_sort")
    half = re.compile(r"\| (\d+\.\d+) \((\d+\.\d+)\) \|$")  # a fit's "half budget: MAE (flat line)" cell
    toy = [a.parent.name for a in sorted(RESULTS.glob("*/ablation.json"))
           if (json.loads(a.read_text()).get("task") or {}).get("name") == "sort"]
    maes = np.array([m.groups() for d in toy for l in (RESULTS / d / "REPORT.md").read_text().splitlines()
                     if (m := half.search(l))], float)
    says(f"the fit's error is {maes[:, 0].min():.3f}–{maes[:, 0].max():.3f} reward against {maes[:, 1].min():.3f}–"
         f"{maes[:, 1].max():.3f} for the flat line", f"the half-budget cells of {len(toy)} toy REPORT.md")
    gain = {d: ok(d).groupby("variant")[[c, "final/samples"]].mean()
            for d, c in (("dapo_ladder_sort", "final/reward"), ("dapo_ladder_lm", "final/eval/accuracy"))}
    (ts, tr), (ls, lr) = [((g.loc["dynamic_sampling"] - g.loc["grpo"]).iloc[0],
                           (g.loc["dynamic_sampling"] / g.loc["grpo"]).iloc[1]) for g in gain.values()]
    says(f"(+{ts:.3f} toy sampled reward, +{ls:.3f} LM accuracy in results/dapo_ladder_sort and results/dapo_ladder_lm"
         f"), were bought with {tr:.1f}× and {lr:.1f}× the samples", "dapo_ladder_sort, dapo_ladder_lm summary.csv")
    seeds = [ok(a.parent.relative_to(RESULTS)).groupby("variant").seed.nunique() for a in
             sorted(RESULTS.glob("**/REPORT.md")) if "ΔA" in a.read_text() and (a.parent / "summary.csv").is_file()]
    says(f"200 resamples of {min(s.min() for s in seeds)}–{max(s.max() for s in seeds)} seeds", "REPORT.md with ΔA")


def test_evaluation_points_and_run_times_are_the_results():
    toy_points = metrics("dapo_ladder_sort")[lambda m: m.metric == "eval/reward"].groupby("run").size().unique()
    says(f"the toy evaluates every 50 rollouts ({toy_points.item()} points)", "results/dapo_ladder_sort")
    for d in ("dapo_ladder_lm", "dapo_ladder_lm_wide", "dapo_ladder_countdown", "dapo_ladder_spell_backward",
              "gpu/dapo_ladder_lm_acts"):
        o = pd.read_parquet(RESULTS / d / "outcomes.parquet")
        steps, problems = sorted(o.step.unique()), o.groupby(["run", "step"]).problem.nunique().groupby("step").max()
        points = f"{steps[0]}, {steps[1]}, {steps[2]}, …, {steps[-1]};"
        if d.endswith("lm_acts"):
            assert set(problems) == {1000} and len(steps) == 7, d
            says(f"`lm_acts`'s {(steps[-1] + 1) // 30} inner steps: {points}", f"results/{d}/outcomes.parquet")
        else:   # every dapo_ladder setting rerun with every evaluation on all its problems (statistics.md names them)
            assert set(problems) == {1000} and len(steps) == 7, d
            says(f"`eval_every: 5`: {len(steps)} points (steps {points}", f"results/{d}/outcomes.parquet")
            says("the `lm` settings of adv_norm, aggregation, length_bias, dapo_ladder,", d)
    # the last setting rerun without a mid-run subset (tests/test_findings.py MID_RUN_SUBSET is empty)
    d = "sampler_mismatch_lm_wide"
    o = pd.read_parquet(RESULTS / d / "outcomes.parquet")
    steps, problems = sorted(o.step.unique()), o.groupby(["run", "step"]).problem.nunique().groupby("step").max()
    assert set(problems) == {1000} and len(steps) == 7, d
    says(f"scores all {problems.max():,} held-out problems at every evaluation", f"results/{d}/outcomes.parquet")
    says(f"every 5 of its 30 rollouts ({len(steps)} points) in the `lm`, `lm_wide`", d)
    for few in sorted(RESULTS.glob("*_lm_seed*")) + sorted(RESULTS.glob("*_spell_backward_slow")):
        o = pd.read_parquet(few / "outcomes.parquet")
        assert o.step.nunique() == 4 and set(o.groupby(["run", "step"]).problem.nunique()) == {1000}, few
    says("every 10 of 30 in the `lm_seed` settings and every 5 of 15 in `spell_backward_slow` (4 points each)",
         "the lm_seed and spell_backward_slow outcomes")
    says("and the `lm_wide` settings of dapo_ladder, policy_losses and sampler_mismatch.", d)
    # v3 read "levelled off" from the first mid-run point on: that point's share of the budget
    says(f'"levelled off by {(steps[1] + 1) / (steps[-1] + 1):.0%}" was just the first mid-run', d)
    step = metrics("arithmetic_lora")[lambda m: m.metric == "time/step_s"].value.median()
    says(f"about {60 * step:.0f} s there ({step:.2f} s a step in `results/arithmetic_lora`", "its metrics.parquet")
    says(f"53 s of the {ok('arithmetic_lora').wall_s.median():.0f} s a run takes", "results/arithmetic_lora")


def test_sequential_boundaries_and_the_toy_margin():
    five = S.obf_bounds((0.2, 0.4, 0.6, 0.8, 1.0), 0.05, True)
    says(f"({', '.join(f'{z:.3f}' for z in five)} for five equal looks", "stats.obf_bounds")
    says(f"a z of {five[0]:.1f} at a fifth of the cap", "stats.obf_bounds")
    one, two = S.obf_bounds((5 / 40, 10 / 40), 0.05, True)
    says(f"(boundary z = {two:.2f} at 10/40; at look 1 it is {one:.2f})", "stats.obf_bounds")
    says(f"equivalent within ±{task('dapo_ladder_sort')['margin']:g}: every paired difference", "the toy's margin")


def test_calibration_simulations():
    V = null_experiments(20_000, 8, np.random.default_rng(2027))  # as tests/test_stats.py draws them
    p = np.stack([st.ttest_rel(V[:, i], V[:, j], axis=1).pvalue for i, j in PAIRS], axis=1)
    holm = np.maximum.accumulate(np.sort(p, axis=1) * [3, 2, 1], axis=1)  # a row holds if its smallest clears
    says(f"is **{(holm < 0.05).any(axis=1).mean():.3f}** over 20,000 simulated experiments (α = 0.05; the same tests "
         f"unadjusted: {(p < 0.05).any(axis=1).mean():.3f})", "test_stats.null_experiments")
    (v3, v4), (s2, s2f), (p15, p15f) = [[crossed_null(sd, psd, floor) for floor in (False, True)]
                                        for sd, psd in ((0.01, 0.05), (0.02, 0.05), (0.01, 0.15))]
    says(f"| v3: drop the seed term | {v3[0]:.3f} | **{v3[1]:.3f}** |", "test_stats.crossed_null")
    says(f"| v4: floor it at MS_resid, S − 1 df | {v4[0]:.3f} | {v4[1]:.3f} |", "test_stats.crossed_null")
    says(f"(seed sd 0.02: {s2f[2]:.0%} of rows truncated) the floored test is still {s2f[1]:.3f} among truncated rows "
         f"(v3: {s2[1]:.3f}), and with a problem sd of 0.15, {p15f[1]:.3f} (v3: {p15[1]:.3f})", "crossed_null")
    says(f"conservative ({crossed_null(0.0, 0.05, True)[0]:.3f} overall)", "crossed_null")
    says(f"({s2f[1]:.3f} at twice the seed sd)", "crossed_null")
    rng, hits = np.random.default_rng(3), np.zeros(2)  # as test_the_interval_of_seeds_and_problems_covers... draws
    for _ in range(2000):
        p = 0.5 + rng.uniform(-0.03, 0.03, (5, 1)) + rng.uniform(-0.45, 0.45, (1, 200))
        r = S.crossed_variance((rng.random(p.shape) < p).astype(float))
        hits += [r["ci"][0] <= 0.5 <= r["ci"][1], r["ci_seeds"][0] <= 0.5 <= r["ci_seeds"][1]]
    says(f"seeds: {hits[0] / 2000:.1%} for seeds + problems, {hits[1] / 2000:.1%} for seeds only", "crossed_variance")


def test_crossed_rows_false_positive_simulation():
    rng, rejects, zero = np.random.default_rng(11), np.zeros(2), pd.Series(np.zeros(5))
    for _ in range(400):  # as test_crossed_rows_keep_the_false_positive_rate_for_new_problems draws
        D = _crossed_d(rng, 5, 200, 0.01, 0.3, 0.3)
        rejects += [S.compare_pairs({"a": pd.Series(D.mean(1)), "b": zero}, [("a", "b", None)], None,
                                    tables=t)[0]["p"] < 0.05 for t in (None, {("a", "b"): D})]
    says(f"seeds-only paired t rejects in {rejects[0] / 400:.0%}, the crossed test in {rejects[1] / 400:.1%}",
         "compare_pairs with and without the problems")


def test_sequential_null_rate_and_power():
    out, V, looks = simulate()
    naive = np.any([st.ttest_1samp((V[a] - V[b])[:, :n], 0, axis=1).pvalue < 0.05 / 3
                    for a, b in PAIRS for n in looks], axis=0)
    says(f"O'Brien–Fleming | **{np.any([np.isin(o, [-1, 1]) for o, _ in out], axis=0).mean():.4f}** (≤ α = 0.05) |"
         f" | no effect: the same looks with an uncorrected paired t at α/3 each | {naive.mean():.4f} |", "simulate()")
    for k, bold in ((0.5, True), (0.75, False)):
        (ab, at), _, _ = simulate(shift=k * 0.5 * math.sqrt(2))[0]
        used = np.where(at >= 0, np.array(looks)[np.maximum(at, 0)], 40)[ab == 1].mean()
        rate = f"**{(ab == 1).mean():.3f}**" if bold else f"{(ab == 1).mean():.3f}"
        assert (ab == -1).mean() == 0
        says(f"{rate} (a single test at 40 pairs, same level: {S.power(k, 40, 0.05 / 3):.3f}); never the wrong way; "
             f"{used:.1f} pairs on average when decided |" if bold else f"| {rate} ({used:.1f} pairs on average) |",
             f"simulate(shift={k} sd)")


def test_sequential_in_toy_units_on_the_page():
    def run(shift):
        out, _, looks = simulate(shift, sd_seed=0.02, sd_run=0.01, margin=0.02)
        assert np.all([~np.isnan(o) for o, _ in out]), "every ordering is decided"
        stop = np.max([np.where(at >= 0, np.array(looks)[np.maximum(at, 0)], 40) for _, at in out], axis=0)
        return out, stop.mean()

    out, stop = run(0.0)
    says(f"after {stop:.1f} seeds on average, as \"equivalent within ±0.02\" (an ordering in "
         f"{np.any([np.isin(o, [-1, 1]) for o, _ in out], axis=0).mean():.1%} of experiments)", "simulate() toy units")
    out, stop = run(0.02)
    says(f"after {stop:.1f} seeds, detected in {(out[0][0] == 1).mean():.2%}", "simulate() toy units")
    out, stop = run(0.01)
    assert (out[0][0] == -1).mean() == 0
    says(f"after {stop:.1f} seeds, {(out[0][0] == 1).mean():.0%} \"a > b\" and {(out[0][0] == 0).mean():.0%} "
         "\"equivalent within ±0.02\"", "simulate() toy units")
