"""Across ablations: several results directories side by side, and the gallery of them all.

    python -m grpo_bench compare results/policy_losses_sort results/policy_losses_lm [--metric M] [--out DIR]
    python -m grpo_bench gallery results

`compare` puts each directory's per-seed final values in one figure (a panel per
directory, the same variant on the same row and in the same colour in every panel)
and one markdown table (mean with its CI, interquartile mean, rank), with Kendall's
tau-b between the variant orderings (by mean) of every pair of directories over the
variants they share: does the toy order the variants as the LM does? Each pair of
shared variants is then tested in every directory (grpo_bench.stats: paired where the
seeds match, Holm over the directory's pairs, MDE, TOST, a verdict), so a reader sees
where both orderings are decided and where one of them could not have told. `gallery` writes results/README.md: for every ablation its
question, its headline figure and a one-line answer computed from its summary.csv.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
from scipy.stats import kendalltau, rankdata

from . import figdata, figures, plotting, report
from .. import stats
from ..store import rundir
from ..store.metrics import higher_is_better, main_column, resolve_column
from ..errors import ConfigError


@dataclass
class Side:
    """One results directory, reduced to one summary column."""

    dir: Path
    name: str
    column: str
    seeds: int
    values: dict[str, np.ndarray] = field(default_factory=dict)  # variant -> per-seed values, ablation order
    by_seed: dict[str, pd.Series | np.ndarray] = field(default_factory=dict)  # the same, indexed by seed if known
    meta: dict = field(default_factory=dict)  # ablation.json: its claim and setting give the equivalence margin

    @property
    def means(self) -> pd.Series:
        return pd.Series({v: float(np.mean(x)) for v, x in self.values.items()}, dtype=float)


def _read(d: Path) -> tuple[dict, pd.DataFrame]:
    if not (d / "ablation.json").is_file() or not (d / "summary.csv").is_file():
        raise ConfigError(str(d), "<dir>", "not a results directory (needs ablation.json and summary.csv)")
    return rundir.read_meta(d), rundir.read_table(d / "summary.csv", ["run", "variant", "status"])


def load_side(d: str | Path, metric: str | None) -> Side:
    d = Path(d)
    meta, summary = _read(d)
    rundir.check_runs(d, meta, summary, partial=False)
    if summary.empty:
        raise ConfigError(str(d / "summary.csv"), "run", "holds no runs: its sweep has not finished one")
    if not (summary.status == "ok").any():
        raise ConfigError(str(d / "summary.csv"), "status", f"every one of its {len(summary)} runs failed (their "
                          "errors are in summary.csv and REPORT.md): nothing to compare")
    column = resolve_column(summary, metric, str(d / "summary.csv"), meta)
    ok = summary[(summary.status == "ok") & summary[column].notna()]
    if ok.empty:
        raise ConfigError(str(d / "summary.csv"), column, "no finished run has a value")
    order = [v for v in meta.get("variants", []) if v in set(ok.variant)]
    order += [v for v in ok.variant.unique() if v not in order]
    values = {v: ok.loc[ok.variant == v, column].to_numpy(float) for v in order}
    by_seed = {v: pd.Series(x, index=ok.loc[ok.variant == v, "seed"].to_numpy()) if "seed" in ok else x
               for v, x in values.items()}
    return Side(d, meta.get("name", d.name), column, len(meta.get("seeds", [])), values, by_seed, meta)


def kendall(a: pd.Series, b: pd.Series) -> tuple[float, float, int]:
    """Kendall's tau-b and its two-sided p between two orderings, over the variants both have."""
    shared = [v for v in a.index if v in b.index]
    if len(shared) < 2:
        return math.nan, math.nan, len(shared)
    res = kendalltau(a[shared].to_numpy(), b[shared].to_numpy())
    return float(res.statistic), float(res.pvalue), len(shared)


def kendall_w(orderings: list[pd.Series], draws: int = 20_000) -> tuple[float, float, int, int]:
    """Kendall's W (coefficient of concordance, tie-corrected) between several tasks' orderings of the variants
    they all ran, and its permutation p: each task's ranks shuffled independently (a fixed generator, so the
    p is the same on every machine), which keeps each task's ties and is exact in expectation where the
    chi-square approximation is poor (few tasks, few variants). (W, p, tasks, variants); W and p are nan
    below two tasks or three shared variants."""
    shared = [v for v in orderings[0].index if all(v in o.index for o in orderings[1:])] if orderings else []
    m, n = len(orderings), len(shared)
    if m < 2 or n < 3:
        return math.nan, math.nan, m, n
    ranks = np.stack([rankdata(o[shared].to_numpy(dtype=float)) for o in orderings])  # (m, n), ties averaged
    ties = sum(float(np.sum(c ** 3 - c)) for r in ranks for c in np.unique(r, return_counts=True)[1:])
    denom = m * m * (n ** 3 - n) - m * ties
    if denom <= 0:  # every task ties every variant: no ordering to agree on
        return math.nan, math.nan, m, n

    def spread(r: np.ndarray) -> np.ndarray:  # S: squared deviations of the rank sums over variants
        sums = r.sum(-2)
        return ((sums - sums.mean(-1, keepdims=True)) ** 2).sum(-1)

    w = 12 * float(spread(ranks)) / denom
    rng = np.random.default_rng(0)
    shuffled = np.take_along_axis(np.broadcast_to(ranks, (draws, m, n)),
                                  rng.random((draws, m, n)).argsort(-1), -1)
    null = 12 * spread(shuffled) / denom
    p = (1 + int(np.sum(null >= w - 1e-12))) / (draws + 1)
    return w, p, m, n


def _union(sides: list[Side]) -> list[str]:
    rows: list[str] = []
    for s in sides:
        rows += [v for v in s.values if v not in rows]
    return rows


def _title(s: Side) -> str:
    return f"{s.name}: {plotting.label_column(s.column)}"


def markdown(sides: list[Side]) -> str:
    rows = _union(sides)
    higher = [higher_is_better(s.column, s.meta) for s in sides]
    ranks = [s.means.rank(ascending=not h, method="min") for s, h in zip(sides, higher)]
    head = ["variant"] + [f"{_title(s)} (rank)" for s in sides]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(sides)]
    for v in rows:
        cells = [f"`{v}`"]
        for s, r in zip(sides, ranks):
            x = s.values.get(v)
            if x is None:
                cells.append("—")
            else:
                m, lo, hi = stats.mean_ci(x)
                cells.append(f"{m:.3f} [{lo:.3f}, {hi:.3f}], IQM {stats.iqm(x):.3f} ({int(r[v])})")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Cells: mean over seeds [95% t CI], interquartile mean (rank by mean, 1 = "
              + ("highest" if all(higher) else "best: the highest, or the lowest where lower is better") + "). Kendall's τ-b "
              "between the orderings by mean of the variants both directories ran (τ = 1: the same order; p: "
              "two-sided, exact for small sets without ties):", "",
              "| A | B | shared variants | Kendall τ | p |", "|---|---|---:|---:|---:|"]
    for a, b in combinations(sides, 2):
        tau, p, n = kendall(a.means, b.means)
        cell = ("—", "—") if math.isnan(tau) else (f"{tau:+.3f}", f"{p:.3g}")
        lines.append(f"| {_title(a)} | {_title(b)} | {n} | {cell[0]} | {cell[1]} |")
    return "\n".join(lines + [""] + between(sides) + orderings(sides)) + "\n"


def variance_components(groups: list[np.ndarray]) -> tuple[float, float, float]:
    """One-way random effects on per-seed values grouped by directory (unequal sizes allowed): the variance
    between directories and within them (the method of moments, the between part floored at 0), and the F test's
    p that the directories do not differ."""
    k, sizes = len(groups), np.array([len(g) for g in groups], float)
    n, grand = sizes.sum(), np.concatenate(groups).mean()
    msb = float(sum(len(g) * (g.mean() - grand) ** 2 for g in groups) / (k - 1))
    msw = float(sum(((g - g.mean()) ** 2).sum() for g in groups) / (n - k))
    n0 = (n - (sizes ** 2).sum() / n) / (k - 1)
    from scipy.stats import f
    p = float(f.sf(msb / msw, k - 1, n - k)) if msw > 0 else (0.0 if msb > 0 else 1.0)
    return max(0.0, (msb - msw) / n0), msw, p


def between(sides: list[Side]) -> list[str]:
    """How much of each variant's spread is the directory's, where every directory read one metric: with
    directories that differ only in their start (task.model.source), the variance due to the start."""
    if len({s.column for s in sides}) > 1:
        return []
    sources = [{str(((c.get("task") or {}).get("model") or {}).get("source"))
                for c in (s.meta.get("configs") or {}).values()} for s in sides]
    one = [next(iter(x)) if len(x) == 1 else None for x in sources]
    what = "start" if None not in one and len(set(one)) == len(sides) else "directory"
    rows = [v for v in _union(sides) if sum(len(s.values.get(v, [])) >= 2 for s in sides) >= 2]
    if not rows:
        return []
    lines = [f"Variance due to the {what}: per variant, one-way random effects over the {what}s that ran it "
             f"(seeds within each): the standard deviation between {what}s and within one (between seeds), the "
             f"{what}'s share of the total variance, and the F test's p that the {what}s do not differ. With "
             f"{len(sides)} {what}s the share is a rough estimate.", "",
             f"| variant | {what}s | σ between {what}s | σ between seeds | {what}'s share | p |",
             "|---|---:|---:|---:|---:|---:|"]
    for v in rows:
        groups = [s.values[v] for s in sides if len(s.values.get(v, [])) >= 2]
        vb, vw, p = variance_components(groups)
        share = vb / (vb + vw) if vb + vw > 0 else math.nan
        lines.append(f"| `{v}` | {len(groups)} | {math.sqrt(vb):.4f} | {math.sqrt(vw):.4f} | {share:.0%} | {p:.3g} |")
    return lines + [""]


def orderings(sides: list[Side]) -> list[str]:
    """Every pair of variants that two or more directories ran, tested in each: is each ordering decided?"""
    rows = _union(sides)
    pairs = [(a, b) for a, b in combinations(rows, 2)
             if sum(a in s.by_seed and b in s.by_seed and len(s.values[a]) > 1 and len(s.values[b]) > 1
                    for s in sides) >= 2]
    lines = ["## Orderings in each directory", ""]
    if not pairs:
        return lines + ["No pair of variants has two seeds or more in two directories: nothing to test.", ""]
    tested = []
    for s in sides:
        mine = [(a, b, None) for a, b in pairs if a in s.by_seed and b in s.by_seed
                and len(s.values[a]) > 1 and len(s.values[b]) > 1]
        margin, source = report.column_margin(s.column, s.meta)
        tested.append({(t["a"], t["b"]): t for t in stats.compare_pairs(s.by_seed, mine, margin)})
        lines.append(f"- {_title(s)}: {len(mine)} pairs Holm-corrected together; equivalence margin "
                     + (f"±{margin:g} ({source})." if margin is not None else f"none ({source})."))
    lines += ["", report.method_text(), "",
              "| pair | " + " | ".join(_title(s) for s in sides) + " | orderings |", "|---|" + "---|" * (len(sides) + 1)]
    for a, b in pairs:
        cells, signs = [], set()
        for t in (found.get((a, b)) for found in tested):
            if t is None:
                cells.append("—")
                continue
            if t["verdict"] == stats.NOT_TESTABLE:
                cells.append(stats.verdict_text(t))
                continue
            cells.append(f"{stats.verdict_text(t)}; Δ {t['diff']:+.3f}; {stats.which_test(t)}; p_holm {t['p_holm']:.2g}; "
                         f"{stats.power_text(t)}; P(a > b) {t['poi']:.2f}")
            if t["outcome"] in ("holds", "reversed"):  # a negligible difference orders nothing a claim is about
                signs.add(t["diff"] > 0)
        agree = {1: "the same", 2: "opposite"}.get(len(signs), "—") if sum(c.startswith("`") for c in cells) >= 2 \
            else "—"
        lines.append(f"| `{a}` vs `{b}` | " + " | ".join(cells) + f" | {agree} |")
    lines += ["", "Orderings: whether the directories that decided an order (beyond seed noise, and beyond the "
              "margin: a negligible difference decides none) agree on it; — where fewer than two did."]
    return lines


def figure(sides: list[Side]):
    rows = _union(sides)
    styles = plotting.variant_styles(rows)
    # the title names the directories in full; a panel keeps what tells it apart (three named
    # sampler_mismatch_lm_seed<N> are wider than their panels)
    cut = os.path.commonprefix([s.name for s in sides]).rfind("_") + 1 if len(sides) > 1 else 0
    cut = cut if all(s.name[cut:] for s in sides) else 0
    panels = [(s.column, plotting.label_column(s.column), f"{s.name[cut:]} ({s.seeds} seeds)", s.values) for s in sides]
    title = " vs ".join(s.name for s in sides) + f": {len(rows)} variants"
    if len(sides) == 2:
        tau, p, n = kendall(sides[0].means, sides[1].means)
        # its own line: with long directory names one line overflows a page-wide figure
        title += ("" if math.isnan(tau) else f"\nKendall τ = {tau:+.2f} (p = {p:.2g}) over {n} shared variants")
    ci = f"; line: 95% bootstrap CI of the mean (>= {plotting.BAND_SEEDS} seeds)" \
        if any(len(x) >= plotting.BAND_SEEDS for s in sides for x in s.values.values()) else ""
    return figures.dot_panels(rows, panels, styles, title + f"\ndots: seeds; bar: mean{ci}")


def compare(dirs: list[str | Path], metrics: list[str] | None = None, out: str | Path | None = None,
            fmt: str = "png") -> tuple[Path, str]:
    """Write OUT/COMPARE.md and OUT/compare.<fmt>; return the markdown's path and its text."""
    if len(dirs) < 2:
        raise ConfigError("compare", "<dirs>", f"needs two or more results directories, got {len(dirs)}")
    metrics = metrics or [None]
    if len(metrics) not in (1, len(dirs)):
        raise ConfigError("compare", "--metric", f"give one metric for all or one per directory "
                          f"({len(dirs)}), got {len(metrics)}")
    if fmt not in plotting.FORMATS:
        raise ConfigError("compare", "--format", f"unknown {fmt!r}; valid: {', '.join(plotting.FORMATS)}")
    per_dir = metrics * len(dirs) if len(metrics) == 1 else metrics
    sides = [load_side(d, m) for d, m in zip(dirs, per_dir)]
    out = Path(out) if out else Path(dirs[0]).parent / ("compare_" + "_vs_".join(s.name for s in sides))
    out.mkdir(parents=True, exist_ok=True)
    with plotting.style():
        fig = figure(sides)
        name = f"compare.{fmt}"
        data = figdata.note(name, fig)  # before save, which closes the figure
        plotting.save(fig, out, "compare", fmt)
    text = (f"# Compare: {' vs '.join(s.name for s in sides)}\n\n"
            + "".join(f"- `{s.dir}`: {plotting.label_column(s.column)} (`{s.column}`), {s.seeds} seeds\n" for s in sides)
            + f"\nRebuild with `python -m grpo_bench compare {' '.join(str(s.dir) for s in sides)}"
            + "".join(f" --metric {m}" for m in metrics if m) + (f" --format {fmt}" if fmt != "png" else "")
            + f" --out {out}`.\n\n" + markdown(sides) + f"\n![side by side]({name})\n{data}\n")
    (out / "COMPARE.md").write_text(text)
    return out / "COMPARE.md", text


# ---------------------------------------------------------------------------- gallery


def question(description: str) -> str:
    """The first sentence of an ablation's description: what it sets out to compare."""
    text = " ".join(description.split())
    # a full stop ends a sentence unless it ends an abbreviation (e.g., i.e., Dr., vs.)
    end = r"(?<=[.!?])(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bDr\.)(?<!\bvs\.)(?<!\bcf\.)\s+"
    return re.split(end, text, maxsplit=1)[0] if text else "(no description)"


def gallery(root: str | Path) -> Path:
    """Write ROOT/README.md: every ablation under root, its question, headline figure and answer."""
    root = Path(root)
    (root / "README.md").write_text(gallery_text(root))
    return root / "README.md"


def gallery_text(root: str | Path) -> str:
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(str(root), "<dir>", "not a directory" if root.exists() else "no such directory")
    dirs = sorted(d for d in root.iterdir() if (d / "ablation.json").is_file() and (d / "summary.csv").is_file())
    if not dirs:
        raise ConfigError(str(root), "<dir>", "holds no results directory (a folder with ablation.json and summary.csv)")
    lines = ["# Results gallery", "",
             f"Every ablation under `{root.name}/`: the question it asks (the first sentence of its description), "
             "its headline figure and a one-line answer computed from its `summary.csv` (best variant by mean of "
             "the task's main metric; \"beyond seed noise\" = a paired test where two variants ran the same seeds, "
             "Welch's t otherwise, Holm-corrected over all pairs, "
             f"p < {report.ALPHA}). Regenerate with `python -m grpo_bench gallery <this directory>`; "
             "each ablation's own `REPORT.md` has the full tables.", ""]
    for d in dirs:
        meta, summary = _read(d)
        column = main_column(summary, meta)
        # a link is a URL: a space or a non-ASCII letter in a folder's name is percent-encoded, or Markdown stops there
        head = next((quote(f"{d.name}/headline.{f}") for f in plotting.FORMATS if (d / f"headline.{f}").is_file()), None)
        # the folder names the entry: two runs of one ablation file (spell_backward_grpo at lr 1e-3 and 1e-4) share a name
        lines += [f"## [{d.name}]({quote(d.name)}/REPORT.md)", "",
                  f"**Question.** {question(meta.get('description', ''))}", ""]
        if head:
            lines += [f"![{d.name} headline]({head})", ""]
        ans = report.answer(summary, column, meta["variants"], meta) if column else "no main metric in summary.csv."
        lines += [f"**Answer** ({plotting.label_column(column) if column else '—'}): {ans}", ""]
    extras = sorted(d for d in root.iterdir() if (d / "COMPARE.md").is_file())
    findings = (root / "FINDINGS.md").is_file()
    if (root / "kernels" / "benchmarks.md").is_file() or extras or findings:
        lines += ["## Other results", ""]
        if findings:
            lines.append("- [FINDINGS.md](FINDINGS.md): the suite's verdict on each published claim it tests")
        lines += [f"- [{d.name}]({quote(d.name)}/COMPARE.md): variants compared across ablations" for d in extras]
        if (root / "kernels" / "benchmarks.md").is_file():
            lines.append("- [kernels](kernels/benchmarks.md): log-prob and GRPO-loss kernel benchmarks")
        lines.append("")
    return "\n".join(lines)
