"""The figures of one ablation directory, drawn from its files alone (`python -m grpo_bench plot DIR`):
the headline curves (and at equal samples where variants draw different numbers per step), the other
headline metrics over training, final values per seed, the training diagnostics, each claim's
mechanism against its threshold, and ScaleRL's saturating curve fitted against samples drawn
(stats.fit_curve). plotting.py says how a metric is drawn over seeds.
"""
from __future__ import annotations

import fnmatch
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.font_manager import FontProperties

from .. import stats
from ..store import metrics
from ..store.metrics import headline_columns, main_metrics
from ..store.rundir import load, load_outcomes
from . import mechanism
from .plotting import (BAND_SEEDS, COLUMN_IN, PAGE_IN, add_legend, legend_rows, bootstrap_mean_ci, by_metric,
                       clip_parts_sum, describe_band, draw_curves, label, label_column, log_ticks, metric_range,
                       plt, points_per_run, same_curve, samples_axis, slug, style, suptitle, text_wider_than, ticker,
                       twin_variants, variant_styles, wrap)
from .quantities import same_problems

DIAGNOSTICS = ["clip/*", "kl/*", "entropy", "ratio/*", "grad/norm", "reward/zero_std_frac", "filter/*",
               "delta/abs_mean", "response/*"]


def _what(meta: dict, summary: pd.DataFrame) -> str:
    n_seeds = len(meta["seeds"])
    axes = [a for a in meta.get("axes") or [] if a != "variant_name"]  # variant_name: a list of named variants
    of = f" of {'/'.join(axes)}" if axes else ""
    planned = len(meta["variants"])
    # a sweep stopped part way has variants with no finished run: the title counts what it drew
    ok = summary[summary["status"] == "ok"] if "status" in summary else summary
    ran = ok["variant"].nunique() if "variant" in ok and len(ok) else 0
    n = f"{ran} of {planned}" if ran < planned else f"{planned}"
    return f"{n} variant{'s' * (planned != 1)}{of}, {n_seeds} seed{'s' * (n_seeds != 1)}"


def _drawn(meta: dict, curves: dict, panels: list[str]) -> list[str]:
    seen = set().union(*(set(curves[m].variant.unique()) for m in panels if m in curves))
    return [v for v in meta["variants"] if v in seen]


def curves_figure(meta: dict, summary: pd.DataFrame, curves: dict, panels: list[str], styles: dict, title: str,
                  x_axis: dict[str, pd.Series] | None = None):
    """Panels stacked in one column, one metric each, one legend under them; x: gradient steps, or
    (x_axis, see samples_axis) responses sampled."""
    order = _drawn(meta, curves, panels)
    rows = legend_rows(order, COLUMN_IN, styles)
    fig, axes = plt.subplots(len(panels), 1, figsize=(COLUMN_IN, 0.55 + 1.75 * len(panels) + 0.14 * rows),
                             sharex=True, squeeze=False)
    bands = []
    for ax, metric in zip(axes[:, 0], panels):
        bands.append(draw_curves(ax, curves, metric, order, styles, x_axis))
        ax.set_ylabel(label(metric))
    axes[-1, 0].set_xlabel("gradient step" if x_axis is None else "responses sampled")
    suptitle(fig, f"{meta['name']}: {title}\n{_what(meta, summary)}" + ("" if x_axis is None else ", at equal samples"))
    add_legend(fig, styles, order, COLUMN_IN)
    return fig, bands


def dot_panels(rows: list[str], panels: list[tuple[str, str, str, dict]], styles: dict, title: str):
    """Per-seed values (dots), their mean (bar) and, with enough seeds, its 95% bootstrap CI (line).

    panels: (summary column, x label, panel title, {variant: per-seed values}). Variants run
    down a shared y axis, so any number of them and any name length stay legible.
    """
    width = min(PAGE_IN, 1.1 + 0.05 * max(len(v) for v in rows) + 2.0 * len(panels))
    # panels of one metric (compare over starts or tasks) share x, so a shift between them reads as one
    one_metric = len({column for column, *_ in panels}) == 1
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 0.9 + 0.22 * len(rows)), sharey=True,
                             sharex=one_metric, squeeze=False)
    jitter = np.random.default_rng(0)  # fixed: a redraw gives the same picture
    for ax, (column, xlabel, ptitle, data) in zip(axes[0], panels):
        rng_ = metric_range(column)
        for i, v in enumerate(rows):
            x = np.asarray(data.get(v, []), float)
            x = x[np.isfinite(x)]
            if not len(x):
                continue
            st = styles[v]
            ax.scatter(x, i + jitter.uniform(-0.15, 0.15, len(x)), s=10, color=st["color"], marker=st["marker"],
                       alpha=0.7, lw=0, gid=v)
            ax.scatter([x.mean()], [i], s=120, marker="|", color="black", lw=1.5, zorder=3)
            if len(x) >= BAND_SEEDS:
                lo, hi = bootstrap_mean_ci(x[None, :])
                ax.plot(np.clip([lo[0], hi[0]], rng_.lo, rng_.hi), [i, i], color="black", lw=1.0, zorder=3)
        ax.set_xlabel(xlabel)
        if ptitle:
            ax.set_title(ptitle)
        ax.grid(axis="y", visible=False)
    axes[0, 0].set_yticks(range(len(rows)), rows)
    axes[0, 0].set_ylim(len(rows) - 0.5, -0.5)  # first variant on top
    suptitle(fig, title)
    # a panel title wider than its panel runs into the next one's: shrink it to fit, and past 6 points wrap it
    renderer = fig.canvas.get_renderer()
    for ax in axes[0]:
        room = ax.get_window_extent(renderer).width
        while ax.title.get_window_extent(renderer).width > room and ax.title.get_fontsize() > 6:
            ax.title.set_fontsize(ax.title.get_fontsize() - 0.5)
        if ax.title.get_window_extent(renderer).width > room:
            ax.title.set_text(wrap(ax.get_title(), text_wider_than(fig, ax.title.get_fontsize(), room)))
    # the height above holds a two-line title over one-line panel titles; without room for more lines,
    # constrained_layout collapsed the axes and gave up (three 40-character directory names did)
    # matplotlib wraps a centred suptitle at the figure's width, greedily at spaces, as wrap() does
    size = FontProperties(size=plt.rcParams["figure.titlesize"]).get_size_in_points()   # "large" outside style()
    lines = wrap(fig.get_suptitle(), text_wider_than(fig, size, fig.get_figwidth() * fig.dpi)).count("\n") + 1
    points = (size * max(0, lines - 2)
              + max(ax.title.get_fontsize() * ax.get_title().count("\n") for ax in axes[0]))
    fig.set_figheight(fig.get_figheight() + 1.2 * points / 72)
    return fig


def final_values_figure(meta: dict, summary: pd.DataFrame, columns: list[tuple[str, str]], styles: dict):
    ok = summary[summary.status == "ok"]
    present = [v for v in meta["variants"] if v in set(ok.variant)]
    panels = [(c, name, "", {v: g[c].to_numpy(float) for v, g in ok.groupby("variant")}) for c, name in columns]
    n = ok.groupby("variant").size()
    seeds = f"{n.min()}" if n.min() == n.max() else f"{n.min()}-{n.max()}"
    ci = "; line: 95% bootstrap CI of the mean" if n.min() >= BAND_SEEDS else ""
    return dot_panels(present, panels, styles, f"{meta['name']}: final values, {len(present)} variants x {seeds} "
                      f"seeds\ndots: seeds; bar: mean{ci}")


def diagnostics_figure(meta: dict, summary: pd.DataFrame, curves: dict, diag: list[str], styles: dict):
    order = _drawn(meta, curves, diag)
    # four small panels a row: a reference grid a reader scans for what moved, at 0.65x the bytes of three
    cols = min(4, len(diag))
    rows = math.ceil(len(diag) / cols)
    lrows = legend_rows(order, PAGE_IN, styles)
    fig, axes = plt.subplots(rows, cols, figsize=(PAGE_IN, 0.5 + 1.4 * rows + 0.14 * lrows), sharex=True,
                             squeeze=False)
    for ax, metric in zip(axes.flat, diag):
        draw_curves(ax, curves, metric, order, styles)
        title = metric + (", log" if metric_range(metric).log else "")
        if len(title) > 26 and "/" in metric:  # wider than a quarter page: break after its last "/"
            cut = metric.rindex("/") + 1
            title = title[:cut] + "\n" + title[cut:]
        ax.set_title(title)
    for ax in list(axes.flat)[len(diag):]:
        ax.axis("off")
    for i in range(cols):  # the lowest drawn panel of each column carries the step axis
        ax = axes[(len(diag) - 1 - i) // cols, i]
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel("gradient step")
    suptitle(fig, f"{meta['name']}: training diagnostics, {_what(meta, summary)}")
    add_legend(fig, styles, order, PAGE_IN)
    return fig


def mechanism_figure(meta: dict, summary: pd.DataFrame, curves: dict, panels: list[tuple[str, float, bool]],
                     styles: dict):
    """Each declared diagnostic over training, every variant, its threshold dotted: where the part had
    something to act on (above the line) and where not."""
    drawn = {}
    for metric, _, reduce in panels:  # a shift's size, where the claim reads the size
        c = curves[metric]
        drawn[metric] = c.assign(value=c.value.abs()) if reduce == "abs_mean" else c
    order = _drawn(meta, drawn, list(drawn))
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    lrows = legend_rows(order, PAGE_IN, styles)
    fig, axes = plt.subplots(rows, cols, figsize=(PAGE_IN, 0.6 + 1.6 * rows + 0.14 * lrows), squeeze=False)
    for ax, (metric, threshold, reduce) in zip(axes.flat, panels):
        draw_curves(ax, drawn, metric, order, styles)
        if reduce == "cv":  # the threshold is on the curve's spread over steps, not on a value: no line
            ax.set_title(f"{metric}\nits cv over steps: threshold {threshold:g}")
        else:
            ax.axhline(threshold, color="k", ls=":", lw=0.8)
            lo, hi = ax.get_ylim()
            squeezed = ax.get_yscale() == "linear" and threshold < 0.05 * (hi - lo) \
                or ax.get_yscale() == "symlog" and ax.yaxis.get_transform().linthresh > threshold
            if threshold > 0 and squeezed:
                # sampler_mismatch_countdown: a 1e-3 threshold on a 0-2 axis sat on the floor, and bf16's 6e-5
                # could not be told from none_k4's 3e-3 across it: linear up to a tenth of it, log above
                ax.set_yscale("symlog", linthresh=threshold / 10, linscale=1.0)
                # symlog's locator rounds the floor to a decade: three of the panel's eight went to a -1e-4 dip
                ax.set_ylim(bottom=1.5 * min(ax.dataLim.y0, 0.0) - threshold / 50)
            if ax.get_yscale() == "log":  # a threshold decades above the curves widens the axis
                log_ticks(ax)
            ax.set_title(f"{'|' + metric + '|' if reduce == 'abs_mean' else metric}\nthreshold {threshold:g} (dotted)")
        ax.set_xlabel("gradient step")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    suptitle(fig, f"{meta['name']}: did each part's mechanism act? {_what(meta, summary)}")
    add_legend(fig, styles, order, PAGE_IN)
    return fig


def diagnostics_in(metric_names) -> list[str]:
    # the spreads of lengths and rewards are mechanisms' diagnostics: mechanism.png draws those a claim declares
    names = sorted(m for m in set(metric_names) if not m.endswith("_cv"))
    out: list[str] = []
    for pat in DIAGNOSTICS:
        out += [m for m in names if fnmatch.fnmatchcase(m, pat) and m not in out]
    return out


# ------------------------------------------------------------------ curves against compute


def fit_data(curves: dict, metric: str, order: list[str], axis: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per variant: (compute at each logged step (P,), metric (P, seeds)) without smoothing, seeds in
    seed order. axis "samples": samples/total at the step (0 before the first rollout), "steps": step + 1."""
    out = {}
    m, samples = curves.get(metric), curves.get("samples/total")
    for v, g in ([] if m is None else m.groupby("variant", observed=True)):
        g = g.drop_duplicates(["run", "step"], keep="last")
        table = g.pivot(index="step", columns="run", values="value").sort_index()
        table = table.loc[:, table.notna().any()]
        if "seed" in g:  # columns in seed order, so that variants sharing seeds resample them together
            seed = g.groupby("run", observed=True)["seed"].first()
            table = table[sorted(table.columns, key=lambda r: seed[r])]
        steps = table.index.to_numpy(float)
        if axis == "steps":
            C = steps + 1
        else:
            s = samples[samples.variant == v].drop_duplicates(["run", "step"], keep="last")
            s = s.pivot(index="step", columns="run", values="value").sort_index()
            per_run = [np.interp(steps, s.index[s[r].notna()], s[r].dropna(), left=0.0)
                       for r in table.columns if r in s and s[r].notna().any()]
            if not per_run:
                continue
            C = np.mean(per_run, axis=0)
        out[v] = (C, table.to_numpy(float))
    return {v: out[v] for v in order if v in out}


def curve_fits(meta: dict, curves: dict) -> dict | None:
    """ScaleRL's curve fitted to every variant's main metric against samples drawn (and gradient steps
    where the two are not proportional); None without samples/total or a metric with enough points."""
    if "samples/total" not in curves:
        return None
    metric = next((m for m in main_metrics(curves, meta) if points_per_run(curves, m) >= stats.MIN_POINTS), None)
    if metric is None:
        return None
    r = metric_range(metric)
    data = {axis: fit_data(curves, metric, meta["variants"], axis) for axis in ("samples", "steps")}
    ratios = [C_s[(C_s > 0)] / data["steps"][v][0][C_s > 0] for v, (C_s, _) in data["samples"].items()]
    flat = np.concatenate(ratios) if ratios else np.array([])
    per_step = float(flat[0]) if len(flat) and np.allclose(flat, flat[0], rtol=1e-6) else None
    out = {"metric": metric, "per_step": per_step, "axes": {}}
    for axis in ("samples",) if per_step else ("samples", "steps"):
        out["axes"][axis] = {}
        for v, (C, Y) in data[axis].items():
            idx = np.random.default_rng(0).integers(0, Y.shape[1], (stats.N_BOOT_FIT, Y.shape[1]))
            fit = stats.fit_curve(C, Y, r.lo, r.hi, idx=idx)
            if len(fit["C"]):  # a curve whose every value is inf or NaN has nothing to draw or fit
                out["axes"][axis][v] = fit
    return out if all(out["axes"].values()) else None


AXIS_LABEL = {"samples": "samples drawn", "steps": "gradient steps"}


def _binned(C: np.ndarray, y: np.ndarray, bins: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """At most `bins` dots per curve: means over log-spaced bins of compute (the fit uses every point)."""
    if len(C) <= bins:
        return C, y
    which = np.digitize(np.log(C), np.linspace(np.log(C[0]), np.log(C[-1]), bins + 1)[1:-1])
    keep = np.unique(which)
    return (np.array([C[which == k].mean() for k in keep]), np.array([y[which == k].mean() for k in keep]))


def fit_figure(meta: dict, fits: dict, styles: dict):
    """The seeds' mean (dots) and the fitted curve (line) per variant on a log compute axis; half the
    budget dotted where every variant has the same budget."""
    axes_ = list(fits["axes"])
    order = [v for v in meta["variants"] if v in fits["axes"][axes_[0]]]
    width = min(PAGE_IN, COLUMN_IN * len(axes_))
    fig, axs = plt.subplots(1, len(axes_), figsize=(width, 2.9 + 0.14 * legend_rows(order, width, styles)), squeeze=False)
    for ax, axis in zip(axs[0], axes_):
        ends = []
        for v in order:
            f, st = fits["axes"][axis][v], styles[v]
            pos = f["C"] > 0
            ax.scatter(*_binned(f["C"][pos], f["y"][pos]), s=6, color=st["color"], marker=st["marker"], alpha=0.6,
                       lw=0, gid=v)
            if f["ok"]:
                grid = np.geomspace(f["C"][pos][0], f["C"][-1], 200)
                ax.plot(grid, stats.saturating(grid, f["r0"], f["A"], f["B"], f["C_mid"]), color=st["color"],
                        ls=st["ls"], lw=1.4, gid=v)
            if len(f["C"]):  # none where every value of the curve is inf or NaN
                ends.append(f["C"][-1])
        if ends and np.allclose(ends, ends[0], rtol=0.01):
            ax.axvline(ends[0] / 2, color="#888888", ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda c, _: f"{c:,.0f}"))
        # under two decades matplotlib labels the minor ticks too ("2 x 10^3"), on top of each other
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel(AXIS_LABEL[axis])
        ax.set_ylabel(label(fits["metric"]))
    declined = [v for v in order if not fits["axes"][axes_[0]][v]["ok"]]
    # the dotted half budget is named in the caption: the title has no room left in one column
    suptitle(fig, f"{meta['name']}: {label(fits['metric'])} against compute\ndots: seed mean; line: fit"
             + (f" ({len(declined)} declined)" if declined else ""))
    add_legend(fig, styles, order, width)
    return fig


def repeated_columns(ok: pd.DataFrame, headline: list[tuple[str, str, str]]) -> dict[str, str]:
    """Headline column -> the name of an earlier one it equals on every finished run (eval reward where the
    reward is 0/1 and so the accuracy)."""
    out: dict[str, str] = {}
    for i, (c, _, _) in enumerate(headline):
        for e, name, _ in headline[:i]:
            if len(ok) and c in ok and e in ok and e not in out and \
                    np.array_equal(ok[c].to_numpy(float), ok[e].to_numpy(float), equal_nan=True):
                out[c] = name
                break
    return out


def offset_columns(headline: list[tuple[str, str, str]]) -> set[str]:
    """The headline columns that are another headline metric shifted by a constant (the same curve again)."""
    present = {m for _, _, m in headline}
    return {c for c, _, m in headline if metrics.get(m).offset_of in present}


def build_figures(out: str | Path, fits: dict | None = None) -> list[tuple[str, object, str]]:
    """Every figure of a results directory as (file stem, Figure, caption); nothing is written.
    fits: curve_fits of the directory, if the caller has them already (they take seconds)."""
    meta, summary, table = load(Path(out))
    curves = by_metric(same_problems(table, load_outcomes(Path(out))))
    fits = curve_fits(meta, curves) if fits is None else fits
    styles = variant_styles(meta["variants"], twin_variants(curves, meta["variants"]))
    ok = summary[summary.status == "ok"]
    headline = headline_columns(summary, meta)
    figures = []
    with style():
        main = [m for m in main_metrics(curves, meta) if points_per_run(curves, m) >= 2]
        judged = (meta.get("claim") or {}).get("metric")
        judged = metrics.metric_of(judged) if judged else None
        if judged and judged not in main and points_per_run(curves, judged) >= 2:
            main = [judged] + main  # the headline leads with what the claim is judged on (kl/seq, a length)
        if main:
            fig, bands = curves_figure(meta, summary, curves, main, styles, " and ".join(map(label, main)))
            figures.append(("headline", fig, f"{' and '.join(map(label, main))} over training ({bands[0]})"))
            x_samples = samples_axis(curves, _drawn(meta, curves, main))
            if x_samples is not None:  # variants draw different samples per step: compare at equal samples too
                fig, bands = curves_figure(meta, summary, curves, main, styles, " and ".join(map(label, main)),
                                           x_samples)
                figures.append(("headline_samples", fig, f"the same against the responses sampled so far, "
                                "where variants draw different numbers per gradient step "
                                f"(dynamic sampling, an on-policy recipe's extra rollouts; {bands[0]})"))
        for _, name, metric in headline:
            if metric in main or points_per_run(curves, metric) < 2:
                continue  # a single point is not a curve: the final value is in final_values
            if metrics.get(metric).offset_of in curves:
                continue  # another metric shifted by a constant: the same curve again
            if any(same_curve(curves, metric, m) for m in main):
                continue  # a 0/1 reward's mean is the accuracy: the headline drew it
            fig, bands = curves_figure(meta, summary, curves, [metric], styles, label(metric))
            figures.append((f"curve_{slug(metric)}", fig, f"{label(metric)} over training ({bands[0]})"))
        mains = [metrics.final_column(m) for m in main]
        cols = sorted(headline, key=lambda h: (h[0] not in mains, mains.index(h[0]) if h[0] in mains else 0))
        cols = [(c, n) for c, n, _ in cols if c not in offset_columns(headline) and c not in repeated_columns(ok, headline)][:3]
        judged_col = metrics.final_column(judged) if judged else None
        if judged_col in ok and ok[judged_col].notna().any() and judged_col not in dict(cols):
            name = label_column(judged_col)  # kl/seq is no task's headline, and declares no label
            cols = [(judged_col, f"final {judged}" if name == judged_col else name)] + cols[:2]
        if cols and not ok.empty:
            figures.append(("final_values", final_values_figure(meta, summary, cols, styles),
                            "final values per seed (dots) with their mean (bar)"
                            + (" and its 95% bootstrap CI (line)" if len(meta["seeds"]) >= BAND_SEEDS else "")))
        mech = [p for p in mechanism.panels(meta, Path(out)) if points_per_run(curves, p[0]) >= 2]
        # the mechanism figure draws its diagnostics with their thresholds: not a second time here
        diag = [m for m in diagnostics_in(curves) if points_per_run(curves, m) >= 2 and m not in {p[0] for p in mech}]
        if "clip/frac" in diag and clip_parts_sum(curves, diag):
            diag.remove("clip/frac")  # the sum of the panels beside it: it added nothing
        if diag:
            figures.append(("diagnostics", diagnostics_figure(meta, summary, curves, diag, styles),
                            "training diagnostics: " + ", ".join(diag) + f" ({describe_band('', len(meta['seeds']))};"
                            " ratios, grad norm and KL(old): median and quartiles, log scale"
                            + ("; the mechanism figure has " + ", ".join(p[0] for p in mech) if mech else "") + ")"))
        if mech:
            figures.append(("mechanism", mechanism_figure(meta, summary, curves, mech, styles),
                            "each declared diagnostic of the claim's mechanisms over training, its threshold "
                            f"dotted ({describe_band('', len(meta['seeds']))})"))
        if fits and any(f["ok"] for axis in fits["axes"].values() for f in axis.values()):
            # every fit declined: its dots are the headline's curves again; the report says why each was
            figures.append(("fit", fit_figure(meta, fits, styles),
                            f"{label(fits['metric'])} against compute: mean over seeds (dots) and the fitted "
                            "saturating curve (line; none where the fit is declined); dotted: half the budget, "
                            "where every variant has the same"))
    stems = [s for s, _, _ in figures]
    assert len(stems) == len(set(stems)), f"two figures share a file name: {stems}"
    return figures
