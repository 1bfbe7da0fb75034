"""Figures and REPORT.md for one ablation directory, drawn from its files alone.

`python -m grpo_bench plot DIR [--format png|pdf|svg]` rebuilds everything here
without training. What the figures draw over seeds:
- curves with >= BAND_SEEDS seeds per variant: the mean and a 95% bootstrap CI of
  the mean; with fewer, every seed as a thin line under the bold mean (a Student-t
  band on three seeds is wider than the data and leaves the metric's range);
- heavy-tailed diagnostics (ratios, grad norms, KL(old), times): median and
  quartiles on a log scale;
- every line and band is clipped to its metric's declared range (METRIC_RANGES).
"Beyond seed noise" means a Welch t-test between two variants' per-seed final values
with p < 0.05 after Holm's correction over all pairs compared.
"""
from __future__ import annotations

import contextlib
import fnmatch
import itertools
import json
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
from scipy import stats  # noqa: E402

from .config import ConfigError  # noqa: E402
from .runner import read_metrics_file  # noqa: E402

ALPHA = 0.05
BAND_SEEDS = 5  # fewer seeds than this: draw the seeds themselves, not a band
N_BOOT = 1000
FORMATS = ("png", "pdf", "svg")

# (summary column, label, metric whose curve is drawn)
HEADLINE = [
    ("final/reward", "final reward", "reward/mean"),
    ("final/eval/accuracy", "eval accuracy", "eval/accuracy"),
    ("final/eval/accuracy_gain", "eval accuracy gain", "eval/accuracy_gain"),
    ("final/eval/reward", "eval reward", "eval/reward"),
    ("final/eval/pass@k", "eval pass@k", "eval/pass@k"),
]
LABELS = {"reward/mean": "rollout reward", "eval/reward": "held-out reward", "eval/accuracy": "held-out accuracy",
          "eval/accuracy_gain": "held-out accuracy gain", "eval/pass@k": "held-out pass@k"}
# The headline of a task: its main metric, then a second curve beside it. Results hold no
# task name, so a task is known by a metric only it logs; the first row that matches wins.
# On the sorting toy an exact sort of 6 numbers stays rare, so the reward is what moves.
MAIN_METRICS = [
    ("eval/accuracy_gain", ["eval/accuracy", "reward/mean"]),  # an LM task with a base policy
    ("reward/mean", ["reward/mean", "eval/reward"]),  # the sorting toy: rollout reward and its held-out twin
]
DIAGNOSTICS = ["clip/*", "kl/*", "entropy", "ratio/*", "grad/norm", "reward/zero_std_frac", "filter/*",
               "delta/abs_mean", "response/*"]


@dataclass(frozen=True)
class Range:
    lo: float = -math.inf
    hi: float = math.inf
    heavy: bool = False  # heavy-tailed: median and quartiles on a log scale


INF = math.inf
# What a metric can be, by name pattern (fnmatch); the first match wins, no match = unbounded.
METRIC_RANGES = [
    ("*accuracy_gain", Range(-1, 1)),
    ("*accuracy", Range(0, 1)), ("*pass@k", Range(0, 1)), ("*/format", Range(0, 1)), ("*frac*", Range(0, 1)),
    ("reward/solved", Range(0, 1)), ("response/finished", Range(0, 1)),
    ("ratio/*", Range(0, INF, True)), ("grad/norm", Range(0, INF, True)), ("kl/old", Range(0, INF, True)),
    ("time/*", Range(0, INF, True)),
    ("entropy", Range(0)), ("*/std", Range(0)), ("*abs*", Range(0)), ("response/length*", Range(0)),
]


def metric_range(metric: str) -> Range:
    name = metric.removeprefix("final/")
    return next((r for pat, r in METRIC_RANGES if fnmatch.fnmatchcase(name, pat)), Range())


def label(metric: str) -> str:
    return LABELS.get(metric, metric)


def final_column(metric: str) -> str:
    return "final/reward" if metric == "reward/mean" else f"final/{metric}"


def main_metrics(metric_names) -> list[str]:
    names = set(metric_names)
    for marker, panels in MAIN_METRICS:
        if marker in names:
            return [m for m in panels if m in names]
    return []


def main_column(summary: pd.DataFrame) -> str | None:
    """The summary column of a task's main metric (final/reward on the toy, final/eval/accuracy on an LM)."""
    names = {"reward/mean" if c == "final/reward" else c.removeprefix("final/")
             for c in summary.columns if c.startswith("final/") and summary[c].notna().any()}
    found = [final_column(m) for m in main_metrics(names)] + [h[0] for h in headline_columns(summary)]
    return found[0] if found else None


# ------------------------------------------------------------------------------ style

# Okabe & Ito's colour-blind-safe palette, with grey for its yellow (too faint on white).
# Past eight variants the colours repeat with another dash and marker.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8C8C8C"]
DASHES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]
COLUMN_IN = 3.4  # one column of a two-column paper
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
    fig.savefig(out / name, dpi=200, metadata=meta)
    plt.close(fig)
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


def by_metric(metrics: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The long metrics table split once per metric: the figures look metrics up by name."""
    return {str(k): g for k, g in metrics.groupby("metric", observed=True, sort=False)}


def points_per_run(curves: dict, metric: str) -> int:
    m = curves.get(metric)
    return int(m.groupby("run", observed=True).step.nunique().max()) if m is not None and len(m) else 0


# ---------------------------------------------------------------------------- drawing


def draw_curves(ax, curves: dict, metric: str, order: list[str], styles: dict) -> str:
    """Draw one metric over training for every variant; return what the lines and bands are."""
    rng_ = metric_range(metric)
    seeds, positive = [], []
    for v, table in run_matrices(curves, metric, order).items():
        steps, M = table.index.to_numpy(float), table.to_numpy(float)
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
    if rng_.heavy:
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
            # plain numbers (1, 2, 5 x 10^k over a short range), not 6 x 10^-2 minor labels
            lo_, hi_ = ax.get_ylim()
            decades = math.log10(hi_ / lo_)
            subs = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if decades < 1 else (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)
            ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs, numticks=8))
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    if rng_.lo == 0 and rng_.hi == 1 and not rng_.heavy:
        lo_, hi_ = ax.get_ylim()
        ax.set_ylim(max(lo_, -0.02), min(hi_, 1.02))
    return describe_band(metric, min(seeds) if seeds else 0)


def describe_band(metric: str, seeds: int) -> str:
    if seeds < BAND_SEEDS:
        what = "median" if metric_range(metric).heavy else "mean"
        return f"thin lines: each of {seeds} seeds; bold: their {what}"
    if metric_range(metric).heavy:
        return "median and quartiles over seeds, log scale"
    return f"mean over {seeds} seeds, band: 95% bootstrap CI of the mean"


def _what(meta: dict, summary: pd.DataFrame) -> str:
    n_seeds = len(meta["seeds"])
    axes = [a for a in meta.get("axes") or [] if a != "variant_name"]  # variant_name: a list of named variants
    of = f" of {'/'.join(axes)}" if axes else ""
    return f"{len(meta['variants'])} variants{of}, {n_seeds} seed{'s' * (n_seeds != 1)}"


def _drawn(meta: dict, curves: dict, panels: list[str]) -> list[str]:
    seen = set().union(*(set(curves[m].variant.unique()) for m in panels if m in curves))
    return [v for v in meta["variants"] if v in seen]


def curves_figure(meta: dict, summary: pd.DataFrame, curves: dict, panels: list[str], styles: dict, title: str):
    """Panels stacked in one column, one metric each, one legend under them."""
    order = _drawn(meta, curves, panels)
    rows = _legend_rows(order, COLUMN_IN)
    fig, axes = plt.subplots(len(panels), 1, figsize=(COLUMN_IN, 0.55 + 1.75 * len(panels) + 0.14 * rows),
                             sharex=True, squeeze=False)
    bands = []
    for ax, metric in zip(axes[:, 0], panels):
        bands.append(draw_curves(ax, curves, metric, order, styles))
        ax.set_ylabel(label(metric))
    axes[-1, 0].set_xlabel("gradient step")
    fig.suptitle(f"{meta['name']}: {title}\n{_what(meta, summary)}")
    _legend(fig, styles, order, COLUMN_IN)
    return fig, bands


def dot_panels(rows: list[str], panels: list[tuple[str, str, str, dict]], styles: dict, title: str):
    """Per-seed values (dots), their mean (bar) and, with enough seeds, its 95% bootstrap CI (line).

    panels: (summary column, x label, panel title, {variant: per-seed values}). Variants run
    down a shared y axis, so any number of them and any name length stay legible.
    """
    width = min(PAGE_IN, 1.1 + 0.05 * max(len(v) for v in rows) + 2.0 * len(panels))
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 0.9 + 0.22 * len(rows)), sharey=True, squeeze=False)
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
    fig.suptitle(title)
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
    cols = min(3, len(diag))
    rows = math.ceil(len(diag) / cols)
    lrows = _legend_rows(order, PAGE_IN)
    fig, axes = plt.subplots(rows, cols, figsize=(PAGE_IN, 0.5 + 1.7 * rows + 0.14 * lrows), sharex=True,
                             squeeze=False)
    for ax, metric in zip(axes.flat, diag):
        draw_curves(ax, curves, metric, order, styles)
        ax.set_title(metric + (", log scale" if metric_range(metric).heavy else ""))
    for ax in list(axes.flat)[len(diag):]:
        ax.axis("off")
    for i in range(cols):  # the lowest drawn panel of each column carries the step axis
        ax = axes[(len(diag) - 1 - i) // cols, i]
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel("gradient step")
    fig.suptitle(f"{meta['name']}: training diagnostics, {_what(meta, summary)}")
    _legend(fig, styles, order, PAGE_IN)
    return fig


def diagnostics_in(metric_names) -> list[str]:
    names = sorted(set(metric_names))
    out: list[str] = []
    for pat in DIAGNOSTICS:
        out += [m for m in names if fnmatch.fnmatchcase(m, pat) and m not in out]
    return out


# ----------------------------------------------------------------------------- report


META_KEYS = {"name": str, "source": str, "variants": list, "seeds": list, "runs": list}


def read_meta(d: Path) -> dict:
    """d/ablation.json, checked; ConfigError naming the file when it is missing, not JSON or lacks a key."""
    path = d / "ablation.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(str(d), "<dir>", "not a results directory: no ablation.json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), "<file>", f"not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(meta, dict):
        raise ConfigError(str(path), "<root>", f"expected a mapping with {', '.join(META_KEYS)}")
    bad = [key for key, kind in META_KEYS.items() if not isinstance(meta.get(key), kind)]
    if bad:
        raise ConfigError(str(path), ", ".join(bad), "missing or of the wrong type; the runner writes "
                          + ", ".join(f"{k} ({t.__name__})" for k, t in META_KEYS.items()))
    return meta


def read_table(path: Path, columns: list[str], dtype: dict | None = None) -> pd.DataFrame:
    """A CSV the runner wrote, with at least `columns`; ConfigError when it is empty, cut short or unreadable.
    A lone newline is the table of no runs, which a sweep interrupted before its first run leaves."""
    data = path.read_bytes()
    if data == b"\n":
        return pd.DataFrame(columns=columns)
    if not data:
        raise ConfigError(str(path), "<file>", "empty (0 bytes): damaged; rerun the sweep to rewrite it")
    if not data.endswith(b"\n"):
        raise ConfigError(str(path), "<file>", "cut short (no final newline): damaged; rerun the sweep to rewrite it")
    try:
        df = pd.read_csv(path, dtype=dtype)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(str(path), "<file>", f"unreadable: {str(e).splitlines()[0]}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(str(path), "<columns>", f"no column {', '.join(missing)}; has {', '.join(map(str, df.columns))}")
    return df


def metrics_path(out: Path) -> Path | None:
    """The long metrics table of a results directory: metrics.parquet, or metrics.csv from before it."""
    return next((p for p in (out / "metrics.parquet", out / "metrics.csv") if p.is_file()), None)


def load(out: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(ablation.json, summary.csv, the metrics table) of a results directory; ConfigError naming a bad file."""
    meta = read_meta(out)
    summary = read_table(out / "summary.csv", ["run", "variant", "status"])
    if summary.empty:
        summary = pd.DataFrame(columns=["run", "variant", "seed", "status", "error", "wall_s"])
    path = metrics_path(out)
    if path is None:
        raise ConfigError(str(out), "<dir>", "not a results directory: no metrics.parquet or metrics.csv")
    columns, names = ["run", "variant", "step", "metric", "value"], {"run": "category", "variant": "category",
                                                                    "metric": "category"}
    if path.suffix == ".csv":
        metrics = read_table(path, columns, names)
    else:
        try:
            metrics = read_metrics_file(path).astype(names)
        except ValueError as e:
            raise ConfigError(str(path), "<file>", f"{e}: damaged; rerun the sweep to rewrite it") from None
        missing = [c for c in columns if c not in metrics.columns]
        if missing:
            raise ConfigError(str(path), "<columns>", f"no column {', '.join(missing)}")
    if len(metrics) and not (pd.api.types.is_numeric_dtype(metrics.value) and pd.api.types.is_numeric_dtype(metrics.step)):
        raise ConfigError(str(path), "value", "holds a step or value that is not a number: damaged")
    return meta, summary, metrics


def finished_in_report(path: Path) -> int | None:
    """How many finished runs a REPORT.md written by `_markdown` reports; None without one."""
    try:
        found = re.search(r"; (\d+) runs finished, \d+ failed", path.read_text())
    except (OSError, UnicodeDecodeError):
        return None
    return int(found.group(1)) if found else None


def headline_columns(summary: pd.DataFrame) -> list[tuple[str, str, str]]:
    return [h for h in HEADLINE if h[0] in summary.columns and summary[h[0]].notna().any()]


def build_figures(out: str | Path) -> list[tuple[str, object, str]]:
    """Every figure of a results directory as (file stem, Figure, caption); nothing is written."""
    meta, summary, metrics = load(Path(out))
    curves = by_metric(metrics)
    styles = variant_styles(meta["variants"])
    ok = summary[summary.status == "ok"]
    headline = headline_columns(summary)
    figures = []
    with style():
        main = [m for m in main_metrics(curves) if points_per_run(curves, m) >= 2]
        if main:
            fig, bands = curves_figure(meta, summary, curves, main, styles, " and ".join(map(label, main)))
            figures.append(("headline", fig, f"{' and '.join(map(label, main))} over training ({bands[0]})"))
        for _, name, metric in headline:
            if metric in main or points_per_run(curves, metric) < 2:
                continue  # a single point is not a curve: the final value is in final_values
            if metric == "eval/accuracy_gain" and "eval/accuracy" in curves:
                continue  # accuracy shifted by the starting accuracy: the same curve again
            fig, bands = curves_figure(meta, summary, curves, [metric], styles, label(metric))
            figures.append((f"curve_{slug(metric)}", fig, f"{label(metric)} over training ({bands[0]})"))
        if headline and not ok.empty:
            mains = [final_column(m) for m in main]
            cols = sorted(headline, key=lambda h: (h[0] not in mains, mains.index(h[0]) if h[0] in mains else 0))
            if any(c == "final/eval/accuracy" for c, _, _ in cols):  # the gain is accuracy shifted by a constant
                cols = [h for h in cols if h[0] != "final/eval/accuracy_gain"]
            cols = [(c, n) for c, n, _ in cols[:3]]
            figures.append(("final_values", final_values_figure(meta, summary, cols, styles),
                            "final values per seed (dots) with their mean (bar)"
                            + (f" and its 95% bootstrap CI (line)" if len(meta["seeds"]) >= BAND_SEEDS else "")))
        diag = [m for m in diagnostics_in(curves) if points_per_run(curves, m) >= 2]
        if diag:
            figures.append(("diagnostics", diagnostics_figure(meta, summary, curves, diag, styles),
                            "training diagnostics: " + ", ".join(diag) + f" ({describe_band('', len(meta['seeds']))};"
                            " ratios, grad norm and KL(old): median and quartiles, log scale)"))
    stems = [s for s, _, _ in figures]
    assert len(stems) == len(set(stems)), f"two figures share a file name: {stems}"
    return figures


def make_report(out: str | Path, fmt: str = "png") -> Path:
    out = Path(out)
    if fmt not in FORMATS:
        raise ValueError(f"format: {fmt!r}; valid: {', '.join(FORMATS)}")
    meta, summary, _ = load(out)
    ok = summary[summary.status == "ok"]
    with style():
        figures = [(save(fig, out, stem, fmt), caption) for stem, fig, caption in build_figures(out)]
    text = _markdown(meta, summary, ok, headline_columns(summary), meta["variants"], figures)
    tmp = out / f".REPORT.md.tmp-{os.getpid()}"  # whole or not at all: a full disk keeps the last report
    try:
        tmp.write_text(text)
        os.replace(tmp, out / "REPORT.md")
    finally:
        tmp.unlink(missing_ok=True)
    return out / "REPORT.md"


# ----------------------------------------------------------------------- significance


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


def answer(summary: pd.DataFrame, column: str, order: list[str]) -> str:
    """One line from the data: the best variant, whom it beats beyond noise, how many pairs differ."""
    ok = summary[(summary.status == "ok")]
    if column not in ok or ok[column].isna().all():
        return "no finished runs."
    means = ok.groupby("variant")[column].agg(["mean", "std", "count"]).reindex([v for v in order if v in set(ok.variant)])
    best = means["mean"].idxmax()
    b = means.loc[best]
    tests = pairwise(summary, column, order)
    beaten = [t for t in tests if t["significant"] and best in (t["a"], t["b"])
              and (t["mean_a"] if t["a"] == best else t["mean_b"]) > (t["mean_b"] if t["a"] == best else t["mean_a"])]
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
    line += f"; {len(sig)} of {len(tests)} pairs differ beyond seed noise"
    if 0 < len(sig) <= 3 and len(sig) < len(tests):  # few enough to name, in the ablation's order
        pairs = sorted(((t["a"], t["b"]) if t["mean_a"] > t["mean_b"] else (t["b"], t["a"]) for t in sig),
                       key=lambda p: (order.index(p[0]), order.index(p[1])))
        line += " (" + ", ".join(f"`{hi}` > `{lo}`" for hi, lo in pairs) + ")"
    return line + "."


def label_column(column: str) -> str:
    return next((n for c, n, _ in HEADLINE if c == column), column)


def _fmt(mean: float, std: float) -> str:
    return "—" if math.isnan(mean) else f"{mean:.3f} ± {0.0 if math.isnan(std) else std:.3f}"


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
    for column, name, _ in headline:
        tests = pairwise(summary, column, order) if len(ok) else []
        lines += [f"## Differences in {name} beyond seed noise", ""]
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
