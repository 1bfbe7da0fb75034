"""Arithmetic data and rewards without a model: tokenizer, problems, answer parsing, the reward axis and presets."""
import random

import pytest

from grpo_bench.algos import rewards
from grpo_bench.errors import ConfigError
from grpo_bench.config.run import resolve_run
from grpo_bench.tasks.lm import problems
from grpo_bench.algos.answers import extract_answer


def test_char_tokenizer_round_trip_and_reload(tmp_path):
    from transformers import AutoTokenizer

    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    text = "17+25=42 -8//3 (9*9)"
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1  # one token per character
    assert tok.decode(ids, skip_special_tokens=True) == text
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text).input_ids == ids
    assert (again.eos_token_id, again.pad_token_id, again.padding_side) == (tok.eos_token_id, tok.pad_token_id, "left")
    batch = again(["1+1=", "10+10="], padding=True)
    assert batch.input_ids[0][:2] == [again.pad_token_id] * 2 and batch.attention_mask[0][:2] == [0, 0]
    assert tok("é").input_ids[1] == tok.unk_token_id


@pytest.mark.parametrize("text, expected", [
    ("42", 42), (" 42 ", 42), ("-8", -8), ("The answer is 42.", 42), ("17+25=42", 42),
    ("1,234", 1234), ("42.0", 42), ("42.5", None), ("\\boxed{7} and then 9", 7),
    ("", None), ("abc", None), ("=", None), ("٤٢", None), ("４２", None), ("😀42😀", 42),
    ("9" * 10_000, None), ("-" * 50, None),
    ("9" * 64, int("9" * 64)), ("-" + "9" * 64, -int("9" * 64)), ("9" * 65, None),   # at most 64 digits
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_rewards_on_malformed_completions_are_defined():
    bad = ["", "abc", "9" * 5000, "٤٢", "17+25=", "17+25=42", "42<eos>junk", "\x00\n\t", "42\n"]
    n = len(bad)
    prompts = ["17+25="] * n
    correct = rewards.correct(prompts, bad, answer=[42] * n)
    assert correct == [0, 0, 0, 0, 0, 1, 1, 0, 1]  # the last integer counts, whatever follows
    fmt = rewards.format_reward(prompts, bad, finished=[True] * (n - 1) + [False])
    assert fmt == [0, 0, 1, 0, 0, 0, 0, 0, 0]  # the last is a bare integer but was cut off
    length = rewards.length_penalty(prompts, bad, completion_lengths=[0, 3, 99, 2, 6, 8, 12, 3, 3], max_new_tokens=8)
    assert length[0] == 0 and length[2] == -1 and all(-1 <= x <= 0 for x in length)
    assert rewards.correct(prompts, bad) == [0.0] * n  # no answers given: nothing is correct


def test_scratchpad_format_takes_a_worked_answer_or_a_bare_one():
    texts = ["432", "(7+5=12 4+8+1=13 3+0+1=4)432", " (3+4=7) 7 ", "(7+5=12 4+8", "(7+5=12)", "(1)(2)3",
             "((7+5=12))432", "432(7+5=12)", "(7+5=12)432junk", "(7+5=12)432"]
    finished = [True] * (len(texts) - 1) + [False]
    assert rewards.scratchpad_format([], texts, finished=finished) == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    # without max_new_tokens the longest completion sets the scale: one token of one is the whole budget
    assert rewards.length_penalty([], ["7"], completion_lengths=[1]) == [-1.0]
    assert rewards.length_penalty([], ["", "7"], completion_lengths=[0, 2]) == [0.0, -1.0]
    # called without `finished` (a direct call, a user's recipe): every completion counts as ended
    assert rewards.scratchpad_format([], ["(1+1=2)2", "2"]) == [1.0, 1.0]
    # the bare-integer format is the old one: a worked answer is not a bare integer
    assert rewards.format_reward([], texts[:2]) == [1.0, 0.0]


def test_combine_weights_and_plugins():
    fns = rewards.check({"correct": 1.0, "format": 0.5, "grpo_bench.algos.rewards:length_penalty": 2.0,
                         "arithmetic_rewards:digits": 0.5}, "arithmetic")
    total, parts = rewards.combine(fns, ["1+1="] * 2, ["2", "3 apples"], answer=[2, 2], finished=[True, True],
                                   completion_lengths=[2, 4], max_new_tokens=8)
    assert parts == {"correct": [1.0, 0.0], "format": [1.0, 0.0], "length_penalty": [-0.25, -0.5], "digits": [1.0, 0.0]}
    assert total == pytest.approx([1.0 + 0.5 - 0.5 + 0.5, -1.0])
    with pytest.raises(ValueError, match="unknown reward 'correctness' for task arithmetic; valid: correct, format, length"):
        rewards.resolve("correctness", "arithmetic")
    with pytest.raises(ValueError, match="unknown reward 'correct' for task sort; valid: inclusion_order, match"):
        rewards.resolve("correct", "sort")
    with pytest.raises(ValueError, match="cannot load"):
        rewards.resolve("no_such_module_xyz:fn", "arithmetic")
    short = {"bad": (lambda prompts, completions, **kw: [1.0], 1.0)}
    with pytest.raises(ValueError, match="returned 1 scores for 2"):
        rewards.combine(short, ["a", "b"], ["1", "2"])
    # a column a reward would zip with the completions and silently cut (scratchpad_format reads `finished` so)
    fmt = rewards.check({"scratchpad_format": 1.0}, "arithmetic")
    for finished in ([True], [True, True, True]):
        with pytest.raises(ValueError, match=rf"reward 'scratchpad_format': finished has {len(finished)} values for 2"):
            rewards.combine(fmt, ["1+1="] * 2, ["2", "2"], finished=finished, max_new_tokens=8)
    assert rewards.combine(fmt, ["1+1="] * 2, ["2", "2"], finished=[True, False], max_new_tokens=8)[0] == [1.0, 0.0]


def test_user_reward_module_beside_the_presets():
    digits = rewards.resolve("arithmetic_rewards:digits", "arithmetic")
    # units digit aligned: 41 for 42 gets 1 of 2, 142 for 42 gets 2 of 3, a wrong sign nothing
    assert digits([], ["42", "41", "142", "-42", "x", "7"], answer=[42, 42, 42, 42, 42, 7]) == \
        pytest.approx([1.0, 0.5, 2 / 3, 0.0, 0.0, 1.0])


def test_sort_rewards_hand_values():
    prompts, completions = [[2, 0, 1]] * 4, [[0, 1, 2], [2, 1, 0], [0, 0, 0], [1, 0, 2]]
    assert rewards.resolve("match", "sort")(prompts, completions) == pytest.approx([1.0, 1 / 3, 1 / 3, 1 / 3])
    # inclusion (tokens of the prompt present) + ordered adjacent pairs, over 2n - 1 = 5
    assert rewards.resolve("inclusion_order", "sort")(prompts, completions) == pytest.approx([1.0, 0.6, 0.6, 0.8])


def test_heldout_commutative_twins_never_train():
    ops = {"add": [0, 30], "mul": [0, 12], "sub": [0, 30]}
    held = problems.heldout(ops, 60, seed=2)
    exclude = problems.exclusion(held)
    stream = problems.train_batch(ops, 5000, random.Random(0), exclude)
    twins = {problems.Problem(p.b, p.op, p.a) for p in held if p.op in ("add", "mul") and p.a != p.b}
    assert twins - set(held)                          # the held-out set has twins outside itself...
    assert not set(stream) & (set(held) | twins)      # ...and the training stream shows none of them
    subs = {problems.Problem(p.b, p.op, p.a) for p in held if p.op == "sub"} - set(held)
    assert set(stream) & subs                         # 5 - 3 is not 3 - 5: sub's swaps stay in training


def test_problems_exact_answers_and_disjoint_heldout():
    ops = {"add": [0, 99], "sub": [-5, 5], "mul": [0, 12], "floordiv": [-9, 9]}
    exact = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
             "floordiv": lambda a, b: a // b}
    for p in problems.heldout(ops, 300, seed=3):
        assert not (p.op == "floordiv" and p.b == 0)
        assert p.answer == exact[p.op](p.a, p.b)
    held = problems.heldout(ops, 100, seed=1)
    assert held == problems.heldout(ops, 100, seed=1) and len(set(held)) == 100
    stream = problems.train_batch(ops, 2000, random.Random(0), set(held))
    assert not set(stream) & set(held)
    assert problems.Problem(17, "floordiv", 5).plain() == "17//5=" and problems.Problem(3, "sub", -4).plain() == "3--4="


@pytest.mark.parametrize("task, key", [
    ({"ops": {"pow": [0, 9]}}, "task.ops"),
    ({"ops": {"add": [9, 0]}}, "task.ops"),
    ({"ops": {"floordiv": [0, 0]}}, "task.ops"),
    ({"ops": {"add": [0, 3]}, "eval_size": 10}, "task.eval_size"),
    ({"rewards": {"nope": 1.0}}, "task.rewards"),
    ({"template": "fancy"}, "task.template"),
    ({"sampling": {"top_p": 0.0}}, "task.sampling.top_p"),
    ({"sampling": {"top_k": 5}}, "task.sampling.top_k"),
    ({"model": {"source": "tiny-scratch", "width": 30, "heads": 4}}, "task.model.width"),
    ({"lora": {"rank": "eight"}}, "task.lora.rank"),
    ({"model": "tiny"}, "task.model"),
    # the shipped checkpoint was warm-started with this held-out split kept out of its training
    ({"ops": {"add": [0, 99], "sub": [0, 99]}}, "task.ops"),
    ({"eval_seed": 7}, "task.eval_seed"),
])
def test_config_errors_name_the_key(task, key):
    with pytest.raises(ConfigError) as err:
        resolve_run({"task": {"name": "arithmetic", **task}}, "x.yaml")
    assert err.value.key == key


def test_presets_resolve_and_merge_overrides():
    from grpo_bench.config import presets

    assert set(presets.names()) >= {"sort_lecture", "sort_hard", "arithmetic_tiny", "arithmetic_qwen"}
    hard = resolve_run({"task": "sort_hard"}).task
    assert (hard.n, hard.vocab, hard.prompts, hard.num_prompts, hard.dim) == (6, 16, None, 16, 64)
    cfg = resolve_run({"task": {"name": "arithmetic_tiny", "sampling": {"temperature": 0.5}, "lora": {"rank": 4}}})
    assert cfg.task.sampling.temperature == 0.5 and cfg.task.sampling.max_new_tokens == 6   # merged, not replaced
    assert cfg.task.lora.rank == 4 and cfg.task.rewards == {"correct": 1.0, "format": 0.1}
    lecture = resolve_run({"task": "sort_lecture"})
    assert lecture.task == resolve_run({"task": "sort"}).task   # the lecture's setting is the sort default
    with pytest.raises(ConfigError, match="unknown task 'sort_easy'; valid: arithmetic, gym, sort .*sort_hard"):
        resolve_run({"task": "sort_easy"}, "x.yaml")


def test_reward_defaults_when_the_task_gives_less():
    # no `finished`: every completion counts as ended; no lengths: the text's length, the longest as the cap
    assert rewards.format_reward(["p", "p"], ["12", "x"]) == [1.0, 0.0]
    assert rewards.length_penalty(["p"] * 3, ["abcd", "ab", ["not text"]]) == [-1.0, -0.5, 0.0]
    assert rewards.length_penalty(["p"], ["a"]) == [-1.0] and rewards.length_penalty(["p"], [""]) == [0.0]
    assert rewards.length_penalty([], []) == []
    assert rewards.length_penalty(["p"], ["abc"], completion_lengths=[5], max_new_tokens=4) == [-1.0]


def test_reward_specs_and_weights_are_checked():
    for spec in ["arithmetic_rewards:", ":digits"]:
        with pytest.raises(ValueError, match="expected module:function"):
            rewards.resolve(spec, "arithmetic")
    for bad, words in [({}, "empty"), ([], "empty"), ({"correct": True}, "must be a number"),
                       ({"correct": "1"}, "must be a number")]:
        with pytest.raises(ValueError, match=f"^rewards: .*{words}"):
            rewards.check(bad, "arithmetic")


def test_a_reward_may_abstain():
    # TRL's convention: None means "does not apply", which counts as 0
    fns = {"a": (lambda prompts, completions, **kw: [None, 1.0], 2.0), "b": (lambda p, c, **kw: [1.0, None], 0.5)}
    total, parts = rewards.combine(fns, ["p", "q"], ["x", "y"])
    assert total == [0.5, 2.0] and parts == {"a": [0.0, 1.0], "b": [1.0, 0.0]}
