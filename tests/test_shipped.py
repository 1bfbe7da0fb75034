"""The shipped tiny checkpoint is the file its manifest describes, and scores what the manifest says."""
import pytest

from grpo_bench.lm import shipped


def test_files_match_their_recorded_hashes():
    assert shipped.file_hashes(shipped.directory()) == shipped.manifest()["files"]


def test_heldout_accuracy_is_the_recorded_one(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path))
    from grpo_bench.config import resolve_run
    from grpo_bench.registry import get

    cfg = resolve_run({"task": "arithmetic_tiny"})
    task = get("task", "arithmetic")(cfg.task, cfg)
    recorded = shipped.manifest()["heldout_greedy_accuracy"]
    # greedy decoding of 200 problems: another CPU's rounding may flip a near-tie argmax,
    # so one problem of slack; anything more means another model or another held-out set
    assert task._base_accuracy() == pytest.approx(recorded, abs=1 / 200 + 1e-9)
    assert task.heldout[:3] == get("task", "arithmetic")(cfg.task, cfg).heldout[:3]


def test_the_shipped_model_is_the_default_and_guards_its_split():
    from grpo_bench.config import ConfigError, resolve_run

    cfg = resolve_run({"task": "arithmetic"})
    assert cfg.task.model.source == shipped.TINY and cfg.task.warmstart.steps == 0
    with pytest.raises(ConfigError, match="task.eval_size: model.source tiny was warm-started"):
        resolve_run({"task": {"name": "arithmetic", "eval_size": 100}})
