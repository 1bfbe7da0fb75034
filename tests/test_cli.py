"""Bad input: exit code 2 and one line naming the file, the key and the valid choices."""
import os
import socket
import sys

import pytest
import yaml

from grpo_bench import registry
from grpo_bench.__main__ import main
from grpo_bench.errors import ConfigError
from grpo_bench.config.ablation import load_ablation
from grpo_bench.store.rundir import lock_out
from helpers import cli, needs

LOSSES = "valid: " + ", ".join(registry.names("loss"))
DELTAS = "valid: " + ", ".join(registry.names("delta"))

BASE = {"task": {"name": "sort"}, "epochs": 2, "inner_steps": 1}


def write(tmp_path, doc, name="abl.yaml"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return p


CASES = [
    # (ablation document, words the one-line error must contain)
    ({"base": {**BASE, "loss": "ppo"}, "grid": {"seed": [0]}}, ["loss", "'ppo'", LOSSES]),
    ({"base": BASE, "grid": {"delta": ["zscore", "whiten"]}}, ["delta", "'whiten'", DELTAS]),
    ({"base": {**BASE, "lr_rate": 0.1}, "grid": {"seed": [0]}}, ["lr_rate", "unknown key", "valid:", "inner_steps"]),
    ({"base": {**BASE, "epochs": "ten"}, "grid": {"seed": [0]}}, ["epochs", "expected int", "'ten'"]),
    ({"base": {**BASE, "group_size": 1}, "grid": {"delta": ["zscore"]}}, ["group_size", ">= 2", "zscore"]),
    ({"base": {**BASE, "loss": {"name": "clipped", "clip_low": 0.0}}, "grid": {"seed": [0]}}, ["loss.clip_low", "must be > 0"]),
    ({"base": {**BASE, "loss": {"name": "clipped", "clip_high": -0.1}}, "grid": {"seed": [0]}}, ["loss.clip_high", "must be > 0"]),
    ({"base": {**BASE, "loss": {"name": "clipped", "tau": 1}}, "grid": {"seed": [0]}},
     ["loss.tau", "no parameter 'tau'", "valid: clip_low, clip_high"]),
    ({"base": {**BASE, "loss": {"name": "sapo", "tau_pos": "hot"}}, "grid": {"seed": [0]}}, ["loss.tau_pos", "expected float"]),
    ({"base": {**BASE, "loss": {"clip_high": 0.3}}, "grid": {"seed": [0]}}, ["loss.name", "missing", LOSSES]),
    ({"base": {**BASE, "filters": ["dynamic_sampling", "shuffle"]}, "grid": {"seed": [0]}},
     ["filters.1", "unknown filter 'shuffle'", "valid: dynamic_sampling"]),
    ({"base": {**BASE, "group_size": 1, "delta": "raw", "filters": ["dynamic_sampling"]}, "grid": {"seed": [0]}},
     ["group_size", "filters.0 'dynamic_sampling'"]),
    ({"base": {**BASE, "delta": {"name": "gpg", "count": "tokens"}}, "grid": {"seed": [0]}},
     ["delta.count", "valid: advantage, reward"]),
    ({"base": {**BASE, "ref_update": {"name": "soft", "alpha": 1.5}}, "grid": {"seed": [0]}}, ["ref_update.alpha", "<= 1"]),
    ({"base": {**BASE, "kl_coef": -0.5}, "grid": {"seed": [0]}}, ["kl_coef", ">= 0"]),
    ({"base": BASE, "grid": {}}, ["grid", "empty"]),
    ({"base": BASE, "grid": {"loss": []}}, ["grid.loss", "non-empty list"]),
    ({"base": BASE, "grid": {"seed": [0]}, "seed": 3}, [": seed: unknown key", "valid: name, description, include, claim, settings, base, grid, variants, seeds, resources"]),
    ({"base": {**BASE, "task": {"name": "sorting"}}, "grid": {"seed": [0]}},
     ["task.name", "valid: arithmetic, gym, sort (tasks); arithmetic_qwen, arithmetic_scratchpad, arithmetic_scratchpad_wide, arithmetic_tiny, countdown, smollm2_arithmetic, smollm2_countdown, smollm2_countdown_warm, smollm2_letter_counting, smollm2_spell_backward, sort_converge, sort_hard, sort_lecture, spell_backward (presets"]),
    ({"base": {**BASE, "task": {"name": "sort", "size": 3}}, "grid": {"seed": [0]}}, ["task.size", "unknown key", "vocab"]),
    ({"base": {**BASE, "task": {"name": "sort", "rewards": {"l2": 1}}}, "grid": {"seed": [0]}},
     ["task.rewards", "unknown reward 'l2' for task sort; valid: inclusion_order, match"]),
    ({"base": {**BASE, "task": {"name": "arithmetic_tiny", "sampling": {"temperature": -1}}}, "grid": {"seed": [0]}},
     ["task.sampling.temperature", "must be > 0"]),
    ({"base": {**BASE, "kl_placement": "advantage"}, "grid": {"seed": [0]}}, ["kl_placement", "valid: loss, reward"]),
    ({"base": BASE, "grid": {"seed": [0]}, "seeds": 0}, ["seeds", "positive int"]),
    ("base: [unclosed\n", ["invalid YAML"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": {"gpu": 1}}, ["resources.gpu", "unknown key", "valid: cpus, gpus"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": {"cpus": 0}}, ["resources.cpus", "got 0"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": {"gpus": 1.5}}, ["resources.gpus", "whole number", "1.5"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": {"gpus": -0.5}}, ["resources.gpus", "-0.5"]),
    ({"base": BASE, "grid": {"seed": [0]}, "resources": 2}, ["resources", "expected a mapping"]),
]


@pytest.mark.parametrize("doc,words", CASES, ids=[str(i) for i in range(len(CASES))])
def test_bad_ablation_is_one_line_exit_2(tmp_path, doc, words, capsys):
    # in-process, so that 25 cases cost no interpreter start-ups; an exception escaping
    # main() (what would print a traceback) fails the test, and test_bad_set_and_missing_file
    # checks the same behaviour through a real process
    path = write(tmp_path, doc)
    code = main(["run", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(path) in lines[0] or "--set" in lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not (tmp_path / "out").exists()


def test_bad_set_and_missing_file(tmp_path):
    res = cli("run", "ablations/loss_modes.yaml", "--set", "loss=nope", "--out", tmp_path / "o")
    assert res.returncode == 2 and LOSSES in res.stderr
    res = cli("run", "ablations/delta_modes.yaml", "--set", "loss.clip_high=-1", "--out", tmp_path / "o")
    assert res.returncode == 2 and "loss.clip_high: must be > 0" in res.stderr
    res = cli("run", "ablations/loss_modes.yaml", "--set", "loss", "--out", tmp_path / "o")
    assert res.returncode == 2 and "key=value" in res.stderr
    res = cli("run", tmp_path / "missing.yaml")
    assert res.returncode == 2 and "missing.yaml" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = cli("plot", tmp_path)
    assert res.returncode == 2 and "not a results directory" in res.stderr


def test_list_prints_every_part():
    res = cli("list")
    assert res.returncode == 0
    for axis in registry.AXES:
        for name in registry.names(axis):
            assert f"  {name} " in res.stdout, name
    assert "clip_high=0.2" in res.stdout and "source: DAPO" in res.stdout



def test_resources_from_file_and_set(tmp_path):
    path = write(tmp_path, {"base": BASE, "grid": {"seed": [0]}, "resources": {"gpus": 0.25}})
    assert load_ablation(path).resources == {"cpus": 1, "gpus": 0.25}
    abl = load_ablation(path, sets=["resources.cpus=2", "resources.gpus=1", "epochs=3"])
    assert abl.resources == {"cpus": 2, "gpus": 1}
    assert all(raw["epochs"] == 3 and "resources" not in raw for _, _, raw in abl.variants)
    with pytest.raises(ConfigError, match=r"^--set: resources.cpus: .*'x'"):
        load_ablation(path, sets=["resources.cpus=x"])


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_busy_or_unwritable_out_is_one_line(tmp_path, capsys, executor):
    if executor == "ray":
        needs("ray")  # without it, `Ray is not installed` comes first (the next test)
    path = write(tmp_path, {"base": BASE, "grid": {"seed": [0]}})
    out = tmp_path / "o"

    def run(out):
        assert main(["run", str(path), "--out", str(out), "--executor", executor, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err

    with lock_out(out):  # as a running sweep holds it
        err = run(out)
    assert f"--out: {out}: another sweep (pid {os.getpid()}) is writing here" in err
    assert not (out / "ablation.json").exists()
    (tmp_path / "file").write_text("")
    for bad in ["/proc/grpo_bench_out", tmp_path / "file" / "o"]:
        assert f"--out: {bad}: cannot create or write the output directory" in run(bad)


def test_ray_missing_or_unreachable_is_one_line(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, {"base": BASE, "grid": {"seed": [0]}})
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Ray is not installed" in err and "pip install -e '.[ray]'" in err
    assert not (tmp_path / "o").exists()
    monkeypatch.undo()

    needs("ray")
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = cli("run", path, "--out", tmp_path / "o", "--address", f"127.0.0.1:{port}", timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"--address: 127.0.0.1:{port}: cannot reach a Ray cluster" in res.stderr


def test_executor_options_that_contradict(tmp_path, capsys):
    path = str(write(tmp_path, {"base": BASE, "grid": {"seed": [0]}}))
    assert main(["run", path, "--executor", "ray", "--workers", "2", "--out", str(tmp_path / "o")]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["run", path, "--executor", "local", "--address", "auto", "--out", str(tmp_path / "o")]) == 2
    assert "is for --executor ray" in capsys.readouterr().err
    assert main(["run", path, "--executor", "ray", "--max-retries", "-1", "--out", str(tmp_path / "o")]) == 2
    assert "--max-retries" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
