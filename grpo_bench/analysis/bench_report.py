"""Turn pytest-benchmark JSON from tests/benchmarks into a table, a plot and the goal checks.

    pytest --benchmark-only --benchmark-json=results/kernels/benchmark.json
    python -m grpo_bench.analysis.bench_report results/kernels/benchmark.json

Writes, next to nothing but the JSON it read (or into --out):
    benchmarks.csv  one row per (case, provider): times, rows/s, GB/s, peak memory, device
    benchmarks.md   the command that rebuilds it, per-case tables with speed-ups over the naive/torch baseline and the share of
                    the memory bound (the `bound` row: one read of the logits) each provider reaches,
                    the device they came from and the issue's CPU goals checked against the numbers
    benchmarks.png  speed-up over the baseline (naive log-prob, torch loss, materialised GRPO step), one
                    panel per case, the memory bound dashed
Everything is drawn from the JSON alone, so the outputs can be rebuilt at any time.
"""
from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from . import figdata, png  # noqa: E402
from .plotting import PALETTE  # noqa: E402

BASELINE = {"logprob": "naive", "grpo_loss": "torch", "lm_step": "materialised"}
BAR, BOUND = PALETTE[0], PALETTE[1]   # drawn, and kept exact by png.shrink
COLUMNS = ["kernel", "mode", "group", "provider", "n", "v", "dtype", "rounds", "min_ms", "median_ms",
           "iqr_ms", "rows_per_s", "gb_per_s", "peak_mem_mb", "compile_s", "speedup", "of_bound", "device", "torch",
           "load_avg", "omp_wait_policy", "datetime"]


def load(paths: list[Path]) -> pd.DataFrame:
    rows = []
    for path in paths:
        data = json.loads(path.read_text())
        for b in data["benchmarks"]:
            e, s = b["extra_info"], b["stats"]
            if "provider" not in e:
                continue  # a benchmark from elsewhere in the suite
            rows.append({**e, "rounds": s["rounds"], "min_ms": s["min"] * 1e3, "median_ms": s["median"] * 1e3,
                         "iqr_ms": s["iqr"] * 1e3, "datetime": data.get("datetime", "")})
    df = pd.DataFrame(rows)
    if df.empty:
        raise SystemExit("no kernel benchmarks in " + ", ".join(map(str, paths)))
    for col in COLUMNS:
        if col not in df:
            df[col] = None
    base = df[df.provider == df.kernel.map(BASELINE)].set_index("group").median_ms
    df["speedup"] = df.group.map(base) / df.median_ms
    bound = df[df.provider == "bound"].set_index("group").median_ms
    # 1.0 = as fast as reading the logits once (the `bound` row), else the share the benchmark
    # recorded against its case's bytes over the measured copy bandwidth
    measured = df.group.map(bound) / df.median_ms
    df["of_bound"] = measured.where(measured.notna(), pd.to_numeric(df.of_bound, errors="coerce"))
    order = df.kernel.map({k: i for i, k in enumerate(BASELINE)})  # log-probs first, then the loss
    return (df.assign(_order=order).sort_values(["_order", "mode", "v", "n", "median_ms"])[COLUMNS]
            .reset_index(drop=True))


def _named(policy) -> bool:
    """An OMP_WAIT_POLICY the benchmark recorded (a JSON from before it did has none: NaN beside the others)."""
    return isinstance(policy, str) and policy != ""


def _check(lines: list[str], what: str, value: float, target: float, higher: bool = True, unit: str = "x") -> None:
    ok = value >= target if higher else value <= target
    lines.append(f"- {what}: {value:.3g}{unit} (goal {'>=' if higher else '<='} {target:g}{unit}): "
                 f"**{'met' if ok else 'missed'}**")


def goals(df: pd.DataFrame) -> list[str]:
    """The log-prob kernel's CPU goals, checked on the N=4096, V=50,257 fp32 forward case."""
    case = df[(df.kernel == "logprob") & (df["mode"] == "fwd") & (df.n == 4096) & (df.v == 50_257)
              & (df.dtype == "float32")].set_index("provider")
    if "chunked" not in case.index or "naive" not in case.index:
        return ["- the N=4096, V=50,257 fp32 forward case is not in this run."]
    t = case.median_ms
    lines: list[str] = []
    _check(lines, "chunked vs naive, forward speed-up", t["naive"] / t["chunked"], 2)
    for trl in ("trl", "trl_rows"):
        if trl in t:
            _check(lines, f"chunked vs {trl}, forward speed-up", t[trl] / t["chunked"], 3)
    mem = case.peak_mem_mb
    _check(lines, "chunked peak extra memory / naive's", mem["chunked"] / mem["naive"], 0.1, higher=False, unit="")
    return lines


def gpu_goals(df: pd.DataFrame) -> list[str]:
    """The kernels' GPU goals: the log-prob forward at >= 90% of the measured memory bound and of
    3.0 TB/s (an H100's achievable HBM bandwidth) at N=16,384, V=151,936 bf16; forward+backward
    within 1.2x of the three-pass bound; the fused loss >= 3x eager torch and no slower than
    torch.compile."""
    gpu = df[~df.device.fillna("").str.contains("cores")]  # CPU device names carry their core count
    lines: list[str] = []
    fwd = gpu[(gpu.kernel == "logprob") & (gpu["mode"] == "fwd") & (gpu.n == 16_384) & (gpu.v == 151_936)
              & (gpu.dtype == "bfloat16")].set_index("provider")
    if "triton" in fwd.index:
        _check(lines, "triton log-prob forward, N=16,384 V=151,936 bf16: share of the measured bound",
               fwd.of_bound["triton"], 0.9, unit="")
        _check(lines, "the same, GB/s over 3.0 TB/s", fwd.gb_per_s["triton"] / 3000, 0.9, unit="")
    for group, g in gpu[(gpu.kernel == "logprob") & (gpu["mode"] == "fwd+bwd")].groupby("group", sort=False):
        t = g.set_index("provider").median_ms
        if "triton" in t and "bound" in t:
            _check(lines, f"{group}: triton time / three-pass bound", t["triton"] / t["bound"], 1.2, higher=False)
    for group, g in gpu[gpu.kernel == "grpo_loss"].groupby("group", sort=False):
        t = g.set_index("provider").median_ms
        if "triton" in t and "torch" in t:
            _check(lines, f"{group}: fused speed-up over eager torch", t["torch"] / t["triton"], 3)
        if "triton" in t and "compile" in t:
            _check(lines, f"{group}: fused time / torch.compile's", t["triton"] / t["compile"], 1.0, higher=False)
    return lines


def step_goals(df: pd.DataFrame) -> list[str]:
    """The GRPO step's goals per case: the fused path's peak extra memory at most a tenth of the
    materialised path's, at no more than 1.2x its time."""
    lines: list[str] = []
    for group, g in df[df.kernel == "lm_step"].groupby("group", sort=False):
        c = g.set_index("provider")
        if "materialised" not in c.index or "fused" not in c.index:
            lines.append(f"- {group}: materialised path not measured (skipped: not enough memory for it here)")
            continue
        _check(lines, f"{group}: fused peak extra memory / materialised's",
               c.peak_mem_mb["fused"] / c.peak_mem_mb["materialised"], 0.1, higher=False, unit="")
        _check(lines, f"{group}: fused time / materialised's",
               c.median_ms["fused"] / c.median_ms["materialised"], 1.2, higher=False)
    return lines


def markdown(df: pd.DataFrame) -> str:
    out = []
    for (device, torch_v, when, policy), run in df.groupby(["device", "torch", "datetime", "omp_wait_policy"],
                                                            sort=False, dropna=False):
        out.append(f"Device: {device}; torch {torch_v}; run {when[:19]} ({', '.join(run.kernel.unique())}); "
                   f"load average {run.load_avg.min():.1f}-{run.load_avg.max():.1f}"
                   + (f"; OMP_WAIT_POLICY={policy}" if _named(policy) else "") + "  ")
    out.append("")
    for group, g in df.groupby("group", sort=False):
        base = BASELINE[g.kernel.iloc[0]]
        out += [f"**{group}**", "", f"| provider | median ms | min ms | rows/s | GB/s | peak extra MB | x {base} "
                "| of bound |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in g.itertuples():
            of_bound = "—" if pd.isna(r.of_bound) else f"{r.of_bound:.0%}"
            speedup = "—" if pd.isna(r.speedup) else f"{r.speedup:.2f}"
            out.append(f"| {r.provider} | {r.median_ms:.2f} | {r.min_ms:.2f} | {r.rows_per_s:.3g} | "
                       f"{r.gb_per_s:.2f} | {r.peak_mem_mb:.1f} | {speedup} | {of_bound} |")
        out.append("")
    on_cpu = df.device.fillna("").str.contains("cores")
    if (on_cpu & (df.kernel == "logprob")).any():
        out += ["Goals (CPU, fp32, N=4096, V=50,257, forward):"] + goals(df) + [""]
    if (~on_cpu & df.kernel.isin(["logprob", "grpo_loss"])).any():
        out += ["Goals (GPU):"] + gpu_goals(df) + [""]
    if (df.kernel == "lm_step").any():
        out += ["Goals of the GRPO step (fused vs materialised):"] + step_goals(df)
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def _theme():
    """seaborn's theme for this figure only: set for good it restyled every later figure of the process (the reports'
    own, drawn in the same test worker, then differed from their committed bytes)."""
    with plt.rc_context():
        sns.set_theme(style="whitegrid", font_scale=0.8)
        yield


def draw(df: pd.DataFrame):
    """The speed-up figure (a seaborn FacetGrid): one panel per case, the memory bound dashed."""
    with _theme():
        # a case without its baseline (a materialised step that did not fit) has no speed-up to draw
        bars = df[(df.provider != "bound") & df.speedup.notna()]
        grid = sns.catplot(bars, kind="bar", x="speedup", y="provider", col="group", col_wrap=3, sharex=False,
                           sharey=False, height=2.6, aspect=1.5, color=BAR,
                           saturation=1)  # seaborn's 0.75 would give the bars a colour png.shrink's palette lacks
        grid.set_titles("{col_name}", size="small")
        grid.set_axis_labels("speed-up over baseline (median time)", "")
        bound = df[df.provider == "bound"].set_index("group").speedup
        for group, ax in grid.axes_dict.items():
            ax.axvline(1.0, color="k", lw=0.8)
            if group in bound:  # the memory bound: what one read of the logits takes
                ax.axvline(bound[group], color=BOUND, ls="--", lw=1.0, label="memory bound")
                ax.legend(loc="lower right", fontsize="x-small")
        runs = df[["device", "omp_wait_policy"]].drop_duplicates()   # every machine the JSON came from
        grid.figure.suptitle("; ".join(d + (f", OMP_WAIT_POLICY={p}" if _named(p) else "") for d, p in runs.values),
                             y=1.02)
    return grid


def save(grid, path: Path) -> None:
    with _theme():   # ticks and text are laid out again as the figure is written
        grid.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(grid.figure)
    png.shrink(path, [BAR, BOUND])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", type=Path, help="pytest-benchmark --benchmark-json file(s)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: the first JSON's folder)")
    args = ap.parse_args()
    out = args.out or args.json[0].parent
    out.mkdir(parents=True, exist_ok=True)
    df = load(args.json)
    df.to_csv(out / "benchmarks.csv", index=False, float_format="%.6g")
    grid = draw(df)
    # the sources and the figure's digest in the text: tests/test_bench_report.py rebuilds each committed table
    # from its JSON and holds the figure to what it draws, without comparing PNG bytes
    md = (f"Rebuild with `python -m grpo_bench.analysis.bench_report {' '.join(map(str, args.json))}`.\n\n"
          + markdown(df) + "\n" + figdata.note("benchmarks.png", grid.figure) + "\n")
    (out / "benchmarks.md").write_text(md)
    save(grid, out / "benchmarks.png")
    print(md)


if __name__ == "__main__":
    main()
