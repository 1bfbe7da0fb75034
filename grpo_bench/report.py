"""Plots and REPORT.md for one ablation directory, drawn from its files alone.

`python -m grpo_bench plot DIR` rebuilds everything here without training.
Curves are mean +- 95% Student-t confidence interval over seeds; "beyond seed
noise" means a Welch t-test between two variants' per-seed final values with
p < 0.05 after Holm's correction over all pairs compared.
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: reports are files, not windows
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from scipy import stats  # noqa: E402

ALPHA = 0.05
# (summary column, label, metric whose curve is drawn)
HEADLINE = [
    ("final/reward", "final reward", "reward/mean"),
    ("final/eval/accuracy", "eval accuracy", "eval/accuracy"),
    ("final/eval/accuracy_gain", "eval accuracy gain", "eval/accuracy_gain"),
    ("final/eval/reward", "eval reward", "eval/reward"),
    ("final/eval/pass@k", "eval pass@k", "eval/pass@k"),
]
DIAGNOSTICS = ["clip/frac", "kl/value", "entropy", "ratio/max", "kl/old", "grad/norm"]


def _ci95(values: np.ndarray) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    return float(stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / math.sqrt(n))


def curve_table(metrics: pd.DataFrame, metric: str, order: list[str]) -> pd.DataFrame:
    """Per variant and step: mean and 95% CI over seeds of one metric, lightly smoothed per run."""
    m = metrics[metrics.metric == metric].sort_values("step")
    if m.empty:
        return m
    n_steps = m.step.nunique()
    window = max(1, n_steps // 40)
    m = m.assign(value=m.groupby("run").value.transform(lambda v: v.rolling(window, min_periods=1).mean()))
    g = m.groupby(["variant", "step"]).value
    out = g.agg(["mean", "count"]).reset_index()
    out["ci"] = g.apply(lambda v: _ci95(v.to_numpy())).to_numpy()
    out["variant"] = pd.Categorical(out.variant, [v for v in order if v in set(out.variant)])
    return out.sort_values(["variant", "step"])


def _plot_curves(ax, table: pd.DataFrame, palette: dict) -> None:
    for variant, t in table.groupby("variant", observed=True):
        c = palette[variant]
        ax.plot(t.step, t["mean"], color=c, label=variant, lw=1.6)
        ax.fill_between(t.step, t["mean"] - t.ci, t["mean"] + t.ci, color=c, alpha=0.2, lw=0)


def pairwise(summary: pd.DataFrame, column: str, order: list[str]) -> list[dict]:
    """Welch t-tests between every pair of variants on one final metric, Holm-corrected."""
    ok = summary[(summary.status == "ok") & summary[column].notna()]
    groups = {v: ok[ok.variant == v][column].to_numpy(float) for v in order}
    groups = {v: x for v, x in groups.items() if len(x) >= 2}
    tests = []
    for a, b in itertools.combinations(groups, 2):
        x, y = groups[a], groups[b]
        if x.std() == 0 and y.std() == 0:
            p = 0.0 if x.mean() != y.mean() else 1.0  # no seed noise at all
        else:
            p = float(stats.ttest_ind(x, y, equal_var=False).pvalue)
        tests.append({"a": a, "b": b, "mean_a": x.mean(), "mean_b": y.mean(), "p": p})
    # Holm: compare the k-th smallest p with alpha / (m - k)
    tests.sort(key=lambda t: t["p"])
    m, running = len(tests), 0.0
    for k, t in enumerate(tests):
        running = max(running, min(1.0, (m - k) * t["p"]))
        t["p_holm"] = running
        t["significant"] = running < ALPHA
    return tests


def _fmt(mean: float, std: float) -> str:
    return "—" if math.isnan(mean) else f"{mean:.3f} ± {0.0 if math.isnan(std) else std:.3f}"


def make_report(out: str | Path) -> Path:
    out = Path(out)
    meta = json.loads((out / "ablation.json").read_text())
    summary = pd.read_csv(out / "summary.csv") if (out / "summary.csv").stat().st_size > 1 else pd.DataFrame()
    metrics = pd.read_csv(out / "metrics.csv")
    order = meta["variants"]
    sns.set_theme(style="whitegrid", context="notebook")
    palette = dict(zip(order, sns.color_palette("tab10" if len(order) <= 10 else "husl", len(order))))
    if summary.empty:
        summary = pd.DataFrame(columns=["run", "variant", "seed", "status", "error", "wall_s"])
    ok = summary[summary.status == "ok"]
    headline = [h for h in HEADLINE if h[0] in summary.columns and summary[h[0]].notna().any()]
    figures = []

    for column, label, metric in headline:
        table = curve_table(metrics, metric, order)
        if table.empty:
            continue
        fig, ax = plt.subplots(figsize=(8, 4.5))
        _plot_curves(ax, table, palette)
        ax.set(xlabel="gradient step", ylabel=label, title=f"{meta['name']}: {metric} (mean ± 95% CI over seeds)")
        ax.legend(fontsize="small", loc="best")
        name = "reward_curve.png" if metric == "reward/mean" else f"{metric.split('/')[-1].replace('@', '_at_')}_curve.png"
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        figures.append((name, f"{label} against step"))

    if headline and not ok.empty:
        cols = headline[:3]
        fig, axes = plt.subplots(1, len(cols), figsize=(1.5 + 1.6 * len(order) * len(cols), 4.5), squeeze=False)
        for ax, (column, label, _) in zip(axes[0], cols):
            data = ok[["variant", column]].dropna()
            present = [v for v in order if v in set(data.variant)]
            sns.stripplot(data=data, x="variant", y=column, order=present, hue="variant", palette=palette,
                          ax=ax, alpha=0.6, legend=False)
            sns.pointplot(data=data, x="variant", y=column, order=present, color="black", errorbar=("ci", 95),
                          seed=0, linestyle="none", markers="_", ax=ax)
            ax.set(xlabel="", ylabel=label, title=f"{label} per seed")
            ax.tick_params(axis="x", rotation=30)
            for t in ax.get_xticklabels():
                t.set_ha("right")
        fig.tight_layout()
        fig.savefig(out / "final_reward.png", dpi=110)
        plt.close(fig)
        figures.append(("final_reward.png", "final values per seed (dots) with mean and 95% bootstrap CI"))

    diag = [m for m in DIAGNOSTICS if m in set(metrics.metric)]
    if diag:
        cols = 3
        rows = math.ceil(len(diag) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(13, 3.3 * rows), squeeze=False)
        for ax, metric in zip(axes.flat, diag):
            _plot_curves(ax, curve_table(metrics, metric, order), palette)
            ax.set_title(metric, fontsize="medium")
        for ax in list(axes.flat)[len(diag):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize="x-small")
        fig.tight_layout()
        fig.savefig(out / "diagnostics.png", dpi=100)
        plt.close(fig)
        figures.append(("diagnostics.png", "training diagnostics: " + ", ".join(diag)))

    (out / "REPORT.md").write_text(_markdown(meta, summary, ok, headline, order, figures))
    return out / "REPORT.md"


def _markdown(meta, summary, ok, headline, order, figures) -> str:
    n_failed = int((summary.status != "ok").sum())
    lines = [f"# Ablation: {meta['name']}", ""]
    if meta.get("description"):
        lines += [meta["description"], ""]
    lines += [f"Source `{meta['source']}`; seeds {meta['seeds']}; {len(ok)} runs finished, {n_failed} failed, "
              f"{len(meta['runs']) - len(summary)} not run. Rebuild with `python -m grpo_bench plot <this directory>`.", "",
              "Final reward = mean rollout reward over the last 10% of epochs. Eval metrics are on a held-out set at the "
              "end of training: accuracy and reward of greedy answers, pass@k of k sampled ones; accuracy gain is over the "
              "starting policy. Cells are mean ± std over seeds.", "",
              "## Results", ""]
    head = ["variant", "runs ok"] + [label for _, label, _ in headline] + ["wall s / run"]
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
    for column, label, _ in headline:
        tests = pairwise(summary, column, order) if len(ok) else []
        lines += [f"## Differences in {label} beyond seed noise", ""]
        if not tests:
            lines += ["Not enough finished runs (two seeds per variant) to compare.", ""]
            continue
        sig = [t for t in tests if t["significant"]]
        lines.append(f"Welch t-test per pair on per-seed values, Holm-corrected over {len(tests)} pairs, α = {ALPHA}.")
        lines.append("")
        if sig:
            for t in sig:
                hi, lo = (t["a"], t["b"]) if t["mean_a"] > t["mean_b"] else (t["b"], t["a"])
                mh, ml = max(t["mean_a"], t["mean_b"]), min(t["mean_a"], t["mean_b"])
                lines.append(f"- `{hi}` > `{lo}`: {mh:.3f} vs {ml:.3f} (Δ = {mh - ml:+.3f}, p_holm = {t['p_holm']:.2g})")
            rest = len(tests) - len(sig)
            lines += ["", f"The other {rest} pair(s) are within seed noise." if rest else "Every pair differs."]
        else:
            lines.append("No pair of variants differs beyond seed noise.")
        lines.append("")
    failed = summary[summary.status != "ok"] if len(summary) else summary
    if len(failed):
        lines += ["## Failed runs", "", "| run | error |", "|---|---|"]
        lines += [f"| `{r.run}` | {str(r.error).replace('|', '/')} |" for r in failed.itertuples()]
        lines.append("")
    if figures:
        lines += ["## Plots", ""]
        for name, caption in figures:
            lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]
    return "\n".join(lines)
