"""REPORT.md for one ablation directory, from its files alone, and the figures it links (figures.py).

`python -m grpo_bench plot DIR [--format png|pdf|svg]` rebuilds everything here without training.
Differences between variants' per-seed final values are tested by grpo_bench.stats: paired
on per-seed differences where two variants share their seeds, Welch's t where they do not,
Holm-corrected over all pairs; "beyond seed noise" means p_holm < 0.05. Every pair also gets
its minimum detectable effect, a TOST equivalence test within the metric's margin and a
verdict; every variant its interquartile mean. Where the metrics hold samples/total, the
main curve's fit (ScaleRL's saturating curve against samples drawn) is tabled with its CIs.
"""
from __future__ import annotations

import itertools
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .. import stats
from ..store import metrics, rundir
from ..store.metrics import final_names, headline_columns, higher_is_better, main_column
from ..store.rundir import load, load_outcomes
from . import figdata, mechanism
from .figures import AXIS_LABEL, build_figures, curve_fits, offset_columns, repeated_columns
from .plotting import FORMATS, by_metric, label, label_column, save, style
from .quantities import same_problems

ALPHA = stats.ALPHA  # "beyond seed noise": p_holm below this


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def fits_section(fits: dict, tests: list[dict]) -> list[str]:
    """The fitted A, B, C_mid per variant with CIs and the half-budget check; where pairs differ, in A or B."""
    metric = fits["metric"]
    lines = ["## Curves against compute", "",
             f"The mean {label(metric)} over seeds fitted with ScaleRL's saturating curve R(C) = R0 + (A − R0) / "
             "(1 + (C_mid / C)^B): R0 is the mean at the first point, A the asymptote, B the efficiency exponent, "
             f"C_mid the compute at half the rise; 95% CIs from {stats.N_BOOT_FIT} refits on seeds resampled with "
             "replacement (variants that share seeds are resampled together). Half budget: the curve fitted on "
             "the first half of the compute predicts the second; its mean absolute error beside that of a flat "
             "line at the first half's last fifth (a fit that does not beat the flat line predicts nothing). A fit "
             "that cannot be read as an asymptote and an efficiency says why instead of printing numbers."]
    if fits["per_step"]:
        lines[-1] += (f" Samples drawn are proportional to gradient steps here ({_num(fits['per_step'])} per step): "
                      f"against steps A and B are the same and C_mid is divided by {_num(fits['per_step'])}.")
    for axis, per in fits["axes"].items():
        lines += ["", f"Against {AXIS_LABEL[axis]}:", "",
                  "| variant | R0 | A [95% CI] | B [95% CI] | C_mid [95% CI] | half budget: MAE (flat line) |",
                  "|---|---:|---|---|---|---|"]
        for v, f in per.items():
            h = f["half"]
            half = (f"{h['mae']:.3f} ({h['flat_mae']:.3f})" if h["ok"] else
                    "—" if not f["ok"] and h["reason"].split(":")[0] == f["reason"].split(":")[0] else f"— ({h['reason']})")
            if f["ok"]:
                ci = f["ci"]
                lines.append(f"| `{v}` | {f['r0']:.3f} | {_ci(f['A'], *ci['A'])} | {f['B']:.2f} [{ci['B'][0]:.2f}, "
                             f"{ci['B'][1]:.2f}] | {_num(f['C_mid'])} [{_num(ci['C_mid'][0])}, {_num(ci['C_mid'][1])}] "
                             f"| {half} |")
            else:
                lines.append(f"| `{v}` | {f['r0']:.3f} | {f['reason']} | | | {half} |")
    per = fits["axes"]["samples"]
    final = {frozenset((t["a"], t["b"])): t for t in tests}
    found, n_pairs = [], 0
    for a, b in itertools.combinations(per, 2):
        c = stats.compare_fits(per[a], per[b])
        if c is None:
            continue
        n_pairs += 1
        t = final.get(frozenset((a, b)))
        where = [k for k in ("A", "B") if c[k][3]]
        if not where and not (t and t["significant"]):
            continue
        lies = {("A",): "in the asymptote A", ("B",): "in the efficiency B", ("A", "B"): "in both A and B"}.get(
            tuple(where), "in neither A nor B resolved by these seeds")
        fv = f"final value {stats.verdict_text(t)}" if t and t["significant"] else "final values within noise"
        found.append(f"- `{a}` vs `{b}`: {fv}; ΔA {_ci(*c['A'][:3], True)}, ΔB {c['B'][0]:+.2f} "
                     f"[{c['B'][1]:+.2f}, {c['B'][2]:+.2f}]: the difference lies {lies}.")
    if n_pairs == 0:
        return lines + ["", "Fewer than two variants have a fit: none to compare on A and B.", ""]
    lines += ["", f"Where two fitted variants differ (final value beyond seed noise, or a 95% CI of ΔA = A_a − A_b "
              f"or ΔB excluding 0; uncorrected over {n_pairs} pairs), against samples drawn:", ""]
    lines += found or ["No pair of fitted variants differs in final value, A or B."]
    return lines + [""]




def render(out: str | Path, fmt: str = "png") -> tuple[str, list[tuple[str, object]]]:
    """REPORT.md's text and its figures as (file name, Figure), from the directory's files; nothing is
    written. The text holds each figure's data digest (figdata), so it alone says whether a committed
    figure is what this code draws."""
    out = Path(out)
    if fmt not in FORMATS:
        raise ValueError(f"format: {fmt!r}; valid: {', '.join(FORMATS)}")
    meta, summary, table = load(out)
    ok = summary[summary.status == "ok"]
    outcomes = load_outcomes(out)
    curves = by_metric(same_problems(table, outcomes))
    fits = curve_fits(meta, curves)
    figures = [(f"{stem}.{fmt}", caption, fig) for stem, fig, caption in build_figures(out, fits)]
    text = _markdown(meta, summary, ok, headline_columns(summary, meta), meta["variants"],
                     [(name, caption, figdata.note(name, fig)) for name, caption, fig in figures], fits,
                     outcomes, eval_points_text(curves), mechanism.report_section(meta, out))
    return text, [(name, fig) for name, _, fig in figures]


def make_report(out: str | Path, fmt: str = "png") -> Path:
    out = Path(out)
    before = _linked_figures(out / "REPORT.md")
    text, figures = render(out, fmt)
    with style():
        for name, fig in figures:
            save(fig, out, Path(name).stem, fmt)
    tmp = out / f".REPORT.md.tmp-{os.getpid()}"  # whole or not at all: a full disk keeps the last report
    try:
        tmp.write_text(text)
        os.replace(tmp, out / "REPORT.md")
    finally:
        tmp.unlink(missing_ok=True)
    # a figure the last report drew and this one does not (a metric no longer declared) would stay
    # beside the results as if current; the report's own figures are the ones its REPORT.md linked
    for stale in before - {name for name, _ in figures}:
        (out / stale).unlink(missing_ok=True)
    return out / "REPORT.md"


def _linked_figures(report: Path) -> set[str]:
    if not report.exists():
        return set()
    return set(re.findall(r"!\[[^\]]*\]\(([\w.-]+\.(?:png|pdf|svg))\)", report.read_text()))


# ----------------------------------------------------------------------- significance


def groups_of(summary: pd.DataFrame, column: str, order: list[str]) -> dict[str, pd.Series | np.ndarray]:
    """Per variant with two or more finished seeds: its values, a Series by seed where seeds are known
    (two variants that share them are then compared seed by seed), else a bare array."""
    ok = summary[(summary.status == "ok") & summary[column].notna()] if column in summary else summary.iloc[:0]
    out = {}
    for v in order:
        g = ok[ok.variant == v]
        if len(g) >= 2:
            x = g[column].to_numpy(float)
            out[v] = pd.Series(x, index=g["seed"].to_numpy()) if "seed" in g else x
    return out


def column_margin(column: str, meta: dict | None = None, summary: pd.DataFrame | None = None) -> tuple[float | None, str]:
    """The equivalence margin of a summary column: the claim's, else the task's on its verdict metric, else
    the metric's own (metrics.claim_margin; a ratio margin is FINDINGS' only). summary: to know the task of
    results that did not record it."""
    meta = meta or {}
    task = metrics.task_of(meta, final_names(summary) if summary is not None else ())
    return metrics.claim_margin(meta.get("claim"), meta.get("setting"), column, task)


def pairwise(summary: pd.DataFrame, column: str, order: list[str], meta: dict | None = None,
             claimed: bool = False) -> list[dict]:
    """Every pair of variants on one final metric (stats.compare_pairs), Holm-corrected over all pairs,
    with the margin of the ablation's claim or the metric's default. claimed: only the pairs the claim's
    orderings name, where it has any that ran here (a > b read as a vs b)."""
    groups = groups_of(summary, column, order)
    pairs = [(a, b, None) for a, b in itertools.combinations(groups, 2)]
    if claimed and claim_pairs(meta, groups):
        pairs = claim_pairs(meta, groups)
    return stats.compare_pairs(groups, pairs, column_margin(column, meta, summary)[0])


def claim_pairs(meta: dict | None, groups) -> list[tuple[str, str, None]]:
    """The pairs of the claim's orderings whose variants both ran, in the claim's order, each once."""
    out = []
    for o in ((meta or {}).get("claim") or {}).get("expect") or []:
        a, b, _ = stats.split_ordering(o)
        if a in groups and b in groups and (a, b, None) not in out:
            out.append((a, b, None))
    return out


def answer(summary: pd.DataFrame, column: str, order: list[str], meta: dict | None = None) -> str:
    """One line from the data: the best variant, whom it beats beyond noise, how many pairs differ."""
    ok = summary[(summary.status == "ok")]
    if column not in ok or ok[column].isna().all():
        return "no finished runs."
    means = ok.groupby("variant")[column].agg(["mean", "std", "count"]).reindex([v for v in order if v in set(ok.variant)])
    sign = 1 if higher_is_better(column, meta) else -1
    best = (sign * means["mean"]).idxmax()
    b = means.loc[best]
    tests = pairwise(summary, column, order)
    beaten = [t for t in tests if t["significant"] and best in (t["a"], t["b"])
              and sign * (t["mean_a"] - t["mean_b"]) * (1 if t["a"] == best else -1) > 0]
    others = len(means) - 1
    if others == 0:   # a default-recipe run: there is no other variant to beat, whatever the seeds
        return (f"`{best}` alone ({label_column(column)} {_fmt(b['mean'], b['std'])}, {int(b['count'])} seeds): "
                "one variant, nothing to compare.")
    line = f"`{best}` is best ({label_column(column)} {_fmt(b['mean'], b['std'])}, {int(b['count'])} seeds)"
    if not tests:
        return line + "; too few seeds to test differences."
    if not beaten:
        line += f", but not beyond seed noise above {'the other' if others == 1 else f'any of the {others} others'}"
    elif len(beaten) == others:
        line += ", beyond seed noise above " + {1: "the other", 2: "both others"}.get(others, f"all {others} others")
    else:
        losers = sorted((t["b"] if t["a"] == best else t["a"] for t in beaten), key=order.index)
        line += f", beyond seed noise above {len(beaten)} of {others} others ({', '.join(f'`{v}`' for v in losers)})"
    sig = [t for t in tests if t["significant"]]
    same = sum(t["verdict"] == stats.NOT_TESTABLE for t in tests)
    line += f"; {len(sig)} of {len(tests) - same} pairs differ beyond seed noise"
    if 0 < len(sig) <= 3 and len(sig) < len(tests):  # few enough to name, in the ablation's order
        pairs = sorted(((t["a"], t["b"]) if t["mean_a"] > t["mean_b"] else (t["b"], t["a"]) for t in sig),
                       key=lambda p: (order.index(p[0]), order.index(p[1])))
        line += " (" + ", ".join(f"`{hi}` > `{lo}`" for hi, lo in pairs) + ")"
    if same:
        line += f"; {same} pair{'s' * (same > 1)} ran the same numbers (not testable)"
    return line + "."


def _fmt(mean: float, std: float) -> str:
    if math.isnan(mean):
        return "—"
    std = 0.0 if math.isnan(std) else std
    if 0 < abs(mean) < 5e-4:
        # a bf16 sampler's KL (~5e-5) against an fp16 one's (~1e-6) would both print 0.000
        return f"{mean:.2e} ± {std:.1e}"
    return f"{mean:.3f} ± {std:.3f}"


def _ci(value: float, lo: float, hi: float, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    if 0 < max(abs(value), abs(lo), abs(hi)) < 5e-4 or (not signed and 0 < abs(value) < 5e-4):
        # three decimals leave a sampler KL of 1e-5 at 0.000 [0.000, 0.000] and one of 4.5e-4 at 0.000 [0.000, 0.001]
        f = "{:+.2e}" if signed else "{:.2e}"
    return f"{f.format(value)} [{f.format(lo)}, {f.format(hi)}]"


def method_text() -> str:
    """How every row of a pairs table is tested, in one paragraph (REPORT.md and COMPARE.md)."""
    return (f"Pairs are tested on per-seed final values, Holm-corrected over the pairs of a table at α = {stats.ALPHA}. "
            "Two variants that ran the same seeds are compared seed by seed on the differences a − b (ρ: their "
            f"correlation across seeds): paired t below {stats.N_PERM} pairs, a sign-flip permutation test from "
            f"{stats.N_PERM} (every sign pattern up to {stats.EXACT_MAX} pairs); Welch's t where the seeds differ. "
            "Δ's interval is the one its verdict used: TOST's for an equivalent pair, else the t interval at "
            "the level Holm adjusted its p to (labelled). MDE: the smallest |Δ| the test detects with "
            f"{stats.POWER:.0%} power at the level Holm compared its p with. *Equivalent*: two one-sided tests "
            "(TOST, Holm-corrected) put Δ within ± the margin; a difference beyond seed noise that TOST also puts "
            "within it is *negligible*, and one whose interval reaches inside it without TOST passing is of *size "
            "unclear*. Two variants whose every paired difference is exactly 0 are not "
            "testable and stay out of Holm. *Undecided* gives the seeds that would decide it "
            f"with {stats.POWER:.0%} power if Δ were as observed, by detecting Δ or by showing it within the margin, "
            "whichever needs fewer. P(a > b): the chance that a seed of a beats a seed of b (ties count ½), "
            "95% bootstrap CI; IQM: the interquartile mean, 95% bootstrap CI (both as rliable defines them).")


def sequential_text(meta: dict) -> str:
    """One sentence on how `run --seeds auto:N` chose the seeds (ablation.json's `sequential`, runner.run_sequential)."""
    seq = meta["sequential"]
    how = {"decided": "stopped because every ordering was decided", "cap": "stopped at the cap, orderings undecided",
           "failed": "stopped because runs failed", "interrupted": "was interrupted",
           "error": "ended with an error"}.get(seq.get("stopped"), "has not stopped yet")
    return (f"Seeds were chosen sequentially (`--seeds auto:{seq['cap']}`): after each batch of {seq['batch']}, a paired "
            f"test of every ordering on `{seq.get('metric') or 'the main metric'}` with O'Brien–Fleming-type alpha "
            f"spending over the looks and α/{seq['orderings']} per ordering (Bonferroni); the sweep {how} at "
            f"{len(meta['seeds'])} seeds (sweep.json has each decision); the fixed-sample tests below ignore that "
            "stopping rule.")


def pair_rows(tests: list[dict], groups: dict) -> list[str]:
    """The pairs table: test, Δ with its CI, Holm p, detectable effect or margin, P(a > b), verdict."""
    lines = ["| pair | test | Δ = a − b [the interval its verdict used] | p_holm | detectable / margin "
             "| P(a > b) [95% CI] | verdict |", "|---|---|---|---:|---|---|---|"]
    for t in tests:
        poi = stats.prob_improvement_ci(np.asarray(groups[t["a"]], float), np.asarray(groups[t["b"]], float))
        p = "—" if math.isnan(t["p_holm"]) else f"{t['p_holm']:.2g}"
        lines.append(f"| `{t['a']}` vs `{t['b']}` | {stats.which_test(t)} | {stats.interval_text(t)} "
                     f"| {p} | {stats.power_text(t)} | {_ci(*poi)} | {stats.verdict_text(t)} |")
    return lines


def variant_rows(groups: dict) -> list[str]:
    lines = ["| variant | seeds | mean [95% CI] | IQM [95% CI] |", "|---|---:|---|---|"]
    for v, x in groups.items():
        x = np.asarray(x, float)
        lines.append(f"| `{v}` | {len(x)} | {_ci(*stats.mean_ci(x))} | {_ci(*stats.iqm_ci(x))} |")
    return lines


def judged_column(meta: dict | None) -> str | None:
    """The summary column a claim is judged on (its metric, else its task's verdict metric); None without a claim."""
    claim = (meta or {}).get("claim") or {}
    if not claim.get("expect"):
        return None
    metric = claim.get("metric") or ((meta or {}).get("task") or {}).get("verdict_metric")
    return None if not metric else metric if metric.startswith("final/") else f"final/{metric}"


def differences_section(summary: pd.DataFrame, column: str, name: str, order: list[str], meta: dict) -> list[str]:
    lines = [f"## Differences in {name}", ""]
    groups = groups_of(summary, column, order)
    judged = judged_column(meta)
    if judged is not None and column != judged and claim_pairs(meta, groups):
        # a claim is judged on one metric: the others' seeds are summarised, their pairs not tested again
        return lines + [f"The claim is judged on `{judged}`: its orderings are tested there. Here each variant's "
                        "seeds:", ""] + variant_rows(groups) + [""]
    margin, source = column_margin(column, meta, summary)
    tests = pairwise(summary, column, order, meta, claimed=True)
    if not tests:
        return lines + ["Not enough finished runs (two seeds per variant) to compare.", ""]
    within = f"±{margin:g} ({source})" if margin is not None else f"none ({source}): no equivalence test"
    # a claim's report tests the pairs its claim asks about (as FINDINGS does), not every pair of its variants:
    # 55 pairs of 11 variants would bury the orderings in Holm and in rows nobody's claim is about
    which = (" (the claim's orderings, the pairs FINDINGS reads; every run's value of every variant is in "
             "summary.csv)") if claim_pairs(meta, groups) else ""
    lines += [f"{len(tests)} pair{'s' * (len(tests) != 1)}{which}, Holm-corrected together; equivalence margin "
              f"{within}.", ""] + variant_rows(groups) + [""] + pair_rows(tests, groups)
    outcomes = [t["outcome"] for t in tests]
    sig = sum(t["significant"] for t in tests)
    small = sum(o.endswith("negligible") for o in outcomes)
    unclear = sum(o.endswith(stats.UNCLEAR) for o in outcomes)
    apart = outcomes.count(stats.NOT_TESTABLE)
    lines += ["", f"Beyond seed noise: {sig} of {len(tests) - apart}" + (f" ({small} of them negligible: within "
              "the margin)" if small else "") + (f" ({unclear} of size unclear: the interval reaches inside the "
              "margin)" if unclear else "") + f"; equivalent within the margin: {outcomes.count('equivalent')}; "
              f"undecided: {outcomes.count('undecided')}"
              + (f"; not testable (every paired difference exactly 0): {apart}" if apart else "") + ".", ""]
    return lines


def final_outcomes(outcomes: pd.DataFrame, ok: pd.DataFrame, order: list[str]) -> dict[str, np.ndarray]:
    """Per variant with finished runs: its (seeds, problems) greedy outcomes at each run's last evaluation (the
    final one, on every held-out problem), on the problems every one of its runs was scored on."""
    o = outcomes[outcomes.run.astype(str).isin(set(ok.run.astype(str)))]
    last = o.groupby("run", observed=True).step.transform("max")
    o = o[o.step == last]
    out = {}
    for v in order:
        g = o[o.variant.astype(str) == v]
        if len(g):
            table = g.pivot_table(index="run", columns="problem", values="greedy", aggfunc="first", observed=True)
            out[v] = table.dropna(axis=1).to_numpy(float)
    return out


def seeds_problems_section(outcomes: pd.DataFrame, ok: pd.DataFrame, order: list[str]) -> list[str]:
    """REPORT.md's split of the variance of each variant's final held-out accuracy between seeds and problems."""
    rows = []
    for v, Y in final_outcomes(outcomes, ok, order).items():
        r = stats.crossed_variance(Y)
        if r is None:
            continue
        sh = r["share"]
        rows.append(f"| `{v}` | {r['seeds']} | {r['problems']} | {r['mean']:.3f} | {sh['seeds']:.0%} | "
                    f"{sh['problems']:.0%} | {sh['residual']:.0%} | [{r['ci_seeds'][0]:.3f}, {r['ci_seeds'][1]:.3f}] "
                    f"| [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] ({r['df']:.0f} df) |")
    if not rows:
        return []
    return ["## Seeds and problems", "",
            "Final held-out greedy accuracy from each run's per-problem outcomes (outcomes.parquet), every seed "
            "scored on the same problems. The variance of a variant's mean accuracy splits into seeds "
            "(σ²_seed / S), problems (σ²_problem / J: which problems the held-out set happens to hold) and "
            "seed × problem (σ²_resid / (S J): the interaction and each answer's coin), estimated as a crossed "
            "random-effects model (ANOVA estimators of the seeds × problems table, a negative one set to 0; "
            "`stats.crossed_variance`); the columns give each part's share. *Seeds only*: the interval for this "
            "held-out set (the one above, t on S − 1); *seeds + problems*: for new problems from the same "
            "generator, t on Satterthwaite's degrees of freedom.", "",
            "| variant | seeds | problems | accuracy | seeds' share | problems' share | seed × problem "
            "| 95% CI, seeds only | 95% CI, seeds + problems |", "|---|---:|---:|---:|---:|---:|---:|---|---|",
            *rows, ""]


def eval_points_text(curves: dict) -> str:
    """A sentence where mid-run evaluations scored a subset of the held-out problems (the task's eval_subset,
    logged as eval/problems); '' where every evaluation scored them all."""
    m = curves.get("eval/problems")
    if m is None or m.value.nunique() < 2:
        return ""
    small, every = f"{m.value.min():,.0f}", f"{m.value.max():,.0f}"
    return (f"Mid-run evaluations score the first {small} of the {every} held-out problems (the task's "
            f"eval_subset), those at step 0 and at the end all of them: so that no curve joins two problem sets, the "
            f"curves here are on those {small}, accuracy and its gain at every evaluation from each problem's "
            f"outcome (the ends included), the other held-out metrics at the mid-run points alone; final values "
            f"and verdicts are on all {every}.")


def _markdown(meta, summary, ok, headline, order, figures, fits: dict | None = None,
              outcomes: pd.DataFrame | None = None, eval_note: str = "", mechanism_lines: list[str] = ()) -> str:
    n_failed = int((summary.status != "ok").sum())
    lines = [f"# Ablation: {meta['name']}", ""]
    if meta.get("description"):
        lines += [meta["description"], ""]
    lines += [f"Source `{meta['source']}`; seeds {meta['seeds']}; {len(ok)} runs finished, {n_failed} failed, "
              f"{len(meta['runs']) - len(summary)} not run. Rebuild with `python -m grpo_bench plot <this directory>`.", "",
              *([sequential_text(meta), ""] if meta.get("sequential") else []),
              *([f"**Note:** {note}.", ""] if (note := rundir.schedule_note(summary)) else []),
              "Final reward = mean rollout reward over the last 10% of epochs. Eval metrics are on a held-out set at the "
              "end of training: accuracy and reward of greedy answers, pass@k of k sampled ones; accuracy gain is over the "
              "starting policy. Cells are mean ± std over seeds." + (f" {eval_note}" if eval_note else ""), "",
              "## Results", ""]
    head = ["variant", "runs ok"] + [name for _, name, _ in headline] + ["wall s / run"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in order:
        g = ok[ok.variant == v]
        n_all = int((summary.variant == v).sum()) if len(summary) else 0
        cells = [f"`{v}`", f"{len(g)}/{n_all}"]
        for column, _, _ in headline:
            x = g[column].astype(float) if column in g else pd.Series(dtype=float)
            cells.append(_fmt(x.mean(), x.std(ddof=1)) if len(x) else "—")
        cells.append(f"{g.wall_s.mean():.1f}" if len(g) else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += list(mechanism_lines)
    if headline and len(ok):
        lines += ["## How variants are compared", "", method_text(), ""]
    same = repeated_columns(ok, headline)
    for column, name, _ in headline:
        if column in offset_columns(headline):
            continue  # another column shifted by a constant: the same differences again
        if column in same:  # a 0/1 reward's mean is the accuracy: its tables would be those again
            lines += [f"## Differences in {name}", "", f"Equal to {same[column]} on every run: the same differences.", ""]
            continue
        lines += differences_section(summary, column, name, order, meta)
    if outcomes is not None and len(ok):
        lines += seeds_problems_section(outcomes, ok, order)
    if fits:
        main = main_column(summary, meta)
        lines += fits_section(fits, pairwise(summary, main, order, meta) if main else [])
    failed = summary[summary.status != "ok"] if len(summary) else summary
    if len(failed):
        lines += ["## Failed runs", "", "| run | error |", "|---|---|"]
        lines += [f"| `{r.run}` | {str(r.error).replace('|', '/')} |" for r in failed.itertuples()]
        lines.append("")
    if figures:
        lines += ["## Plots", ""]
        for name, caption, data in figures:
            lines += [f"![{caption}]({name})", data, "", f"*{caption}*", ""]
    return "\n".join(lines)
