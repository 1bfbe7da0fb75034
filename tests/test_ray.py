"""The Ray executor against a 2-CPU Ray instance started here: same numbers as the local executor,
a killed worker retried, a killed driver resumed, a failing run recorded and not retried.

One sweep serves every assertion (Ray start-up and worker imports dominate the time): the
local executor runs the ablation once for reference; a Ray driver is SIGKILLed after its
first finished run; a second driver resumes, and while it runs one worker is SIGKILLed.
"""
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from helpers import ROOT, needs

ray = needs("ray")  # the ray extra (pip install -e '.[ray]'); without it these tests skip
# one xdist worker for the module: its cluster and its sweep (50 s on 2 cores) are module fixtures, which each
# worker that ran one of its tests set up again (--durations showed the sweep's set-up twice)
pytestmark = pytest.mark.xdist_group("ray")

from grpo_bench.sweep.cluster import Session
from grpo_bench.errors import ConfigError
from grpo_bench.config.ablation import load_ablation
from grpo_bench.sweep.worker import SCHEDULE
from grpo_bench.store.rundir import finished
from grpo_bench.sweep.runner import run_ablation

ABLATION = {
    "name": "ray_test",
    "base": {"task": {"name": "sort"}, "epochs": 4, "inner_steps": 2},
    # SGD at lr 1e30 gives a non-finite loss within a step or two; `long` is there to be killed. At 80 epochs a long
    # run took 0.26 s against a short one's 0.02 s, a window a loaded CI machine missed once (a long run finished
    # before the first driver was killed); 1,200 take about 4 s
    "variants": {"short": {}, "bad": {"optimizer": "sgd", "lr": 1e30}, "long": {"epochs": 1200}},
    "seeds": 2,
}
N_RUNS = 6


def _run_dirs(out: Path) -> dict[str, int]:
    runs = out / "runs"
    return {d.name: (d / "summary.json").stat().st_mtime_ns
            for d in (runs.iterdir() if runs.exists() else []) if not d.name.startswith(".")}


def _workers_running(prefix: str) -> list[int]:
    """Pids of Ray workers executing a task whose name (our run id) starts with prefix."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "cmdline").read_bytes().startswith(f"ray::{prefix}".encode()):
                pids.append(int(p.name))
        except OSError:
            pass
    return pids


def _driver(abl: Path, out: Path, address: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")
    return subprocess.Popen([sys.executable, "-m", "grpo_bench", "run", str(abl), "--out", str(out),
                             "--executor", "ray", "--address", address, *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as m:
        yield m


@pytest.fixture(scope="module")
def cluster(monkeypatch_module):
    # Ray starts its workers at nice 15: beside busy loops (scripts/under_load.py) they got 4% of a core, and the
    # long runs the kill tests need crawled past 10 min; the raylet started here reads its config from RAY_*
    monkeypatch_module.setenv("RAY_worker_niceness", "0")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cluster):
    tmp = tmp_path_factory.mktemp("ray")
    abl = tmp / "abl.yaml"
    # in this order: the first driver dies after a `short` run, before any `long` one can finish
    abl.write_text(yaml.safe_dump(ABLATION, sort_keys=False))
    # the reference: the local executor, in this process (one start-up fewer than a CLI call)
    threads = torch.get_num_threads()
    try:
        run_ablation(load_ablation(abl), tmp / "local", workers=1, progress=False)
    finally:
        torch.set_num_threads(threads)

    out = tmp / "ray"
    first = _driver(abl, out, cluster, "--no-progress")
    # the kill waits for the first finished run however loaded the machine is (a 60 s bound once ran out beside
    # a busy loop and two sweeps: scripts/under_load.py); the bound only keeps a broken driver from hanging CI
    deadline = time.time() + 900
    while time.time() < deadline and first.poll() is None and not any(finished(out / "runs" / r) for r in _run_dirs(out)):
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    before = _run_dirs(out)
    done = {r for r in before if finished(out / "runs" / r)}
    assert not any(r.startswith("long-") for r in done), "the first driver lived too long"
    # Ray ends a dead driver's tasks; wait for that so the worker killed below is the second driver's
    deadline = time.time() + 300
    while any(_workers_running(v) for v in ABLATION["variants"]) and time.time() < deadline:
        time.sleep(0.1)

    second = _driver(abl, out, cluster)
    # Workers titled with a `long` run are killed until the driver says it lost one. Twice on 2 cores (once after
    # the kill waited until the worker had run 0.5 s) the one killed was not the second driver's: the driver saw
    # no error and its long runs finished. A worker started late for the first, dead driver's job carries the same
    # title; the wait above cannot see one that starts after it. The driver's stderr is read as it comes.
    streams = {"stdout": [], "stderr": []}

    def read(name):
        for line in iter(getattr(second, name).readline, ""):
            streams[name].append(line)

    readers = [threading.Thread(target=read, args=(k,), daemon=True) for k in streams]
    for r in readers:
        r.start()
    killed, seen = [], {}
    while second.poll() is None:
        if not any("worker lost" in line for line in streams["stderr"]):
            now = time.time()
            for pid in _workers_running("long-"):
                if pid not in killed and now - seen.setdefault(pid, now) >= 0.5:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        time.sleep(0.02)
    for r in readers:
        r.join(timeout=60)
    stdout, stderr = "".join(streams["stdout"]), "".join(streams["stderr"])
    return {"local": tmp / "local", "ray": out, "before": before, "done": done, "after": _run_dirs(out),
            "rc": second.returncode, "stdout": stdout, "stderr": stderr, "killed": killed}


def test_same_summary_as_local_executor(sweep):
    assert sweep["rc"] == 1, sweep["stderr"][-3000:]    # exit 1: the `bad` variant's runs fail by design
    local = pd.read_csv(sweep["local"] / "summary.csv")
    on_ray = pd.read_csv(sweep["ray"] / "summary.csv")
    assert len(local) == N_RUNS and list(on_ray.columns) == list(local.columns)
    # results, not the schedule: how many runs shared the retried population depends on when the kill landed
    assert (on_ray.executor == "ray").all() and (local.executor == "local").all()
    cols = [c for c in local.columns if c not in SCHEDULE]
    # every number to the last bit, the killed and retried run included
    pd.testing.assert_frame_equal(on_ray[cols], local[cols], check_exact=True)
    assert (local.status == "ok").sum() == 4


def test_killed_worker_is_retried_and_sweep_completes(sweep):
    assert sweep["killed"], "no run of the `long` variant was caught running"
    lost = [line for line in sweep["stderr"].splitlines() if "worker lost" in line]
    assert len(lost) == 1 and "long-s" in lost[0] and "retry 1 of 3" in lost[0], sweep["stderr"]
    summary = pd.read_csv(sweep["ray"] / "summary.csv")
    assert len(summary) == N_RUNS and (summary[summary.variant_name == "long"].status == "ok").all()
    assert "4 runs ok, 2 failed" in sweep["stdout"]
    assert "ray_test [ray: 1 node, 2 CPUs]" in sweep["stderr"]  # the progress bar names the cluster


def test_killed_driver_resumes_only_missing_runs(sweep):
    before, after = sweep["before"], sweep["after"]
    done = {k: before[k] for k in sweep["done"]}
    assert done and len(done) < N_RUNS, "the first driver was killed too late to test resuming"
    assert f"{len(done)} of {N_RUNS} runs already finished" in sweep["stderr"]
    # finished runs are kept as they were; a failed one is run again, as locally
    assert len(after) == N_RUNS and all(after[k] == v for k, v in done.items())
    assert all(after[k] != v for k, v in before.items() if k not in done)


def test_failing_run_recorded_as_failed_not_retried(sweep):
    summary = pd.read_csv(sweep["ray"] / "summary.csv")
    bad = summary[summary.variant_name == "bad"]
    assert (bad.status == "failed").all() and bad.error.str.contains("non-finite loss").all()
    assert not any("bad-s" in line and "retry" in line for line in sweep["stderr"].splitlines())
    for run in bad.run:
        record = json.loads((sweep["ray"] / "runs" / run / "summary.json").read_text())
        assert "NonFiniteLoss" in record["traceback"]
    assert "Failed runs" in (sweep["ray"] / "REPORT.md").read_text()


def test_slots_and_resources_no_node_can_hold(cluster):
    session = Session()
    assert session.describe() == "ray: 1 node, 2 CPUs"
    assert session.slots({"cpus": 1, "gpus": 0}) == 2 and session.slots({"cpus": 0.5, "gpus": 0}) == 4
    assert session.slots({"cpus": 2, "gpus": 0}) == 1 and session.slots({"cpus": 1, "gpus": 0.5}) == 0
    # a task no node can hold would wait forever: an error instead
    with pytest.raises(ConfigError, match=r"gpus=0.5: no node .* \(nodes: 2 CPUs/0 GPUs\)"):
        next(session.results([], 1, {"cpus": 1, "gpus": 0.5}, 0, print))


def test_job_ships_package_and_tasks_not_results(tmp_path, monkeypatch):
    """What reaches a node without the repository: the code and tasks/ (checkpoints), not results or the venv."""
    from ray._private.runtime_env.packaging import create_package

    import grpo_bench.sweep.cluster as cl

    root = tmp_path / "checkout"
    for f in ["pyproject.toml", "grpo_bench/sweep/runner.py", "tasks/arithmetic/warmstart.safetensors", "ablations/a.yaml",
              "results/a/metrics.csv", ".venv/bin/python", ".git/HEAD", "tests/test_x.py", "sweeps/mine/runs/r/m.csv",
              "grpo_bench/__pycache__/runner.cpython-311.pyc"]:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("x")
    monkeypatch.setattr(cl, "PACKAGE", root / "grpo_bench")
    monkeypatch.delenv("GRPO_BENCH_CACHE", raising=False)
    env = cl.runtime_env(root / "sweeps" / "mine")  # an --out inside the checkout is not shipped back out
    assert env["working_dir"] == str(root) and "env_vars" not in env
    create_package(env["working_dir"], tmp_path / "pkg.zip", include_gitignore=True, excludes=env["excludes"])
    names = {n for n in zipfile.ZipFile(tmp_path / "pkg.zip").namelist() if not n.endswith("/")}
    assert names == {"pyproject.toml", "grpo_bench/sweep/runner.py", "tasks/arithmetic/warmstart.safetensors", "ablations/a.yaml"}

    monkeypatch.setenv("GRPO_BENCH_CACHE", "/shared/cache")
    (root / "pyproject.toml").unlink()  # an installed package: it alone is shipped
    assert cl.runtime_env(tmp_path) == {"py_modules": [str(root / "grpo_bench")],
                                        "env_vars": {"GRPO_BENCH_CACHE": "/shared/cache"}}
