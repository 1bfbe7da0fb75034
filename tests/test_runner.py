"""The runner end to end: shipped ablations, failures, resume after a kill (figures: test_report.py)."""
import hashlib
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

from grpo_bench.config.ablation import load_ablation
from grpo_bench.config.run import resolve_run, run_dict
from grpo_bench.engine.trainer import auto_device
from helpers import ROOT, cli

# the claim ablations (with `settings`) have their own smoke test in test_findings.py; smollm2_smoke is a smoke
# itself, with a real model's half-minute load per worker: tests/test_pretrained.py runs its budget and checks
# that smollm2_grpo (a GPU's: 200 problems x pass@8 an evaluation) loads as it says
SHIPPED = sorted(p.name for p in (ROOT / "ablations").glob("*.yaml")
                 if p.name not in ("arithmetic_qwen.yaml", "smollm2_smoke.yaml", "smollm2_grpo.yaml")
                 and "settings" not in yaml.safe_load(p.read_text())
                 and not p.name.startswith("headroom_search"))
# the headroom search's files warm-start models of thousands of SFT steps per variant: a record of
# the search, checked to load (below), not smoke-run
SEARCH = sorted(p.name for p in (ROOT / "ablations").glob("headroom_search*.yaml"))


@pytest.mark.parametrize("name", SEARCH)
def test_the_headroom_search_files_load(name):
    abl = load_ablation(ROOT / "ablations" / name)
    assert len(abl.variants) >= 3 and len(abl.seeds) >= 2


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_ablation_smoke(tmp_path, name):
    tiny = ["--set", "epochs=2", "--set", "inner_steps=2"]
    lm = name.startswith(("arithmetic", "countdown", "spell_backward"))
    seeds = 2
    if lm:
        # the held-out set is the preset's (1000 problems, guarded), scored at both ends of every run: most of
        # a run's time, so one seed (the toy's files show that seeds reach the numbers); pass@k's 8 samples each
        # are not needed here
        # completions of 12 tokens: an evaluation decodes until its chunk's longest answer ends (up to 72 tokens)
        tiny = ["--set", "epochs=1", "--set", "inner_steps=1", "--set", "group_size=2", "--set", "task.pass_k=0",
                "--set", "task.sampling.max_new_tokens=12"]
        seeds = 1
    res = cli("run", f"ablations/{name}", "--seeds", str(seeds), "--out", tmp_path, "--workers", "2", *tiny)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "summary.csv")
    abl = yaml.safe_load((ROOT / "ablations" / name).read_text())
    n_variants = len(json.loads((tmp_path / "ablation.json").read_text())["variants"])
    # countdown_grpo and spell_backward_grpo ask one thing, whether default GRPO gains on the start: one variant
    assert n_variants >= (1 if name.endswith("_grpo.yaml") else 2) and len(summary) == seeds * n_variants
    assert (summary.status == "ok").all(), summary.error.tolist()
    assert abl.get("seeds", 0) >= (3 if lm else 5)
    # each run trained on its own variant's resolved config (grid and --set applied), with its seed
    planned = load_ablation(ROOT / "ablations" / name, seeds=seeds, sets=tiny[1::2])
    want = {label: raw for label, _, raw in planned.variants}
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    assert {"run", "variant", "seed", "step", "metric", "value"} <= set(metrics.columns)
    steps = 2 * 2 if not lm else 1
    for _, run in summary.iterrows():
        saved = yaml.safe_load((tmp_path / "runs" / run.run / "config.yaml").read_text())
        expected = resolve_run(dict(want[run.variant], seed=run.seed))
        expected.device = auto_device(expected)  # what `auto` means here is what the run records
        assert saved == json.loads(json.dumps(run_dict(expected))), run.run
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
        assert f"| `{v}` | {seeds}/{seeds} |" in report


def _write(tmp_path, base, grid, seeds):
    p = tmp_path / "abl.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "base": base, "grid": grid, "seeds": seeds}))
    return p


def test_failed_run_is_recorded_and_sweep_goes_on(tmp_path):
    # SGD at lr 1e30 blows the logits up to inf within a step or two: a NaN loss
    base = {"task": {"name": "sort"}, "epochs": 5, "inner_steps": 2, "optimizer": "sgd"}
    path = _write(tmp_path, base, {"lr": [1e30, 0.01]}, 2)
    res = cli("run", path, "--out", tmp_path / "o", "--workers", "1")
    assert res.returncode == 1, res.stderr      # a failed run is a failure of the command, said once
    assert res.stderr.strip().splitlines()[-1].startswith("error: 2 of 4 runs failed")
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
    deadline = time.time() + 600   # a safety bound, not a timing: the loop waits for two runs
    while time.time() < deadline and len([d for d in runs.glob("*") if not d.name.startswith(".")] if runs.exists() else []) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = {d.name: (d / "summary.json").stat().st_mtime_ns for d in runs.iterdir() if not d.name.startswith(".")}
    assert 2 <= len(done) < 8, "kill came too late to test resuming"
    # every run directory that exists is complete; partial work only lives in dot-directories
    for name in done:
        assert json.loads((runs / name / "summary.json").read_text())["status"] == "ok"
        assert (runs / name / "metrics.parquet").stat().st_size > 0

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


# ------------------------------------------------------------------ in-process: the runner's pieces

from grpo_bench.sweep import runner as RN  # noqa: E402
from grpo_bench.store import rundir as ST
from grpo_bench.sweep import worker as WK
from grpo_bench.errors import ConfigError  # noqa: E402
from grpo_bench.config.run import config_hash

TINY = {"task": {"name": "sort", "prompts": None, "num_prompts": 2, "eval_prompts": 4, "n": 2, "vocab": 3},
        "epochs": 2, "inner_steps": 1, "group_size": 2, "delta": "centered"}


def _abl(tmp_path, grid=None, seeds=2, base=None):
    return load_ablation(_write(tmp_path, base or TINY, grid or {"loss": ["naive", "clipped"]}, seeds))


def test_a_run_is_resolved_once(tmp_path, monkeypatch):
    """Loading, planning, the population key, training and the record resolve each variant's config once, not
    once per run or per stage (it was resolved four times per run, and every look of --seeds auto re-resolved
    every earlier seed). Counted at every module that holds resolve_run, so a new call site is counted too."""
    import sys

    from grpo_bench.config import run as config_run

    real, calls = config_run.resolve_run, []

    def counting(data, source="<config>"):
        calls.append(source)
        return real(data, source)

    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "__name__", "").startswith("grpo_bench") \
                and getattr(module, "resolve_run", None) is real:
            monkeypatch.setattr(module, "resolve_run", counting)
    abl = _abl(tmp_path, {"loss": ["naive", "clipped"]}, seeds=3)
    assert len(calls) == 2  # one per variant, when the file loads
    summary = RN.run_ablation(abl, tmp_path / "out", workers=1, progress=False, population=2)
    assert (summary.status == "ok").all() and len(summary) == 6
    assert len(calls) == 2, calls  # the plan, populations, workers, ablation.json and the hash resolved nothing
    # and what the plan hands on is what resolving the run alone gives (same hash: same run ids)
    for spec in RN.plan(abl):
        assert config_hash(spec.resolved) == config_hash(real(spec.config))
        assert spec.resolved.task_name == "sort"


def test_slug_and_plan(tmp_path):
    assert RN._slug("loss=clipped,kl=k3") == "loss=clipped_kl=k3" and RN._slug(" a b/c ") == "a_b_c"
    assert RN._slug("///") == "base" and len(RN._slug("x" * 200)) == 80
    abl = _abl(tmp_path, {"loss": ["naive", {"name": "clipped", "clip_high": 0.3}]})
    specs = RN.plan(abl)
    assert [(s.variant, s.seed) for s in specs] == [(v, s) for v, _, _ in abl.variants for s in (0, 1)]
    for s in specs:
        h = config_hash(resolve_run(dict(s.config)))
        assert s.run_id == RN.run_id(s.variant, s.seed, h) and s.config["seed"] == s.seed
    # a label that is its own slug keeps the plain id; a lossy one gets the label's hash after a `+`
    assert specs[0].run_id == f"loss=naive-s0-{config_hash(resolve_run(dict(specs[0].config)))}"
    assert re.fullmatch(r"loss=_clip_high_0.3_name_clipped\+[0-9a-f]{8}-s0-[0-9a-f]{10}", specs[2].run_id)
    assert specs[2].values == {"loss": '{"clip_high": 0.3, "name": "clipped"}'} and specs[0].values == {"loss": "naive"}
    assert len({s.run_id for s in specs}) == 4


def test_device_auto_on_a_gpu_machine_plans_cuda_runs_with_their_own_ids(tmp_path, monkeypatch):
    import torch
    from grpo_bench import registry

    abl = _abl(tmp_path, {"loss": ["naive"]}, base={**TINY, "device": "auto"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = RN.plan(abl)
    assert all(s.config["device"] == "cpu" for s in cpu)  # auto on a CPU machine: a cpu run, with a cpu run's id
    (tmp_path / "cpu").mkdir()
    explicit = RN.plan(_abl(tmp_path / "cpu", {"loss": ["naive"]}, base={**TINY, "device": "cpu"}))
    assert [s.run_id for s in explicit] == [s.run_id for s in cpu]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(registry.get("task", "sort"), "gpu_replaces_cores", 1e6, raising=False)
    gpu = RN.plan(abl)
    assert [s.config["device"] for s in gpu] == ["cuda", "cuda"]
    assert not {s.run_id for s in cpu} & {s.run_id for s in gpu}  # never resumed into each other
    assert [s.run_id.rsplit("-", 1)[0] for s in gpu] == [s.run_id.rsplit("-", 1)[0] for s in cpu]
    # an explicit device is kept as written
    assert all(s.config["device"] == "cpu" for s in RN.plan(_abl(tmp_path / "cpu", {"loss": ["naive"]},
                                                                  base={**TINY, "device": "cpu"})))


def test_train_one_records_a_failure_and_never_raises():
    import torch
    before = torch.get_num_threads()
    try:
        spec = RN.RunSpec("r-s0-x", "v", {"lr": 1e30}, 0, {**TINY, "optimizer": "sgd", "lr": 1e30, "epochs": 5, "seed": 0})
        cfg, rows, summary, kept = WK.train_group([spec], threads=1)[0]
        assert torch.get_num_threads() == 1
        # SGD at lr 1e30: a non-finite loss, or logits so large that sampling itself fails
        assert summary["status"] == "failed" and re.match(r"^(NonFiniteLoss|RuntimeError): \w", summary["error"])
        assert "\n" not in summary["error"] and "Traceback" in summary["traceback"] and summary["wall_s"] >= 0
        assert summary["run"] == "r-s0-x" and summary["variant"] == "v" and summary["lr"] == 1e30
        assert rows and cfg["lr"] == 1e30   # what it logged before failing is kept
        assert kept == []   # the sorting toy keeps no per-problem outcomes
        ok = WK.train_group([RN.RunSpec("ok", "v", {}, 3, {**TINY, "seed": 3})])[0][2]
        assert ok["status"] == "ok" and ok["error"] == "" and ok["seed"] == 3 and "final/reward" in ok
    finally:
        torch.set_num_threads(before)


def test_failed_result_keeps_the_first_line():
    spec = RN.RunSpec("r", "v", {"loss": "naive"}, 1, {**TINY, "seed": 1})
    cfg, rows, s, kept = RN.failed_result(spec, "WorkerLost: gone\nmore", "tb")
    assert s["error"] == "WorkerLost: gone" and s["status"] == "failed" and s["traceback"] == "tb"
    assert rows == [] == kept and cfg["seed"] == 1 and s["loss"] == "naive" and s["seed"] == 1
    assert RN.failed_result(spec, "")[2]["error"] == "failed"


def test_write_run_is_whole_or_absent(tmp_path):
    spec = RN.RunSpec("r1", "v", {}, 0, {**TINY, "seed": 0})
    cfg = run_dict(resolve_run(spec.config))
    RN.write_run(tmp_path, spec, (cfg, [(0, "m", 1.5)], {"run": "r1", "status": "failed"}))
    d = tmp_path / "runs" / "r1"
    assert not ST.finished(d) and yaml.safe_load((d / "config.yaml").read_text()) == json.loads(json.dumps(cfg))
    RN.write_run(tmp_path, spec, (cfg, [(0, "m", 2.5)], {"run": "r1", "status": "ok"}))  # a retry replaces it
    assert ST.finished(d) and pd.read_parquet(d / "metrics.parquet").value.tolist() == [2.5]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r1"]   # no temporary directory left
    (d / "summary.json").write_text("{not json")
    assert not ST.finished(d) and not ST.finished(tmp_path / "runs" / "nope")
    (d / "summary.json").write_text("{}")
    assert not ST.finished(d)


def test_the_lock_is_held_and_named(tmp_path):
    out = tmp_path / "o"
    lock = RN.lock_out(out)
    try:
        assert (out / ".lock").read_text() == f"{os.getpid()}\n" and not list(out.glob(".write-test*"))
        with pytest.raises(ConfigError, match=rf"another sweep \(pid {os.getpid()}\) is writing here"):
            RN.lock_out(out)
    finally:
        lock.close()
    RN.lock_out(out).close()   # released: the next sweep takes it


@pytest.mark.parametrize("workers", [1, 2])
def test_run_ablation_in_process_and_resume(tmp_path, workers, capsys):
    abl = _abl(tmp_path, seeds=2)
    out = tmp_path / "o"
    summary = RN.run_ablation(abl, out, workers=workers, progress=False)
    specs = RN.plan(abl)
    assert summary.run.tolist() == [s.run_id for s in specs] and (summary.status == "ok").all()
    meta = json.loads((out / "ablation.json").read_text())
    assert meta["runs"] == summary.run.tolist() and meta["variants"] == ["loss=naive", "loss=clipped"]
    assert meta["axes"] == ["loss"] and meta["seeds"] == [0, 1] and meta["name"] == "t"
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert list(metrics.columns) == ["run", "variant", "loss", "seed", "step", "metric", "value"]
    assert set(metrics.run) == set(summary.run) and "traceback" not in summary.columns
    first = {p.name: (p / "summary.json").stat().st_mtime_ns for p in (out / "runs").iterdir()}
    capsys.readouterr()
    again = RN.run_ablation(abl, out, workers=workers, progress=False)
    assert "4 of 4 runs already finished" in capsys.readouterr().err
    assert {p.name: (p / "summary.json").stat().st_mtime_ns for p in (out / "runs").iterdir()} == first
    pd.testing.assert_frame_equal(again, summary)


def test_a_failed_run_is_reported_and_kept(tmp_path, capsys):
    abl = load_ablation(_write(tmp_path, {**TINY, "optimizer": "sgd", "epochs": 4}, {"lr": [1e30, 0.01]}, 1))
    summary = RN.run_ablation(abl, tmp_path / "o", workers=1, progress=False)
    assert summary.status.tolist() == ["failed", "ok"] and "traceback" not in summary.columns
    err = capsys.readouterr().err
    assert f"run {summary.run[0]} failed: {summary.error[0]}" in err and summary.run[1] not in err
    # resuming redoes the failed run only
    RN.run_ablation(abl, tmp_path / "o", workers=1, progress=False)
    assert "1 of 2 runs already finished" in capsys.readouterr().err


def test_collect_reads_only_the_current_plan(tmp_path):
    abl = _abl(tmp_path, seeds=1)
    out = tmp_path / "o"
    RN.run_ablation(abl, out, workers=1, progress=False)
    # a run of another plan in runs/ (a changed config) and a planned run that never ran
    (out / "runs" / "stale").mkdir()
    (out / "runs" / "stale" / "summary.json").write_text(json.dumps({"run": "stale", "status": "ok"}))
    meta = json.loads((out / "ablation.json").read_text())
    meta["runs"].append("never-ran")
    (out / "ablation.json").write_text(json.dumps(meta))
    summary = RN.collect(out)
    assert summary.run.tolist() == meta["runs"][:2]
    assert set(pd.read_parquet(out / "metrics.parquet").run) == set(meta["runs"][:2])


def _sweep_abl(tmp_path, cpus):
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "base": TINY, "grid": {"loss": ["naive", "clipped"]}, "seeds": 2,
                                 "resources": {"cpus": cpus}}))
    return load_ablation(p)


def _in_process(monkeypatch, train=True):
    """local_results replaced by one that records (workers, threads) and trains here, one thread."""
    seen = []

    def local(todo, workers, threads, tick=None):
        seen.append((workers, threads))
        for group in todo:
            for s in group:
                yield s, WK.train_group([s], 1)[0] if train else RN.failed_result(s, "not run")

    monkeypatch.setattr(RN, "local_results", local)
    return seen


def test_sweep_json_and_the_progress_bar(tmp_path, monkeypatch, capsys):
    import torch

    from grpo_bench.numerics import cpu as cpu_numerics
    before = torch.get_num_threads()
    seen = _in_process(monkeypatch)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2345, 5.0, 9.0))
    monkeypatch.setattr(sys, "argv", ["grpo_bench", "run", "sweep.yaml", "--seeds", "2"])
    abl, out = _sweep_abl(tmp_path, 2), tmp_path / "o"
    t0 = time.perf_counter()
    try:
        summary = RN.run_ablation(abl, out)     # the progress bar is on by default
    finally:
        torch.set_num_threads(before)
    elapsed = time.perf_counter() - t0
    # 8 cpus, 2 threads a run: 4 workers for 4 runs
    assert seen == [(4, 2)]
    text = (out / "sweep.json").read_text()
    sweep = json.loads(text)
    assert text == json.dumps(sweep, indent=1)
    meta = (out / "ablation.json").read_text()
    # a key a line, each value on it: what every committed ablation.json holds (the main job rewrites one)
    assert meta == ST.meta_text(json.loads(meta)) and meta.count("\n") == len(json.loads(meta)) + 1
    wall = sweep.pop("wall_s")
    assert 0 <= wall <= elapsed + 0.05 and wall == round(wall, 1)      # to a tenth of a second
    # two loss parts, two seeds each: two populations, split in four for four workers
    assert sweep == {"runs": 4, "skipped": 0, "where": "local: 4 workers", "threads": 2, "populations": [1, 1, 1, 1],
                     "cpus": 8, "cpu": RN.cpu_name(), "cpu_model": RN.cpu_model(),
                     "cpu_paths": cpu_numerics.state(),  # the paths its numbers took
                     "load_avg_end": 1.23, "command": "run sweep.yaml --seeds 2"}
    written = pd.read_csv(out / "summary.csv")
    assert written.run.tolist() == summary.run.tolist()
    assert written["final/reward"].tolist() == summary["final/reward"].tolist()
    err = capsys.readouterr().err
    final = err.strip().split("\r")[-1]                      # the bar as it was left
    assert final.startswith("t [local: 4 workers]: 100%") and " 4/4 [" in final
    last = summary.iloc[-1]
    assert f"last: {last.variant} seed {last.seed} reward {last['final/reward']:.3f}" in err
    # nothing left to run: one worker at most, and sweep.json stays the first sweep's
    RN.run_ablation(abl, out, progress=False)
    assert seen[-1] == (1, 2) and (out / "sweep.json").read_text() == text
    # one run lost: the rest are skipped, and the sweep says so
    first = summary.run[0]
    import shutil
    shutil.rmtree(out / "runs" / first)
    RN.run_ablation(abl, out, progress=False)
    assert "3 of 4 runs already finished" in capsys.readouterr().err
    again = json.loads((out / "sweep.json").read_text())
    assert (again["runs"], again["skipped"], again["where"]) == (1, 3, "local: 1 worker")


@pytest.mark.parametrize("workers, cpus, cpu_count, want", [
    (None, 2, 8, (4, 2)),      # cpu_count // threads
    (None, 2, 1, (1, 2)),      # 1 // 2 = 0: still one worker
    (None, 1, None, (1, 1)),   # cpu_count unknown
    (None, 0.5, 8, (4, 1)),    # a fraction of a cpu a run: one thread; never more workers than runs
    (3, 1, 8, (3, 1)),         # asked for
    (9, 1, 8, (4, 1)),         # never more than the runs
])
def test_workers_and_threads(tmp_path, monkeypatch, workers, cpus, cpu_count, want):
    seen = _in_process(monkeypatch, train=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cpu_count)
    RN.run_ablation(_sweep_abl(tmp_path, cpus), tmp_path / "o", workers=workers, progress=False)
    assert seen == [want] and type(seen[0][0]) is int


@pytest.mark.parametrize("workers, threads, cpu_count, note", [
    (None, None, 8, "note: 1 population at 1 torch thread each leave 7 of 8 cores idle; --threads 8 would use them"),
    (None, None, 2, "note: 1 population at 1 torch thread each leave 1 of 2 cores idle; --threads 2 would use them"),
    (None, None, 1, None),  # nothing idle
    (None, None, None, None),  # cores unknown: counted as one, none claimed idle
    (1, None, 8, None),     # one worker asked for: the user chose
    (None, 1, 8, None),     # threads asked for: the user chose
])
def test_idle_cores_are_named_with_the_threads_that_would_use_them(tmp_path, monkeypatch, capsys, workers, threads,
                                                                    cpu_count, note):
    """A sweep of one population (a pretrained preset's one run) on a machine with more cores than its threads says
    so, once, with the --threads that fills them: a run's threads are fixed for its bits, not fitted to the machine,
    and SmolLM2 on 2 cores took twice as long at the default without a word."""
    _in_process(monkeypatch, train=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cpu_count)
    RN.run_ablation(_abl(tmp_path, grid={"loss": ["naive"]}, seeds=1), tmp_path / "o", workers=workers,
                    threads=threads, progress=False)
    err = capsys.readouterr().err
    assert (note in err and err.count("note:") == 1) if note else "note:" not in err


def test_one_worker_runs_here_in_order(monkeypatch):
    calls = []
    monkeypatch.setattr(RN, "train_group", lambda g, threads: calls.append((g, threads)) or [({}, [], {})] * len(g))
    specs = [RN.RunSpec(f"r{k}", "v", {}, k, {}) for k in range(3)]
    todo = [specs[:2], specs[2:]]
    assert [s for s, _ in RN.local_results(todo, 1, 2)] == specs
    assert calls == [(g, 2) for g in todo]     # in this process: the patched train_group ran, a population a call


def test_ray_is_checked_before_anything_and_only_for_ray(tmp_path, monkeypatch):
    from grpo_bench.sweep import cluster

    def missing():
        raise ConfigError("--executor", "ray", "not installed")

    monkeypatch.setattr(cluster, "check_installed", missing)
    _in_process(monkeypatch, train=False)
    abl = _abl(tmp_path, seeds=1)
    with pytest.raises(ConfigError, match="not installed"):
        RN.run_ablation(abl, tmp_path / "ray", executor="ray", progress=False)
    assert not (tmp_path / "ray").exists()
    assert len(RN.run_ablation(abl, tmp_path / "local", progress=False)) == 2


def test_cpu_name_keeps_colons_in_the_model_name(monkeypatch):
    import io
    from grpo_bench.store import rundir
    info = "processor\t: 0\nmodel name\t: Vendor: Fast CPU @ 2.0GHz\n"
    monkeypatch.setattr(rundir, "open", lambda *a, **k: io.StringIO(info), raising=False)
    assert rundir.cpu_name() == "Vendor: Fast CPU @ 2.0GHz"


def test_the_schedule_note_counts_finished_runs_with_a_schedule_only():
    """A failed run, or one without a recorded schedule (from before it was recorded), makes no mixture; two
    finished schedules do, by device alone where threads were not recorded, and the counts are per schedule."""
    from grpo_bench.store.rundir import schedule_note
    assert schedule_note(pd.DataFrame({"status": ["ok", "failed"], "device": "cpu", "threads": [1, 2]})) == ""
    assert schedule_note(pd.DataFrame({"status": "ok", "device": ["cpu", None], "threads": [1, 2]})) == ""
    mixed = pd.DataFrame({"status": "ok", "device": "cpu", "threads": [2, 1, 1]})
    assert schedule_note(mixed.drop(columns="status")) == ""
    assert "(cpu, 1 thread: 2 runs; cpu, 2 threads: 1 run)" in schedule_note(mixed)   # in order, not as met
    assert "(cpu: 1 run; cuda: 1 run)" in schedule_note(pd.DataFrame({"status": ["ok", "ok"],
                                                                      "device": ["cpu", "cuda"]}))
    assert "(1 thread: 1 run; 4 threads: 1 run)" in schedule_note(pd.DataFrame({"status": "ok", "threads": [1, 4]}))


def test_cpu_name_without_cpuinfo_is_the_platforms(monkeypatch):
    from grpo_bench.store import rundir

    def no_cpuinfo(*a, **k):
        raise FileNotFoundError("/proc/cpuinfo")

    monkeypatch.setattr(rundir, "open", no_cpuinfo, raising=False)
    monkeypatch.setattr(rundir.platform, "processor", lambda: "")
    monkeypatch.setattr(rundir.platform, "machine", lambda: "x86_64")
    assert rundir.cpu_name() == "x86_64"
    monkeypatch.setattr(rundir.platform, "machine", lambda: "")
    assert rundir.cpu_name() == "unknown CPU"


def test_cpu_model_names_the_generation_the_model_name_hides(monkeypatch):
    """Two of these machines both read "AMD EPYC" and pick different BLAS kernels (reliability.md): sweep.json
    keeps the family and model of the first processor; "" where cpuinfo lacks them."""
    import io
    from grpo_bench.store import rundir
    one = "vendor_id\t: AuthenticAMD\ncpu family\t: {f}\nmodel\t\t: {m}\nmodel name\t: AMD EPYC\n"
    info = one.format(f=26, m=2) + "\n" + one.format(f=25, m=17)   # a second block may not win
    monkeypatch.setattr(rundir, "open", lambda *a, **k: io.StringIO(info), raising=False)
    assert rundir.cpu_model() == "AuthenticAMD family 26 model 2"
    monkeypatch.setattr(rundir, "open", lambda *a, **k: io.StringIO("processor\t: 0\nmodel name\t: x\n"),
                        raising=False)
    assert rundir.cpu_model() == ""
    # the three fields alone are enough
    monkeypatch.setattr(rundir, "open", lambda *a, **k: io.StringIO("vendor_id: V\ncpu family: 6\nmodel: 143\n"),
                        raising=False)
    assert rundir.cpu_model() == "V family 6 model 143"


def test_train_one_threads_traceback_and_wall_time():
    import torch
    before = torch.get_num_threads()
    spec = RN.RunSpec("r", "v", {}, 0, {**TINY, "optimizer": "sgd", "lr": 1e30, "epochs": 5, "seed": 0})
    try:
        torch.set_num_threads(3)
        t0 = time.perf_counter()
        summary = WK.train_group([spec], threads=2)[0][2]
        elapsed = time.perf_counter() - t0
        assert torch.get_num_threads() == 2
        WK.train_group([spec])[0]
        assert torch.get_num_threads() == 1                  # one thread unless told
    finally:
        torch.set_num_threads(before)
    # at most the innermost three frames: where it failed, not how the runner got there
    frames = re.findall(r'^  File "([^"]+)", line \d+, in (\w+)', summary["traceback"], re.M)
    assert 1 <= len(frames) <= 3 and not {"train_one", "train_group"} & {fn for f, fn in frames if "sweep" in f}
    assert summary["error"].startswith("NonFiniteLoss: non-finite loss")
    assert 0 <= summary["wall_s"] <= elapsed + 0.0005 and summary["wall_s"] == round(summary["wall_s"], 3)


def test_write_run_files_and_a_stale_temporary(tmp_path):
    spec = RN.RunSpec("r1", "v", {}, 0, {**TINY, "seed": 0})
    cfg = run_dict(resolve_run(spec.config))
    stale = tmp_path / "runs" / f".r1.tmp-{os.getpid()}"     # a crashed attempt of this very process
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x")
    summary = {"run": "r1", "status": "ok", "final/reward": 0.5}
    RN.write_run(tmp_path, spec, (cfg, [(0, "m", 1.5)], summary))
    d = tmp_path / "runs" / "r1"
    assert sorted(p.name for p in d.iterdir()) == ["config.yaml", "metrics.parquet", "summary.json"]
    assert list(yaml.safe_load((d / "config.yaml").read_text())) == list(cfg)       # the config's own order
    m = pd.read_parquet(d / "metrics.parquet")
    assert m.values.tolist() == [[0, "m", 1.5]] and str(m.dtypes.value) == "float64"
    record = {"name": "metrics.parquet", "rows": 1, "sha256": hashlib.sha256((d / "metrics.parquet").read_bytes()).hexdigest()}
    assert (d / "summary.json").read_text() == json.dumps(summary | {"metrics_file": record}, indent=1)


@pytest.mark.parametrize("raised, filename", [
    (OSError(28, "No space left on device"), "RUN"),                    # pandas' writers name no file: the run's
    (OSError(13, "Permission denied", "/elsewhere/f"), "/elsewhere/f"),  # one that names its file keeps it
    (ValueError("not a table"), None),                                  # not an OSError: as it was raised
])
def test_write_run_that_fails_leaves_nothing_and_names_the_run_where_the_error_does_not(tmp_path, monkeypatch,
                                                                                       raised, filename):
    spec = RN.RunSpec("r1", "v", {}, 0, {**TINY, "seed": 0})
    cfg = run_dict(resolve_run(spec.config))

    def fails(df, path):
        raise raised

    monkeypatch.setattr(ST, "write_parquet", fails)
    with pytest.raises(type(raised)) as e:
        RN.write_run(tmp_path, spec, (cfg, [(0, "m", 1.5)], {"run": "r1", "status": "ok"}))
    if filename is None:
        assert e.value is raised
    else:
        assert e.value.filename == (str(tmp_path / "runs" / "r1") if filename == "RUN" else filename)
        assert e.value.errno == raised.errno
    assert list((tmp_path / "runs").iterdir()) == []


def test_the_lock_file_holds_only_this_pid_and_is_closed(tmp_path):
    import gc
    import warnings
    out = tmp_path / "a" / "b"                                  # parents made too
    out.mkdir(parents=True)
    (out / ".lock").write_text("99999999\nstale\n")            # left by a sweep that ended
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        lock = RN.lock_out(out)
        assert (out / ".lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(ConfigError, match="another sweep"):
            RN.lock_out(out)
        lock.close()
        RN.run_ablation(_abl(tmp_path, seeds=1), tmp_path / "x" / "y", workers=1, progress=False)
        # the write probe cannot be written (a directory in its place): unusable, and the lock let go
        bad = tmp_path / "bad"
        (bad / f".write-test-{os.getpid()}").mkdir(parents=True)
        with pytest.raises(ConfigError, match="output directory is not writable"):
            RN.lock_out(bad)
        gc.collect()
    # every lock file object is closed by the code, none left to the garbage collector
    assert not [w for w in caught if issubclass(w.category, ResourceWarning) and ".lock" in str(w.message)]


def test_the_pool_path_records_errors_and_drops_what_has_not_started(monkeypatch):
    import concurrent.futures as cf
    futures = []

    def boom():
        raise ValueError("boom")

    def inner():
        boom()

    class Pool:   # a stand-in for the process pool: futures this test settles by hand
        def __init__(self, workers, mp_context=None, initializer=None, initargs=()):
            assert workers == 2 and initializer is RN._die_with_parent and initargs == (os.getpid(), None)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, group, threads, *rest):
            f = cf.Future()
            futures.append(f)
            if len(futures) == 1:
                try:
                    inner()
                except ValueError as e:
                    f.set_exception(e)     # raised outside training: recorded as a failed run
            return f

    monkeypatch.setattr(cf, "ProcessPoolExecutor", Pool)
    todo = [[RN.RunSpec(f"r{k}", "v", {}, k, {**TINY, "seed": k})] for k in range(3)]
    results = RN.local_results(todo, 2, 1)
    spec, (_, rows, summary, _) = next(results)
    assert spec == todo[0][0] and rows == [] and summary["status"] == "failed" and summary["error"] == "ValueError: boom"
    # the innermost three frames of where it was raised
    assert re.findall(r", in (\w+)\n", summary["traceback"]) == ["submit", "inner", "boom"]
    results.close()      # Ctrl-C or a lost worker: the runs not started are dropped
    assert [f.cancelled() for f in futures] == [False, True, True]


def test_a_ray_sweep_through_a_stand_in_session(tmp_path, monkeypatch, capsys):
    import contextlib
    from grpo_bench.sweep import cluster
    seen, nodes = [], iter(range(1, 100))

    class Session:
        def describe(self):
            return f"ray: {next(nodes)} nodes"    # a cluster that grows between two looks

        def results(self, todo, threads, resources, max_retries, log):
            seen.append((threads, resources, max_retries))
            log("a note from the cluster")
            for group in todo:
                for s in group:
                    yield s, RN.failed_result(s, "not run")

    @contextlib.contextmanager
    def connect(address, exclude):
        seen.append((address, exclude))
        yield Session()

    monkeypatch.setattr(cluster, "check_installed", lambda: None)
    monkeypatch.setattr(cluster, "connect", connect)
    out = tmp_path / "o"
    RN.run_ablation(_sweep_abl(tmp_path, 2), out, executor="ray", address="auto")
    assert seen == [("auto", out), (2, {"cpus": 2, "gpus": 0}, 3)]
    err = capsys.readouterr().err
    # described on start (1), after each of the 4 runs (2-5), and in sweep.json (6)
    assert "t [ray: 1 nodes]" in err and "t [ray: 5 nodes]" in err and "a note from the cluster" in err
    assert json.loads((out / "sweep.json").read_text())["where"] == "ray: 6 nodes"
    # Ray schedules the populations itself: they are made as for one worker (4 runs of one part: one population
    # of 4, where two local workers get two of 2)
    one = load_ablation(_write(tmp_path, TINY, {"loss": ["naive"]}, 4))
    RN.run_ablation(one, tmp_path / "one", executor="ray", address="auto", progress=False)
    assert json.loads((tmp_path / "one" / "sweep.json").read_text())["populations"] == [4]


def test_the_progress_bar_moves_with_the_epochs_of_a_population(tmp_path):
    """Two populations on two spawned workers report their epochs as they train; the bar reaches exactly
    the number of runs when the last result lands, and never counts a run before its result."""
    abl = _abl(tmp_path, {"loss": ["naive", "clipped"]}, seeds=3, base={**TINY, "epochs": 4})
    specs = RN.plan(abl)
    groups = RN.populations(specs, 3, 2)
    ticks = []

    class Bar:
        n = 0.0

        def update(self, x):
            self.n += x

    bar = Bar()
    progress = RN._Progress(bar, groups)

    def tick(i, members):
        ticks.append((i, members))
        progress.tick(i, members)

    seen_before = []
    for spec, result in RN.local_results(groups, 2, 1, tick=tick):
        seen_before.append(bar.n)
        bar.update(progress.finished(spec))
    assert sorted(ticks) == sorted((i, len(g)) for i, g in enumerate(groups) for _ in range(4))  # 4 epochs each
    assert bar.n == pytest.approx(len(specs)) and seen_before[0] > 0   # moved before the first result
    # in one process too, with no queue
    ticks.clear()
    list(RN.local_results(groups[:1], 1, 1, tick=tick))
    assert ticks == [(0, len(groups[0]))] * 4


def test_the_progress_bar_never_passes_its_total_when_epoch_reports_arrive_after_the_result(tmp_path):
    """With many workers a population's last epoch reports can be read after its result (a 16-worker
    machine showed 'clamping frac to range [0, 1]' and a negative ETA): they must not count."""
    abl = _abl(tmp_path, {"loss": ["naive", "clipped"]}, seeds=2, base={**TINY, "epochs": 4})
    groups = RN.populations(RN.plan(abl), 2, 2)

    class Bar:
        n = 0.0

        def update(self, x):
            self.n += x
            assert self.n <= sum(map(len, groups)) + 1e-9, "the bar passed its total"

    bar = Bar()
    progress = RN._Progress(bar, groups)
    progress.tick(0, len(groups[0]))                 # epoch 1 of 4
    for spec in groups[0]:
        bar.update(progress.finished(spec))          # its results land first ...
    for _ in range(3):
        progress.tick(0, len(groups[0]))             # ... then its other epochs' reports
    for _ in range(4):
        progress.tick(1, len(groups[1]))
    for spec in groups[1]:
        bar.update(progress.finished(spec))
    assert bar.n == pytest.approx(sum(map(len, groups)))


def test_the_progress_bar_counts_an_epoch_as_its_share_of_a_run_and_keeps_the_last_share_for_the_result():
    """A population of 3 runs of 4 epochs: each epoch moves the bar 3/4 of a run; the epochs' reports stop at
    99% of the population's runs (the rest lands with the results); a 1-epoch population's single report
    takes it straight there; a run the bar never planned settles a whole run."""
    from types import SimpleNamespace as NS

    def group(n, epochs, tag):
        return [NS(run_id=f"{tag}{k}", resolved=NS(epochs=epochs)) for k in range(n)]

    class Bar:
        n = 0.0

        def update(self, x):
            self.n += x

    bar = Bar()
    progress = RN._Progress(bar, [group(3, 4, "a"), group(2, 1, "b")])
    progress.tick(0, 3)
    assert bar.n == pytest.approx(0.75)
    for _ in range(4):
        progress.tick(0, 3)
    assert bar.n == pytest.approx(0.99 * 3)
    progress.tick(1, 2)
    assert bar.n == pytest.approx(0.99 * 3 + 0.99 * 2)
    assert progress.finished(NS(run_id="a0")) == pytest.approx(0.01)
    assert progress.finished(NS(run_id="elsewhere")) == 1.0


def test_the_progress_bar_ends_full_when_float_shares_fall_short_of_the_total():
    """README's main job (3 populations of 20 runs of 600 epochs) drew its last bar as '100%|█████████▉| 60/60':
    the epochs' shares summed to 59.99999999999865. The last result lands the bar on its total exactly, from where
    it started (runs already finished count as the start)."""
    import io
    from types import SimpleNamespace as NS
    from tqdm import tqdm

    groups = [[NS(run_id=f"{g}{k}", resolved=NS(epochs=600)) for k in range(20)] for g in "abc"]
    out = io.StringIO()
    # disable=False: TQDM_DISABLE in the environment (scripts/mutate.py sets it) would otherwise leave the bar at 5
    bar = tqdm(total=65, initial=5, file=out, ascii=False, bar_format="{bar}|{n}/{total}", ncols=20, disable=False)
    progress = RN._Progress(bar, groups)
    for i in range(3):
        for _ in range(600):
            progress.tick(i, 20)
    for g in groups:
        for spec in g:
            bar.update(progress.finished(spec))
    bar.close()
    assert bar.n == 65 and out.getvalue().split("\r")[-1].startswith("\u2588" * 10)


def test_the_record_names_the_device_the_runs_trained_on(tmp_path, monkeypatch):
    """ablation.json's device is the set of the runs' devices (cpu when none is named); sweep.json names the GPU
    only where a run asked for cuda or auto and one was there."""
    import torch
    from types import SimpleNamespace as NS

    abl = _abl(tmp_path, seeds=1)
    specs = RN.plan(abl)
    out = tmp_path / "o"
    out.mkdir()
    on = lambda *devices: [NS(config={"device": d}, run_id=f"r{k}") for k, d in enumerate(devices)]  # noqa: E731
    for specs_, want in [(specs, "cpu"), ([], "cpu"), (on("cuda", "cuda"), "cuda"), (on("cpu", "cuda"), "cpu/cuda")]:
        RN.write_meta(out, abl, abl.seeds, specs_, {})
        assert json.loads((out / "ablation.json").read_text())["device"] == want
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some GPU")
    assert RN.gpu_record(on("cpu", "cpu")) == {} and RN.gpu_record([NS(config={})]) == {}
    assert RN.gpu_record(on("cpu", "cuda")) == RN.gpu_record(on("auto")) == {"gpu": "Some GPU"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert RN.gpu_record(on("cuda")) == {}
    # two planned runs in one directory would lose one of them
    from grpo_bench.errors import ConfigError
    with pytest.raises(ConfigError, match="share the run id 'r0'"):
        RN.write_meta(out, abl, abl.seeds, [*on("cpu"), *on("cuda")], {})   # both r0
    with pytest.raises(ConfigError, match="share the run id 'r1'"):  # the shared one named, not the first
        RN.write_meta(out, abl, abl.seeds, [*on("cpu", "cpu"), on("cpu", "cpu")[1]], {})


def test_leaving_the_results_early_ends_the_runs_in_progress(tmp_path):
    """Ctrl-C, SIGTERM or an error while populations train: the runs in progress are ended, not waited for (a
    pool left normally waits for every run it started: here a million epochs). Six populations on two workers:
    the pool queues three (workers + 1), and the rest, never queued, are dropped."""
    import multiprocessing as mp

    abl = _abl(tmp_path, {"loss": ["naive", "clipped", "unclipped"]}, seeds=2, base={**TINY, "epochs": 1_000_000})
    groups = RN.populations(RN.plan(abl), 1, 2)
    assert len(groups) == 6

    def tick(i, members):  # the first epoch a worker reports: stop the sweep
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        for _ in RN.local_results(groups, 2, 1, tick=tick):
            pass
    assert not mp.active_children()


def test_another_ablations_results_are_refused_unless_forced(tmp_path):
    """run_ablation itself, not only the CLI, keeps another ablation's results unless told to replace them."""
    from grpo_bench.errors import ConfigError
    out = tmp_path / "o"
    RN.run_ablation(_abl(tmp_path, seeds=1), out, workers=1, progress=False)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"name": "other", "base": TINY, "grid": {"lr": [0.1]}, "seeds": 1}))
    with pytest.raises(ConfigError, match="--force"):
        RN.run_ablation(load_ablation(other), out, workers=1, progress=False)
    assert len(RN.run_ablation(load_ablation(other), out, workers=1, progress=False, force=True)) == 1


def test_check_out_counts_runs_kept_as_table_rows_or_directories_and_nothing_else(tmp_path):
    """As results/ are committed (summary.csv's rows, no runs/), another ablation's runs are still refused; an
    ablation.json listing runs of which neither a row nor a directory is left (cancelled before any finished)
    holds nothing to lose."""
    from grpo_bench.errors import ConfigError
    out, abl = tmp_path / "o", _abl(tmp_path, seeds=1)
    out.mkdir()
    (out / "ablation.json").write_text(json.dumps({"name": "other", "runs": ["a-s0", "b-s0"]}))
    RN.check_out(out, abl)                                        # nothing of them kept
    pd.DataFrame({"run": ["b-s0"], "x": [1.0]}).to_csv(out / "summary.csv", index=False)
    with pytest.raises(ConfigError, match="holds 1 runs of ablation 'other'"):
        RN.check_out(out, abl)                                    # one as a row only
    (out / "summary.csv").unlink()
    (out / "runs" / "a-s0").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds 1 runs of ablation 'other'"):
        RN.check_out(out, abl)                                    # one as a directory only


def test_device_auto_takes_the_gpu_only_where_it_beats_this_machines_cpu_workers(tmp_path, monkeypatch):
    """`auto` (the default) means cuda where a GPU is and the task's measured gpu_replaces_cores exceeds the
    cores here."""
    from grpo_bench import registry
    from grpo_bench.engine.trainer import auto_device

    sort = registry.get("task", "sort")
    cfg = RN.plan(_abl(tmp_path, seeds=1))[0].resolved
    cfg.device = "auto"
    monkeypatch.setattr(sort, "gpu_replaces_cores", 19.0, raising=False)
    assert auto_device(cfg, cuda=True, cores=16) == "cuda"
    assert auto_device(cfg, cuda=True, cores=32) == "cpu"     # 32 CPU workers outrun one GPU at 19 cores' worth
    assert auto_device(cfg, cuda=False, cores=2) == "cpu"
    monkeypatch.setattr(sort, "gpu_replaces_cores", None)      # never measured on a GPU: stays on the CPU
    assert auto_device(cfg, cuda=True, cores=2) == "cpu"
    cfg.device = "cpu"
    monkeypatch.setattr(sort, "gpu_replaces_cores", 19.0)
    assert auto_device(cfg, cuda=True, cores=2) == "cpu"      # what the file says, when it says a device


def test_each_tasks_gpu_replaces_cores_is_the_measured_one():
    """The numbers `device: auto` decides by are results/gpu/population.csv's, at the default population (64)."""
    import csv
    from grpo_bench import registry

    rows = {(r["task"], r["population"], r.get("cuda_graphs", "off")): float(r["cpu_cores_replaced"])
            for r in csv.DictReader((Path(__file__).resolve().parents[1] / "results/gpu/population.csv").open())}
    assert registry.get("task", "sort").gpu_replaces_cores == rows[("toy", "64", "off")]
    assert registry.get("task", "arithmetic").gpu_replaces_cores == rows[("lm", "64", "off")]


def test_auto_takes_the_gpu_only_where_it_does_more_than_the_cores_here(monkeypatch):
    from grpo_bench.tasks import device_for

    class Measured:
        gpu_replaces_cores = 2.0   # one GPU does what two CPU cores do

    class Unmeasured:
        pass

    assert device_for("cpu", Measured, cuda=True) == "cpu" and device_for("cuda", Unmeasured, cuda=False) == "cuda"
    assert device_for("auto", Measured, cuda=True, cores=1) == "cuda"
    assert device_for("auto", Measured, cuda=True, cores=2) == "cpu"    # no more than the cores: stay
    assert device_for("auto", Measured, cuda=False, cores=1) == "cpu"
    assert device_for("auto", Unmeasured, cuda=True, cores=1) == "cpu"
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert device_for("auto", Measured, cuda=True) == "cpu"
    monkeypatch.setattr(os, "cpu_count", lambda: None)   # unknown: counted as one core
    assert device_for("auto", Measured, cuda=True) == "cuda"
    Measured.gpu_replaces_cores = 1.5
    assert device_for("auto", Measured, cuda=True) == "cuda"
