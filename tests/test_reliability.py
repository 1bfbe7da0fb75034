"""Reliability v3 (issue 31): the probes on the surfaces added since the battery of tests/test_faults.py.

Each test reproduces one probe (lost or mixed results, a member's error failing its population,
tracebacks and wrong-but-plausible output of the analysis commands, late errors) and fails
without its fix. docs/reliability.md lists each with the test that holds it.
"""
import json

import pandas as pd
import pytest

from grpo_bench.sweep import runner as RN
from grpo_bench.sweep import worker as WK
from grpo_bench.config.ablation import load_ablation
from grpo_bench.__main__ import main
from test_faults import TINY, one_line, run_main, write
from helpers import needs


@pytest.fixture(autouse=True)
def keep_torch_threads():
    import torch
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _files(out):
    return {f: (out / f).read_bytes() for f in ("ablation.json", "summary.csv", "metrics.parquet", "REPORT.md")}


def _swept_once(tmp_path_factory, doc: dict):
    """doc's results run once through the CLI per test process, and its ablation file (the tests share it)."""
    d = tmp_path_factory.mktemp(doc["name"])
    path = write(d, doc)
    assert main(["run", str(path), "--out", str(d / "o"), "--no-progress"]) == 0
    return path, d / "o"


@pytest.fixture(scope="module")
def _two_runs(tmp_path_factory):
    return _swept_once(tmp_path_factory, {"name": "t", "base": TINY, "grid": {"loss": ["naive", "clipped"]},
                                          "seeds": 1})


@pytest.fixture
def two_runs(_two_runs, tmp_path):
    """results of `t` (naive and clipped, seed 0) run through the CLI, and the ablation's file: a test's own copy
    of the results (a sweep spawns its workers: seconds a test, where the copy takes milliseconds)."""
    import shutil
    path, out = _two_runs
    return path, shutil.copytree(out, tmp_path / "o")


# ------------------------------------------------------------------ (a) lost results


@pytest.mark.parametrize("case", ["fewer seeds", "fewer seeds, tables only", "another config", "another ablation"])
def test_run_never_replaces_other_results_without_force(two_runs, tmp_path, capsys, case):
    path, out = two_runs
    if case == "fewer seeds, tables only":   # as results/ are committed: summary, metrics, report, no runs/
        import shutil
        shutil.rmtree(out / "runs")
        (out / "runs").mkdir()
    n_runs = len(list((out / "runs").iterdir()))
    before = _files(out)
    if case.startswith("fewer seeds"):
        doc = {"name": "t", "base": TINY, "grid": {"loss": ["naive"]}, "seeds": 1}
        args = [write(tmp_path, doc, "fewer.yaml")]
    elif case == "another config":
        args = [path, "--set", "epochs=3"]
    else:
        args = [write(tmp_path, {"name": "other", "base": TINY, "grid": {"lr": [0.1]}, "seeds": 1}, "other.yaml")]
    code, _, err = run_main(capsys, "run", *args, "--out", out, "--no-progress")
    line = one_line(err)
    assert code == 2 and str(out) in line and "--force" in line, line
    assert ("'other'" in line) if case == "another ablation" else ("this plan does not have" in line), line
    assert _files(out) == before                                   # nothing replaced
    assert len(list((out / "runs").iterdir())) == n_runs           # nothing mixed in
    code, _, err = run_main(capsys, "run", *args, "--out", out, "--no-progress", "--force")
    assert code == 0, err


def test_resuming_or_growing_the_plan_needs_no_force(two_runs, capsys):
    path, out = two_runs
    for args in ([], ["--seeds", "2"]):
        code, _, err = run_main(capsys, "run", path, "--out", out, "--no-progress", *args)
        assert code == 0, err
    assert len(pd.read_csv(out / "summary.csv")) == 4


# ------------------------------------------------------------------ (c, i) the schedule is recorded, not compared


def test_a_runs_record_says_how_it_was_scheduled_and_results_do_not_depend_on_it(tmp_path, capsys):
    abl = load_ablation(write(tmp_path, {"name": "t", "base": TINY, "grid": {"lr": [0.01, 0.02]}, "seeds": 2}))
    one = RN.run_ablation(abl, tmp_path / "p1", workers=1, progress=False, population=1)
    four = RN.run_ablation(abl, tmp_path / "p4", workers=1, progress=False, population=4)
    record = json.loads(next((tmp_path / "p4" / "runs").iterdir()).joinpath("summary.json").read_text())
    assert {k: record[k] for k in ("population", "executor", "device", "threads")} == \
        {"population": 4, "executor": "local", "device": "cpu", "threads": 1}
    assert set(one.population) == {1} and set(four.population) == {4}
    cols = [c for c in one.columns if c not in WK.SCHEDULE]
    pd.testing.assert_frame_equal(one[cols], four[cols], check_exact=True)
    assert "different devices or thread counts" not in capsys.readouterr().err


def test_results_of_two_thread_counts_in_one_directory_are_flagged_in_the_report(tmp_path, capsys):
    """Runs redone at another thread count may differ in the last bits; the note said so on stderr only, gone
    with the terminal: REPORT.md, which a reader of the results sees, says it, and `plot` redraws it."""
    path = write(tmp_path, {"name": "t", "base": TINY, "grid": {"lr": [0.01, 0.02]}, "seeds": 2})
    out = tmp_path / "p1"
    code, _, err = run_main(capsys, "run", path, "--out", out, "--workers", "1", "--no-progress")
    assert code == 0 and "different devices or thread counts" not in err + (out / "REPORT.md").read_text()
    # one run redone at two threads
    victim = pd.read_csv(out / "summary.csv").run[0]
    (out / "runs" / victim / "summary.json").unlink()
    code, _, err = run_main(capsys, "run", path, "--out", out, "--workers", "1", "--threads", "2", "--no-progress")
    assert code == 0, err
    note = "the finished runs here ran on different devices or thread counts (cpu, 1 thread: 3 runs; " \
           "cpu, 2 threads: 1 run)"
    report = (out / "REPORT.md").read_text()
    assert f"**Note:** {note}" in report and "differ in the last bits" in report, report[:1500]
    assert f"note: {note}" in err, err
    # drawn from summary.csv alone: `plot` keeps it
    (out / "REPORT.md").unlink()
    code, _, err = run_main(capsys, "plot", out)
    assert code == 0, err
    assert f"**Note:** {note}" in (out / "REPORT.md").read_text()


def _fake_ray(monkeypatch, get):
    """A stand-in for the ray module with one 2-CPU node, whose ray.get(ref) is get(ref): Session.results'
    retry and failure paths without starting Ray."""
    import sys
    import types

    class RayError(Exception):
        pass

    class RayTaskError(RayError):
        cause = None

    class WorkerCrashedError(RayError):
        pass

    class Remote:
        def options(self, **kw):
            return self

        def remote(self, group, threads, executor):
            return object()

    fake = types.ModuleType("ray")
    fake.exceptions = types.SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError,
                                            WorkerCrashedError=WorkerCrashedError)
    fake.nodes = lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}]
    fake.remote = lambda fn: Remote()
    fake.wait = lambda refs, num_returns: (refs[:1], refs[1:])
    fake.get = get
    fake.cancel = lambda ref, force=False: None
    monkeypatch.setitem(sys.modules, "ray", fake)
    return fake


@pytest.mark.parametrize("how", ["worker lost", "raised outside training"])
def test_a_run_lost_with_its_worker_records_how_it_was_scheduled(monkeypatch, how):
    """A run whose Ray worker kept dying (or whose population raised outside training) was recorded without
    population, executor, device and threads: summary.csv's schedule columns were empty for it alone."""
    from grpo_bench.sweep.cluster import Session

    def get(ref):
        if how == "worker lost":
            raise fake.exceptions.WorkerCrashedError("the worker died")
        raise fake.exceptions.RayTaskError("RuntimeError: no memory")

    fake = _fake_ray(monkeypatch, get)
    group = [RN.RunSpec(f"r{s}", "v", {}, s, {**TINY, "seed": s}) for s in (0, 1, 2)]
    log = []
    out = list(Session().results([group], 2, {"cpus": 1, "gpus": 0}, max_retries=1, log=log.append))
    assert len(log) == (how == "worker lost")   # lost once: retried; twice: recorded
    ok = WK.train_group([RN.RunSpec("ok", "v", {}, 0, {**TINY, "seed": 0})])[0][2]
    for spec, (_, rows, summary, _) in out:
        assert summary["status"] == "failed" and rows == []
        assert {k: summary[k] for k in ("population", "executor", "device", "threads")} == \
            {"population": 3, "executor": "ray", "device": "cpu", "threads": 2}
        # every column of a run that trained but its metrics
        assert set(WK.SCHEDULE) <= set(summary) and all("/" in k for k in set(ok) - set(summary))


def test_a_population_that_raised_in_a_local_worker_records_how_it_was_scheduled():
    """The local executor's record of runs whose worker raised outside training: the same schedule fields."""
    import concurrent.futures as cf
    import concurrent.futures.process  # noqa: F401  (_finished names its BrokenProcessPool; a pool imports it)

    group = [RN.RunSpec(f"r{s}", "v", {}, s, {**TINY, "seed": s}) for s in (0, 1)]
    fut = cf.Future()
    fut.set_exception(MemoryError("cannot allocate"))
    out = list(RN._finished({fut}, {fut: group}, 3))
    assert [s.run_id for s, _ in out] == ["r0", "r1"]
    for _, (_, _, summary, _) in out:
        assert summary["error"] == "MemoryError: cannot allocate"
        assert {k: summary[k] for k in ("population", "executor", "device", "threads")} == \
            {"population": 2, "executor": "local", "device": "cpu", "threads": 3}


# ------------------------------------------------------------------ (d, e) the analysis commands


@pytest.fixture(scope="module")
def _swept(tmp_path_factory):
    return _swept_once(tmp_path_factory, {"name": "t", "base": {**TINY, "epochs": 12},
                                          "grid": {"loss": ["naive", "clipped"]}, "seeds": 3})[1]


@pytest.fixture
def swept(_swept, tmp_path):
    """Three seeds of two variants, long enough for a curve fit, run through the CLI: a test's own copy."""
    import shutil
    return shutil.copytree(_swept, tmp_path / "o")


def _copy(out, name):
    import shutil
    return shutil.copytree(out, out.parent / name)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # inf - inf, on purpose
def test_inf_values_are_reported_not_a_traceback(swept, capsys):
    """Results whose main metric is inf everywhere (a reward of inf, before rewards had to be finite): the report
    crashed on an empty curve fit (IndexError), compare in brentq (ValueError)."""
    import numpy as np
    d = _copy(swept, "inf")
    m = pd.read_parquet(d / "metrics.parquet")
    m.loc[m.metric == "reward/mean", "value"] = np.inf
    m.to_parquet(d / "metrics.parquet")
    s = pd.read_csv(d / "summary.csv")
    s["final/reward"] = np.inf
    s.to_csv(d / "summary.csv", index=False)
    code, _, err = run_main(capsys, "plot", d)
    assert code == 0 and "Traceback" not in err, err
    assert "undecided (some values are not finite)" in (d / "REPORT.md").read_text()
    code, out, err = run_main(capsys, "compare", d, swept, "--out", d.parent / "cmp")
    assert code == 0 and "undecided (some values are not finite)" in out, err


def test_seeds_to_detect_and_mde_on_values_that_are_not_finite():
    import math

    from grpo_bench import stats as S
    for effect, sd in [(math.nan, 0.1), (math.inf, 0.1), (0.1, math.nan), (math.inf, math.inf)]:
        assert S.seeds_to_detect(effect, sd, 0.05) == S.MAX_SEEDS + 1
        assert S.seeds_for_equivalence(effect, sd, 0.02, 0.05) == S.MAX_SEEDS + 1
    assert math.isnan(S.mde(math.nan, 5, 0.05)) and S.mde(math.inf, 5, 0.05) == math.inf


def test_plot_on_metrics_with_other_columns_or_another_ablations_runs(swept, capsys):
    d = _copy(swept, "cols")
    m = pd.read_parquet(d / "metrics.parquet")
    m.drop(columns=["variant"]).to_parquet(d / "metrics.parquet")   # a run's own table: the cast failed (KeyError)
    code, _, err = run_main(capsys, "plot", d)
    line = one_line(err)
    assert code == 2 and "metrics.parquet" in line and "no column variant" in line, line
    d = _copy(swept, "other")
    m = pd.read_parquet(d / "metrics.parquet")
    m["run"], m["variant"] = "x-" + m["run"].astype(str), "x"          # another ablation's runs
    m.to_parquet(d / "metrics.parquet")
    code, _, err = run_main(capsys, "plot", d)
    line = one_line(err)
    assert code == 2 and "metrics.parquet" in line and "does not plan" in line, line
    d = _copy(swept, "other_summary")
    s = pd.read_csv(d / "summary.csv")
    s["run"], s["variant"] = "x-" + s["run"], "x"
    s.to_csv(d / "summary.csv", index=False)
    code, _, err = run_main(capsys, "plot", d)
    line = one_line(err)
    assert code == 2 and "summary.csv" in line and "does not plan" in line, line


@pytest.mark.parametrize("cmd", ["compare", "findings"])
def test_a_summary_that_lost_rows_is_refused_not_read_as_fewer_seeds(swept, tmp_path, capsys, cmd):
    """compare printed a zero-width CI and tau -1 against the directory's own copy; findings said 3 seeds and went
    from paired to Welch. Both now check summary.csv against ablation.json's runs."""
    meta = json.loads((swept / "ablation.json").read_text())
    meta["claim"] = {"text": "t", "source": "s", "expect": ["loss=naive > loss=clipped"]}
    (swept / "ablation.json").write_text(json.dumps(meta))
    s = pd.read_csv(swept / "summary.csv")
    s.drop(index=[0]).to_csv(swept / "summary.csv", index=False)
    args = [swept, _copy(swept, "copy")] if cmd == "compare" else [swept.parent]
    code, _, err = run_main(capsys, cmd, *args)
    line = one_line(err)
    assert code == 2 and "summary.csv" in line and "5 of the 6 runs ablation.json plans" in line, line
    assert s.run[0] in line


def test_compare_on_a_directory_where_every_run_failed(swept, capsys):
    s = pd.read_csv(swept / "summary.csv")
    s["status"], s["error"] = "failed", "ValueError: boom"
    s.to_csv(swept / "summary.csv", index=False)
    code, _, err = run_main(capsys, "compare", swept, swept)
    line = one_line(err)
    assert code == 2 and "every one of its 6 runs failed" in line and "summary.csv" in line, line


def test_findings_on_a_directory_without_results_exits_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = run_main(capsys, "findings", tmp_path / "empty")
    line = one_line(err)
    assert code == 2 and "no results with a claim" in line and not (tmp_path / "empty" / "FINDINGS.md").exists()


def test_findings_command_for_an_ablation_without_settings(swept, capsys):
    """It added --setting sort (which fails: the file has no settings), dropped --seeds auto:CAP and named
    results/<name> for a directory elsewhere."""
    meta = json.loads((swept / "ablation.json").read_text())
    meta |= {"claim": {"text": "t", "source": "s", "expect": ["loss=naive > loss=clipped"]}, "setting": None,
             "source": "abl.yaml", "sequential": {"cap": 10, "batch": 5, "orderings": 1}}
    (swept / "ablation.json").write_text(json.dumps(meta))
    code, _, err = run_main(capsys, "findings", swept.parent)
    assert code == 0, err
    text = (swept.parent / "FINDINGS.md").read_text()
    assert f"Command: `python -m grpo_bench run abl.yaml --seeds auto:10 --out {swept}`." in text
    assert "--setting" not in text


def test_gallery_links_are_urls(tmp_path, two_runs, capsys):
    import shutil
    import urllib.parse
    _, out = two_runs
    root = tmp_path / "root"
    for name in ("my results", "résultats"):
        shutil.copytree(out, root / name)
    code, _, err = run_main(capsys, "gallery", root)
    assert code == 0, err
    text = (root / "README.md").read_text()
    links = [t for t in __import__("re").findall(r"\]\(([^)]*)\)", text)]
    assert "my%20results/REPORT.md" in links and "r%C3%A9sultats/REPORT.md" in links
    for link in links:
        assert " " not in link and link.isascii() and (root / urllib.parse.unquote(link)).exists(), link


# ------------------------------------------------------------------ (f) late errors, found early


def _checkpoint(tmp_path, damage=None):
    """A copy of the shipped tiny checkpoint, damaged by damage(dir)."""
    import shutil

    from grpo_bench.tasks.lm import shipped
    d = shutil.copytree(shipped.directory(), tmp_path / "model")
    if damage:
        damage(d)
    return d


BAD_SOURCES = {
    "missing path": (lambda t: t / "no" / "such", ["no such directory"]),
    "empty dir": (lambda t: (t / "empty").mkdir() or t / "empty", ["no config.json"]),
    "a file": (lambda t: (t / "f.bin").write_bytes(b"x") and t / "f.bin", ["not a directory"]),
    "no tokenizer": (lambda t: _checkpoint(t, lambda d: [(d / f).unlink() for f in
                                                        ("tokenizer.json", "tokenizer_config.json")]),
                     ["no tokenizer"]),
    "corrupt config.json": (lambda t: _checkpoint(t, lambda d: (d / "config.json").write_text('{"model_type": "gp')),
                            ["config.json unreadable"]),
    "truncated weights": (lambda t: _checkpoint(t, lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:5000])), ["model.safetensors is cut short"]),
    "no weights": (lambda t: _checkpoint(t, lambda d: (d / "model.safetensors").unlink()), ["no weights"]),
    "truncated .bin": (lambda t: _checkpoint(t, lambda d: _as_bin(d, cut=0.5)),
                       ["pytorch_model.bin is cut short", "no readable zip directory"]),
    ".bin without its last byte": (lambda t: _checkpoint(t, lambda d: _as_bin(d, cut=-1)),
                                   ["pytorch_model.bin is cut short"]),
    "empty .bin": (lambda t: _checkpoint(t, lambda d: _as_bin(d, cut=0)), ["pytorch_model.bin is empty"]),
    ".bin that is a web page": (lambda t: _checkpoint(t, lambda d: _as_bin(d, body=b"<!DOCTYPE html><html>")),
                                ["pytorch_model.bin is not a torch.save file"]),
    "Git LFS pointer": (lambda t: _checkpoint(t, lambda d: (d / "model.safetensors").write_bytes(
        b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 1655899\n")),
                        ["model.safetensors is a Git LFS pointer", "git lfs pull"]),
    "config.json without model_type": (lambda t: _checkpoint(t, lambda d: (d / "config.json").write_text(
        '{"vocab_size": 16}')), ["config.json has no model_type"]),
    "safetensors without its last byte": (lambda t: _checkpoint(t, lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:-1])), ["model.safetensors is cut short"]),
    ".bin that is another zip": (lambda t: _checkpoint(t, lambda d: _as_bin(d, body=_zip({"weights.txt": b"1"}))),
                                 ["pytorch_model.bin is a zip without data.pkl"]),
    "missing shard": (lambda t: _checkpoint(t, lambda d: _sharded(d, keep=1)),
                      ["model.safetensors.index.json names shards that are not there", "model-00002-of-00002"]),
}


def _zip(files: dict[str, bytes]) -> bytes:
    import io
    import zipfile
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return out.getvalue()


def _as_bin(d, cut=None, body=None):
    """The checkpoint's weights as torch.save's pytorch_model.bin (transformers' format before safetensors),
    cut to `cut` of its bytes (a fraction, or a count from the end when negative), or replaced by `body`."""
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    data = (d / "pytorch_model.bin").read_bytes()
    if body is not None:
        data = body
    elif cut is not None:
        data = data[:cut] if cut < 0 else data[:int(len(data) * cut)]
    (d / "pytorch_model.bin").write_bytes(data)


def _sharded(d, keep=2):
    """The weights as two safetensors shards and their index, as save_pretrained writes a large model; only the
    first `keep` shards kept."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
    for i, (shard, keys) in enumerate(shards.items()):
        if i < keep:
            save_file({k: tensors[k] for k in keys}, d / shard, metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))


@pytest.mark.parametrize("case", list(BAD_SOURCES))
def test_a_bad_local_model_is_refused_when_the_config_loads(tmp_path, capsys, case):
    where, words = BAD_SOURCES[case]
    source = where(tmp_path)
    doc = {"name": "lm", "base": {"task": {"name": "arithmetic", "model": {"source": str(source)}}, "epochs": 1},
           "grid": {"lr": [0.01]}, "seeds": 1}
    code, _, err = run_main(capsys, "run", write(tmp_path, doc), "--out", tmp_path / "o", "--no-progress")
    line = one_line(err)
    assert code == 2 and "model.source" in line and str(source) in line, line
    for w in words:
        assert w in line, (w, line)
    assert not (tmp_path / "o").exists()


def test_a_good_local_model_and_hub_ids_pass_the_check(tmp_path):
    from grpo_bench.tasks.lm.models import check_local_source
    check_local_source(str(_checkpoint(tmp_path)))
    # the other formats whole: a torch.save .bin, shards with their index; and a damaged .bin that transformers
    # would not read, beside safetensors that it reads instead
    check_local_source(str(_checkpoint(tmp_path / "bin", _as_bin)))
    check_local_source(str(_checkpoint(tmp_path / "sharded", _sharded)))
    both = _checkpoint(tmp_path / "both")
    (both / "pytorch_model.bin").write_bytes(b"PK\x03\x04 cut")
    check_local_source(str(both))
    for hub in ("gpt2", "Qwen/Qwen2.5-0.5B-Instruct"):
        check_local_source(hub)
    with pytest.raises(ValueError, match="neither a local directory nor a hub id"):
        check_local_source("a b")
    with pytest.raises(ValueError, match="no/such/dir: no such directory"):   # two slashes: a path, not a hub id
        check_local_source("no/such/dir")


def test_safetensors_are_checked_to_the_byte(tmp_path):
    """check_weights reads a safetensors header where the file holds all of it, however little follows: a file of
    no tensors is whole; a header that claims more bytes than the file has is damaged, even where the bytes there
    happen to read as JSON."""
    import struct
    from safetensors.torch import save_file
    from grpo_bench.tasks.lm.models import check_weights
    save_file({}, tmp_path / "empty.safetensors")
    check_weights([tmp_path / "empty.safetensors"], "w")
    (tmp_path / "short.safetensors").write_bytes(struct.pack("<Q", 100) + b"{}" + b" " * 18)
    with pytest.raises(ValueError, match="short.safetensors is damaged"):
        check_weights([tmp_path / "short.safetensors"], "w")
    save_file({"x": __import__("torch").zeros(4)}, tmp_path / "one.safetensors")
    data = (tmp_path / "one.safetensors").read_bytes()
    (tmp_path / "one.safetensors").write_bytes(data[:-1])
    with pytest.raises(ValueError, match=rf"one.safetensors is cut short \({len(data) - 1} bytes, its header lays "
                                         rf"out {len(data)}\)"):
        check_weights([tmp_path / "one.safetensors"], "w")


def test_out_as_a_dangling_symlink_is_one_line(tmp_path, capsys):
    path = write(tmp_path, {"name": "t", "base": TINY, "grid": {"loss": ["naive"]}, "seeds": 1})
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    code, _, err = run_main(capsys, "run", path, "--out", tmp_path / "link", "--no-progress")
    line = one_line(err)
    assert code == 2 and "link" in line and "symbolic link" in line and "gone" in line and "File exists" not in line


def test_a_bad_local_model_is_refused_for_the_gym_task_too(tmp_path):
    """The reasoning-gym task loads the same local directories: the same check when its config loads."""
    needs("gym")
    from grpo_bench.config.run import resolve_run
    from grpo_bench.errors import ConfigError

    task = {"name": "gym", "dataset": "countdown", "eval_size": 20}
    good = _checkpoint(tmp_path / "good")
    resolve_run({"task": {**task, "model": {"source": str(good)}}})
    cut = _checkpoint(tmp_path / "cut", lambda d: _as_bin(d, cut=0.5))
    with pytest.raises(ConfigError) as e:
        resolve_run({"task": {**task, "model": {"source": str(cut)}}})
    assert e.value.key == "task.model.source" and "pytorch_model.bin is cut short" in str(e.value), str(e.value)


# ------------------------------------------------------------------ a reward's timeout, from any thread


def _in_thread(fn, *args, **kwargs):
    """fn's result or exception, called from a new thread (not the main one), and the seconds it took;
    (None, None, inf) when it has not returned after 12 s."""
    import threading
    import time

    box = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:
            box["error"] = e

    t0 = time.monotonic()
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(12)
    return (None, None, float("inf")) if t.is_alive() else (box.get("value"), box.get("error"), time.monotonic() - t0)


def test_a_reward_that_never_returns_times_out_when_called_from_a_thread(monkeypatch):
    """The timeout was SIGALRM's, which only the main thread receives: a reward called from any other thread
    (a caller's thread pool) waited forever. It now times out there too, and the reward's own
    thread is stopped rather than left spinning beside training."""
    import threading
    import time

    from grpo_bench.algos import rewards

    monkeypatch.setenv("GRPO_BENCH_REWARD_TIMEOUT", "0.3")
    abandoned, release = threading.Event(), threading.Event()

    def spins(prompts, completions, **kw):   # a loop in Python: 20 s, so the test ends without the fix too
        end = time.monotonic() + 20
        try:
            while time.monotonic() < end:
                pass
        except BaseException:
            abandoned.set()
            raise
        return [0.0] * len(completions)

    def blocks(prompts, completions, **kw):  # a wait in C
        release.wait(20)
        return [0.0] * len(completions)

    try:
        for fn in (spins, blocks):
            value, error, took = _in_thread(rewards.call, "m:r", fn, [[1, 0]], [[0, 1]])
            assert isinstance(error, rewards.RewardTimeout) and "within 0.3 s" in str(error), (fn, value, error)
            assert took < 5, took
        assert abandoned.wait(5), "the timed-out reward's thread is still running"
        # the one a C wait keeps alive is a daemon: it cannot hold the interpreter open at exit
        left = [t for t in threading.enumerate() if t.name == "grpo_bench-reward m:r"]
        assert left and all(t.daemon for t in left)
    finally:
        release.set()
    # a reward that takes part of its limit in a thread is waited for; a limit of 0 waits as long as it takes
    assert _in_thread(rewards.call, "m:r", lambda p, c: time.sleep(0.1) or [1.0], [[1]], [[1]])[:2] == ([1.0], None)
    assert _in_thread(rewards.bounded, "m:r", 0, lambda: time.sleep(0.05) or 7)[:2] == (7, None)
    # what returns or raises in time is the reward's, in a thread as in the main one
    assert _in_thread(rewards.call, "m:r", lambda p, c, answer: [answer], [[1]], [[1]], answer=0.5)[0] == [0.5]

    def raises(prompts, completions, **kw):
        raise ValueError("cannot score")

    assert str(_in_thread(rewards.call, "m:r", raises, [[1]], [[1]])[1]) == "cannot score"
    with pytest.raises(ValueError, match="cannot score"):   # the main thread's path, unchanged
        rewards.call("m:r", raises, [[1]], [[1]])


def test_a_reward_in_the_main_thread_with_a_timer_running_still_times_out(monkeypatch):
    """The main thread with an interval timer of the caller's: SIGALRM is not ours to take, so the reward ran
    unbounded; now it runs in a thread that is waited for, and the caller's timer is left as it was."""
    import signal
    import time

    from grpo_bench.algos import rewards

    monkeypatch.setenv("GRPO_BENCH_REWARD_TIMEOUT", "0.3")
    previous = signal.signal(signal.SIGALRM, lambda *a: None)
    signal.setitimer(signal.ITIMER_REAL, 60)
    try:
        t0 = time.monotonic()
        with pytest.raises(rewards.RewardTimeout, match="within 0.3 s"):
            rewards.call("m:r", lambda p, c: time.sleep(3) or [0.0], [[1]], [[1]])
        assert time.monotonic() - t0 < 2.5
        assert 50 < signal.getitimer(signal.ITIMER_REAL)[0] <= 60
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_run_trained_in_a_thread_fails_alone_on_its_rewards_timeout(tmp_path, monkeypatch):
    """End to end: the sort task trained from a thread, its user reward hanging on every call."""
    (tmp_path / "reward_hangs_in_thread.py").write_text(
        "import time\ndef reward(prompts, completions, **kw):\n    time.sleep(30)\n    return [0.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GRPO_BENCH_REWARD_TIMEOUT", "0.3")
    cfg = {**TINY, "task": {**TINY["task"], "rewards": {"reward_hangs_in_thread:reward": 1.0}}, "seed": 0}
    result, error, took = _in_thread(lambda spec: WK.train_group([spec])[0], RN.RunSpec("r", "v", {}, 0, cfg))
    assert error is None and took < 10, (error, took)
    summary = result[2]
    assert summary["status"] == "failed" and summary["error"].startswith("RewardTimeout: reward "), summary["error"]


# ------------------------------------------------------------------ scripts/under_load.py


def _children(pid: int) -> list[int]:
    """Pids of the live processes whose parent is pid and that multiprocessing spawned (the busy loops)."""
    from pathlib import Path

    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and _ppid_state(int(p.name))[0] == pid and \
                    b"spawn_main" in (p / "cmdline").read_bytes():
                out.append(int(p.name))
        except OSError:
            pass
    return out


def _ppid_state(pid: int) -> tuple[int, str]:
    from pathlib import Path

    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[1]), fields[0]


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_under_load_busy_loops_end_with_the_script(tmp_path, sig):
    """docs/testing.md: the busy loops of scripts/under_load.py end with it. On SIGTERM (its default ends the
    script without its `finally`) or SIGKILL they went on spinning, orphaned, for good."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers import ROOT

    (tmp_path / "test_wait.py").write_text("import time\ndef test_wait():\n    time.sleep(6)\n")
    script = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "under_load.py"), "--runs", "1", "--busy", "1",
                               "--", str(tmp_path / "test_wait.py")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    spinners = []
    try:
        deadline = time.time() + 30
        while not spinners and time.time() < deadline and script.poll() is None:
            time.sleep(0.1)
            spinners = _children(script.pid)
        assert spinners, "no busy loop started"
        time.sleep(0.5)   # past its prctl
        script.send_signal(getattr(signal, sig))
        script.wait(10)

        def alive(pid):
            try:
                return _ppid_state(pid)[1] != "Z"
            except OSError:
                return False

        deadline = time.time() + 5
        while any(map(alive, spinners)) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(map(alive, spinners)), f"busy loops still spinning after the script's {sig}"
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
        for pid in spinners:   # only the ones this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ------------------------------------------- a reward's timeout: every reward, the task's limit (issue 45)


def test_a_reward_that_sleeps_forever_ends_its_member_within_the_tasks_limit(tmp_path, monkeypatch):
    """A reward that sleeps forever (time.sleep(1e6)) on its second call, member 1's first rollout, at the
    completion of index 5 (prompt 2, G = 2): member 1 fails with RewardTimeout naming the reward, the task's
    limit (task.reward_timeout, no environment variable) and the prompt; members 0 and 2 finish as they do
    alone, and the population ends within the limit plus a few seconds. Before: the limit was 300 s and the
    line named no prompt; a task had no limit of its own."""
    import time

    from grpo_bench.config.run import resolve_run
    from grpo_bench.engine.trainer import train, train_population

    monkeypatch.delenv("GRPO_BENCH_REWARD_TIMEOUT", raising=False)
    (tmp_path / "sleeps_on_second_call.py").write_text(
        "import time\nCALLS = []\n"
        "def reward(prompts, completions, **kw):\n"
        "    CALLS.append(1)\n"
        "    out = []\n"
        "    for j, c in enumerate(completions):\n"
        "        if len(CALLS) == 2 and j == 5:\n"
        "            time.sleep(1e6)\n"
        "        out.append(float(c == sorted(c)))\n"
        "    return out\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = {**TINY["task"], "num_prompts": 4, "rewards": {"sleeps_on_second_call:reward": 1.0}, "reward_timeout": 1}
    raws = [{**TINY, "task": task, "eval_every": 0, "seed": s} for s in range(3)]
    t0 = time.monotonic()
    results = train_population([resolve_run(r) for r in raws])
    took = time.monotonic() - t0
    assert took < 1 + 5, took
    assert type(results[1]).__name__ == "RewardTimeout", results[1]
    assert str(results[1]) == ("reward 'sleeps_on_second_call:reward' did not return within 1 s at prompt 2 of 4 "
                               "(index of the last completion it read: 5); task.reward_timeout or "
                               "GRPO_BENCH_REWARD_TIMEOUT sets the limit")
    import sleeps_on_second_call
    for i in (0, 2):
        sleeps_on_second_call.CALLS[:] = [1, 1]   # past the hanging call: the reward as it is for them
        assert results[i] == train(resolve_run(raws[i])), i


@pytest.mark.parametrize("spec", ["correct", "score", "mod:fn"])
def test_every_reward_call_is_bounded_the_tasks_own_a_verifier_and_a_users(spec):
    """The limit held only `module:function` rewards: a registered one (the task's own, reasoning-gym's
    verifier `score`) ran unbounded. A reward that reads nothing before hanging says so."""
    import time

    from grpo_bench.algos import rewards

    def hangs(prompts, completions, **kw):
        time.sleep(30)

    t0 = time.monotonic()
    with pytest.raises(rewards.RewardTimeout) as e:
        rewards.combine({spec: (hangs, 1.0)}, ["p"] * 4, ["c"] * 4, limit=0.3, group=2, answer=[1] * 4)
    assert time.monotonic() - t0 < 3
    assert str(e.value).startswith(f"reward {spec!r} did not return within 0.3 s before reading any of its 4 "
                                   "completions;"), str(e.value)


def test_a_reward_called_where_sigalrm_reaches_runs_there_and_leaves_no_timer_or_handler_behind():
    """In the main thread with no timer of the caller's, a reward runs in that thread under SIGALRM (which also
    cuts a C wait short); a call that returns in time leaves no timer running and the caller's handler in
    place (a timer left running would deliver SIGALRM later, to a handler that may end the process)."""
    import signal
    import threading

    from grpo_bench.algos import rewards

    mine = lambda *a: None  # noqa: E731
    previous = signal.signal(signal.SIGALRM, mine)
    try:
        where = []
        out = rewards.call("m:r", lambda p, c: where.append(threading.current_thread()) or [1.0], [[1]], [[1]],
                           limit=0.3)
        assert out == [1.0] and where == [threading.main_thread()]
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is mine
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert rewards.timeout_s() == 300.0   # a reward called by hand, without a task's limit


@pytest.mark.parametrize("read, group, where", [
    (lambda c: c[5], 2, "at prompt 2 of 4 (index of the last completion it read: 5)"),
    (lambda c: c[-1], 2, "at prompt 3 of 4 (index of the last completion it read: 7)"),   # from the end
    (lambda c: c[0], 2, "at prompt 0 of 4 (index of the last completion it read: 0)"),
    (lambda c: c[5], None, "at prompt 5 of 8 (index of the last completion it read: 5)"),  # a prompt each
])
def test_a_reward_that_hangs_after_reading_by_index_names_where(read, group, where):
    import time

    from grpo_bench.algos import rewards

    def hangs(prompts, completions, **kw):
        read(completions)
        time.sleep(30)

    kw = {} if group is None else {"group": group}
    with pytest.raises(rewards.RewardTimeout) as e:
        rewards.call("m:r", hangs, ["p"] * 8, ["c"] * 8, limit=0.3, **kw)
    assert f"within 0.3 s {where};" in str(e.value), str(e.value)
    with pytest.raises(rewards.RewardTimeout) as e:
        rewards.combine({"m:r": (hangs, 1.0)}, ["p"] * 8, ["c"] * 8, limit=0.3, **kw)
    assert f"within 0.3 s {where};" in str(e.value), str(e.value)


def test_reward_timeout_default_fits_each_task_and_is_checked():
    """Each task has its own default limit, which resolve_run checks, and the environment variable overrides."""
    from grpo_bench.algos import rewards
    from grpo_bench.config.run import resolve_run
    from grpo_bench.errors import ConfigError

    assert resolve_run({"task": {"name": "sort"}}).task.reward_timeout == 10.0
    assert resolve_run({"task": {"name": "arithmetic"}}).task.reward_timeout == 30.0
    with pytest.raises(ConfigError, match=r"task.reward_timeout: seconds >= 0 \(0: no limit\), got -1"):
        resolve_run({"task": {"name": "sort", "reward_timeout": -1}})
    assert rewards.timeout_s(10.0) == 10.0 and rewards.timeout_s() == rewards.REWARD_TIMEOUT_S


def test_a_reward_sees_plain_lists_whatever_tracks_its_reading():
    """What tracks how far a reward read is a list: the reward's own list operations are unchanged."""
    from grpo_bench.algos import rewards

    seen = {}

    def looks(prompts, completions, **kw):
        seen.update(isinstance=isinstance(completions, list), eq=completions == ["a", "b"], n=len(completions),
                    copy=list(completions), sl=completions[::-1], neg=completions[-1])
        return [1.0, 0.0]

    assert rewards.call("m:f", looks, ["p", "q"], ["a", "b"], limit=5) == [1.0, 0.0]
    assert seen == {"isinstance": True, "eq": True, "n": 2, "copy": ["a", "b"], "sl": ["b", "a"], "neg": "b"}
