"""Figures and REPORT.md for one ablation directory, drawn from its files alone.

`python -m grpo_bench plot DIR [--format png|pdf|svg]` rebuilds everything here
without training. What the figures draw over seeds:
- curves with >= BAND_SEEDS seeds per variant: the mean and a 95% bootstrap CI of
  the mean; with fewer, every seed as a thin line under the bold mean (a Student-t
  band on three seeds is wider than the data and leaves the metric's range);
- heavy-tailed diagnostics (ratios, grad norms, KL(old), times): median and
  quartiles on a log scale;
- every line and band is clipped to its metric's declared range (grpo_bench/store/metrics.py).
Differences between variants' per-seed final values are tested by grpo_bench.stats: paired
on per-seed differences where two variants share their seeds, Welch's t where they do not,
Holm-corrected over all pairs; "beyond seed noise" means p_holm < 0.05. Every pair also gets
its minimum detectable effect, a TOST equivalence test within the metric's margin and a
verdict; every variant its interquartile mean. Where the metrics hold samples/total, the
main curve is fitted with ScaleRL's saturating curve against samples drawn (stats.fit_curve).
"""
from __future__ import annotations

import contextlib
import fnmatch
import itertools
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: reports are files, not windows
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .. import stats
from ..store import metrics, rundir  # noqa: E402
from . import figdata, mechanism, png  # noqa: E402
from .quantities import same_problems  # noqa: E402
from ..store.metrics import final_names, headline_columns, higher_is_better, main_column, main_metrics  # noqa: E402
from ..store.rundir import load, load_outcomes  # noqa: E402

ALPHA = stats.ALPHA  # "beyond seed noise": p_holm below this
BAND_SEEDS = 5  # fewer seeds than this: draw the seeds themselves, not a band
N_BOOT = 1000
FORMATS = ("png", "pdf", "svg")

DIAGNOSTICS = ["clip/*", "kl/*", "entropy", "ratio/*", "grad/norm", "reward/zero_std_frac", "filter/*",
               "delta/abs_mean", "response/*"]


@dataclass(frozen=True)
class Range:
    """How a metric is drawn, from its declaration (grpo_bench/store/metrics.py)."""

    lo: float = -math.inf
    hi: float = math.inf
    heavy: bool = False  # heavy-tailed: median and quartiles on a log scale
    log: bool = False    # a log axis (heavy ones have one too)


def metric_range(metric: str) -> Range:
    m = metrics.get(metric)
    return Range(m.lo, m.hi, m.heavy, m.scale != "linear")


def label(metric: str) -> str:
    return metrics.get(metric).label or metric


# ------------------------------------------------------------------------------ style

# Okabe & Ito's colour-blind-safe palette, with grey for its yellow (too faint on white).
# Past eight variants the colours repeat with another dash and marker.
# Okabe-Ito's eight, then four of Paul Tol's muted set: twelve colours a reader tells apart without the dashes
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8C8C8C",
           "#882255", "#44AA99", "#999933", "#332288"]
DASHES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]
COLUMN_IN = 3.4  # one column of a two-column paper
DPI = 100  # matplotlib's own: a page-wide figure 700 px across, 7-pt text 10 px high, read at screen size
PAGE_IN = 7.0
RC = {"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
      "legend.fontsize": 7, "figure.titlesize": 8.5, "lines.linewidth": 1.3, "axes.grid": True,
      "grid.color": "#e4e4e4", "grid.linewidth": 0.6, "axes.spines.top": False, "axes.spines.right": False,
      "axes.edgecolor": "#555555", "legend.frameon": False, "svg.hashsalt": "grpo_bench",
      "figure.constrained_layout.use": True}


def variant_styles(variants: list[str]) -> dict[str, dict]:
    """One fixed colour, dash and marker per variant, by its position in the ablation's order."""
    return {v: {"color": PALETTE[i % len(PALETTE)], "ls": DASHES[i // len(PALETTE) % len(DASHES)],
                "marker": MARKERS[i // len(PALETTE) % len(MARKERS)]} for i, v in enumerate(variants)}


def style():
    return plt.rc_context(RC)


def save(fig, out: Path, stem: str, fmt: str) -> str:
    name = f"{stem}.{fmt}"
    # no dates in the files: a redraw of the same data gives the same bytes
    meta = {"png": {"Software": None}, "pdf": {"CreationDate": None, "ModDate": None}, "svg": {"Date": None}}[fmt]
    fig.savefig(out / name, dpi=DPI, metadata=meta)
    plt.close(fig)
    if fmt == "png":
        png.shrink(out / name, PALETTE)
    return name


def slug(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", metric.replace("@", "_at_")).strip("_")


def _legend_cols(variants: list[str], width_in: float) -> int:
    per = 0.45 + 0.055 * max(len(v) for v in variants)  # inches per entry at 7 pt
    return max(1, min(len(variants), int(width_in // per)))


def _legend_rows(variants: list[str], width_in: float) -> int:
    return math.ceil(len(variants) / _legend_cols(variants, width_in))


def _legend(fig, styles: dict, variants: list[str], width_in: float) -> None:
    handles = [plt.Line2D([], [], color=styles[v]["color"], ls=styles[v]["ls"], lw=1.6) for v in variants]
    fig.legend(handles, variants, loc="outside lower center", ncols=_legend_cols(variants, width_in),
               handlelength=2.2, columnspacing=1.2)


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN steps are expected where a run did not log
        yield


# ------------------------------------------------------------------------- statistics


def bootstrap_mean_ci(matrix: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """95% percentile-bootstrap CI of the mean over columns (seeds), per row (step); NaN = missing."""
    rng = np.random.default_rng(seed)  # fixed: a redraw gives the same band
    n = matrix.shape[1]
    counts = rng.multinomial(n, np.full(n, 1 / n), size=n_boot).T.astype(float)  # (seeds, n_boot)
    have = np.isfinite(matrix)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (np.where(have, matrix, 0.0) @ counts) / (have @ counts)  # (steps, n_boot)
    return _percentiles(means, 2.5), _percentiles(means, 97.5)


def _percentiles(x: np.ndarray, q: float) -> np.ndarray:
    """np.nanpercentile along axis 1, fast where a row has no NaN (nearly always)."""
    full = ~np.isnan(x).any(axis=1)
    out = np.full(len(x), np.nan)
    out[full] = np.percentile(x[full], q, axis=1)
    if (~full).any():
        with _quiet():
            out[~full] = np.nanpercentile(x[~full], q, axis=1)
    return out


def run_matrices(curves: dict, metric: str, order: list[str]) -> dict[str, pd.DataFrame]:
    """Per variant: a (step x run) table of one metric, each run lightly smoothed."""
    m = curves.get(metric)
    out = {}
    for v, g in ([] if m is None else m.groupby("variant", observed=True)):
        g = g.drop_duplicates(["run", "step"], keep="last")
        table = g.pivot(index="step", columns="run", values="value").sort_index()
        table = table.loc[:, table.notna().any()]  # categorical columns keep every run of the ablation
        window = max(1, len(table) // 20)  # ~5% of the run: noise down, trends kept
        if window > 1:
            r = table.rolling(window, min_periods=1)
            table = r.median() if metric_range(metric).heavy else r.mean()
        out[v] = table
    return {v: out[v] for v in order if v in out}


def by_metric(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The long metrics table split once per metric: the figures look metrics up by name."""
    return {str(k): g for k, g in table.groupby("metric", observed=True, sort=False)}


def same_curve(curves: dict, a: str, b: str) -> bool:
    """Whether metrics a and b hold the same value at every (run, step): one curve under two names."""
    x, y = curves.get(a), curves.get(b)
    if x is None or y is None or len(x) != len(y):
        return False
    key = ["run", "step"]
    x, y = x.sort_values(key)[[*key, "value"]], y.sort_values(key)[[*key, "value"]]
    return all(np.array_equal(x[c].astype(str if c == "run" else float).to_numpy(),
                              y[c].astype(str if c == "run" else float).to_numpy()) for c in [*key, "value"])


def clip_parts_sum(curves: dict, drawn: list[str]) -> bool:
    """Whether clip/frac is, at every (run, step), the sum of the clip regions' fractions (clip/low_frac,
    clip/high_frac, a loss's own) and each of those is drawn: the regions are disjoint where they are."""
    parts = [m for m in curves if m.startswith("clip/") and m.endswith("_frac") and m != "clip/frac"]
    if not parts or not set(parts) <= set(drawn):
        return False
    key = ["run", "step"]
    total = curves["clip/frac"].groupby(key, observed=True).value.last()
    summed = sum(curves[m].groupby(key, observed=True).value.last() for m in parts)
    both = pd.concat([total, summed], axis=1, join="outer")
    return bool(np.allclose(both.iloc[:, 0], both.iloc[:, 1], rtol=0, atol=1e-6, equal_nan=False))


def points_per_run(curves: dict, metric: str) -> int:
    m = curves.get(metric)
    return int(m.groupby("run", observed=True).step.nunique().max()) if m is not None and len(m) else 0


# ---------------------------------------------------------------------------- drawing


def samples_axis(curves: dict, order: list[str]) -> dict[str, pd.Series] | None:
    """Per variant, step -> responses sampled so far (samples/total, the mean over seeds): the x axis on
    which variants that draw different numbers of samples per step (dynamic sampling redraws, an
    on-policy recipe's extra rollouts) compare at equal samples. None when every variant draws the
    same per step: the step axis says it already."""
    m = curves.get("samples/total")
    if m is None or not len(m):
        return None
    axis = {v: g.groupby("step").value.mean().sort_index() for v, g in m.groupby("variant", observed=True)
            if v in order}
    shared = list(axis.values())
    if not shared or all(len(a) == len(shared[0]) and np.allclose(a.to_numpy(), shared[0].to_numpy())
                         and (a.index == shared[0].index).all() for a in shared):
        return None
    return axis


def draw_curves(ax, curves: dict, metric: str, order: list[str], styles: dict,
                x_axis: dict[str, pd.Series] | None = None) -> str:
    """Draw one metric over training for every variant; return what the lines and bands are.
    x_axis: per variant, the x of each step (samples drawn); None: the gradient step."""
    rng_ = metric_range(metric)
    seeds, positive, sizes = [], [], []
    for v, table in run_matrices(curves, metric, order).items():
        steps, M = table.index.to_numpy(float), table.to_numpy(float)
        if x_axis is not None:  # a step's samples so far; eval steps between logged ones by interpolation
            xs = x_axis[v]
            steps = np.interp(steps, xs.index.to_numpy(float), xs.to_numpy(float))
        st = styles[v]
        seeds.append(M.shape[1])
        with np.errstate(all="ignore"), _quiet():
            center = np.nanmedian(M, axis=1) if rng_.heavy else np.nanmean(M, axis=1)
        if M.shape[1] < BAND_SEEDS:
            for col in M.T:
                ok = np.isfinite(col)
                if ok.sum() >= 2:
                    ax.plot(steps[ok], np.clip(col[ok], rng_.lo, rng_.hi), color=st["color"], ls=st["ls"],
                            lw=0.5, alpha=0.3, gid=v)
        else:
            with np.errstate(all="ignore"), _quiet():
                lo, hi = (_percentiles(M, 25), _percentiles(M, 75)) if rng_.heavy \
                    else bootstrap_mean_ci(M)
            ok = np.isfinite(lo) & np.isfinite(hi)
            if ok.sum() >= 2:
                ax.fill_between(steps[ok], np.clip(lo[ok], rng_.lo, rng_.hi), np.clip(hi[ok], rng_.lo, rng_.hi),
                                color=st["color"], alpha=0.18, lw=0, gid=v)
        ok = np.isfinite(center)
        if ok.sum() >= 2:
            ax.plot(steps[ok], np.clip(center[ok], rng_.lo, rng_.hi), color=st["color"], ls=st["ls"], lw=1.4, gid=v)
        positive.append(M[np.isfinite(M) & (M > 0)])
        with np.errstate(all="ignore"), _quiet():
            sizes.append(float(np.nanmax(np.abs(center))) if np.isfinite(center).any() else 0.0)
    spread = sorted(x for x in sizes if x > 0)
    if not rng_.log and rng_.lo == -math.inf and len(spread) >= 3 and spread[-1] > 50 * spread[len(spread) // 2]:
        # one variant 50x the others (a KL that runs away) would flatten the rest into the axis: linear up
        # to the typical variant's size, logarithmic beyond it
        ax.set_yscale("symlog", linthresh=spread[len(spread) // 2], linscale=1.0)
    if rng_.log:
        pos = np.concatenate(positive) if positive else np.array([])
        zero = any(np.any(np.asarray(ln.get_ydata(), float) <= 0) for ln in ax.get_lines())
        if zero and len(pos):
            # exact zeros need a linear stretch at the bottom; at most 6 decades above it, or the
            # symlog locator (a label per decade) would stack its labels on top of each other
            top = math.ceil(math.log10(pos.max()))
            low = max(math.floor(math.log10(np.percentile(pos, 1))), top - 6)
            ax.set_yscale("symlog", linthresh=10.0 ** low, linscale=1.0)
        elif len(pos):
            ax.set_yscale("log")
            log_ticks(ax)
    if rng_.lo == 0 and rng_.hi == 1 and not rng_.log:
        lo_, hi_ = ax.get_ylim()
        ax.set_ylim(max(lo_, -0.02), min(hi_, 1.02))
    return describe_band(metric, min(seeds) if seeds else 0)


def log_ticks(ax) -> None:
    """Plain numbers on a log y-axis (1, 2, 5 x 10^k over a short range, decades over a long one), not
    6 x 10^-2 minor labels; again after anything widens the axis, or the labels of the short range pile up."""
    lo_, hi_ = ax.get_ylim()
    decades = math.log10(hi_ / lo_)
    subs = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if decades < 1 else (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs, numticks=8))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def describe_band(metric: str, seeds: int) -> str:
    if seeds < BAND_SEEDS:
        what = "median" if metric_range(metric).heavy else "mean"
        return f"thin lines: each of {seeds} seeds; bold: their {what}"
    if metric_range(metric).heavy:
        return "median and quartiles over seeds, log scale"
    return f"mean over {seeds} seeds, band: 95% bootstrap CI of the mean" + (", log scale" * metric_range(metric).log)


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
    rows = _legend_rows(order, COLUMN_IN)
    fig, axes = plt.subplots(len(panels), 1, figsize=(COLUMN_IN, 0.55 + 1.75 * len(panels) + 0.14 * rows),
                             sharex=True, squeeze=False)
    bands = []
    for ax, metric in zip(axes[:, 0], panels):
        bands.append(draw_curves(ax, curves, metric, order, styles, x_axis))
        ax.set_ylabel(label(metric))
    axes[-1, 0].set_xlabel("gradient step" if x_axis is None else "responses sampled")
    fig.suptitle(f"{meta['name']}: {title}\n{_what(meta, summary)}" + ("" if x_axis is None else ", at equal samples"),
                 wrap=True)  # a long ablation name would run off both edges
    _legend(fig, styles, order, COLUMN_IN)
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
    fig.suptitle(title, wrap=True)
    # a panel title wider than its panel runs into the next one's: shrink it to fit
    renderer = fig.canvas.get_renderer()
    for ax in axes[0]:
        while ax.title.get_window_extent(renderer).width > ax.get_window_extent(renderer).width \
                and ax.title.get_fontsize() > 6:
            ax.title.set_fontsize(ax.title.get_fontsize() - 0.5)
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
    lrows = _legend_rows(order, PAGE_IN)
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
    fig.suptitle(f"{meta['name']}: training diagnostics, {_what(meta, summary)}", wrap=True)
    _legend(fig, styles, order, PAGE_IN)
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
    lrows = _legend_rows(order, PAGE_IN)
    fig, axes = plt.subplots(rows, cols, figsize=(PAGE_IN, 0.6 + 1.6 * rows + 0.14 * lrows), squeeze=False)
    for ax, (metric, threshold, reduce) in zip(axes.flat, panels):
        draw_curves(ax, drawn, metric, order, styles)
        if reduce == "cv":  # the threshold is on the curve's spread over steps, not on a value: no line
            ax.set_title(f"{metric}\nits cv over steps: threshold {threshold:g}")
        else:
            ax.axhline(threshold, color="k", ls=":", lw=0.8)
            if ax.get_yscale() == "log":  # a threshold decades above the curves widens the axis
                log_ticks(ax)
            ax.set_title(f"{'|' + metric + '|' if reduce == 'abs_mean' else metric}\nthreshold {threshold:g} (dotted)")
        ax.set_xlabel("gradient step")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{meta['name']}: did each part's mechanism act? {_what(meta, summary)}", wrap=True)
    _legend(fig, styles, order, PAGE_IN)
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
    fig, axs = plt.subplots(1, len(axes_), figsize=(width, 2.9 + 0.14 * _legend_rows(order, width)), squeeze=False)
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
    fig.suptitle(f"{meta['name']}: {label(fits['metric'])} against compute\ndots: seed mean; line: fit"
                 + (f" ({len(declined)} declined)" if declined else ""), wrap=True)
    _legend(fig, styles, order, width)
    return fig


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


# ----------------------------------------------------------------------------- report


def _repeats(ok: pd.DataFrame, headline: list[tuple[str, str, str]]) -> dict[str, str]:
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


def _offsets(headline: list[tuple[str, str, str]]) -> set[str]:
    """The headline columns that are another headline metric shifted by a constant (the same curve again)."""
    present = {m for _, _, m in headline}
    return {c for c, _, m in headline if metrics.get(m).offset_of in present}


def build_figures(out: str | Path, fits: dict | None = None) -> list[tuple[str, object, str]]:
    """Every figure of a results directory as (file stem, Figure, caption); nothing is written.
    fits: curve_fits of the directory, if the caller has them already (they take seconds)."""
    meta, summary, table = load(Path(out))
    curves = by_metric(same_problems(table, load_outcomes(Path(out))))
    fits = curve_fits(meta, curves) if fits is None else fits
    styles = variant_styles(meta["variants"])
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
        cols = [(c, n) for c, n, _ in cols if c not in _offsets(headline) and c not in _repeats(ok, headline)][:3]
        judged_col = metrics.final_column(judged) if judged else None
        if judged_col in ok and ok[judged_col].notna().any() and judged_col not in dict(cols):
            name = label_column(judged_col)  # kl/seq is no task's headline, and declares no label
            cols = [(judged_col, f"final {judged}" if name == judged_col else name)] + cols[:2]
        if cols and not ok.empty:
            figures.append(("final_values", final_values_figure(meta, summary, cols, styles),
                            "final values per seed (dots) with their mean (bar)"
                            + (f" and its 95% bootstrap CI (line)" if len(meta["seeds"]) >= BAND_SEEDS else "")))
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


def label_column(column: str) -> str:
    """A summary column's name in tables: its metric's declared `summary`, else the column itself."""
    name = metrics.metric_of(column)
    m = metrics.get(name) if name else None
    return m.summary if m and m.summary and m.column == column else column


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
    if 0 < max(abs(value), abs(lo), abs(hi)) < 5e-4:  # a sampler KL of 1e-5 would read 0.000 [0.000, 0.000]
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
    same = _repeats(ok, headline)
    for column, name, _ in headline:
        if column in _offsets(headline):
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
