"""Shipped checkpoints are the files their manifests describe, score what the manifests say, and guard their splits."""
import pytest

from grpo_bench.errors import ConfigError
from grpo_bench.config.run import resolve_run
from grpo_bench.tasks.lm import shipped


@pytest.mark.parametrize("which", shipped.available())
def test_files_match_their_recorded_hashes(which):
    assert shipped.file_hashes(shipped.directory(which)) == shipped.manifest(which)["files"]


def test_every_shipped_directory_is_found():
    assert {shipped.DEFAULT, "arithmetic_scratchpad"} <= set(shipped.available())


@pytest.mark.parametrize("preset, which", [("arithmetic_tiny", "arithmetic_tiny"),
                                           ("arithmetic_scratchpad", "arithmetic_scratchpad"),
                                           ("arithmetic_scratchpad_wide", "arithmetic_scratchpad_wide")])
def test_heldout_accuracy_is_the_recorded_one(tmp_path, monkeypatch, preset, which):
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path))
    from grpo_bench.registry import get

    cfg = resolve_run({"task": preset})
    assert shipped.name(cfg.task.model.source) == which
    task = get("task", "arithmetic")(cfg.task, cfg)
    recorded = shipped.manifest(which)["heldout_greedy_accuracy"]
    # greedy decoding: another CPU's rounding may flip a near-tie argmax, so one problem of
    # slack; anything more means another model or another held-out set
    assert task._base_accuracy() == pytest.approx(recorded, abs=1 / cfg.task.eval_size + 1e-9)
    assert task.heldout[:3] == get("task", "arithmetic")(cfg.task, cfg).heldout[:3]


def test_the_shipped_model_is_the_default_and_guards_its_split():
    cfg = resolve_run({"task": "arithmetic"})
    assert cfg.task.model.source == shipped.TINY and cfg.task.warmstart.steps == 0
    with pytest.raises(ConfigError, match="task.eval_size: model.source tiny was warm-started"):
        resolve_run({"task": {"name": "arithmetic", "eval_size": 100}})
    # a manifest from before `operands` existed was drawn uniformly, and says so
    assert shipped.split(shipped.DEFAULT)["operands"] == "uniform"
    assert shipped.split("arithmetic_scratchpad")["operands"] == "digits"
    with pytest.raises(ConfigError) as err:
        resolve_run({"task": {"name": "arithmetic_scratchpad", "operands": "uniform"}})
    assert err.value.key == "task.operands"
    with pytest.raises(ConfigError) as err:
        resolve_run({"task": {"name": "arithmetic", "operands": "digits"}})
    assert err.value.key == "task.operands"


def test_sources_name_shipped_directories():
    assert shipped.name("tiny") == shipped.DEFAULT == "arithmetic_tiny"
    assert shipped.name("shipped:arithmetic_tiny") == "arithmetic_tiny"
    assert shipped.name("tiny-scratch") is None and shipped.name("Qwen/Qwen2.5-0.5B-Instruct") is None
    # `shipped:arithmetic_tiny` is `tiny` under its directory's name: the same split guard
    cfg = resolve_run({"task": {"name": "arithmetic", "model": {"source": "shipped:arithmetic_tiny"}}})
    assert cfg.task.eval_size == 200
    with pytest.raises(ConfigError) as err:
        resolve_run({"task": {"name": "arithmetic", "model": {"source": "shipped:nope"}}}, "x.yaml")
    assert err.value.key == "task.model.source" and ("valid: tiny, shipped:arithmetic_scratchpad, shipped:arithmetic_scratchpad_seed1, shipped:arithmetic_scratchpad_seed2, "
                                                    "shipped:arithmetic_scratchpad_wide, shipped:arithmetic_tiny") in str(err.value)


@pytest.mark.parametrize("which", [w for w in shipped.available() if "preset" in shipped.manifest(w)])
def test_a_start_was_built_from_its_preset_as_it_now_reads(which):
    """The manifest's hash of the preset it was built from is the preset file's: a `start:` or task setting (or a
    description's claim about the start) edited after the build would describe another start than the one shipped."""
    import hashlib

    m = shipped.manifest(which)
    preset = shipped.root(which).parent / m["preset"]["file"]
    assert hashlib.sha256(preset.read_bytes()).hexdigest() == m["preset"]["sha256"]
