"""Arithmetic problems of 1-4 digit operands and their scratchpads: exact text, exact draw frequencies."""
import collections
import random

import pytest

from grpo_bench.errors import ConfigError
from grpo_bench.config.run import resolve_run
from grpo_bench.tasks.lm import problems
from grpo_bench.algos.answers import extract_answer, is_answer

P = problems.Problem


@pytest.mark.parametrize("a, b, text", [
    (347, 85, "(7+5=12 4+8+1=13 3+0+1=4)432"),        # two carries, the shorter operand padded with 0
    (9999, 9999, "(9+9=18 9+9+1=19 9+9+1=19 9+9+1=19)19998"),  # the longest: a carry out of the last column
    (3, 4, "(3+4=7)7"),
    (0, 0, "(0+0=0)0"),
    (5, 1234, "(5+4=9 0+3=3 0+2=2 0+1=1)1239"),       # the second operand longer
    (95, 5, "(5+5=10 9+0+1=10)100"),                 # a carry into a column of zeros, then out of it
])
def test_scratchpad_by_hand(a, b, text):
    p = P(a, "add", b)
    assert p.scratchpad() == text
    assert extract_answer(text) == a + b and is_answer(text)


def test_scratchpad_columns_recompute_the_sum():
    # every column of every scratchpad: digit + digit + carry in = its sum, whose tens digit is the next carry
    rng = random.Random(0)
    for _ in range(500):
        p = problems.sample({"add": [0, 9999]}, rng, "digits")
        work, _, result = p.scratchpad()[1:].partition(")")
        carry, digits = 0, []
        for i, step in enumerate(work.split(" ")):
            lhs, total = step.split("=")
            terms = [int(t) for t in lhs.split("+")]
            assert terms[:2] == [p.a // 10 ** i % 10, p.b // 10 ** i % 10] and terms[2:] == ([1] if carry else [])
            assert int(total) == sum(terms)
            carry, digits = int(total) // 10, [int(total) % 10] + digits
        assert int(result) == p.answer == int("".join(map(str, [carry] * bool(carry) + digits)))


def test_scratchpad_only_for_additions():
    for p in (P(3, "sub", 1), P(-3, "add", 1), P(2, "mul", 2)):
        with pytest.raises(ValueError, match="only for additions"):
            p.scratchpad()
    with pytest.raises(ConfigError) as err:
        resolve_run({"task": {"name": "arithmetic", "model": {"source": "tiny-scratch"}, "ops": {"add": [0, 9], "sub": [0, 9]},
                              "warmstart": {"steps": 1, "scratchpad": 0.5}}}, "x.yaml")
    assert err.value.key == "task.ops"
    with pytest.raises(ConfigError) as err:
        resolve_run({"task": {"name": "arithmetic", "model": {"source": "tiny-scratch"}, "warmstart": {"scratchpad": 1.5}}}, "x.yaml")
    assert err.value.key == "task.warmstart.scratchpad"
    with pytest.raises(ConfigError) as err:
        resolve_run({"task": {"name": "arithmetic", "operands": "log"}}, "x.yaml")
    assert err.value.key == "task.operands"


def test_digit_spans_by_hand():
    assert problems._digit_spans(0, 9999) == (((0, 9),), ((10, 99),), ((100, 999),), ((1000, 9999),))
    # a sign is not a digit: -7 and 5 are both one digit; the range cuts the spans it reaches into
    assert problems._digit_spans(-120, 5) == (((-9, -1), (0, 5)), ((-99, -10),), ((-120, -100),))
    assert problems._digit_spans(50, 150) == (((50, 99),), ((100, 150),))
    # a span of one value is a span: [0, 10] draws 10 as often as all of 0-9 together
    assert problems._digit_spans(0, 10) == (((0, 9),), ((10, 10),))
    assert problems._digit_spans(-10, -10) == (((-10, -10),),)


@pytest.mark.parametrize("ops, size", [
    ({"add": [0, 9]}, 100), ({"sub": [-2, 2]}, 25), ({"mul": [7, 7]}, 1),
    ({"floordiv": [0, 3]}, 4 * 3),     # b = 0 is never drawn: 4 of the 16 pairs are not problems
    ({"floordiv": [-3, 0]}, 4 * 3),    # the zero at the top of the range
    ({"floordiv": [1, 3]}, 9),         # no zero to skip
    ({"floordiv": [-3, -1]}, 9),
    ({"add": [0, 9], "floordiv": [0, 3], "mul": [1, 2]}, 100 + 12 + 4),   # each operation's problems are its own
])
def test_space_size_counts_the_distinct_problems_by_hand(ops, size):
    assert problems.space_size(ops) == size
    # and it is what sampling can reach: every problem of a small space turns up
    rng = random.Random(0)
    assert len({problems.sample(ops, rng) for _ in range(60 * size)}) == size


@pytest.mark.parametrize("ops, error", [
    ({}, "ops: empty"), ({"pow": [0, 9]}, "unknown operation 'pow'; valid: add, sub, mul, floordiv"),
    ({"add": [0, "9"]}, "integers with lo <= hi"), ({"add": ["0", 9]}, "integers with lo <= hi"),
    ({"add": [True, 9]}, "integers with lo <= hi"),  # YAML's true is an int to Python, not an operand
    ({"add": [0, 9.0]}, "integers with lo <= hi"), ({"add": [9, 0]}, "integers with lo <= hi"),
    ({"add": (0, 9)}, "integers with lo <= hi"), ({"add": [0, 5, 9]}, "integers with lo <= hi"),
    ({"floordiv": [0, 0]}, "non-zero divisor"),
])
def test_check_ops_refuses_what_is_no_operand_range(ops, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(")):
        problems.check_ops(ops)


def test_check_ops_takes_the_edges():
    # a range of one value, a zero-only range of an operation that can divide by nothing, a divisor range with 0 in it
    for ops in ({"add": [5, 5]}, {"add": [0, 0]}, {"sub": [-3, -3]}, {"floordiv": [0, 1]}, {"floordiv": [-1, 0]},
                {"mul": [-9, 9], "floordiv": [1, 1]}):
        problems.check_ops(ops)


def test_check_scratchpad_takes_additions_from_zero_only():
    problems.check_scratchpad({"add": [0, 9999]})
    problems.check_scratchpad({"add": [3, 5]})
    for ops in ({"add": [-1, 9]}, {"sub": [0, 9]}, {"add": [0, 9], "mul": [0, 9]}):
        with pytest.raises(ValueError, match="additions of non-negative operands"):
            problems.check_scratchpad(ops)


def test_digits_draws_each_count_equally_and_uniformly_within_it():
    rng = random.Random(1)
    n = 40_000
    draws = [problems._operand(-120, 5, rng, "digits") for _ in range(n)]
    counts = collections.Counter(len(str(abs(x))) for x in draws)
    for d in (1, 2, 3):  # a third each, within 4 standard deviations of n/3
        assert abs(counts[d] - n / 3) < 4 * (n * (1 / 3) * (2 / 3)) ** 0.5
    ones = collections.Counter(x for x in draws if -9 <= x <= 5)
    # 15 one-digit values (-9..5) share their third equally, negatives and positives alike
    assert set(ones) == set(range(-9, 6))
    assert max(ones.values()) - min(ones.values()) < 8 * (n / 3 / 15) ** 0.5
    assert min(draws) >= -120 and max(draws) <= 5


def test_uniform_operands_draw_what_they_always_drew():
    # the default keeps the stream of the shipped tiny checkpoint's training, draw for draw
    rng, old = random.Random(5), random.Random(5)
    ops = {"add": [0, 99], "sub": [0, 99]}
    for _ in range(50):
        p = problems.sample(ops, rng)
        name = old.choice(sorted(ops))
        assert p == P(old.randint(0, 99), name, old.randint(0, 99))


def test_digits_heldout_is_disjoint_from_training_and_covers_every_length():
    ops = {"add": [0, 9999]}
    held = problems.heldout(ops, 1000, 1234, "digits")
    assert len(set(held)) == 1000 and held == problems.heldout(ops, 1000, 1234, "digits")
    stream = problems.train_batch(ops, 3000, random.Random(0), problems.exclusion(held), "digits")
    assert not set(stream) & problems.exclusion(held)
    columns = collections.Counter(max(len(str(p.a)), len(str(p.b))) for p in stream)
    # the longer of two uniform digit counts in 1..4: P(c) = (2c - 1) / 16, so 4 columns 7 times as often
    # as 1; fewer 1s still, as most of the 100 sums of two digits are held out or their twins are
    assert columns[4] > columns[3] > columns[2] > 2 * columns[1] > 0


def test_warmstart_writes_the_scratchpads_it_is_asked_for():
    from grpo_bench.tasks.lm import models, warmstart
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = models.prepare_tokenizer(build_char_tokenizer())
    batch = [P(347, "add", 85), P(3, "add", 4)]
    ids, mask, labels = warmstart._sequences(tok, batch, "plain", tok.eos_token_id, "cpu", [True, False])
    answers = [tok.decode([t for t in row if t != -100]) for row in labels.tolist()]
    assert answers == ["(7+5=12 4+8+1=13 3+0+1=4)432<eos>", "7<eos>"]
    prompts = [tok.decode([t for t, m, y in zip(r, mr, yr) if m and y == -100]) for r, mr, yr in
               zip(ids.tolist(), mask.tolist(), labels.tolist())]
    assert prompts == ["<bos>347+85=", "<bos>3+4="]
    plain = warmstart._sequences(tok, batch, "plain", tok.eos_token_id, "cpu")
    assert tok.decode([t for t in plain[2][0].tolist() if t != -100]) == "432<eos>"


def test_warmstart_cache_key_grows_only_with_the_new_settings():
    from grpo_bench.tasks.lm import warmstart

    def spec(**task):
        return warmstart.spec(resolve_run({"task": {"name": "arithmetic", "model": {"source": "tiny-scratch"},
                                                    "warmstart": {"steps": 5}, **task}}).task)

    # the keys of a config without them are the ones it always had: its cached checkpoint keeps its name
    assert "operands" not in spec() and "scratchpad" not in spec()
    assert spec(operands="digits")["operands"] == "digits"
    assert spec(warmstart={"steps": 5, "scratchpad": 0.3})["scratchpad"] == 0.3


def test_the_char_tokenizer_padded_to_a_models_vocabulary():
    """size pads the vocabulary with tokens no text encodes to, so every id a larger model samples decodes to
    something; the characters keep their ids."""
    from grpo_bench.tasks.lm.tokenizer import CHARS, SPECIALS, build_char_tokenizer
    small, big = build_char_tokenizer(), build_char_tokenizer(size=100)
    assert len(small) == len(SPECIALS) + len(CHARS) < 100 == len(big)
    text = "(7+5=12 4+8+1=13)132? abc"
    assert big(text).input_ids == small(text).input_ids and max(big(text).input_ids) < len(small)
    assert big.convert_ids_to_tokens([len(small), 99]) == [f"<u{len(small)}>", "<u99>"]
    assert big.decode(big(text).input_ids, skip_special_tokens=True) == text


def test_the_warm_starts_schedule_by_hand():
    """AdamW without weight decay; the rate rises linearly over the first tenth of the steps, then stays."""
    import torch
    from grpo_bench.tasks.lm import warmstart

    opt, sched = warmstart.optimizer(torch.nn.Linear(1, 1), 0.3, 30)
    assert opt.param_groups[0]["weight_decay"] == 0.0 and isinstance(opt, torch.optim.AdamW)
    rates = []
    for _ in range(5):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates == pytest.approx([0.1, 0.2, 0.3, 0.3, 0.3])   # warm-up of 30 // 10 = 3 steps
    opt, sched = warmstart.optimizer(torch.nn.Linear(1, 1), 0.3, 9)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.3)     # under 10 steps: no warm-up
    opt, sched = warmstart.optimizer(torch.nn.Linear(1, 1), 0.3, 25)
    rates = []
    for _ in range(3):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates == pytest.approx([0.15, 0.3, 0.3])            # 25 // 10 = 2 whole steps, not 2.5


def test_warm_start_steps_by_hand():
    """Eight supervised steps: cross-entropy on the answer tokens only, gradients clipped to norm 1 (Adam's first
    step does not see a gradient's scale, its second does), AdamW, the schedule stepped; each returns the batch's
    token accuracy before its step (argmax against the answer tokens)."""
    import copy
    import torch
    from grpo_bench.tasks.lm import models, warmstart
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = models.prepare_tokenizer(build_char_tokenizer())
    model = models.build_tiny(tok, 1, 16, 2, seed=0)
    models.disable_dropout(model)
    batches = [warmstart._sequences(tok, b, "plain", tok.eos_token_id, "cpu")
               for b in ([P(12, "add", 7), P(3, "add", 4)], [P(250, "add", 1)])] * 4
    ref = copy.deepcopy(model)
    opt, sched = warmstart.optimizer(model, 0.05, 20)
    accuracies = []
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.0)
    for k, (ids, mask, labels) in enumerate(batches):
        acc = warmstart.step(model, opt, sched, ids, mask, labels)
        logits = ref(input_ids=ids, attention_mask=mask, position_ids=models.positions(mask)).logits[:, :-1]
        target = labels[:, 1:]
        on = target != -100
        assert on.sum() == [2 + 1 + 2, 3 + 1][k % 2]   # "19<eos>", "7<eos>"; "251<eos>"
        assert acc == pytest.approx((logits.argmax(-1)[on] == target[on]).double().mean().item())
        accuracies.append(acc)
        ref.zero_grad()
        # the mean over answer tokens, summed in the step's own order (Adam's update of a near-zero gradient
        # magnifies a rounding difference)
        torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=-100).backward()
        norm = torch.sqrt(sum((q.grad.double() ** 2).sum() for q in ref.parameters()))
        assert norm > 1   # so the clip acts
        for q in ref.parameters():
            q.grad = (q.grad.double() / (norm + 1e-6)).to(q.dtype)
        ref_opt.param_groups[0]["lr"] = 0.05 * min(1, (k + 1) / 2)   # a warm-up of 20 // 10 = 2 steps
        ref_opt.step()
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        if name.endswith("c_attn.bias"):   # its key third has a gradient of rounding noise alone (softmax ignores a
            a, b = a[:16], b[:16]          # shift of every score), which Adam's step scales up to the rate
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)   # the schedule moved on
    assert 0 < max(accuracies) < 1, accuracies


def _sft_spy(monkeypatch, eos_ids):
    """warmstart.sft with its step replaced by a spy: each step's labels and train/eval mode, each check's mode and a
    draw from torch's generator."""
    import torch
    from grpo_bench.tasks.lm import models, warmstart
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer("0123456789+-*/=() .,:?abcdefghijklmnopqrstuvwxyzCRW\n")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok = models.prepare_tokenizer(tok)
    model = models.build_tiny(tok, n_layer=1, n_embd=16, n_head=2, seed=0, n_positions=128)
    model.generation_config.eos_token_id = eos_ids(tok)
    seen = {"steps": [], "checks": [], "labels": []}

    def step(model, opt, sched, ids, mask, labels):
        seen["steps"].append(model.training)
        seen["labels"].append(labels)
        return 0.5

    def check(model, tokenizer, s, accuracy):
        seen["checks"].append((model.training, torch.rand(1).item()))
        return False

    monkeypatch.setattr(warmstart, "step", step)
    return tok, model, seen, check


@pytest.mark.parametrize("template", ["plain", "chat"])
@pytest.mark.parametrize("generation_eos", ["a list", "one id", "none"])
def test_each_warm_start_answer_ends_with_the_templates_end_token(monkeypatch, template, generation_eos):
    """A plain prompt's answer ends with the tokenizer's EOS; a chat turn's with the model's own turn end: the first
    of the generation config's ids, its one id, else the tokenizer's EOS."""
    from grpo_bench.tasks.lm import warmstart

    ends = {"a list": lambda t: [t.convert_tokens_to_ids("<|im_end|>"), t.eos_token_id],
            "one id": lambda t: t.convert_tokens_to_ids("<|im_start|>"), "none": lambda t: None}[generation_eos]
    tok, model, seen, _ = _sft_spy(monkeypatch, ends)
    cfg = resolve_run({"task": {"name": "arithmetic", "template": template, "warmstart": {"steps": 2, "batch": 3}}}).task
    warmstart.sft(model, tok, cfg, "cpu")
    chat = {"a list": "<|im_end|>", "one id": "<|im_start|>", "none": tok.eos_token}[generation_eos]
    want = tok.eos_token_id if template == "plain" else tok.convert_tokens_to_ids(chat)
    assert len(seen["labels"]) == 2 and tok.convert_tokens_to_ids("<|im_end|>") != tok.eos_token_id
    assert {row[-1].item() for labels in seen["labels"] for row in labels} == {want}


def test_a_warm_start_trains_in_train_mode_checks_in_eval_mode_and_ends_in_eval_mode(monkeypatch):
    """Whatever mode the model comes in, its steps run in train mode, each check sees it in eval mode (a check
    samples), and it is handed back in eval mode; what a check draws from torch's generator is the same whatever
    the generator's state before (the seed is set), so a check's samples are the warm start's own."""
    import torch
    from grpo_bench.tasks.lm import warmstart

    cfg = resolve_run({"task": {"name": "arithmetic", "warmstart": {"steps": 3, "batch": 2}}}).task
    draws = []
    for before in (1, 2):
        tok, model, seen, check = _sft_spy(monkeypatch, lambda t: t.eos_token_id)
        model.eval()
        torch.manual_seed(before)
        assert warmstart.sft(model, tok, cfg, "cpu", check) == 0.5
        assert seen["steps"] == [True] * 3 and [m for m, _ in seen["checks"]] == [False] * 3 and not model.training
        draws.append([d for _, d in seen["checks"]])
    assert draws[0] == draws[1]
