"""The runner end to end: shipped ablations, failures, resume after a kill (figures: test_report.py)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from grpo_bench.config import load_ablation, resolve_run, run_dict
from helpers import ROOT, cli

SHIPPED = sorted(p.name for p in (ROOT / "ablations").glob("*.yaml") if p.name != "arithmetic_qwen.yaml")


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_ablation_smoke(tmp_path, name):
    tiny = ["--set", "epochs=2", "--set", "inner_steps=2"]
    if name.startswith("arithmetic"):
        tiny = ["--set", "epochs=1", "--set", "inner_steps=1", "--set", "group_size=2"]
    res = cli("run", f"ablations/{name}", "--seeds", "2", "--out", tmp_path, "--workers", "2", *tiny)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "summary.csv")
    abl = yaml.safe_load((ROOT / "ablations" / name).read_text())
    n_variants = len(json.loads((tmp_path / "ablation.json").read_text())["variants"])
    assert n_variants >= 2 and len(summary) == 2 * n_variants
    assert (summary.status == "ok").all(), summary.error.tolist()
    assert abl.get("seeds", 0) >= (3 if name.startswith("arithmetic") else 5)
    # each run trained on its own variant's resolved config (grid and --set applied), with its seed
    planned = load_ablation(ROOT / "ablations" / name, seeds=2, sets=tiny[1::2])
    want = {label: raw for label, _, raw in planned.variants}
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert {"run", "variant", "seed", "step", "metric", "value"} <= set(metrics.columns)
    steps = 2 * 2 if not name.startswith("arithmetic") else 1
    for _, run in summary.iterrows():
        saved = yaml.safe_load((tmp_path / "runs" / run.run / "config.yaml").read_text())
        assert saved == json.loads(json.dumps(run_dict(resolve_run(dict(want[run.variant], seed=run.seed))))), run.run
        m = metrics[metrics.run == run.run]
        last = m[m.step == steps - 1].set_index("metric").value
        assert np.isfinite(last["loss/total"]) and 0 <= last["reward/mean"] <= 1, run.run
        # final/reward is the mean rollout reward of the last tenth of epochs: the last one here
        assert run["final/reward"] == pytest.approx(last["reward/mean"]), run.run
    # seeds and variants reach the numbers: no two runs share every metric
    fingerprints = metrics.groupby("run").value.apply(lambda v: tuple(v.round(12)))
    assert fingerprints.nunique() == len(summary)
    report = (tmp_path / "REPORT.md").read_text()
    # two epochs may leave no metric with a curve; the per-seed final values always exist
    figures = re.findall(r"\]\(([\w.]+\.png)\)", report)
    assert "final_values.png" in figures
    for f in figures:
        assert (tmp_path / f).stat().st_size > 0, f
    assert "± " in report and "seed noise" in report
    for v in want:
        assert f"| `{v}` | 2/2 |" in report


def _write(tmp_path, base, grid, seeds):
    p = tmp_path / "abl.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "base": base, "grid": grid, "seeds": seeds}))
    return p


def test_failed_run_is_recorded_and_sweep_goes_on(tmp_path):
    # SGD at lr 1e30 blows the logits up to inf within a step or two: a NaN loss
    base = {"task": {"name": "sort"}, "epochs": 5, "inner_steps": 2, "optimizer": "sgd"}
    path = _write(tmp_path, base, {"lr": [1e30, 0.01]}, 2)
    res = cli("run", path, "--out", tmp_path / "o", "--workers", "1")
    assert res.returncode == 0, res.stderr
    s = pd.read_csv(tmp_path / "o" / "summary.csv")
    assert sorted(s.status) == ["failed", "failed", "ok", "ok"]
    assert s[s.status == "failed"].error.str.contains("non-finite loss").all()
    assert "Failed runs" in (tmp_path / "o" / "REPORT.md").read_text()
    assert "2 runs ok, 2 failed" in res.stdout


def test_kill_and_resume(tmp_path):
    base = {"task": {"name": "sort"}, "epochs": 40, "inner_steps": 5}
    path = _write(tmp_path, base, {"loss": ["naive", "clipped"]}, 4)
    out = tmp_path / "o"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "grpo_bench", "run", str(path), "--out", str(out),
                             "--workers", "1", "--no-progress"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = out / "runs"
    deadline = time.time() + 120
    while time.time() < deadline and len([d for d in runs.glob("*") if not d.name.startswith(".")] if runs.exists() else []) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = {d.name: (d / "summary.json").stat().st_mtime_ns for d in runs.iterdir() if not d.name.startswith(".")}
    assert 2 <= len(done) < 8, "kill came too late to test resuming"
    # every run directory that exists is complete; partial work only lives in dot-directories
    for name in done:
        assert json.loads((runs / name / "summary.json").read_text())["status"] == "ok"
        assert (runs / name / "metrics.csv").stat().st_size > 0

    res = cli("run", path, "--out", out, "--workers", "1")
    assert res.returncode == 0, res.stderr
    assert f"{len(done)} of 8 runs already finished" in res.stderr
    after = {d.name: (d / "summary.json").stat().st_mtime_ns for d in runs.iterdir() if not d.name.startswith(".")}
    assert len(after) == 8 and all(after[k] == v for k, v in done.items())
    s = pd.read_csv(out / "summary.csv")
    assert len(s) == 8 and (s.status == "ok").all()

    # a changed config is a different run: nothing is skipped
    res = cli("run", path, "--out", out, "--workers", "1", "--set", "lr=0.002")
    assert "already finished" not in res.stderr
