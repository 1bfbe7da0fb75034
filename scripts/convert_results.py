"""Convert results directories from CSV metrics to Parquet, in place.

    python scripts/convert_results.py [ROOT ...]      (default: results)

For every directory under ROOT with an ablation.json: the long table metrics.csv becomes
metrics.parquet, and each runs/<id>/metrics.csv becomes runs/<id>/metrics.parquet, its
summary.json gaining the row count and SHA-256 that resume checks. summary.csv stays CSV.
Values are parsed with Python's float() (correctly rounded whatever the pandas version)
and stored as float64; a CSV is deleted only after its Parquet file reads back equal, bit
for bit. Directories already converted are left as they are, so running it twice is safe.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_bench.store.rundir import METRICS_FILE, _sha256, read_metrics_file, write_parquet


def exact_csv(path: Path) -> pd.DataFrame:
    """A metrics CSV as `plot` reads it, but every value exactly the float its text names (pandas'
    parser is exact since pandas 3; before, it could miss by an ulp)."""
    df = pd.read_csv(path)
    text = pd.read_csv(path, usecols=["value"], dtype=str, keep_default_na=False)["value"]
    df["value"] = [math.nan if t == "" else float(t) for t in text]
    return df


def same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Equal columns and values; floats compared by their bits (NaN equals NaN, -0.0 differs from 0.0)."""
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            if not np.array_equal(x.astype("float64").view("int64"), y.astype("float64").view("int64")):
                return False
        elif [None if v is None or v != v else v for v in x.tolist()] != [None if v is None or v != v else v
                                                                           for v in y.tolist()]:
            return False
    return True


def convert(csv: Path) -> Path:
    """csv -> its Parquet twin beside it, checked, then the CSV removed."""
    df = exact_csv(csv)
    target = csv.with_name(METRICS_FILE)
    write_parquet(df, target)
    if not same(df, read_metrics_file(target)):
        target.unlink()
        raise SystemExit(f"error: {target} does not read back as {csv}; left the CSV")
    csv.unlink()
    return target


def convert_run(run_dir: Path) -> None:
    target = convert(run_dir / "metrics.csv")
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text())
    summary["metrics_file"] = {"name": METRICS_FILE, "rows": len(read_metrics_file(target)), "sha256": _sha256(target)}
    summary_file.write_text(json.dumps(summary, indent=1))


def main(roots: list[str]) -> int:
    for root in map(Path, roots or ["results"]):
        for d in sorted(p.parent for p in root.rglob("ablation.json")):
            if (d / "metrics.csv").is_file():
                before = (d / "metrics.csv").stat().st_size
                after = convert(d / "metrics.csv").stat().st_size
                print(f"{d}: metrics.csv {before / 1e6:.2f} MB -> {METRICS_FILE} {after / 1e6:.2f} MB")
            runs = sorted(p.parent for p in (d / "runs").glob("*/metrics.csv")) if (d / "runs").is_dir() else []
            for run_dir in runs:
                convert_run(run_dir)
            if runs:
                print(f"{d}: {len(runs)} run directories converted")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
