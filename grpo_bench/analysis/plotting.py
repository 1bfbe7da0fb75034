"""How one metric's runs are drawn, for every figure the analysis makes: a fixed colour, dash and
marker per variant, the metric's declared range and scale, and over seeds either a bootstrap band of
the mean (>= BAND_SEEDS seeds), every seed as a thin line (fewer), or, for heavy-tailed diagnostics
(ratios, grad norms, KL(old), times), median and quartiles on a log scale. Every line and band is
clipped to its metric's declared range (grpo_bench/store/metrics.py).
"""
from __future__ import annotations

import contextlib
import math
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

from ..store import metrics  # noqa: E402
from . import png  # noqa: E402

BAND_SEEDS = 5  # fewer seeds than this: draw the seeds themselves, not a band
N_BOOT = 1000
FORMATS = ("png", "pdf", "svg")


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


def label_column(column: str) -> str:
    """A summary column's name in tables: its metric's declared `summary`, else the column itself."""
    name = metrics.metric_of(column)
    m = metrics.get(name) if name else None
    return m.summary if m and m.summary and m.column == column else column


# ------------------------------------------------------------------------------ style

# Okabe & Ito's colour-blind-safe eight, with grey for its yellow (too faint on white), then Paul Tol's wine,
# magenta, olive and indigo: twelve colours a reader tells apart without the dashes (no two closer than
# ΔE 25 in CIELAB; Tol's teal, #44AA99, was 18.6 from Okabe-Ito's green and read as the same line).
# Past twelve variants the colours repeat with another dash and marker.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8C8C8C",
           "#882255", "#EE3377", "#999933", "#332288"]
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


def variant_styles(variants: list[str], twins: dict[str, str] | None = None) -> dict[str, dict]:
    """One fixed colour, dash and marker per variant, by its position in the ablation's order.
    twins (twin_variants): a variant whose runs are an earlier one's, number for number, is drawn in wide
    dashes over it, or its line would hide the other's exactly, and the legend names the pair."""
    styles = {v: {"color": PALETTE[i % len(PALETTE)], "ls": DASHES[i // len(PALETTE) % len(DASHES)],
                  "marker": MARKERS[i // len(PALETTE) % len(MARKERS)], "label": v} for i, v in enumerate(variants)}
    for v, first in (twins or {}).items():
        styles[v].update(ls=(0, (4, 4)), label=f"{v} (= {first})")
    return styles


def twin_variants(curves: dict, order: list[str]) -> dict[str, str]:
    """Later variant -> the earlier one whose runs logged, seed by seed, the same value of every metric at
    every step: one set of runs under two names. Clocks aside, and the objective's value (loss/*, kl/value):
    k3+ logs k3's value and trains on k2's gradient, number for number as k2 does."""
    parts = {v: [] for v in order}
    for metric in sorted(curves):
        if metric.startswith(("time/", "loss/")) or metric == "kl/value":
            continue
        for v, g in curves[metric].groupby("variant", observed=True):
            if v in parts:
                g = g.sort_values(["seed", "step"])
                parts[v].append(g[["seed", "step", "value"]].to_numpy(float))
    twins = {}
    for i, v in enumerate(order):
        for first in order[:i]:
            if first in twins or not parts[v] or len(parts[v]) != len(parts[first]):
                continue
            if all(a.shape == b.shape and np.array_equal(a, b, equal_nan=True) for a, b in zip(parts[v], parts[first])):
                twins[v] = first
                break
    return twins


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


def legend_cols(variants: list[str], width_in: float) -> int:
    per = 0.45 + 0.055 * max(len(v) for v in variants)  # inches per entry at 7 pt
    return max(1, min(len(variants), int(width_in // per)))


def legend_rows(variants: list[str], width_in: float, styles: dict | None = None) -> int:
    labels = [styles[v]["label"] for v in variants] if styles else variants
    return math.ceil(len(labels) / legend_cols(labels, width_in))


def add_legend(fig, styles: dict, variants: list[str], width_in: float) -> None:
    handles = [plt.Line2D([], [], color=styles[v]["color"], ls=styles[v]["ls"], lw=1.6) for v in variants]
    labels = [styles[v].get("label", v) for v in variants]
    fig.legend(handles, labels, loc="outside lower center", ncols=legend_cols(labels, width_in),
               handlelength=2.2, columnspacing=1.2)


def break_word(word: str, wide) -> str:
    """A word wider than its room (wide(s) says whether s is) on several lines: broken after an underscore
    where one falls in the line, anywhere else where none does."""
    lines = [""]
    for piece in re.findall(r"[^_]*_|[^_]+", word):
        if not wide(lines[-1] + piece):
            lines[-1] += piece
            continue
        if lines[-1]:
            lines.append("")
        for ch in piece:  # a piece too wide on its own line is cut where it must be
            if lines[-1] and wide(lines[-1] + ch):
                lines.append("")
            lines[-1] += ch
    return "\n".join(lines)


def wrap(text: str, wide) -> str:
    """text on as many lines as it needs to keep each within its room: at spaces, and inside a word (break_word)
    that is too wide alone."""
    if "\n" in text:
        return "\n".join(wrap(line, wide) for line in text.split("\n"))
    lines: list[str] = []
    for word in text.split(" "):
        if lines and not wide(lines[-1] + " " + word):
            lines[-1] += " " + word
        else:
            lines.extend((break_word(word, wide) if wide(word) else word).split("\n"))
    return "\n".join(lines)


def text_wider_than(fig, size: float, room: float):
    """The predicate wrap and break_word take: is a string at this font size wider than room pixels?"""
    from matplotlib.font_manager import FontProperties
    renderer, prop = fig.canvas.get_renderer(), FontProperties(size=size)
    return lambda s: renderer.get_text_width_height_descent(s, prop, ismath=False)[0] > room


def suptitle(fig, text: str) -> None:
    """fig.suptitle(text, wrap=True), but a word wider than the figure is broken too: matplotlib wraps at
    spaces only, so a long ablation name (one word) ran off both edges."""
    wide = text_wider_than(fig, plt.rcParams["figure.titlesize"], 0.95 * fig.get_figwidth() * fig.dpi)
    text = "\n".join(" ".join(break_word(w, wide) if wide(w) else w for w in line.split(" ")) for line in text.split("\n"))
    fig.suptitle(text, wrap=True)


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
    values = np.where(have, matrix, 0.0)
    # summed seed by seed, not by `values @ counts`: BLAS picks its kernel, and with it the order of the sum, by the
    # CPU (OpenBLAS takes its Haswell kernel on a Zen 5 and its SkylakeX one on a Zen 4), so a band then differs in
    # the last bit between machines and a committed figure's digest with it
    total, weight = np.zeros((len(matrix), n_boot)), np.zeros((len(matrix), n_boot))
    for j in range(n):
        total += values[:, j, None] * counts[j]
        weight += have[:, j, None] * counts[j]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = total / weight  # (steps, n_boot)
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
