"""Faults and hostile input (issue 22): every probe ends in one line or a handled outcome.

Each case is what a hostile but realistic user does: malformed files and flags, damaged
results directories, signals, a full disk, a tampered checkpoint. The contract: a one-line
`error: ...` on stderr and a documented exit code (2 bad input, 1 a failed run or an I/O
failure, 130/143 interrupted), never a traceback, and nothing lost or counted twice.
In-process calls of the CLI's main() wherever a real process adds nothing; subprocesses
only for signals.
"""
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from grpo_bench.sweep import runner as RN
from grpo_bench.store import rundir as ST
from grpo_bench.__main__ import main
from grpo_bench.errors import ConfigError
from grpo_bench.config.run import config_hash, parse_set, resolve_run
from grpo_bench.config.ablation import load_ablation
from grpo_bench.tasks.lm import shipped
from helpers import HIDE_ENV, ROOT, extras, installed, needs

TINY = {"task": {"name": "sort", "prompts": None, "num_prompts": 2, "eval_prompts": 4, "n": 2, "vocab": 3},
        "epochs": 2, "inner_steps": 1, "group_size": 2, "delta": "centered"}


def write(tmp_path, doc, name="abl.yaml"):
    p = tmp_path / name
    if isinstance(doc, bytes):
        p.write_bytes(doc)
    else:
        p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return p


def run_main(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(err: str) -> str:
    """The single stderr line of a handled fault."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def last_line(err: str) -> str:
    """A sweep's one error line: its last, after any progress lines (`2 of 4 runs already finished`)."""
    lines = err.strip().splitlines()
    assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:] and "Traceback" not in err, err
    return lines[-1]


@pytest.fixture(autouse=True)
def keep_torch_threads():
    import torch
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------ bad configs

DUP_VARIANTS = "name: t\nbase: {task: sort, epochs: 2}\nvariants:\n  a: {lr: 0.01}\n  b: {lr: 0.02}\n  a: {lr: 0.03}\n"
BAD_CONFIGS = {
    # (ablation: a mapping, YAML text or bytes; words the one line must contain)
    "seed twice": ({"base": TINY, "grid": {"loss": ["naive"]}, "seeds": [3, 0, 3]}, ["seeds", "3", "twice"]),
    "grid value twice": ({"base": TINY, "grid": {"loss": ["naive", "clipped", "naive"]}},
                         ["grid.loss", "'naive'", "twice"]),
    "grid mapping twice": ({"base": TINY, "grid": {"loss": [{"name": "clipped", "clip_high": 0.3},
                                                             {"clip_high": 0.3, "name": "clipped"}]}},
                           ["grid.loss", "twice"]),
    "grid over seed": ({"base": TINY, "grid": {"seed": [0, 1]}}, ["grid.seed", "seeds"]),
    "duplicate variant": (DUP_VARIANTS, ["variants.a", "duplicate key", "lines 4 and 6"]),
    "duplicate base key": ("base:\n  task: sort\n  lr: 0.1\n  lr: 0.2\ngrid: {loss: [naive]}\n",
                           ["base.lr", "duplicate key"]),
    "duplicate claim key": ("base: {task: sort}\nvariants: {a: {}, b: {lr: 0.1}}\nclaim:\n  text: x\n  source: y\n"
                            "  expect: ['a > b']\n  expect: ['b > a']\n", ["claim.expect", "duplicate key"]),
    "duplicate nested key": ("base: {task: {name: sort, n: 2, n: 3}}\ngrid: {loss: [naive]}\n",
                             ["base.task.n", "duplicate key"]),
    "not UTF-8": (b"base: {task: sort}\ngrid: {loss: [naive]}\n# caf\xe9\n", ["not UTF-8", "byte 0xe9"]),
    "infinite lr": ({"base": {**TINY, "lr": float("inf")}, "grid": {"loss": ["naive"]}}, ["lr", "finite", "inf"]),
    "nan kl_coef": ({"base": {**TINY, "kl_coef": float("nan")}, "grid": {"loss": ["naive"]}}, ["kl_coef", "finite"]),
    "infinite weight_decay": ({"base": {**TINY, "weight_decay": float("inf")}, "grid": {"loss": ["naive"]}},
                              ["weight_decay", "finite"]),
    "infinite max_grad_norm": ({"base": {**TINY, "max_grad_norm": float("inf")}, "grid": {"loss": ["naive"]}},
                               ["max_grad_norm", "finite"]),
    "infinite task float": ({"base": {**TINY, "task": "arithmetic_tiny"}, "grid": {"task.sampling.temperature":
                             [float("inf")]}}, ["task.sampling.temperature", "finite"]),
    "seed 2**64": ({"base": TINY, "grid": {"loss": ["naive"]}, "seeds": [2**64]}, ["seeds", "0 <= seed < 2**63", str(2**64)]),
    "negative seed": ({"base": TINY, "grid": {"loss": ["naive"]}, "seeds": [-1]}, ["seeds", "0 <= seed < 2**63", "-1"]),
    "seed in base": ({"base": {**TINY, "seed": -1}, "grid": {"loss": ["naive"]}}, ["seed", "0 <= seed < 2**63", "-1"]),
    "a trillion seeds": ({"base": TINY, "grid": {"loss": ["naive"]}, "seeds": 10**12}, ["seeds", "at most 100000"]),
    "loss 3": ({"base": {**TINY, "loss": 3}, "grid": {"delta": ["centered"]}},
               ["loss", "a loss name or a mapping with `name`", "got 3", "valid: "]),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_is_one_line_exit_2(tmp_path, capsys, case):
    doc, words = BAD_CONFIGS[case]
    path = write(tmp_path, doc)
    code, _, err = run_main(capsys, "run", path, "--out", tmp_path / "out", "--no-progress")
    line = one_line(err)
    assert code == 2 and str(path) in line, line
    for w in words:
        assert w in line, (w, line)
    assert not (tmp_path / "out").exists()


BAD_FLAGS = {
    "--set unclosed mapping": (["--set", "loss={name: clipped"], ["--set", "loss", "invalid YAML"]),
    "--set wrong type": (["--set", "epochs=ten"], ["--set: epochs", "expected int", "'ten'"]),
    "--set unknown part": (["--set", "loss.name=ppo"], ["--set: loss", "'ppo'"]),
    "--set infinite lr": (["--set", "lr=.inf"], ["--set: lr", "finite"]),
    "--set duplicate key": (["--set", "loss={name: clipped, name: naive}"], ["--set", "loss.name", "duplicate key"]),
    "--seeds a trillion": (["--seeds", "1000000000000"], ["--seeds", "at most 100000", "1000000000000"]),
    "--setting unknown": (["--setting", "gpu"], ["--setting", "'gpu'"]),
}


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_bad_flag_is_one_line_exit_2(tmp_path, capsys, case):
    flags, words = BAD_FLAGS[case]
    path = write(tmp_path, {"base": TINY, "grid": {"loss": ["naive", "clipped"]}})
    code, _, err = run_main(capsys, "run", path, "--out", tmp_path / "out", *flags)
    line = one_line(err)
    assert code == 2
    for w in words:
        assert w in line, (w, line)
    assert str(path) not in line or "--setting" in flags    # the flag is named, not the file it did not come from
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, value", [("1e-3", 0.001), ("1E-3", 0.001), ("-2.5e+2", -250.0), ("3e2", 300.0),
                                         (".5e-1", 0.05), ("1_000.5", 1000.5), ("0.001", 0.001)])
def test_exponent_floats_are_floats(tmp_path, text, value):
    # PyYAML's YAML 1.1 resolver reads 1e-3 as the string '1e-3'; every user means the number
    from grpo_bench.config import strict_yaml
    got = strict_yaml.load(f"x: {text}")["x"]
    assert type(got) is float and got == value
    assert parse_set([f"lr={text}"]) == [("lr", value)]
    if value > 0:
        path = write(tmp_path, f"base: {{task: sort, lr: {text}}}\ngrid: {{loss: [naive]}}\n")
        assert load_ablation(path).variants[0][2]["lr"] == value
    # what stays a string: not a number in any YAML
    assert parse_set(["x=1e", "y=e3", "z=1.2.3e4"]) == [("x", "1e"), ("y", "e3"), ("z", "1.2.3e4")]


def test_every_yaml_the_suite_reads_refuses_duplicate_keys(tmp_path, monkeypatch):
    from grpo_bench.config import presets
    from grpo_bench.config.ablation import ablation_settings
    from grpo_bench.config import strict_yaml
    # every shipped file still loads: none of them repeats a key. Without the gym extra a reasoning-gym
    # ablation cannot resolve (its task needs the package), so its YAML alone is read: that is where a
    # duplicate key is refused (before: this test failed where the extra was absent)
    gym = installed("gym")
    for p in sorted((ROOT / "ablations").glob("*.yaml")):
        strict_yaml.load(p.read_text())
        for s in ablation_settings(p) or [None]:
            try:
                load_ablation(p, setting=s)
            except ConfigError as e:
                if gym or "needs reasoning-gym" not in str(e):
                    raise
    # a task preset in tasks/
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "__init__.py").write_text("")
    (tasks / "mine.yaml").write_text("description: x\ntask: {name: sort, n: 2, n: 3}\n")
    with monkeypatch.context() as m:
        m.setattr(presets, "tasks_dir", lambda: tasks)
        presets._read.cache_clear()
        try:
            with pytest.raises(ConfigError, match=r"mine.yaml: task.n: duplicate key"):
                resolve_run({"task": "mine"})
        finally:
            presets._read.cache_clear()
    # a variant file of the TRL integration
    needs("trl")
    from grpo_bench.integrations import trl as T
    path = write(tmp_path, "loss: clipped\ndelta: zscore\nloss: naive\n", "variant.yaml")
    with pytest.raises(ConfigError, match=r"variant.yaml: loss: duplicate key \(lines 1 and 3\)"):
        T.load_variant(path)


# --------------------------------------------------------------- run ids and duplicates


def test_run_ids_are_unique_whatever_the_label(tmp_path):
    doc = {"name": "t", "base": TINY, "variants": {"α": {}, "β": {}, "a,b": {}, "a_b": {}, "x" * 90: {},
                                                   "x" * 90 + "y": {}, "plain": {}}, "seeds": [0, 1]}
    specs = RN.plan(load_ablation(write(tmp_path, doc)))
    ids = [s.run_id for s in specs]
    assert len(set(ids)) == len(ids) == 14
    # an ASCII label the slug keeps whole keeps the id committed results were written under
    plain = next(s for s in specs if s.variant == "plain" and s.seed == 0)
    assert plain.run_id == f"plain-s0-{config_hash(resolve_run(plain.config))}"
    assert all(len(i) < 120 for i in ids)


def test_two_labels_one_slug_both_kept(tmp_path):
    # α and β used to share base-s0-<hash>: α's run was overwritten and counted 0/0
    doc = {"name": "t", "base": TINY, "variants": {"α": {}, "β": {}}, "seeds": 1}
    out = tmp_path / "o"
    summary = RN.run_ablation(load_ablation(write(tmp_path, doc)), out, workers=1, progress=False)
    assert summary.variant.tolist() == ["α", "β"] and (summary.status == "ok").all()
    assert len(list((out / "runs").iterdir())) == 2


# ----------------------------------------------------------------- damaged directories


@pytest.fixture
def swept(tmp_path):
    """A finished two-run sweep and the bytes of each run's files, to damage and compare."""
    abl = load_ablation(write(tmp_path, {"name": "t", "base": TINY, "grid": {"loss": ["naive", "clipped"]},
                                         "seeds": 1}))
    out = tmp_path / "o"
    RN.run_ablation(abl, out, workers=1, progress=False)
    runs = {d.name: {f.name: f.read_bytes() for f in d.iterdir()} for d in (out / "runs").iterdir()}
    return abl, out, runs


def _metrics_table(path: Path, data: bytes | None = None) -> pd.DataFrame:
    """A run's metrics file as a table; from `data` instead of the file when given."""
    import io
    return pd.read_parquet(io.BytesIO(data if data is not None else path.read_bytes()))


def _metrics_file(run_dir: Path) -> Path:
    return run_dir / ST.METRICS_FILE


def _without_checksum(run_dir: Path) -> None:
    s = json.loads((run_dir / "summary.json").read_text())
    del s["metrics_file"]
    (run_dir / "summary.json").write_text(json.dumps(s))


DAMAGE = {
    "truncated metrics": lambda d: _metrics_file(d).write_bytes(_metrics_file(d).read_bytes()[:200]),
    "empty metrics": lambda d: _metrics_file(d).write_bytes(b""),
    "metrics gone": lambda d: _metrics_file(d).unlink(),
    "one value edited": lambda d: _metrics_file(d).write_bytes(_metrics_file(d).read_bytes().replace(b"0", b"1", 1)),
    "summary not JSON": lambda d: (d / "summary.json").write_text("{\"status\": \"ok\""),
    "summary gone": lambda d: (d / "summary.json").unlink(),
    "summary without checksum": _without_checksum,   # as before Parquet: its metrics cannot be checked
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_run_is_redone_with_one_line(swept, capsys, case):
    abl, out, runs = swept
    victim = sorted(runs)[0]
    DAMAGE[case](out / "runs" / victim)
    assert not ST.finished(out / "runs" / victim)
    capsys.readouterr()
    summary = RN.run_ablation(abl, out, workers=1, progress=False)
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if victim in line]
    assert len(said) == 1 and "damaged" in said[0] and "running it again" in said[0], err
    assert "1 of 2 runs already finished" in err
    assert (summary.status == "ok").all() and len(summary) == 2
    # redone to the same numbers (same config and seed), times aside: nothing from the damage kept
    d = out / "runs" / victim
    assert sorted(p.name for p in d.iterdir()) == sorted(runs[victim])
    assert (d / "config.yaml").read_bytes() == runs[victim]["config.yaml"]
    name = json.loads(runs[victim]["summary.json"])["metrics_file"]["name"]
    redone, first = (_metrics_table(d / name), _metrics_table(d / name, runs[victim][name]))
    pd.testing.assert_frame_equal(redone[~redone.metric.str.startswith("time/")].reset_index(drop=True),
                                  first[~first.metric.str.startswith("time/")].reset_index(drop=True), check_exact=True)
    assert set(pd.read_parquet(out / "metrics.parquet").run) == set(runs)


def test_summary_json_records_rows_and_checksum(swept):
    import hashlib
    _, out, _ = swept
    for d in (out / "runs").iterdir():
        record = json.loads((d / "summary.json").read_text())["metrics_file"]
        f = d / record["name"]
        assert record["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
        assert record["rows"] == len(pd.read_parquet(f)) > 0


COLLECT_WHY = {"truncated metrics": "SHA-256 differs", "empty metrics": "SHA-256 differs",
               "metrics gone": "metrics.parquet is missing", "one value edited": "SHA-256 differs",
               "summary not JSON": "summary.json unreadable", "summary gone": "no summary.json",
               "summary without checksum": ST.NO_RECORD}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_collect_marks_a_damaged_run_failed_never_keeps_it(swept, capsys, case):
    """Whatever the damage, the run's metrics are left out (one value edited is still a readable table of the
    recorded rows: only its checksum says it is not the run's) and its error says what check_run found."""
    _, out, runs = swept
    victim = sorted(runs)[0]
    DAMAGE[case](out / "runs" / victim)
    summary = RN.collect(out)
    row = summary.set_index("run").loc[victim]
    assert row.status == "failed" and "damaged" in row.error and COLLECT_WHY[case] in row.error, row.error
    if "summary" not in case:   # what its summary says of it stays: its variant and seed
        assert (row.variant, row.seed) == (json.loads(runs[victim]["summary.json"])["variant"], 0)
    # summary.csv is the table itself: its first column is the run, not an index
    assert pd.read_csv(out / "summary.csv").columns[0] == "run"
    assert "metrics_file" not in summary.columns and "traceback" not in summary.columns
    assert victim not in set(pd.read_parquet(out / "metrics.parquet").run)
    assert [line for line in capsys.readouterr().err.splitlines() if victim in line]


def test_a_failed_run_whose_metrics_are_damaged_keeps_its_own_error(swept, capsys):
    _, out, runs = swept
    victim = sorted(runs)[0]
    d = out / "runs" / victim
    s = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps(s | {"status": "failed", "error": "ValueError: boom"}))
    DAMAGE["truncated metrics"](d)
    row = RN.collect(out).set_index("run").loc[victim]
    assert (row.status, row.error) == ("failed", "ValueError: boom")
    assert f"run {victim} failed and its metrics are damaged" in capsys.readouterr().err


@pytest.mark.parametrize("case, why", [("other columns", "has columns ['step', 'name', 'value']"),
                                       ("a value that is no number", "not a number")])
def test_a_metrics_file_matching_its_checksum_is_still_read_whole(swept, capsys, case, why):
    # summary.json rewritten to match a file that is no table of (step, metric, number): the checksum
    # passes, reading it does not, and collect keeps none of it
    _, out, runs = swept
    victim = sorted(runs)[0]
    d = out / "runs" / victim
    m = pd.read_parquet(d / ST.METRICS_FILE)
    m = m.rename(columns={"metric": "name"}) if case == "other columns" else m.assign(value="x")
    m.to_parquet(d / ST.METRICS_FILE, index=False)
    s = json.loads((d / "summary.json").read_text())
    s["metrics_file"]["sha256"] = ST._sha256(d / ST.METRICS_FILE)
    (d / "summary.json").write_text(json.dumps(s))
    row = RN.collect(out).set_index("run").loc[victim]
    assert row.status == "failed" and why in row.error, row.error
    assert victim not in set(pd.read_parquet(out / "metrics.parquet").run)


def test_stale_temporaries_of_dead_processes_are_cleaned(swept):
    abl, out, _ = swept
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = [out / "runs" / f".r1.tmp-{dead}", out / f".metrics.parquet.tmp-{dead}"]
    stale[0].mkdir()
    (stale[0] / ST.METRICS_FILE).write_bytes(b"PAR1")
    stale[1].write_text("run,")
    # SIGHUP as it is by default (a parent under nohup would pass it on ignored): a signal would end it
    live = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGHUP, "
                             "signal.SIG_DFL); print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert live.stdout.readline() == b"ready\n"
    alive = out / f".REPORT.md.tmp-{live.pid}"          # a live process's (a concurrent plot): left alone
    alive.write_text("x")
    try:
        RN.run_ablation(abl, out, workers=1, progress=False)
        assert not any(p.exists() for p in stale) and alive.exists()
        with pytest.raises(subprocess.TimeoutExpired):   # asked whether it lives, not sent a signal
            live.wait(timeout=1)
    finally:
        live.kill()
        live.wait()
        live.stdout.close()


def test_a_stale_temporary_that_cannot_be_removed_does_not_stop_the_sweep(swept, monkeypatch):
    """A dead process's temporary that cannot be deleted (another user's file, a read-only mount) is left; the
    sweep that found it goes on."""
    abl, out, _ = swept
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stuck = [out / "runs" / f".r1.tmp-{dead}", out / f".summary.csv.tmp-{dead}"]
    stuck[0].mkdir()
    (stuck[0] / "x").write_text("x")
    stuck[1].write_text("x")
    real_rmdir, real_unlink = os.rmdir, os.unlink

    def refuse(f):
        def call(p, *a, **k):
            if str(dead) in str(p):
                raise PermissionError(13, "Permission denied", str(p))
            return f(p, *a, **k)
        return call

    monkeypatch.setattr(os, "rmdir", refuse(real_rmdir))
    monkeypatch.setattr(os, "unlink", refuse(real_unlink))
    ST.lock_out(out).close()


def test_another_users_live_process_keeps_its_temporary(swept, monkeypatch):
    """kill(pid, 0) on another user's process raises PermissionError: it lives, and its temporary stays."""
    abl, out, _ = swept
    theirs = out / ".REPORT.md.tmp-1"
    theirs.write_text("x")

    def not_yours(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(ST.os, "kill", not_yours)
    ST.lock_out(out).close()
    assert theirs.exists()


def test_a_replaced_file_that_fails_to_write_leaves_the_old_one_and_no_temporary(tmp_path):
    """_atomic: the file as it was, no temporary, and the error as raised, naming the file where it names
    none (pandas' writers); one raised before any temporary exists is not hidden by cleaning up."""
    path = tmp_path / "summary.csv"
    path.write_text("old\n")

    def full(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as e:
        ST._atomic(path, full)
    assert (e.value.errno, e.value.filename) == (28, str(path))
    with pytest.raises(OSError) as e:
        ST._atomic(path, lambda tmp: (_ for _ in ()).throw(OSError(13, "Permission denied", "/x/y")))
    assert e.value.filename == "/x/y"
    with pytest.raises(ValueError, match="not a table"):
        ST._atomic(path, lambda tmp: (_ for _ in ()).throw(ValueError("not a table")))
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.csv"]


def test_a_summary_record_without_its_checksum_field_is_damaged(swept):
    _, out, runs = swept
    d = out / "runs" / sorted(runs)[0]
    s = json.loads((d / "summary.json").read_text())
    del s["metrics_file"]["sha256"]
    (d / "summary.json").write_text(json.dumps(s))
    assert ST.check_run(d) == ("damaged", "'sha256'")


def test_a_temporary_gone_before_it_is_removed_is_no_error(swept, monkeypatch):
    abl, out, _ = swept
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (out / f".summary.csv.tmp-{dead}").write_text("x")
    real_unlink = os.unlink

    def gone_first(p, *a, **k):    # another process removed it between the listing and the unlink
        if str(dead) in str(p):
            real_unlink(p, *a, **k)
        return real_unlink(p, *a, **k)

    monkeypatch.setattr(os, "unlink", gone_first)
    ST.lock_out(out).close()


# -------------------------------------------------------------------- plot on bad input


@pytest.fixture
def plotted(swept, capsys):
    _, out, _ = swept
    assert main(["plot", str(out)]) == 0
    capsys.readouterr()
    return out


BAD_RESULTS = {
    "empty summary.csv": (lambda o: (o / "summary.csv").write_text(""), ["summary.csv", "empty"]),
    "summary without status": (lambda o: pd.read_csv(o / "summary.csv").drop(columns="status").to_csv(
        o / "summary.csv", index=False), ["summary.csv", "status"]),
    "empty metrics": (lambda o: (o / "metrics.parquet").write_bytes(b""), ["metrics.parquet", "empty"]),
    "metrics cut": (lambda o: (o / "metrics.parquet").write_bytes((o / "metrics.parquet").read_bytes()[:100]),
                    ["metrics.parquet", "unreadable"]),
    "broken ablation.json": (lambda o: (o / "ablation.json").write_text('{"name": "t", "vari'), ["ablation.json", "JSON"]),
    "ablation.json not a mapping": (lambda o: (o / "ablation.json").write_text("[1, 2]"), ["ablation.json"]),
    "ablation.json without variants": (lambda o: (o / "ablation.json").write_text('{"name": "t"}'),
                                       ["ablation.json", "variants"]),
}


@pytest.mark.parametrize("case", list(BAD_RESULTS))
def test_plot_on_bad_files_is_one_line_and_keeps_the_report(plotted, capsys, case):
    damage, words = BAD_RESULTS[case]
    report = (plotted / "REPORT.md").read_bytes()
    damage(plotted)
    code, _, err = run_main(capsys, "plot", plotted)
    line = one_line(err)
    assert code == 2
    for w in words:
        assert w in line, (w, line)
    assert (plotted / "REPORT.md").read_bytes() == report


def test_plot_never_shrinks_a_report_without_saying_so(plotted, capsys):
    report = (plotted / "REPORT.md").read_text()
    assert "2 runs finished" in report
    s = pd.read_csv(plotted / "summary.csv")
    s.iloc[:1].to_csv(plotted / "summary.csv", index=False)     # a summary that lost a row
    code, _, err = run_main(capsys, "plot", plotted)
    line = one_line(err)
    assert code == 2 and "REPORT.md" in line and "2 finished runs" in line and "1" in line and "--force" in line
    assert (plotted / "REPORT.md").read_text() == report
    code, out, err = run_main(capsys, "plot", plotted, "--force")
    assert code == 0 and "1 runs finished" in (plotted / "REPORT.md").read_text()


def test_run_says_when_its_report_has_fewer_runs(plotted, tmp_path, capsys):
    # the same directory with fewer seeds, forced (without --force it is refused: test_reliability.py)
    path = write(tmp_path, {"name": "t", "base": TINY, "grid": {"loss": ["naive"]}, "seeds": 1}, "fewer.yaml")
    code, out, err = run_main(capsys, "run", path, "--out", plotted, "--no-progress", "--force")
    assert code == 0, err
    assert "REPORT.md now has 1 finished runs (it had 2)" in err


BAD_ROOTS = {
    "missing": (lambda t: t / "nope", ["nope", "no such directory"]),
    "a file": (lambda t: (t / "f.txt").write_text("x") and t / "f.txt", ["f.txt", "not a directory"]),
}


@pytest.mark.parametrize("cmd", ["findings", "gallery"])
@pytest.mark.parametrize("case", list(BAD_ROOTS))
def test_findings_and_gallery_on_a_bad_root(tmp_path, capsys, cmd, case):
    where, words = BAD_ROOTS[case]
    code, _, err = run_main(capsys, cmd, where(tmp_path))
    line = one_line(err)
    assert code == 2
    for w in words:
        assert w in line, (w, line)


def test_findings_out_unwritable_and_damaged_meta(plotted, tmp_path, capsys):
    root = plotted.parent
    meta = json.loads((plotted / "ablation.json").read_text())   # a claim: findings has something to judge
    meta["claim"] = {"text": "t", "source": "s", "expect": ["loss=naive > loss=clipped"]}
    (plotted / "ablation.json").write_text(json.dumps(meta))
    (tmp_path / "f.txt").write_text("")
    code, _, err = run_main(capsys, "findings", root, "--out", tmp_path / "f.txt" / "FINDINGS.md")
    assert code == 1 and "FINDINGS.md" in one_line(err)
    (plotted / "ablation.json").write_text("{broken")
    for cmd in (["findings", root], ["gallery", root], ["compare", plotted, plotted]):
        code, _, err = run_main(capsys, *cmd)
        assert code == 2 and "ablation.json" in one_line(err), cmd


# ---------------------------------------------------------------------- exit codes


def test_run_exits_1_when_any_run_failed(tmp_path, capsys):
    path = write(tmp_path, {"name": "t", "base": {**TINY, "optimizer": "sgd", "epochs": 4}, "grid": {"lr": [1e30, 0.01]},
                            "seeds": 1})
    code, out, err = run_main(capsys, "run", path, "--out", tmp_path / "o", "--workers", "1", "--no-progress")
    assert code == 1
    assert "1 runs ok, 1 failed" in out
    assert err.strip().splitlines()[-1] == f"error: 1 of 2 runs failed; their errors are in {tmp_path / 'o' / 'REPORT.md'}"


def test_seeds_up_to_2_63_run(tmp_path):
    big = 2**63 - 1
    abl = load_ablation(write(tmp_path, {"name": "t", "base": TINY, "grid": {"loss": ["naive"]}, "seeds": [big]}))
    summary = RN.run_ablation(abl, tmp_path / "o", workers=1, progress=False)
    assert summary.status.tolist() == ["ok"] and summary.seed.tolist() == [big]


# ----------------------------------------------------------------- full disk, read-only


def _enospc(monkeypatch, name):
    """Writing a file called `name` fails as on a full disk."""
    real = Path.write_text

    def write_text(self, *a, **k):
        if self.name == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", write_text)


def test_full_disk_mid_run_is_one_line_and_resumable(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, {"name": "t", "base": TINY, "grid": {"loss": ["naive", "clipped"]}, "seeds": 1})
    out = tmp_path / "o"
    _enospc(monkeypatch, "summary.json")
    code, _, err = run_main(capsys, "run", path, "--out", out, "--workers", "1", "--no-progress")
    line = one_line(err)
    assert code == 1 and "No space left on device" in line and "run the same command again" in line
    assert not [p for p in (out / "runs").iterdir()], "a half-written run was left behind"
    monkeypatch.undo()
    code, _, err = run_main(capsys, "run", path, "--out", out, "--workers", "1", "--no-progress")
    assert code == 0, err


def test_read_only_runs_is_one_line(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, {"name": "t", "base": TINY, "grid": {"loss": ["naive"]}, "seeds": 1})
    out = tmp_path / "o"
    real = Path.mkdir

    def mkdir(self, *a, **k):
        if self.parent.name == "runs":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    code, _, err = run_main(capsys, "run", path, "--out", out, "--workers", "1", "--no-progress")
    line = one_line(err)
    assert code == 1 and "Read-only file system" in line and str(out / "runs") in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_unwritable_runs_by_permissions(tmp_path, capsys):
    path = write(tmp_path, {"name": "t", "base": TINY, "grid": {"loss": ["naive"]}, "seeds": 1})
    out = tmp_path / "o"
    (out / "runs").mkdir(parents=True)
    (out / "runs").chmod(0o500)
    try:
        code, _, err = run_main(capsys, "run", path, "--out", out, "--workers", "1", "--no-progress")
        assert code == 1 and "Permission denied" in one_line(err)
    finally:
        (out / "runs").chmod(0o700)


def _can_mount() -> bool:
    if os.geteuid() != 0 or not sys.platform.startswith("linux") or not shutil.which("mount"):
        return False
    probe = Path(f"/tmp/grpo_bench_mount_probe_{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", str(probe)], check=True)
        return ok
    finally:
        probe.rmdir()


@pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root; the mocked full disk above covers it")
def test_a_really_full_disk(tmp_path, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        path = write(tmp_path, {"name": "t", "base": TINY, "grid": {"loss": ["naive", "clipped"]}, "seeds": 1})
        out = disk / "o"
        assert run_main(capsys, "run", path, "--out", out, "--workers", "1", "--no-progress")[0] == 0
        before = {d.name: (d / "summary.json").read_bytes() for d in (out / "runs").iterdir()}
        with open(disk / "filler", "wb", buffering=0) as f:         # fill the disk, then give back two pages
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        os.truncate(disk / "filler", os.path.getsize(disk / "filler") - 8192)
        code, _, err = run_main(capsys, "run", path, "--out", out, "--workers", "1", "--no-progress", "--seeds", "2")
        line = last_line(err)
        assert code == 1 and "No space left on device" in line and str(out / "runs") in line
        assert not [p for p in (out / "runs").iterdir() if p.name.startswith(".")]
        assert {d.name: (d / "summary.json").read_bytes() for d in (out / "runs").iterdir()
                if d.name in before} == before
        (disk / "filler").unlink()
        code, _, err = run_main(capsys, "run", path, "--out", out, "--workers", "1", "--no-progress", "--seeds", "2")
        assert code == 0 and "2 of 4 runs already finished" in err
    finally:
        subprocess.run(["umount", "-l", str(disk)])


# ------------------------------------------------------------------------- signals


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(p.name))
    return pids


def _sweep_then(tmp_path, sig):
    """`run --workers 2` of a short and an endless run; `sig` once the short one finished. -> (rc, stderr, out, pgid)"""
    path = write(tmp_path, {"name": "t", "base": TINY, "variants": {"short": {}, "endless": {"epochs": 10**8}},
                            "seeds": 1})
    out = tmp_path / "o"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")
    proc = subprocess.Popen([sys.executable, "-m", "grpo_bench", "run", str(path), "--out", str(out), "--workers", "2",
                             "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)   # its own group: every descendant is findable
    try:
        deadline = time.time() + 600   # a safety bound: it waits for the short run however loaded
        while time.time() < deadline and not any(ST.finished(d) for d in (out / "runs").glob("short-*")):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        assert len(_group(proc.pid)) >= 3, "parent and two workers"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        deadline = time.time() + 20
        while _group(proc.pid) and time.time() < deadline:
            time.sleep(0.1)
        return proc.returncode, err, out, _group(proc.pid)
    finally:
        for pid in _group(proc.pid):       # leave nothing behind, even when the test fails
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc and PR_SET_PDEATHSIG")
def test_sigterm_is_handled_like_ctrl_c(tmp_path):
    rc, err, out, survivors = _sweep_then(tmp_path, signal.SIGTERM)
    assert rc == 143 and not survivors, (rc, survivors, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == f"terminated: finished runs are kept in {out / 'runs'}; run the same command again to resume"
    kept = [d for d in (out / "runs").iterdir()]
    assert len(kept) == 1 and kept[0].name.startswith("short-") and ST.finished(kept[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc and PR_SET_PDEATHSIG")
def test_sigkill_of_the_parent_leaves_no_worker(tmp_path):
    rc, _, out, survivors = _sweep_then(tmp_path, signal.SIGKILL)
    assert rc == -signal.SIGKILL and not survivors
    assert [d.name for d in (out / "runs").iterdir() if not d.name.startswith(".")][0].startswith("short-")


# ---------------------------------------------------------------- tampered checkpoint


@pytest.fixture
def checkpoint_copy(tmp_path, monkeypatch):
    """shipped.root() pointed at a copy of tasks/arithmetic_tiny, to tamper with."""
    root = tmp_path / "arithmetic_tiny"
    shutil.copytree(shipped.root(), root)
    real = shipped.root
    monkeypatch.setattr(shipped, "root", lambda which=shipped.DEFAULT: root if which == shipped.DEFAULT else real(which))
    shipped.manifest.cache_clear()
    yield root
    shipped.manifest.cache_clear()


def _flip(path: Path, offset: int = -1000) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_tampered_checkpoint_is_refused(checkpoint_copy, tmp_path, capsys):
    checked = resolve_run({"task": "arithmetic_tiny"}, "x")
    _flip(checkpoint_copy / "checkpoint" / "model.safetensors")
    path = write(tmp_path, {"base": {"task": "arithmetic_tiny", "epochs": 1}, "grid": {"loss": ["naive"]}})
    code, _, err = run_main(capsys, "run", path, "--out", tmp_path / "o")
    line = one_line(err)
    assert code == 2 and "model.safetensors" in line and "SHA-256" in line and "manifest.json" in line
    # and where the model is loaded (a file changed after the config was checked): the run fails, named
    from grpo_bench.tasks.lm import models
    with pytest.raises(ValueError, match="model.safetensors: SHA-256"):
        models.starting_model(checked.task, None)


def test_other_weights_get_other_run_ids(checkpoint_copy):
    cfg = {"task": "arithmetic_tiny"}
    shipped_id = config_hash(resolve_run(cfg))
    # rebuilt weights with their manifest updated to match: valid, but another model
    _flip(checkpoint_copy / "checkpoint" / "model.safetensors")
    manifest = json.loads((checkpoint_copy / "manifest.json").read_text())
    manifest["files"] = shipped.file_hashes(checkpoint_copy / "checkpoint")
    (checkpoint_copy / "manifest.json").write_text(json.dumps(manifest))
    assert config_hash(resolve_run(cfg)) != shipped_id   # the rewritten manifest is read again in this process
    # a config that does not load the shipped model does not depend on it
    assert config_hash(resolve_run({"task": "sort"})) == config_hash(resolve_run({"task": "sort"}))


def test_a_missing_or_extra_checkpoint_file_is_named(checkpoint_copy):
    config = checkpoint_copy / "checkpoint" / "config.json"
    kept = config.read_bytes()
    config.unlink()
    with pytest.raises(ValueError, match=r"config\.json: SHA-256 [0-9a-f]{12}… expected by .*manifest\.json, the file "
                                         r"is missing: the shipped checkpoint was modified"):
        shipped.verify()
    config.write_bytes(kept)
    shipped.verify()
    (checkpoint_copy / "checkpoint" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"notes\.txt: SHA-256 no such file expected by .*, found [0-9a-f]{12}…"):
        shipped.verify()


def test_a_checkpoint_is_hashed_again_only_when_a_file_changes(checkpoint_copy, monkeypatch):
    calls = []
    monkeypatch.setattr(shipped, "verify", lambda which=shipped.DEFAULT: calls.append(which))
    shipped._verified.clear()
    shipped.verify_cached()
    shipped.verify_cached()
    assert calls == [shipped.DEFAULT]
    model = checkpoint_copy / "checkpoint" / "config.json"
    os.utime(model, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns + 10**9))
    shipped.verify_cached()
    assert calls == [shipped.DEFAULT] * 2


def test_the_weights_id_is_the_manifests_files_in_any_order(checkpoint_copy):
    """A manifest rewritten with its files in another order names the same weights: the same part of a run id."""
    before = shipped.weights_id(resolve_run({"task": "arithmetic_tiny"}).task)
    manifest = json.loads((checkpoint_copy / "manifest.json").read_text())
    manifest["files"] = dict(reversed(list(manifest["files"].items())))
    assert len(manifest["files"]) > 1
    (checkpoint_copy / "manifest.json").write_text(json.dumps(manifest))
    after = shipped.weights_id(resolve_run({"task": "arithmetic_tiny"}).task)
    assert before == after and len(after) == 16


def test_a_checkpoint_directory_without_its_manifest_is_no_shipped_start(tmp_path, monkeypatch):
    from grpo_bench.config import presets
    (tmp_path / "bare" / "checkpoint").mkdir(parents=True)
    (tmp_path / "bare" / "checkpoint" / "config.json").write_text("{}")
    monkeypatch.setattr(presets, "tasks_dir", lambda: tmp_path)
    assert not shipped.loadable("bare") and shipped.available() == []
    (tmp_path / "bare" / "manifest.json").write_text("{}")
    assert shipped.loadable("bare") and shipped.available() == ["bare"]


# --------------------------------------------------------------------- the extras


# tests whose module or body uses an extra only in part: run whole where it is hidden (they failed before)
PARTLY = {"gym": ["tests/test_faults.py::test_every_yaml_the_suite_reads_refuses_duplicate_keys"]}


def _pytest(hidden: list[str], *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, **{HIDE_ENV: ",".join(hidden)}, PYTHONPATH=str(ROOT / "tests"))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env=env)


def test_the_suite_collects_and_skips_with_reasons_without_the_extras():
    """pytest's collection of the whole suite where no extra is installed (their modules made unimportable by
    conftest, GRPO_BENCH_HIDE_EXTRA; every extra of pyproject.toml, a new one included): no error, and each
    module that needs one is skipped with the reason naming it and its install command. One collection for
    all of them, as a collection costs most of a minute on 2 busy cores: a module that collects with every
    extra missing collects with any one missing, unless it imports one extra only where another is present."""
    res = _pytest(sorted(extras()), "--collect-only", "tests")
    tail = res.stdout[-3000:]
    assert res.returncode == 0 and " error" not in tail and "Error" not in tail, tail
    skipped = [line for line in res.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all(re.search(r"needs the ([\w-]+) extra, pip install -e '\.\[\1\]'", line)
                           for line in skipped), skipped
    assert {re.search(r"needs the ([\w-]+) extra", line).group(1) for line in skipped} >= {"gym", "ray", "trl"}


@pytest.mark.parametrize("extra", sorted(PARTLY))
def test_tests_that_use_an_extra_in_part_pass_without_it(extra):
    """A test that uses an extra for some of what it checks runs the rest, and passes, where it is absent
    (before: test_every_yaml_the_suite_reads_refuses_duplicate_keys failed without gym)."""
    res = _pytest([extra], *PARTLY[extra])
    assert res.returncode == 0 and " passed" in res.stdout and "failed" not in res.stdout, res.stdout[-3000:]


def test_an_extra_hidden_is_absent_for_the_suite_and_the_package():
    """What the collection test relies on: a hidden extra neither imports nor is found (the package asks
    importlib.util.find_spec for triton and the trackers), and needs() skips with the extra's reason."""
    probe = ("import importlib.util, sys, pytest\nsys.path.insert(0, 'tests')\nimport helpers\n"
             "helpers.hide_extra('gym')\nassert importlib.util.find_spec('reasoning_gym') is None\n"
             "try:\n    helpers.needs('gym')\nexcept pytest.skip.Exception as e:\n    print(e.msg)\n")
    res = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "needs the gym extra, pip install -e '.[gym]' (reasoning_gym is not installed)"
