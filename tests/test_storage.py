"""Metrics in Parquet (issue 23): values back bit for bit, compact dtypes; what is left of a results
directory from before it (metrics.csv, summaries without a checksum) is refused, not read: the readers of
that format and its converter were retired once every committed directory was Parquet.
"""
import json
import math
import shutil
import struct

import pandas as pd
import pytest
import yaml

from grpo_bench.sweep import runner as RN
from grpo_bench.store import rundir as ST
from grpo_bench.__main__ import main
from grpo_bench.errors import ConfigError
from grpo_bench.config.ablation import load_ablation

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
    assert dict(long.dtypes.astype(str)) == {"run": "category", "variant": "category", "loss": "category",
                                             "lr": "float64", "seed": "int64", "step": "int64",
                                             "metric": "category", "value": "float64"}
    # the long table is each run's file, labelled, bit for bit, one metric after another (each metric's
    # runs in the plan's order, each run's steps in order: its values sit together and compress)
    metric = long.metric.astype(str)
    assert metric.tolist() == sorted(metric)
    plan = json.loads((out / "ablation.json").read_text())["runs"]
    for name, part in long.groupby("metric", observed=True, sort=False):
        assert part.run.astype(str).drop_duplicates().tolist() == plan
    for run, part in long.groupby("run", observed=True, sort=False):
        own = ST.read_metrics_file(out / "runs" / run / ST.METRICS_FILE)
        own = own.assign(metric=own.metric.astype(str)).sort_values("metric", kind="stable")
        assert bits(part.value) == bits(own.value) and part.step.tolist() == own.step.tolist()
        assert part.metric.astype(str).tolist() == own.metric.tolist()
    # a twentieth of the CSV that held the same table, and smaller than pandas' own Parquet of it
    long.to_csv(tmp_path / "as.csv", index=False)
    assert (out / "metrics.parquet").stat().st_size * 5 < (tmp_path / "as.csv").stat().st_size
    long.sort_values(["run", "step"], kind="stable").to_parquet(tmp_path / "plain.parquet", compression="zstd")
    assert (out / "metrics.parquet").stat().st_size < 0.8 * (tmp_path / "plain.parquet").stat().st_size


def test_the_stored_dtypes_whatever_the_writer_handed(tmp_path):
    """Steps and seeds as int64 and values as float64 whatever width they came in (a float32 value widened
    exactly), names and text axes as categories, an axis mixing numbers and text as text (1 and "1" one
    category), a missing name kept missing, numbers and flags left as they are."""
    import numpy as np

    df = pd.DataFrame({"step": np.array([0, 1, 2], dtype="int32"), "seed": np.array([3, 3, 3], dtype="int16"),
                       "value": np.array([0.1, 1 / 3, -2.5], dtype="float32"), "metric": ["a", "b", None],
                       "axis": [1, "1", "x"], "lr": [0.1, 0.2, 0.3], "flag": [True, False, True]})
    ST.write_parquet(df, tmp_path / "m.parquet")
    back = pd.read_parquet(tmp_path / "m.parquet")
    assert dict(back.dtypes.astype(str)) == {"step": "int64", "seed": "int64", "value": "float64",
                                             "metric": "category", "axis": "category", "lr": "float64",
                                             "flag": "bool"}
    assert bits(back.value) == bits(np.array([0.1, 1 / 3, -2.5], dtype="float32").astype("float64"))
    assert back.axis.tolist() == ["1", "1", "x"] and back.metric.isna().tolist() == [False, False, True]


def test_outcomes_take_the_smallest_dtypes_that_hold_them_and_the_encodings_the_docstring_names(tmp_path):
    """k_correct Int8 up to 127 correct samples and Int16 from 128 (its largest, not its smallest, decides),
    NA where pass@k never ran; seed int64 as in every table. The metrics table's values are byte-stream-split
    and every other column dictionary-encoded, all zstd; the outcomes table (no value column) splits none."""
    import numpy as np
    import pyarrow.parquet as pq

    def outcomes(k):
        return pd.DataFrame({"run": ["r"] * 2, "variant": ["v"] * 2, "seed": np.array([1, 1], dtype="int32"),
                             "step": [0, 0], "problem": [0, 1], "greedy": [1, 0], "k_correct": k})

    for k, dtype in (([0, 127], "Int8"), ([0, 128], "Int16"), ([None, None], "Int8")):
        t = ST.outcomes_table(outcomes(k))
        assert str(t.k_correct.dtype) == dtype and t.k_correct.astype("Float64").tolist() == \
            pd.array(k, dtype="Float64").tolist(), k
        assert str(t.seed.dtype) == "int64" and str(t.greedy.dtype) == "int8" and str(t.step.dtype) == "int32"
    ST._write_outcomes(outcomes([3, 200]), tmp_path / "o.parquet")
    ST.write_parquet(pd.DataFrame({"run": ["r"] * 3, "metric": ["a"] * 3, "step": [0, 1, 2], "seed": [0] * 3,
                                   "value": [0.5, 1 / 3, 2.0]}), tmp_path / "m.parquet")
    for name, split in (("m.parquet", {"value"}), ("o.parquet", set())):
        meta = pq.ParquetFile(tmp_path / name).metadata.row_group(0)
        cols = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
        assert {n for n, c in cols.items() if "BYTE_STREAM_SPLIT" in c.encodings} == split, name
        assert all("RLE_DICTIONARY" in c.encodings for n, c in cols.items() if n not in split), name
        assert {c.compression for c in cols.values()} == {"ZSTD"}, name


# ---------------------------------------------------------------------- what the CSV era left


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("swept")
    p = tmp / "abl.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "base": TINY, "grid": {"loss": ["naive", "clipped"]}, "seeds": 1}))
    out = tmp / "t"
    RN.run_ablation(load_ablation(p), out, workers=1, progress=False)
    return out


def test_reading_results_learns_their_task_from_the_record(tmp_path):
    """Results of a task this process cannot import (a user's, plotted elsewhere) are read by their record in
    ablation.json: reading it declares the task's metrics."""
    from grpo_bench.store import metrics as M

    task = {"name": "ghost_task", "label": "ghost toy", "short": "ghost", "main_metric": "final/ghost/score",
            "curves": ["ghost/score"], "higher_is_better": True,
            "metrics": [{"name": "ghost/score", "label": "ghost score", "range": [0, None]}]}
    meta = {"name": "g", "source": "g.yaml", "variants": ["a"], "seeds": [0], "runs": [], "task": task}
    (tmp_path / "ablation.json").write_text(json.dumps(meta))
    assert "ghost_task" not in M.task_names()
    ST.read_meta(tmp_path)
    assert "ghost_task" in M.task_names()
    assert M.get("ghost/score").label == "ghost score" and M.get("ghost/score").range == (0, math.inf)


@pytest.mark.parametrize("bad", ["value", "step"])
def test_a_long_table_with_a_step_or_value_that_is_no_number_is_refused(swept, tmp_path, bad):
    d = tmp_path / "t"
    shutil.copytree(swept, d)
    long = pd.read_parquet(d / "metrics.parquet")
    long[bad] = long[bad].astype(str)
    long.to_parquet(d / "metrics.parquet", index=False)
    with pytest.raises(ConfigError, match="holds a step or value that is not a number"):
        ST.load(d)


def test_a_directory_with_only_metrics_csv_is_not_a_results_directory(swept, tmp_path, capsys):
    d = shutil.copytree(swept, tmp_path / "t")
    pd.read_parquet(d / "metrics.parquet").to_csv(d / "metrics.csv", index=False)
    (d / "metrics.parquet").unlink()
    with pytest.raises(ConfigError) as e:
        ST.load(d)
    assert str(e.value) == f"{d}: <dir>: not a results directory: no metrics.parquet"
    capsys.readouterr()
    assert main(["plot", str(d)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {d}: <dir>: not a results directory: no metrics.parquet\n", err


def test_a_run_without_its_checksum_is_damaged(swept, tmp_path, capsys):
    # its metrics file whole or not: nothing says it is the one the run wrote (a sweep redoes it: test_faults.py)
    d = shutil.copytree(swept, tmp_path / "t")
    run = sorted((d / "runs").iterdir())[0]
    s = json.loads((run / "summary.json").read_text())
    del s["metrics_file"]
    (run / "summary.json").write_text(json.dumps(s, indent=1))
    assert ST.check_run(run) == ("damaged", "summary.json records no metrics_file (its name, rows and SHA-256)")
    row = ST.collect(d).set_index("run").loc[run.name]
    assert row.status == "failed" and row.error.endswith("summary.json records no metrics_file (its name, rows "
                                                          "and SHA-256)"), row.error
    assert f"run {run.name} is damaged (summary.json records no metrics_file" in capsys.readouterr().err


def test_committed_ablation_json_is_what_the_runner_writes():
    """Every committed ablation.json in the runner's own layout, so a rerun (README's main job) rewrites none of
    them byte for byte differently."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "results"
    files = sorted(root.rglob("ablation.json"))
    assert len(files) >= 50
    for f in files:
        text = f.read_text()
        assert text == ST.meta_text(json.loads(text)), f
