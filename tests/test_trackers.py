"""`run --log-to`: each tracker's files read back with that tracker's own reader.

The logged runs are synthetic results shaped as the runner's (config, rows, summary): rows out of
step order, a NaN, a metric name MLflow does not take, a failed run with no rows. One sweep through
the runner checks the wiring: every run logged once, right after its directory, and not again on resume.
"""
import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import yaml

from grpo_bench.sweep import runner as RN
from grpo_bench.store import rundir as ST
from grpo_bench.sweep import trackers as T
from grpo_bench.__main__ import main
from grpo_bench.errors import ConfigError
from grpo_bench.config.run import resolve_run, run_dict
from helpers import ROOT, needs

ABL = str(ROOT / "ablations" / "loss_modes.yaml")
# the environment that would send runs elsewhere than the output directory
ELSEWHERE = ("WANDB_MODE", "MLFLOW_TRACKING_URI", "TRACKIO_DIR", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL")


def _cfg(loss):
    return run_dict(resolve_run({"task": {"name": "sort", "n": 2, "vocab": 3, "prompts": None}, "loss": loss, "seed": 3,
                                 "filters": [{"name": "mask_truncated"}]}))


OK_ROWS = [(1, "reward/mean", 0.1234567890123456), (0, "reward/mean", -1 / 3), (0, "loss/policy", math.nan),
           (1, "loss/policy", 2.5e-7), (1, "eval/pass@k", 0.75), (5, "reward/mean", 1e-300)]
RESULTS = [
    (_cfg("clipped"), OK_ROWS, {"run": "loss=clipped-s3-abc", "variant": "loss=clipped", "loss": "clipped", "seed": 3,
                                "status": "ok", "error": "", "final/reward": 0.625, "final/eval/accuracy": math.nan,
                                "wall_s": 1.5}),
    (_cfg("naive"), [], {"run": "loss=naive-s3-def", "variant": "loss=naive", "loss": "naive", "seed": 3,
                         "status": "failed", "error": "ValueError: bad", "traceback": "...", "wall_s": math.nan}),
]


def _want(rows):
    """{metric: {step: value}}, written independently of trackers._steps."""
    out = {}
    for s, m, v in rows:
        out.setdefault(m, {})[s] = v
    return out


def _same(a, b, rel=0.0):
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=rel, abs=0)


def _log(name, tmp_path_factory):
    """The synthetic results logged by one tracker alone, into a directory of their own. Each round trip logs
    its own tracker (not one fixture for all), so a mutation run's tracer credits each tracker's code to the
    test that reads it back."""
    needs(name)
    out = tmp_path_factory.mktemp(name)
    with mock.patch.dict(os.environ):
        for k in ELSEWHERE:
            os.environ.pop(k, None)
        t = T.Trackers([name], out, "proj")
        for r in RESULTS:
            t.log(r)
        t.close()
        assert t.logged == {name: 2}
    # the tracker closed what it wrote (a writer left open keeps its thread and its event file)
    import threading
    assert not [t for t in threading.enumerate() if type(t).__name__ == "_AsyncWriterThread"]
    if os.path.isdir("/proc/self/fd"):
        held = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                held.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        # (MLflow's client keeps its SQLite store open for the sweep's next runs, by design)
        assert not [h for h in held if h.startswith(str(out)) and not h.endswith("mlflow.db")], held
    return out


@pytest.fixture
def quiet(capfd):
    """What a tracker printed while logging: only the driver's own summary line, no warning, no tracker banner."""
    yield capfd
    err = capfd.readouterr()
    lines = [x for x in (err.out + err.err).splitlines() if x.strip()]
    assert all(" runs logged; view: " in x for x in lines), lines


def test_an_unknown_or_missing_tracker_is_one_line_before_anything(tmp_path, monkeypatch, capsys):
    assert main(["run", ABL, "--out", str(tmp_path / "o"), "--log-to", "neptune"]) == 2
    assert capsys.readouterr().err == ("error: --log-to: neptune: unknown tracker; "
                                       "valid: tensorboard, wandb, mlflow, trackio\n")
    real = T.importlib.util.find_spec
    monkeypatch.setattr(T.importlib.util, "find_spec", lambda name: None if name == "mlflow" else real(name))
    assert main(["run", ABL, "--out", str(tmp_path / "o"), "--log-to", "mlflow"]) == 2
    assert capsys.readouterr().err == ("error: --log-to: mlflow: mlflow is not installed; "
                                       "install it with pip install -e '.[mlflow]'\n")
    # the runner checks too, before it creates or locks the output directory
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[mlflow\]'"):
        RN.run_ablation(object(), tmp_path / "o", log_to=("tensorboard", "mlflow"))
    assert not (tmp_path / "o").exists()


def test_the_cli_passes_every_tracker_in_order(monkeypatch, tmp_path):
    seen = {}

    def run_ablation(abl, out, **kw):
        seen.update(kw)
        raise KeyboardInterrupt   # ends main before it reports

    monkeypatch.setattr(T, "check_installed", lambda names: None)
    monkeypatch.setattr(RN, "run_ablation", run_ablation)
    main(["run", ABL, "--out", str(tmp_path), "--log-to", "wandb", "--log-to", "tensorboard"])
    assert seen["log_to"] == ("wandb", "tensorboard")


def test_steps_are_grouped_and_ordered():
    assert T._steps([(2, "a", 1), (0, "b", 2), (2, "b", 3), (0, "a", 4)]) == [(0, {"b": 2.0, "a": 4.0}),
                                                                             (2, {"a": 1.0, "b": 3.0})]
    assert T._flat({"a": {"b": 1, "c": [1, {"d": 2}]}, "e": None}) == {"a.b": 1, "a.c": '[1, {"d": 2}]', "e": None}


# ---------------------------------------------------------------------------------------- TensorBoard


def test_tensorboard_round_trip(tmp_path_factory, quiet):
    logged = _log("tensorboard", tmp_path_factory)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    import numpy as np
    for cfg, rows, summary in RESULTS:
        ea = EventAccumulator(str(logged / "tensorboard" / summary["run"]), size_guidance={"scalars": 0, "tensors": 0})
        ea.Reload()
        want = _want(rows)
        finals = {k: v for k, v in summary.items() if k.startswith("final/") or k == "wall_s"}
        last = max((s for s, _, _ in rows), default=0)
        assert set(ea.Tags()["scalars"]) == set(want) | set(finals)
        for m, by_step in want.items():
            got = {e.step: e.value for e in ea.Scalars(m)}
            assert got.keys() == by_step.keys()
            # TensorBoard keeps scalars in float32
            assert all(_same(got[s], float(np.float32(v))) for s, v in by_step.items()), m
        for k, v in finals.items():
            (e,) = ea.Scalars(k)
            assert e.step == last and _same(e.value, float(np.float32(v))), k
        (text,) = ea.Tensors("config/text_summary")
        written = text.tensor_proto.string_val[0].decode()
        assert list(yaml.safe_load(written.strip("`").removeprefix("yaml\n"))) == list(cfg) != sorted(cfg)
        text = ea.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
        assert yaml.safe_load(text.removeprefix("```yaml\n").removesuffix("```")) == cfg
        start = plugin_data_pb2.HParamsPluginData.FromString(
            ea.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info
        hp = {k: v.string_value or v.number_value for k, v in start.hparams.items()}
        assert hp["loss.name"] == cfg["loss"]["name"] and hp["seed"] == 3 and hp["variant"] == summary["variant"]
        assert hp["status"] == summary["status"] and hp["filters"] == json.dumps(cfg["filters"])
        assert "task.prompts" not in hp     # None has no HParams type


# ---------------------------------------------------------------------------------------- W&B


def _wandb_records(path: Path):
    """The records of a .wandb file: LevelDB-log blocks of 32 KiB after a 7-byte ':W&B' header, each
    record split into FULL/FIRST/MIDDLE/LAST chunks, each a protobuf `Record` of wandb's own schema."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:         # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += block - pos % block
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):                  # FULL or LAST: a whole record
            yield pb.Record.FromString(buf)
            buf = b""


def _wandb_run(d: Path) -> dict:
    run = {"history": {}, "summary": {}}
    for r in _wandb_records(next(d.glob("*.wandb"))):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run |= {"name": r.run.display_name, "group": r.run.run_group, "project": r.run.project,
                    "config": {i.key: json.loads(i.value_json) for i in r.run.config.update if i.key != "_wandb"}}
        elif kind == "history":
            # a key is in `key` or, one path element here, in `nested_key`
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            run["history"][r.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "summary":
            run["summary"] |= {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.summary.update}
        elif kind == "exit":
            run["exit_code"] = r.exit.exit_code
    return run


def test_wandb_offline_round_trip(tmp_path_factory, quiet):
    logged = _log("wandb", tmp_path_factory)
    runs = {r["name"]: r for r in map(_wandb_run, sorted((logged / "wandb").glob("offline-run-*")))}
    assert set(runs) == {s["run"] for _, _, s in RESULTS}
    for cfg, rows, summary in RESULTS:
        r = runs[summary["run"]]
        assert r["project"] == "proj" and r["group"] == summary["variant"] and r["config"] == cfg
        assert r["exit_code"] == (0 if summary["status"] == "ok" else 1)
        got = {}
        for step, items in r["history"].items():
            for m, v in items.items():
                got.setdefault(m, {})[step] = v
        want = _want(rows)
        assert got.keys() == want.keys()
        for m in want:
            assert got[m].keys() == want[m].keys() and all(_same(got[m][s], v) for s, v in want[m].items()), m
        for k in ("status", "error", "wall_s") + tuple(k for k in summary if k.startswith("final/")):
            v = summary[k]
            # wandb's summary keeps NaN as null (its history keeps NaN)
            assert r["summary"][k] == (None if isinstance(v, float) and math.isnan(v) else v), k
        assert "traceback" not in r["summary"]
    # the driver's code, requirements and console are not the run's: no files beside the run's records
    for d in (logged / "wandb").glob("offline-run-*"):
        kept = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and p.parent.name != "logs")
        assert kept == [f"run-{d.name.rsplit('-', 1)[1]}.wandb"], kept


def test_wandb_keeps_the_drivers_git_state_and_machine_out(tmp_path, monkeypatch):
    """What the offline files cannot show here (this checkout's git state, stats sampled every few seconds):
    the settings each run starts with."""
    needs("wandb")
    import wandb
    seen = []
    real = wandb.init
    monkeypatch.setattr(wandb, "init", lambda **kw: seen.append(kw["settings"]) or real(**kw))
    _log_one = T.WandB(tmp_path, "proj")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    _log_one.log(*(lambda c, r, s: (s["run"], s["variant"], c, r, s))(*RESULTS[0]))
    (st,) = seen
    assert (st.silent, st.console, st.x_disable_stats, st.disable_git, st.save_code, st.x_save_requirements,
            st.disable_job_creation) == (True, "off", True, True, False, False, True)


def test_wandb_says_where_its_runs_are(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert T.WandB(tmp_path, "p").where() == f"wandb sync {tmp_path}/wandb/offline-run-*"
    monkeypatch.setenv("WANDB_MODE", "online")
    assert T.WandB(tmp_path, "p").where() == "wandb (mode online)"


# ---------------------------------------------------------------------------------------- MLflow


def test_mlflow_round_trip(tmp_path_factory, quiet):
    logged = _log("mlflow", tmp_path_factory)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{logged}/mlflow.db")
    exp = client.get_experiment_by_name("proj")
    assert exp.artifact_location == (logged / "mlartifacts").resolve().as_uri()
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {s["run"] for _, _, s in RESULTS}
    for cfg, rows, summary in RESULTS:
        r = runs[summary["run"]]
        assert r.info.status == ("FINISHED" if summary["status"] == "ok" else "FAILED")
        assert r.data.tags["variant"] == summary["variant"] and r.data.tags["status"] == summary["status"]
        assert r.data.tags["error"] == summary["error"]
        assert r.data.params["loss.name"] == cfg["loss"]["name"] and r.data.params["seed"] == "3"
        assert r.data.params["task.prompts"] == "None" and json.loads(r.data.params["filters"]) == cfg["filters"]
        assert len(r.data.params) == sum(1 for _ in _leaves(cfg))
        want = {m.replace("@", "_"): by for m, by in _want(rows).items()}
        last = max((s for s, _, _ in rows), default=0)
        want |= {k: {last: v} for k, v in summary.items() if k.startswith("final/") or k == "wall_s"}
        assert set(r.data.metrics) == set(want)
        for m, by_step in want.items():
            got = {x.step: x.value for x in client.get_metric_history(r.info.run_id, m)}
            assert got.keys() == by_step.keys() and all(_same(got[s], v) for s, v in by_step.items()), m


def test_mlflow_takes_a_run_past_its_batch_limits(tmp_path, monkeypatch):
    """MLflow refuses more than 100 params or 1,000 metrics in one log_batch: a wide config and a long run."""
    needs("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = {f"k{i}": i for i in range(150)}
    rows = [(s, f"m{j}", float(s * j)) for s in range(300) for j in range(4)]
    summary = {"run": "wide", "variant": "v", "status": "ok", "error": "", "final/reward": 0.5, "wall_s": 1.0}
    from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH

    m = T.MLflow(tmp_path, "proj")
    t0 = int(time.time() * 1000)
    m.log("wide", "v", {}, [], summary)   # opens the client
    sizes = []
    real = m.client.log_batch
    monkeypatch.setattr(m.client, "log_batch", lambda rid, metrics=(), params=(): sizes.append(
        (len(metrics), len(params))) or real(rid, metrics=metrics, params=params))
    m.log("wide", "v", cfg, rows, summary)
    t1 = int(time.time() * 1000)
    # a SQLite store takes any batch; a tracking server refuses one past MLflow's own limits
    assert max(n for n, _ in sizes) == MAX_METRICS_PER_BATCH and max(n for _, n in sizes) == MAX_PARAMS_TAGS_PER_BATCH
    assert sum(n for n, _ in sizes) == len(rows) + 2 and sum(n for _, n in sizes) == 150
    client = MlflowClient(tracking_uri=m.uri)
    r = next(r for r in client.search_runs([client.get_experiment_by_name("proj").experiment_id])
             if len(r.data.params))
    assert len(r.data.params) == 150 and r.info.status == "FINISHED"
    hist = client.get_metric_history(r.info.run_id, "m3")
    assert len(hist) == 300 and hist[-1].value == 897.0
    assert all(t0 <= x.timestamp <= t1 for x in hist)   # milliseconds since the epoch, as MLflow keeps them


def _leaves(d):
    for v in d.values():
        yield from (_leaves(v) if isinstance(v, dict) else [v])


# ---------------------------------------------------------------------------------------- trackio

READ_TRACKIO = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage as S
runs = S.get_runs("proj")
print(json.dumps({r: {"logs": S.get_logs("proj", r), "config": S.get_run_config("proj", r)} for r in runs}))
"""


def test_trackio_round_trip(tmp_path_factory, quiet):
    logged = _log("trackio", tmp_path_factory)
    # trackio fixes its store when imported: read it in a process of its own, as the logging was written
    res = subprocess.run([sys.executable, "-c", READ_TRACKIO], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, TRACKIO_DIR=str(logged / "trackio")))
    assert res.returncode == 0, res.stderr[-2000:]
    runs = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(runs) == {s["run"] for _, _, s in RESULTS}
    for cfg, rows, summary in RESULTS:
        r = runs[summary["run"]]
        assert {k: v for k, v in r["config"].items() if not k.startswith("_")} == cfg
        assert r["config"]["_Group"] == summary["variant"]
        got = {}
        for entry in r["logs"]:
            for m, v in entry.items():
                if m not in ("step", "timestamp"):
                    got.setdefault(m, {})[entry["step"]] = v
        want = _want(rows)
        last = max((s for s, _, _ in rows), default=0)
        want |= {k: {last: v} for k, v in summary.items() if k.startswith("final/") or k == "wall_s"}
        assert got.keys() == want.keys()
        for m in want:
            assert got[m].keys() == want[m].keys() and all(_same(got[m][s], v) for s, v in want[m].items()), m


def test_trackio_follows_a_store_the_user_chose(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "mine"))
    assert T.Trackio(tmp_path / "out", "p").store == str(tmp_path / "mine")
    monkeypatch.delenv("TRACKIO_DIR")
    assert T.Trackio(tmp_path / "out", "p").store == str(tmp_path / "out" / "trackio")


# ---------------------------------------------------------------------------------------- through the runner


def test_a_sweep_logs_each_run_once_after_its_directory(tmp_path, monkeypatch, capsys):
    from grpo_bench.config.ablation import load_ablation

    tiny = {"task": {"name": "sort", "prompts": None, "num_prompts": 2, "eval_prompts": 4, "n": 2, "vocab": 3},
            "epochs": 4, "inner_steps": 1, "group_size": 2, "delta": "centered", "optimizer": "sgd"}
    (tmp_path / "abl.yaml").write_text(yaml.safe_dump({"name": "t", "base": tiny, "grid": {"lr": [1e30, 0.01]},
                                                       "seeds": 1}))
    abl = load_ablation(tmp_path / "abl.yaml")   # the first run diverges and fails
    seen = []

    class Spy:
        def __init__(self, out, project):
            seen.append(("open", project))

        def log(self, run, variant, cfg, rows, summary):
            # the run's directory is already whole when a tracker sees it
            assert ST.finished(out / "runs" / run) == (summary["status"] == "ok")
            assert yaml.safe_load((out / "runs" / run / "config.yaml").read_text()) == cfg
            seen.append((run, summary["status"], len(rows)))

        def where(self):
            return "here"

    monkeypatch.setitem(T.BACKENDS, "tensorboard", Spy)
    out = tmp_path / "o"
    summary = RN.run_ablation(abl, out, workers=1, progress=False, log_to=("tensorboard",))
    assert seen[0] == ("open", "t") and [s[:2] for s in seen[1:]] == list(zip(summary.run, summary.status))
    assert seen[2][2] > 0 and "tensorboard: 2 runs logged; view: here" in capsys.readouterr().err
    # resume: the failed run again, the finished one not logged twice
    seen.clear()
    RN.run_ablation(abl, out, workers=1, progress=False, log_to=("tensorboard",))
    assert [s[0] for s in seen[1:]] == [summary.run[0]]


def test_a_tracker_failure_is_one_line_and_the_sweep_goes_on(tmp_path, capsys):
    class Broken:
        def __init__(self, out, project):
            pass

        def log(self, *a):
            raise OSError("disk full\nsecond line")

    t = T.Trackers([], tmp_path, "p")
    t.backends, t.logged = {"wandb": Broken(tmp_path, "p")}, {"wandb": 0}
    t.log(RESULTS[0])
    t.close()
    run = RESULTS[0][2]['run']
    assert capsys.readouterr().err == (f"warning: --log-to wandb: run {run} not logged: OSError: disk full; wandb is "
                                       f"off for the rest of this sweep\nwandb: off since run {run}: the runs after "
                                       "it are in runs/ only\n")


@pytest.mark.parametrize("how", ["raises", "hangs"])
def test_a_failing_tracker_is_tried_once_and_switched_off(tmp_path, capsys, monkeypatch, how):
    """An unreachable MLflow server cost ~4 minutes a run, W&B ~90 s, and a failed tracker was tried again on
    every run: now one bounded try, then off; the sweep's other trackers go on."""
    import threading
    calls, release = [], threading.Event()

    class Bad:
        def log(self, run, *a):
            calls.append(run)
            if how == "raises":
                raise ConnectionError("server unreachable")
            release.wait(30)     # a tracker stuck on the network

    class Good:
        def __init__(self):
            self.runs = []

        def log(self, run, *a):
            self.runs.append(run)

        def where(self):
            return "here"

    monkeypatch.setenv("GRPO_BENCH_TRACKER_TIMEOUT", "0.5")
    t = T.Trackers([], tmp_path, "p")
    good = Good()
    t.backends, t.logged = {"mlflow": Bad(), "tensorboard": good}, {"mlflow": 0, "tensorboard": 0}
    start = time.perf_counter()
    for result in RESULTS * 3:
        t.log(result)
    t.close()
    release.set()
    assert time.perf_counter() - start < 10           # one timeout, not one a run
    assert calls == [RESULTS[0][2]["run"]] and len(good.runs) == 3 * len(RESULTS)
    err = capsys.readouterr().err
    why = "ConnectionError: server unreachable" if how == "raises" else "TimeoutError: no answer within 0.5 s"
    assert f"run {RESULTS[0][2]['run']} not logged: {why}" in err and "mlflow is off for the rest of this sweep" in err
    assert f"tensorboard: {3 * len(RESULTS)} runs logged; view: here" in err


def test_a_tracker_that_fails_to_close_is_one_warning(tmp_path, capsys):
    class Unclosed:
        def log(self, *a):
            pass

        def close(self):
            raise OSError("store gone")

        def where(self):
            return "here"

    t = T.Trackers([], tmp_path, "p")
    t.backends, t.logged = {"mlflow": Unclosed()}, {"mlflow": 0}
    t.close()
    assert capsys.readouterr().err == "warning: --log-to mlflow: OSError: store gone\n"


def test_trackio_closes_quietly_with_or_without_runs(tmp_path, capsys):
    T.Trackio(tmp_path, "p").close()     # never started its process: nothing to wait for
    t = T.Trackers([], tmp_path, "p")
    t.backends, t.logged = {"trackio": T.Trackio(tmp_path, "p")}, {"trackio": 0}
    t.close()
    assert capsys.readouterr().err == ""


def test_trackio_reports_its_process_ending_badly(tmp_path):
    tr = T.Trackio(tmp_path, "p")
    tr.child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"],
                                stdin=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="exit code 3"):
        tr.close()


def test_the_trackio_process_logs_each_run_it_is_sent(monkeypatch):
    """_trackio_child in this process, against a stand-in trackio (the real one runs in tests above, in a child
    process the mutation run's tracer cannot see)."""
    import io
    import signal
    import types

    calls = []
    fake = types.SimpleNamespace(init=lambda **kw: calls.append(("init", kw)),
                                 log=lambda m, step: calls.append(("log", step, m)),
                                 finish=lambda: calls.append(("finish",)))
    monkeypatch.setitem(sys.modules, "trackio", fake)
    line = json.dumps({"name": "r", "group": "g", "config": {"a": 1}, "steps": [[0, {"x": 1.0}], [2, {"x": 2.0}]]})
    monkeypatch.setattr(sys, "stdin", io.StringIO(line + "\n" + line.replace('"r"', '"s"') + "\n"))
    before = signal.getsignal(signal.SIGINT)
    try:
        T._trackio_child("proj")
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN   # Ctrl-C: the runs already sent still finish
    finally:
        signal.signal(signal.SIGINT, before)
    init = {"project": "proj", "name": "r", "group": "g", "config": {"a": 1}, "auto_log_cpu": False,
            "auto_log_gpu": False, "embed": False}
    assert calls == [("init", init), ("log", 0, {"x": 1.0}), ("log", 2, {"x": 2.0}), ("finish",),
                     ("init", init | {"name": "s"}), ("log", 0, {"x": 1.0}), ("log", 2, {"x": 2.0}), ("finish",)]


def test_a_bounded_call_waits_without_limit_at_zero_and_leaves_no_thread_to_block_exit(monkeypatch):
    import threading
    assert T._bounded(lambda: time.sleep(0.3) or 5, 0) == 5          # 0: no limit
    release = threading.Event()
    with pytest.raises(TimeoutError, match="no answer within 0.1 s"):
        T._bounded(lambda: release.wait(30), 0.1)
    stuck = [t for t in threading.enumerate() if t.name == "grpo_bench-tracker"]
    release.set()
    assert stuck and all(t.daemon for t in stuck)   # a tracker stuck on the network must not keep the sweep alive


def test_the_default_timeout_is_the_one_docs_trackers_gives(monkeypatch):
    monkeypatch.delenv("GRPO_BENCH_TRACKER_TIMEOUT", raising=False)
    text = " ".join((ROOT / "docs/trackers.md").read_text().split())
    assert T.timeout_s() == T.TIMEOUT_S and f"`GRPO_BENCH_TRACKER_TIMEOUT` seconds ({T.TIMEOUT_S:g};" in text


def test_a_run_reaches_the_trackio_process_when_it_is_logged(tmp_path):
    """Not when the sweep ends: a driver killed mid-sweep has sent every finished run."""
    import select
    tr = T.Trackio(tmp_path, "p")
    tr.child = subprocess.Popen([sys.executable, "-c", "import sys; print(sys.stdin.readline(), end='', flush=True); "
                                 "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    cfg, rows, summary = RESULTS[0]
    tr.log(summary["run"], summary["variant"], cfg, rows, summary)
    ready, _, _ = select.select([tr.child.stdout], [], [], 20)
    got = json.loads(tr.child.stdout.readline()) if ready else None
    tr.close()
    assert got is not None and got["name"] == summary["run"] and got["group"] == summary["variant"]
    assert got["steps"][-1][1]["final/reward"] == 0.625    # trackio has no summary: finals at the last step
