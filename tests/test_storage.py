"""Metrics in Parquet (issue 23): values back bit for bit, compact dtypes, CSV-era directories still read.

A results directory written before Parquet holds metrics.csv (the long table and one per
run, summaries without a checksum); `plot`, resume, `compare`, `gallery` and `findings`
read it as they read a new one, and scripts/convert_results.py turns one into the other.
"""
import importlib.util
import json
import math
import shutil
import struct

import numpy as np
import pandas as pd
import pytest
import yaml

from grpo_bench.sweep import runner as RN
from grpo_bench.store import rundir as ST
from grpo_bench.__main__ import main
from grpo_bench.config.ablation import load_ablation
from helpers import ROOT

TINY = {"task": {"name": "sort", "prompts": None, "num_prompts": 2, "eval_prompts": 4, "n": 2, "vocab": 3},
        "epochs": 3, "inner_steps": 1, "group_size": 2, "delta": "centered"}
# values a lossy format would change: not float32 (1/3, 0.1, a time), signed zero, the extremes, nan, inf
AWKWARD = [1 / 3, 0.1, 0.23036958899956517, -0.0, 0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
           math.nan, math.inf, -math.inf, 2.0**53 + 2, -1e-300, 0.5]


def bits(values) -> list[int]:
    return [struct.unpack("<q", struct.pack("<d", float(v)))[0] for v in values]


@pytest.fixture(autouse=True)
def keep_torch_threads():
    import torch
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_runs_metrics_read_back_bit_identical(tmp_path):
    spec = RN.RunSpec("r", "v", {}, 0, {**TINY, "seed": 0})
    rows = [(step, f"m/{i % 3}", v) for i, v in enumerate(AWKWARD) for step in (i, 10**12 + i)]
    RN.write_run(tmp_path, spec, ({"seed": 0}, rows, {"run": "r", "status": "ok"}))
    path = tmp_path / "runs" / "r" / ST.METRICS_FILE
    m = ST.read_metrics_file(path)
    assert m.step.tolist() == [s for s, _, _ in rows] and m.metric.tolist() == [k for _, k, _ in rows]
    assert bits(m.value) == bits(v for _, _, v in rows)
    assert (m.dtypes.astype(str) == ["int64", "category", "float64"]).all()
    assert ST.finished(tmp_path / "runs" / "r")


def test_the_long_table_is_compact_and_exact(tmp_path):
    p = tmp_path / "abl.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "base": TINY, "grid": {"loss": ["naive", "clipped"], "lr": [0.01, 0.02]},
                                 "seeds": 2}))
    out = tmp_path / "o"
    RN.run_ablation(load_ablation(p), out, workers=1, progress=False)
    long = pd.read_parquet(out / "metrics.parquet")
    assert not (out / "metrics.csv").exists()
    assert dict(long.dtypes.astype(str)) == {"run": "category", "variant": "category", "loss": "category",
                                             "lr": "float64", "seed": "int64", "step": "int64",
                                             "metric": "category", "value": "float64"}
    # the long table is each run's file, labelled, bit for bit
    for run, part in long.groupby("run", observed=True, sort=False):
        own = ST.read_metrics_file(out / "runs" / run / ST.METRICS_FILE)
        assert bits(part.value) == bits(own.value) and part.step.tolist() == own.step.tolist()
        assert part.metric.astype(str).tolist() == own.metric.astype(str).tolist()
    # a twentieth of the CSV that held the same table
    long.to_csv(tmp_path / "as.csv", index=False)
    assert (out / "metrics.parquet").stat().st_size * 5 < (tmp_path / "as.csv").stat().st_size


# ---------------------------------------------------------------------- the CSV era


def to_csv_era(d):
    """d as the runner wrote it before Parquet: metrics.csv everywhere, summaries without a checksum."""
    long = pd.read_parquet(d / "metrics.parquet")
    long.to_csv(d / "metrics.csv", index=False)
    (d / "metrics.parquet").unlink()
    for run in (d / "runs").iterdir():
        ST.read_metrics_file(run / ST.METRICS_FILE).to_csv(run / "metrics.csv", index=False)
        (run / ST.METRICS_FILE).unlink()
        s = json.loads((run / "summary.json").read_text())
        del s["metrics_file"]
        (run / "summary.json").write_text(json.dumps(s, indent=1))
    return d


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The same sweep twice: as written now (Parquet) and as a CSV-era directory; both plotted."""
    tmp = tmp_path_factory.mktemp("eras")
    p = tmp / "abl.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "description": "Which loss? More.", "base": TINY,
                                 "grid": {"loss": ["naive", "clipped"]}, "seeds": 2}))
    new = tmp / "new" / "t"
    RN.run_ablation(load_ablation(p), new, workers=1, progress=False)
    old = to_csv_era(shutil.copytree(new, tmp / "old" / "t"))
    for d in (new, old):
        assert main(["plot", str(d)]) == 0
    return p, new, old


def test_a_csv_era_directory_plots_as_its_parquet_twin(both):
    _, new, old = both
    assert not list(old.rglob("*.parquet")) and not list(new.rglob("metrics.csv"))
    for f in sorted(p.name for p in new.iterdir() if p.suffix in (".md", ".png")):
        assert (old / f).read_bytes() == (new / f).read_bytes(), f


def test_compare_gallery_findings_read_either_era(both, tmp_path, capsys):
    _, new, old = both
    assert main(["compare", str(new), str(old), "--out", str(tmp_path / "cmp")]) == 0
    text = (tmp_path / "cmp" / "COMPARE.md").read_text()
    variants = text.split("## Orderings")[0]   # the variant table; the orderings table compares the same way
    rows = [line.split(" | ") for line in variants.splitlines() if line.startswith("| `loss=")]
    assert len(rows) == 2 and all(r[1] == r[2].rstrip(" |") for r in rows)     # the same numbers from either era
    orderings = [line.split(" | ") for line in text.split("## Orderings")[1].splitlines() if line.startswith("| `loss=")]
    assert len(orderings) == 1 and orderings[0][1] == orderings[0][2]
    for root in (new.parent, old.parent):
        assert main(["gallery", str(root)]) == 0
        # findings judges claims: a copy with one (the ablation has none; its grid labels hold an `=`)
        d = shutil.copytree(root / "t", tmp_path / root.name / "t")
        meta = json.loads((d / "ablation.json").read_text())
        meta["claim"] = {"text": "t", "source": "s", "expect": ["loss=naive > loss=clipped"]}
        (d / "ablation.json").write_text(json.dumps(meta))
        assert main(["findings", str(d.parent)]) == 0
    assert (new.parent / "README.md").read_text() == (old.parent / "README.md").read_text().replace("old/", "new/")


def test_a_csv_era_directory_resumes_and_moves_on(both, tmp_path, capsys):
    p, _, old = both
    d = shutil.copytree(old, tmp_path / "t")
    capsys.readouterr()
    RN.run_ablation(load_ablation(p), d, workers=1, progress=False)
    assert "4 of 4 runs already finished" in capsys.readouterr().err   # checked by reading them
    # the long table is rewritten in Parquet and the stale CSV one removed; the runs stay as they were
    assert (d / "metrics.parquet").exists() and not (d / "metrics.csv").exists()
    assert all((r / "metrics.csv").exists() for r in (d / "runs").iterdir())
    assert main(["plot", str(d)]) == 0
    assert (d / "REPORT.md").read_bytes() == (old / "REPORT.md").read_bytes()


def test_convert_results_smoke(both, tmp_path):
    spec = importlib.util.spec_from_file_location("convert_results", ROOT / "scripts" / "convert_results.py")
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    _, new, old = both
    root = tmp_path / "results"
    d = shutil.copytree(old, root / "t")
    text = (d / "metrics.csv").read_text().splitlines()
    assert convert.main([str(root)]) == 0
    assert {p.name for p in root.rglob("*.csv")} == {"summary.csv"}
    long = pd.read_parquet(d / "metrics.parquet")
    value_at = text[0].split(",").index("value")
    want = [float(line.split(",")[value_at] or "nan") for line in text[1:]]
    assert bits(long.value) == bits(want)
    for run in (d / "runs").iterdir():
        assert ST.finished(run) and json.loads((run / "summary.json").read_text())["metrics_file"]["name"] == \
            ST.METRICS_FILE
    assert main(["plot", str(d)]) == 0 and (d / "REPORT.md").read_bytes() == (new / "REPORT.md").read_bytes()
    assert convert.main([str(root)]) == 0      # twice: nothing left to convert, nothing changed
    assert np.array_equal(pd.read_parquet(d / "metrics.parquet").value, long.value, equal_nan=True)
