"""Turn the population benchmark's --benchmark-json file into results/population/.

    .venv/bin/python -m pytest tests/benchmarks/test_bench_population.py --benchmark-only \
        --benchmark-json /tmp/population.json
    .venv/bin/python -m grpo_bench.analysis.bench_population /tmp/population.json

Writes population.csv (one row per provider: runs, CPU and wall seconds, runs per
core-minute, peak RSS) and population.md (the table README quotes: speed-up of populations
over one run per process, and memory per member), drawn from the csv as written, so that
tests/test_population_table.py rebuilds the committed table from the committed csv.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

OUT = Path("results") / "population"  # the checkout's: run from its root, as above (an installed package has none)


COLUMNS = ["ablation", "seeds", "population", "runs", "cpu_s", "wall_s", "cpu_s_per_run", "runs_per_core_minute",
           "peak_rss_mb", "sets", "device", "load_avg"]


def read(csv: Path) -> pd.DataFrame:
    """population.csv as main wrote it (an empty `sets` is no override, not a missing value)."""
    return pd.read_csv(csv, dtype={"sets": str}, keep_default_na=False)


def table(df: pd.DataFrame) -> str:
    """population.md from population.csv's rows: each ablation's populations against its run alone."""
    lines = ["| ablation | seeds | population | runs trained | CPU s per run | runs per core-minute | speed-up "
             "| peak RSS (MB) | memory per member (MB) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, g in df.groupby("ablation", sort=False):
        alone = g[g.population == 1].iloc[0]
        for _, r in g.sort_values("population").iterrows():
            per_member = ((r.peak_rss_mb - alone.peak_rss_mb) / (r.population - 1)) if r.population > 1 else float("nan")
            lines.append(f"| {name}{' (' + r.sets + ')' if r.sets else ''} | {r.seeds} | {r.population} | {r.runs} "
                         f"| {r.cpu_s_per_run:.2f} | {r.runs_per_core_minute:.1f} "
                         f"| {alone.cpu_s_per_run / r.cpu_s_per_run:.1f}x | {r.peak_rss_mb:.0f} "
                         f"| {'—' if per_member != per_member else f'{per_member:.1f}'} |")
    machine = f"{df.device.iloc[0]}; load average {df.load_avg.min():.2f}-{df.load_avg.max():.2f} during the runs"
    return "\n".join(lines) + f"\n\nMeasured on {machine}, one torch thread per process, each provider in a fresh " \
        "process, in one sitting.\n"


def main(path: str) -> None:
    data = json.loads(Path(path).read_text())
    df = pd.DataFrame([b["extra_info"] for b in data["benchmarks"]])[COLUMNS]
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "population.csv", index=False)
    (OUT / "population.md").write_text(table(read(OUT / "population.csv")))
    print((OUT / "population.md").read_text())


if __name__ == "__main__":
    main(sys.argv[1])
