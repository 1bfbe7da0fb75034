"""The arithmetic task on a causal LM: masks, log-probs, the LoRA reference, loading, warm-start cache, a short run."""
import hashlib
import copy
import json
import re
from pathlib import Path
from unittest import mock

import pytest
import torch

from grpo_bench.config.run import resolve_run
from grpo_bench.registry import get
from grpo_bench.tasks import Rollout
from grpo_bench.tasks.arithmetic import completion_mask

ROOT = Path(__file__).resolve().parents[1]

SMALL = {"name": "arithmetic", "ops": {"add": [0, 99]}, "model": {"source": "tiny-scratch", "layers": 1, "width": 32,
         "heads": 2}, "prompts_per_step": 4, "sampling": {"max_new_tokens": 5}, "eval_size": 12, "pass_k": 2}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "cache"))


def make(task=None, seeds=(0,), **run):
    """The task for a population of runs with these seeds (one, by default)."""
    from grpo_bench.config.presets import merge
    cfgs = [resolve_run({"task": merge(SMALL, task or {}), "group_size": 3, **run, "seed": s}) for s in seeds]
    return get("task", "arithmetic")(cfgs[0].task, cfgs), cfgs[0]


def perturb_adapter(task, scale=0.2, seed=0):
    """Move every member's adapter off its zero update (B starts at 0, where nothing shows)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in task.layers:
            layer.B.add_(scale * torch.randn(layer.B.shape, generator=g))


def test_completion_mask_ends_at_first_eos():
    eos = torch.tensor([2, 7])
    tokens = torch.tensor([[5, 6, 2, 0, 0],    # EOS then padding
                           [2, 5, 5, 5, 5],    # EOS first
                           [5, 5, 5, 5, 5],    # cut off, never ended
                           [5, 7, 2, 2, 2]])   # second EOS id; pad == eos afterwards
    mask, finished = completion_mask(tokens, eos)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert finished.tolist() == [True, True, False, True]


def test_left_padding_and_positions():
    # every prompt is padded to the widest the ops can render (<bos>99+99=: 7 tokens), whatever the batch
    task, _ = make()
    from grpo_bench.tasks.lm import models, problems

    ids, attn = task._prompts([problems.Problem(1, "add", 2), problems.Problem(10, "add", 2)])
    assert task.width == 7
    assert attn.tolist() == [[0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1]]
    assert ids[0, :2].tolist() == [task.tokenizer.pad_token_id] * 2 and ids[0, 2] == task.tokenizer.bos_token_id
    assert models.positions(attn).tolist() == [[0, 0, 0, 1, 2, 3, 4], [0, 0, 1, 2, 3, 4, 5]]


def test_rollout_shapes_mask_and_rewards():
    task, _ = make()
    ro = task.rollout(0, 0, 3)
    p, b, g, t = ro.responses.shape
    assert (p, b, g, t) == (1, 4, 3, 5) and ro.mask.shape == ro.rewards.shape + (t,)   # always the whole budget
    eos = task.eos
    for resp, m in zip(ro.responses.view(-1, t), ro.mask.view(-1, t)):
        ends = torch.isin(resp, eos).nonzero()
        n = int(ends[0]) + 1 if len(ends) else t
        assert m.tolist() == [1.0] * n + [0.0] * (t - n)
        assert (resp[n:] == task.tokenizer.pad_token_id).all()   # pad after the first EOS
    assert {"reward/correct", "reward/format", "response/finished"} <= set(ro.metrics)
    assert torch.equal(ro.lengths, ro.mask.sum(-1)) and ro.finished.shape == (p, b, g)


def test_streams_by_seed_and_the_caller_rng_untouched():
    """Same seed, same prompts and samples, whatever the variant or the global RNG; other seeds or
    draws, other streams. A constant in place of the run's seed fails the last assertion."""
    task, _ = make()
    torch.manual_seed(123)
    a = task.rollout(5, 1, 3)
    after = torch.rand(1)
    torch.manual_seed(7)
    other, _ = make(lr=0.5, loss="naive")
    b = other.rollout(5, 1, 3)
    assert torch.equal(a.responses, b.responses) and a.prompts == b.prompts
    torch.manual_seed(123)
    task.rollout(5, 1, 3)
    assert torch.equal(after, torch.rand(1))  # sampling draws from its own streams only
    assert task.rollout(5, 2, 3).prompts != a.prompts
    seed1, _ = make(seeds=(1,))
    c = seed1.rollout(5, 1, 3)
    assert c.prompts != a.prompts and not torch.equal(c.responses, a.responses)


def test_a_population_member_samples_what_it_samples_alone():
    pop, _ = make(seeds=(3, 0, 5))
    perturb_adapter(pop, seed=1)
    alone, _ = make(seeds=(0,))
    with torch.no_grad():
        for mine, theirs in zip(alone.layers, pop.layers):
            mine.B.copy_(theirs.B[1:2])
    ro, ro1 = pop.rollout(2, 0, 3), alone.rollout(2, 0, 3)
    assert torch.equal(ro.responses[1], ro1.responses[0]) and ro.prompts[1] == ro1.prompts[0]
    assert not torch.equal(ro.responses[0], ro.responses[1])
    with torch.no_grad():
        assert torch.equal(pop.logprobs(ro)[0][1], alone.logprobs(ro1)[0][0])
    assert pop.evaluate()[1] == alone.evaluate()[0]
    assert pop.outcomes[1] == alone.outcomes[0]   # each held-out problem's outcome too


def test_logprobs_are_the_samplers():
    """Log-probs of the sampled tokens equal generate's own tempered scores, despite left padding."""
    task, _ = make({"sampling": {"temperature": 0.7}})
    from grpo_bench.tasks.lm import problems

    batch = [problems.Problem(3, "add", 4), problems.Problem(55, "add", 47)]
    ids, attn = task._prompts(batch)
    torch.manual_seed(0)
    # transformers' own sampler, on the base model (the adapter is 0 here): its scores are the
    # tempered log-probs the task must give back
    with task._stacked.adapters(task.layers, task._stacked.OFF):
        out = task.policy.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=0.7, top_p=1.0,
                                   top_k=0, num_return_sequences=2, max_new_tokens=5,
                                   output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[:, ids.shape[1]:]
    sampler = torch.log_softmax(torch.stack(out.scores, 1).float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    mask, _ = completion_mask(tokens, task.eos)
    t = tokens.shape[1]
    ro = Rollout([batch], tokens.view(1, 2, 2, t), mask.view(1, 2, 2, t), torch.zeros(1, 2, 2),
                 extra={"prompt_ids": ids[None], "prompt_mask": attn[None]})
    with torch.no_grad():
        logp, ent = task.logprobs(ro)
    on = mask.view(1, 2, 2, t) > 0
    torch.testing.assert_close(logp[on], sampler.view(1, 2, 2, t)[on], atol=1e-5, rtol=1e-5)
    assert ent.shape == logp.shape and (ent[on] > 0).all()


def test_reference_with_adapter_off_is_the_base_model():
    task, cfg = make()
    from grpo_bench.tasks.lm import models

    # the same base weights, built independently of peft
    base = models.build_tiny(task.tokenizer, 1, 32, 2, seed=cfg.task.warmstart.seed)
    ro = task.rollout(0, 0, 3)
    perturb_adapter(task)
    with torch.no_grad():
        ref, ref_ent = task.logprobs(ro, reference=True)
        pol, _ = task.logprobs(ro)
        p, b, g, t = ro.responses.shape
        ids = torch.cat([ro.extra["prompt_ids"][0].repeat_interleave(g, 0), ro.responses.view(-1, t)], 1)
        attn = torch.cat([ro.extra["prompt_mask"][0].repeat_interleave(g, 0), ro.mask.view(-1, t).long()], 1)
        logits = base(input_ids=ids, attention_mask=attn, position_ids=models.positions(attn)).logits
        want = torch.log_softmax(logits[:, -t - 1:-1], -1).gather(-1, ro.responses.view(-1, t, 1)).view(p, b, g, t)
    on = ro.mask > 0
    torch.testing.assert_close(ref[on], want[on], atol=1e-5, rtol=1e-5)
    assert ref_ent is None and (pol[on] - ref[on]).abs().max() > 1e-3


def test_snapshot_reference_changes_only_at_refresh():
    task, _ = make()
    trainable = {n for n, p in task.policy.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith((".A", ".B")) for n in trainable)   # the adapters alone train
    ro = task.rollout(0, 0, 3)
    on = ro.mask > 0

    def lp(reference):
        with torch.no_grad():
            return task.logprobs(ro, reference=reference)[0][on]

    perturb_adapter(task, seed=1)
    task.mix_reference([1.0])
    snap = lp(True)
    assert torch.equal(snap, lp(False))  # a hard refresh copies the policy, to the last bit
    perturb_adapter(task, seed=2)
    opt = torch.optim.SGD([p for p in task.policy.parameters() if p.requires_grad], lr=0.1)
    task.logprobs(ro)[0][on].sum().backward()
    opt.step()
    assert torch.equal(lp(True), snap) and (lp(False) - snap).abs().max() > 1e-3  # policy moved, reference did not
    assert {n for n, p in task.policy.named_parameters() if p.requires_grad} == trainable
    task.mix_reference([0.0])
    assert torch.equal(lp(True), snap)   # a weight of 0: no update
    task.mix_reference([1.0])
    assert torch.equal(lp(True), lp(False))


def test_embedding_adapters_and_their_refresh():
    # an adapter on the token embedding: peft's embedding LoRA (A = 0, B random), and a refresh that
    # copies it too (one that skipped embeddings left the reference up to 0.39 nats from the policy)
    task, _ = make({"lora": {"targets": ["c_attn", "wte"]}})
    wte = [layer for layer in task.layers if layer.embedding]
    assert len(wte) == 1 and (wte[0].A == 0).all() and wte[0].B.abs().sum() > 0
    with torch.no_grad():
        for layer in task.layers:
            layer.A.add_(0.3 * torch.randn(layer.A.shape, generator=torch.Generator().manual_seed(3)))
    ro = task.rollout(0, 0, 3)
    with torch.no_grad():
        assert (task.logprobs(ro, reference=True)[0] - task.logprobs(ro)[0]).abs().max() > 1e-3
    task.mix_reference([1.0])
    with torch.no_grad():
        assert torch.equal(task.logprobs(ro, reference=True)[0], task.logprobs(ro)[0])


def _deltas(task, reference, m=0):
    """Each layer's weight update B A of member m: the policy's or the reference's."""
    return [((layer.ref_B if reference else layer.B)[m] @ (layer.ref_A if reference else layer.A)[m]).detach().clone()
            for layer in task.layers]


def test_soft_reference_mixes_the_adapters_weight_updates():
    """Each member's reference moves towards its policy by its own weight: from the adapter switched off the mix is
    exact (rank r); after both factors moved it is the best rank-r approximation (an SVD here), and task.residual is
    each member's worst module's relative error of that cut, 0 for a member that copied."""
    task, _ = make(seeds=(0, 1))
    perturb_adapter(task, seed=5)
    first = _deltas(task, False)
    task.mix_reference([0.6, 1.0])         # from the adapter switched off: 0.6 * update, rank r, exact
    for got, p in zip(_deltas(task, True), first):
        torch.testing.assert_close(got, 0.6 * p, rtol=1e-4, atol=1e-6)
    assert max(task.residual) < 1e-6 and len(task.residual) == 2
    prev = [_deltas(task, True, m) for m in (0, 1)]
    perturb_adapter(task, seed=6)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():   # A moves too: the mix of two updates is then of rank up to 2r
        for layer in task.layers:
            layer.A.add_(0.5 * torch.randn(layer.A.shape, generator=g))
    policy = [_deltas(task, False, m) for m in (0, 1)]
    task.mix_reference([0.25, 1.0])
    cuts = []
    for got, p, r in zip(_deltas(task, True), policy[0], prev[0]):
        mix = 0.25 * p + 0.75 * r
        u, sv, vh = torch.linalg.svd(mix.double())
        k = 8  # the adapter's rank (lora.rank default)
        best = (u[:, :k] * sv[:k]) @ vh[:k]
        torch.testing.assert_close(got.double(), best, rtol=1e-4, atol=1e-6)
        cuts.append(((sv[k:] ** 2).sum() / (sv ** 2).sum()).sqrt().item())
    assert min(cuts) < 0.9 * max(cuts) and min(cuts) > 1e-3   # the modules' cuts differ: the worst is the one kept
    assert task.residual[0] == pytest.approx(max(cuts), rel=1e-3) and task.residual[1] == 0.0
    for got, p in zip(_deltas(task, True, 1), policy[1]):     # member 1 copied its policy: exact
        torch.testing.assert_close(got, p, rtol=0, atol=0)


def test_a_soft_reference_logs_each_runs_rank_cut():
    """The trainer logs ref/mix_residual at every epoch that mixed (every: 1 here): each member's own cut, the one it
    has alone; nothing is logged without a soft mix."""
    from grpo_bench.engine.trainer import train_population
    from grpo_bench.config.presets import merge

    def run(seeds, ref):
        # a length reward: groups' rewards spread as soon as some responses end early, so the adapters move
        cfgs = [resolve_run({"task": merge(SMALL, {"pass_k": 0, "rewards": {"length": 1.0}}), "group_size": 3,
                             "epochs": 4, "inner_steps": 1,
                             "lr": 0.05, "log_every": 1, "eval_every": 0, "kl_coef": 0.1, "kl": "k2",
                             "ref_update": ref, "seed": s}) for s in seeds]
        rows = [[] for _ in seeds]
        train_population(cfgs, rows)
        return [[v for _, k, v in r if k == "ref/mix_residual"] for r in rows]

    soft = {"name": "soft", "every": 1, "alpha": 0.6}
    cut, alone = run((0, 1), soft), run((1,), soft)
    # epochs 1-3 mix (epoch 0's reference is the start). The first two are exact: B is still 0, then only B has
    # moved (A's gradient is 0 while B is), so the reference's update and the policy's share their A. The third
    # mixes two updates with different A: rank up to 2r, cut to r
    assert [len(c) for c in cut] == [3, 3] and cut[0][:2] == [0.0, 0.0] and 1e-4 < cut[0][2] < 1
    assert cut[0] != cut[1] and cut[1] == alone[0]
    assert run((0,), {"name": "hard", "every": 1}) == [[0.0] * 3] and run((0,), "frozen") == [[]]


def save_other_gpt2(path):
    """A GPT-2-shaped model unlike the tiny default: other sizes, other vocabulary order."""
    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = models.prepare_tokenizer(build_char_tokenizer("9876543210=+-*/ "))
    model = models.build_tiny(tok, n_layer=2, n_embd=24, n_head=3, seed=5, n_positions=40)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return tok


def test_model_and_tokenizer_load_from_a_local_directory(tmp_path):
    tok = save_other_gpt2(tmp_path / "other")
    task, _ = make({"model": {"source": str(tmp_path / "other")}})
    assert task.policy.config.n_embd == 24
    assert task.tokenizer.get_vocab() == tok.get_vocab()
    ro = task.rollout(0, 0, 3)
    with torch.no_grad():
        logp, _ = task.logprobs(ro)
    assert torch.isfinite(logp).all()
    assert set(task.evaluate()[0]) == {"eval/accuracy", "eval/reward", "eval/format", "eval/pass@k",
                                       "eval/mean@k", "eval/accuracy_gain"}


def test_pass_and_mean_at_k_from_known_samples(monkeypatch):
    task, _ = make()  # 12 held-out problems, k = 2
    n, k = len(task.heldout), task.cfg.pass_k
    right = [str(p.answer) for p in task.heldout]
    wrong = [str(p.answer + 1) for p in task.heldout]
    # problems 0-3: one of two samples right; 4-7: none; 8-11: both
    samples = [t for i in range(n) for t in ((right[i], wrong[i]) if i < 4 else (wrong[i],) * 2 if i < 8 else (right[i],) * 2)]
    greedy = right[:6] + wrong[6:]
    sampled = []
    monkeypatch.setattr(task, "_generate",   # n: samples of each prompt row
                        lambda ids, attn, gens, n=1: sampled.append(gens is not None) or torch.zeros(len(ids) * n, 1))
    monkeypatch.setattr(task, "_decode", lambda tokens: (samples if sampled[-1] else greedy, torch.ones(len(tokens), 3),
                                                         torch.ones(len(tokens), dtype=torch.bool)))
    out = task.evaluate()[0]
    assert out["eval/pass@k"] == pytest.approx(8 / 12) and k == 2
    assert out["eval/mean@k"] == pytest.approx((4 * 0.5 + 4 * 1.0) / 12)
    assert out["eval/accuracy"] == pytest.approx(0.5) and out["eval/accuracy_gain"] == 0.0  # base = same greedy


def test_warmstart_is_cached_by_config(tmp_path, monkeypatch):
    from grpo_bench.tasks.lm import warmstart

    save_other_gpt2(tmp_path / "other")
    task_cfg = {"model": {"source": str(tmp_path / "other")}, "warmstart": {"steps": 3, "batch": 8}}
    cfg = make(task_cfg)[1].task
    first = warmstart.checkpoint(cfg, torch.device("cpu"))
    assert (first / "done.json").exists() and not list(first.parent.glob(".tmp-*"))

    def no_build(*a, **k):
        raise AssertionError("rebuilt a cached warm-start")

    monkeypatch.setattr(warmstart, "_build", no_build)
    assert warmstart.checkpoint(cfg, torch.device("cpu")) == first
    cfg.warmstart.lr *= 2  # another config is another checkpoint
    with pytest.raises(AssertionError, match="rebuilt"):
        warmstart.checkpoint(cfg, torch.device("cpu"))


def test_the_warm_start_cache_and_what_names_its_entries(tmp_path, monkeypatch):
    """The cache is the repository's .cache/grpo_bench unless GRPO_BENCH_CACHE says otherwise; an entry is named by
    what shapes the model: a local model's files (a rewritten one is another model), tiny-scratch's shape (and
    only tiny-scratch's)."""
    import os
    import time as _time
    from grpo_bench.tasks.lm import warmstart

    monkeypatch.delenv("GRPO_BENCH_CACHE", raising=False)
    assert warmstart.cache_root() == ROOT / ".cache" / "grpo_bench"
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "c"))
    assert warmstart.cache_root() == tmp_path / "c"

    def spec(**task):
        return warmstart.spec(resolve_run({"task": {"name": "arithmetic", "warmstart": {"steps": 3}, **task}}).task)

    scratch = spec(model={"source": "tiny-scratch", "layers": 1, "width": 32, "heads": 2})
    assert scratch["tiny"] == [1, 32, 2] and scratch != spec(model={"source": "tiny-scratch", "layers": 2,
                                                                     "width": 32, "heads": 2})
    save_other_gpt2(tmp_path / "other")
    local = spec(model={"source": str(tmp_path / "other")})
    assert "tiny" not in local and local["model"][0] == str((tmp_path / "other").resolve())
    weights = next((tmp_path / "other").glob("*.safetensors"))
    _time.sleep(0.01)
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert spec(model={"source": str(tmp_path / "other")}) != local


def test_a_warm_start_trains_on_one_thread_without_dropout_and_shares_its_cache(tmp_path, monkeypatch):
    """One CPU thread while it trains, whatever the caller's (the stopping point must not depend on the worker), the
    caller's count restored after; the base's dropout off; the cache entry readable by other users."""
    from grpo_bench.tasks.lm import warmstart

    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "cache"))
    seen = {}

    def sft(model, tokenizer, cfg, device, check=None):
        seen["threads"] = torch.get_num_threads()
        seen["dropout"] = {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)}
        return 0.5

    monkeypatch.setattr(warmstart, "sft", sft)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        save_other_gpt2(tmp_path / "other")
        config = json.loads((tmp_path / "other/config.json").read_text())   # saved with GPT-2's own dropout
        (tmp_path / "other/config.json").write_text(json.dumps(config | {k: 0.1 for k in (
            "resid_pdrop", "embd_pdrop", "attn_pdrop")}))
        cfg = make({"model": {"source": str(tmp_path / "other")}, "warmstart": {"steps": 3, "batch": 8}})[1].task
        done = warmstart.checkpoint(cfg, torch.device("cpu"))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert seen == {"threads": 1, "dropout": {0.0}}
    assert re.fullmatch(r"warmstart-[0-9a-f]{16}", done.name) and done.stat().st_mode & 0o777 == 0o755
    assert json.loads((done / "done.json").read_text())["last_batch_token_accuracy"] == 0.5


def test_short_run_end_to_end_is_deterministic():
    from grpo_bench.engine.trainer import train

    raw = {"task": {**SMALL, "warmstart": {"steps": 20, "batch": 16}}, "group_size": 3, "epochs": 3,
           "inner_steps": 2, "kl_coef": 0.05, "ref_update": {"name": "hard", "every": 2}, "eval_every": 2, "lr": 1e-3}
    rows_a, rows_b = [], []
    summary = train(resolve_run(copy.deepcopy(raw)), rows=rows_a)
    train(resolve_run(copy.deepcopy(raw)), rows=rows_b)
    untimed = lambda rows: [r for r in rows if not r[1].startswith("time/")]  # noqa: E731
    assert untimed(rows_a) == untimed(rows_b)
    for key in ("final/eval/accuracy", "final/eval/pass@k", "final/reward"):
        assert 0.0 <= summary[key] <= 1.1
    metrics = {m for _, m, _ in rows_a}
    assert {"reward/correct", "kl/value", "eval/accuracy", "entropy"} <= metrics


def test_chat_template_prompts_and_turn_end_token(tmp_path):
    """A tokenizer with a chat template: prompts go through it, completions end at its turn-end token."""
    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer("0123456789+-*/=() .,:?abcdefghijklmnopqrstuvwxyzCRW\n")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    models.build_tiny(tok, n_layer=1, n_embd=32, n_head=2, seed=0, n_positions=128).save_pretrained(tmp_path / "chat")
    tok.save_pretrained(tmp_path / "chat")

    task, _ = make({"model": {"source": str(tmp_path / "chat")}, "ops": {"mul": [0, 12]}, "eval_size": 20})
    assert task.template == "chat"
    ro = task.rollout(0, 0, 3)
    ids, attn = ro.extra["prompt_ids"][0, -1], ro.extra["prompt_mask"][0, -1]
    prompt = task.tokenizer.decode(ids[attn > 0], skip_special_tokens=False)  # without the left padding
    p = ro.prompts[0][-1]
    turn = f"Compute {p.a} * {p.b}. Reply with the integer only."
    assert prompt == f"<|im_start|>user\n{turn}<|im_end|>\n<|im_start|>assistant\n"
    assert task.tokenizer.convert_tokens_to_ids("<|im_end|>") in task.eos.tolist()
    with torch.no_grad():
        assert torch.isfinite(task.logprobs(ro)[0]).all()


def test_default_lora_targets_per_architecture():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_bench.tasks.lm import models

    def targets(model):
        peft_model = models.attach_lora(model, rank=2, alpha=4, dropout=0.0, targets=None)
        return {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in peft_model.named_parameters() if "lora_A" in n}

    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))
    assert targets(qwen) == set(models.LORA_TARGETS["qwen2"])
    task, _ = make()
    lora = {n.rsplit(".", 2)[-2] for n, p in task.policy.named_parameters() if p.requires_grad}
    assert lora == {"c_attn", "c_proj", "c_fc"} and len(task.layers) == 4   # one layer: attn c_attn, c_proj; mlp c_fc, c_proj


def test_special_tokens_inside_a_completion_are_not_skipped():
    # `4<pad><bos>2<eos>` once decoded as `42` (skip_special_tokens): scored correct and well-formed
    task, _ = make()
    tok = task.tokenizer
    ids = [tok.convert_tokens_to_ids(c) for c in "4"] + [tok.pad_token_id, tok.bos_token_id] + \
          [tok.convert_tokens_to_ids("2"), tok.eos_token_id]
    clean = [tok.convert_tokens_to_ids(c) for c in "42"] + [tok.eos_token_id, tok.pad_token_id, tok.pad_token_id]
    texts, mask, finished = task._decode(torch.tensor([ids, clean]))
    assert texts == ["4<pad><bos>2", "42"] and finished.tolist() == [True, True]
    from grpo_bench.tasks.lm.problems import Problem
    total, parts = task._score([Problem(40, "add", 2)], texts, *task._host(mask, finished), 2)
    assert parts["correct"] == [0.0, 1.0] and parts["format"] == [0.0, 1.0]


def test_on_policy_step_is_exact_with_lora_dropout(monkeypatch):
    # K = 1: the old log-probs are the gradient pass's own, so the ratio is 1 to the last bit
    # even though dropout makes every train-mode pass different (it was not, with old log-probs
    # from a separate eval-mode pass)
    from grpo_bench.tasks.lm import stacked
    from grpo_bench.engine.trainer import train

    attach = stacked.attach

    def attach_nonzero(*args, **kwargs):  # LoRA's B starts at 0, where dropout changes nothing
        layers = attach(*args, **kwargs)
        perturb_adapter(type("T", (), {"layers": layers})(), scale=0.5, seed=7)
        return layers

    monkeypatch.setattr(stacked, "attach", attach_nonzero)
    base = {"task": {"name": "arithmetic_tiny", "prompts_per_step": 4, "pass_k": 0, "lora": {"dropout": 0.3}},
            "group_size": 3, "epochs": 2, "loss": {"name": "clipped", "clip_low": 0.01, "clip_high": 0.01}}
    rows = []
    train(resolve_run({**base, "inner_steps": 1}), rows=rows)
    assert {v for _, m, v in rows if m in ("ratio/max", "ratio/min")} == {1.0}
    assert {v for _, m, v in rows if m == "clip/frac"} == {0.0}
    rows = []
    train(resolve_run({**base, "inner_steps": 2, "log_every": 1}), rows=rows)
    first = [v for s, m, v in rows if m == "ratio/max" and s == 0]
    assert first[0] > 1.0  # K = 2 keeps the eval-mode pass: dropout alone moves the first ratio


@pytest.mark.parametrize("backend, tau", [("auto", 0.7), ("torch", 2.0)])
def test_tempered_logprobs_are_the_samplers_fp32_ones(backend, tau):
    # a bf16 model: the sampler divides fp32 logits by the temperature, and so must the log-probs, through the fused
    # head and through the materialised logits
    task, _ = make({"sampling": {"temperature": tau}}, backend=backend)
    ro = task.rollout(0, 0, 3)
    task.policy.to(torch.bfloat16)
    with torch.no_grad():
        logp, _ = task.logprobs(ro)
        p, b, g, t = ro.responses.shape
        from grpo_bench.tasks.lm import models
        ids = torch.cat([ro.extra["prompt_ids"][0].repeat_interleave(g, 0), ro.responses.view(-1, t)], 1)
        attn = torch.cat([ro.extra["prompt_mask"][0].repeat_interleave(g, 0), ro.mask.view(-1, t).long()], 1)
        logits = task.policy(input_ids=ids, attention_mask=attn, position_ids=models.positions(attn)).logits
        want = torch.log_softmax(logits[:, -t - 1:-1].float() / tau, -1)
        want = want.gather(-1, ro.responses.view(-1, t, 1)).view(p, b, g, t)
    on = ro.mask > 0
    torch.testing.assert_close(logp[on], want[on], rtol=0, atol=1e-6)


def test_a_bf16_base_keeps_fp32_adapters():
    # as peft's autocast_adapter_dtype: the trained weights stay fp32 over a bf16 base
    task, _ = make({"model": {"dtype": "bf16"}})
    base = [p for p in task.policy.parameters() if not p.requires_grad]
    assert base and all(p.dtype == torch.bfloat16 for p in base)
    assert all(layer.A.dtype == layer.B.dtype == torch.float32 for layer in task.layers)
    perturb_adapter(task)
    ro = task.rollout(0, 0, 3)
    logp, _ = task.logprobs(ro)
    logp[ro.mask > 0].sum().backward()
    assert all(layer.B.grad is not None and layer.B.grad.dtype == torch.float32 for layer in task.layers)
    fp32, _ = make({"model": {"dtype": "fp32"}})
    assert all(p.dtype == torch.float32 for p in fp32.policy.parameters())
    from grpo_bench.errors import ConfigError
    with pytest.raises(ConfigError, match="task.model.dtype: unknown 'fp8'; valid: auto, fp32, bf16"):
        make({"model": {"dtype": "fp8"}})


def test_gradient_checkpointing_gives_the_same_numbers_in_less_memory():
    """model.gradient_checkpointing recomputes each block in the backward: the log-probs and every adapter's
    gradient are the same bits, and a gradient pass's peak allocation is lower (what lets a pretrained model's
    population fit a GPU); with LoRA dropout it is refused (the recompute would draw other masks)."""
    import torch

    from grpo_bench.config.run import resolve_run
    from grpo_bench.registry import get
    from helpers import cpu_allocations

    def build(gc, dropout=0.0):
        task = {"name": "arithmetic", "prompts_per_step": 4, "eval_size": 8, "pass_k": 0, "lora": {"dropout": dropout},
                "model": {"source": "tiny-scratch", "layers": 4, "width": 64, "heads": 2, "gradient_checkpointing": gc}}
        cfgs = [resolve_run({"task": task, "seed": s, "group_size": 4}) for s in (0, 1)]
        return get("task", cfgs[0].task_name)(cfgs[0].task, cfgs)

    results = []
    for gc in (False, True):
        task = build(gc)
        with torch.no_grad():
            for layer in task.layers:   # B = 0 at the start would leave A's gradient 0 either way
                layer.B.normal_(0, 0.1, generator=torch.Generator().manual_seed(3))
        ro = task.rollout(0, 0, 4)

        def step():
            logp, _ = task.logprobs(ro)
            (logp * ro.mask).sum().backward()
            return logp.detach()

        events = cpu_allocations(step)
        peak = max(total for _, total in events) - (events[0][1] - events[0][0])   # above what was held before
        for layer in task.layers:
            layer.A.grad = layer.B.grad = None
        logp = step()
        results.append((logp, [g.clone() for layer in task.layers for g in (layer.A.grad, layer.B.grad)], peak))
    (lp0, g0, peak0), (lp1, g1, peak1) = results
    assert torch.equal(lp0, lp1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert peak1 < 0.8 * peak0, (peak0, peak1)
    assert any(g.abs().sum() > 0 for g in g0[::2])   # A's gradients are not all zero: the test sees them
    with pytest.raises(ValueError, match="model.gradient_checkpointing: needs lora.dropout 0"):
        build(True, dropout=0.1)


def test_each_members_length_and_format_rewards_read_its_own_responses():
    """A population of two's rollout on the scratchpad start: each response's `length` component is -(its tokens, EOS
    included) / max_new_tokens and its format component 0 where it was cut off (no EOS), read from that member's
    rows; the total is their weighted sum. A length off by one, another member's rows or `finished` read the wrong
    way fails."""
    from grpo_bench.registry import get
    raws = [{"task": {"name": "arithmetic_scratchpad", "prompts_per_step": 3, "pass_k": 0,
                      "rewards": {"scratchpad_format": 1.0, "length": 0.5}, "sampling": {"max_new_tokens": 8}},
             "group_size": 4, "seed": s} for s in (0, 1)]
    cfgs = [resolve_run(r) for r in raws]
    task = get("task", "arithmetic")(cfgs[0].task, cfgs)
    ro = task.rollout(0, 0, 4)
    tokens = ro.mask.sum(-1)                                          # (P, B, G)
    weights = dict(cfgs[0].task.rewards)          # the preset's own rewards, these two among them
    col = {name: i for i, name in enumerate(weights)}
    fmt, length = ro.components[..., col["scratchpad_format"]], ro.components[..., col["length"]]
    assert torch.equal(length, -tokens / 8) and len(set(tokens.flatten().tolist())) > 1
    assert not fmt[~ro.finished].any() and (~ro.finished).any() and fmt[ro.finished].any()
    from grpo_bench.algos.rewards import scratchpad_format   # each text again, with the rollout's own ends
    texts, _, _ = task._decode(ro.responses.reshape(-1, ro.responses.shape[-1]))
    assert fmt.flatten().tolist() == scratchpad_format([], texts, finished=ro.finished.flatten().tolist())
    torch.testing.assert_close(ro.rewards, sum(w * ro.components[..., col[n]] for n, w in weights.items()))
    assert not torch.equal(ro.responses[0], ro.responses[1])


def test_a_rollouts_metrics_are_each_members_means_over_its_own_responses():
    """reward/<name>, response/finished and the lengths split by correctness (what length_bias is judged on) are,
    per member, plain means over that member's responses, worked out here from the rollout's components, ends and
    masks: a sum for a mean, the correct answers' lengths under 'incorrect', or another member's rows fail."""
    raws = [{"task": {"name": "arithmetic_scratchpad", "prompts_per_step": 6, "pass_k": 0,
                      "rewards": {"scratchpad_format": 1.0, "length": 0.5}, "sampling": {"max_new_tokens": 24}},
             "group_size": 4, "seed": s} for s in (0, 1)]
    cfgs = [resolve_run(r) for r in raws]
    task = get("task", "arithmetic")(cfgs[0].task, cfgs)
    ro = task.rollout(0, 0, 4)
    col = {name: i for i, name in enumerate(cfgs[0].task.rewards)}
    tokens = ro.mask.sum(-1).double()
    for p in range(2):
        for name, i in col.items():
            assert ro.metrics[f"reward/{name}"][p].item() == pytest.approx(ro.components[p, ..., i].double().mean().item())
        assert ro.metrics["response/finished"][p].item() == pytest.approx(ro.finished[p].double().mean().item())
        right = ro.components[p, ..., col["correct"]] > 0.5
        assert right.any() and (~right).any()   # both kinds, so neither mean is empty
        assert ro.metrics["response/length_correct"][p].item() == pytest.approx(tokens[p][right].mean().item())
        assert ro.metrics["response/length_incorrect"][p].item() == pytest.approx(tokens[p][~right].mean().item())
    assert ro.metrics["response/length_incorrect"][0] != ro.metrics["response/length_incorrect"][1]


def test_a_task_that_names_only_arithmetic_gets_the_documented_presets_settings():
    """The dataclass defaults are tasks/arithmetic_tiny.yaml's (docs/extending.md's example preset), its 6-token
    budget aside; and each task's reward limit is the one docs/reliability.md gives."""
    import re
    from pathlib import Path
    import yaml
    root = Path(__file__).resolve().parents[1]
    preset = yaml.safe_load((root / "tasks/arithmetic_tiny.yaml").read_text())["task"]
    c = resolve_run({"task": {"name": "arithmetic"}}).task
    assert (c.model.source, c.ops, c.prompts_per_step, c.sampling.temperature, c.rewards, c.eval_size, c.eval_seed,
            c.pass_k) == (preset["model"]["source"], preset["ops"], preset["prompts_per_step"],
                          preset["sampling"]["temperature"], preset["rewards"], preset["eval_size"],
                          preset["eval_seed"], preset["pass_k"])
    doc = (root / "docs/reliability.md").read_text()
    limits = dict(re.findall(r"(sort|arithmetic|gym) (\d+) s", re.search(r"reward_timeout` \((sort[^;]*);", doc)[1]))
    assert limits and c.reward_timeout == float(limits["arithmetic"])


@pytest.mark.parametrize("task, key", [
    ({"reward_timeout": -1}, "reward_timeout"), ({"sampling": {"temperature": 0.0}}, "sampling.temperature"),
    ({"sampling": {"top_p": 1.5}}, "sampling.top_p"), ({"warmstart": {"steps": 3, "lr": 0.0}}, "warmstart"),
    ({"warmstart": {"scratchpad": 1.01}}, "warmstart.scratchpad"), ({"eval_size": 0}, "eval_size"),
    ({"model": {"quantization": "Q4_1"}}, "model.quantization"),
    ({"model": {"source": "/no/such/checkpoint"}}, "model.source"),
])
def test_each_task_bound_refuses_the_value_just_beyond_it(task, key):
    from grpo_bench.config.presets import merge
    with pytest.raises(Exception, match=key.replace(".", r"\.")):
        resolve_run({"task": merge(SMALL, task)})


def test_each_task_bound_takes_its_edge():
    """The edges the checks' comparisons must let through: a full scratchpad share, one held-out problem or exactly
    half the problem space, a one-example warm-up batch, top_p 1."""
    from grpo_bench.tasks.lm import problems
    half = problems.space_size(SMALL["ops"]) // 2
    for task in ({"warmstart": {"scratchpad": 1.0}}, {"eval_size": 1, "pass_k": 0}, {"eval_size": half},
                 {"warmstart": {"steps": 3, "batch": 1, "lr": 1e-3}}, {"sampling": {"top_p": 1.0}},
                 {"reward_timeout": 0}, {"eval_size": 12, "eval_subset": 12}, {"eval_subset": 0}):
        from grpo_bench.config.presets import merge
        resolve_run({"task": merge(SMALL, task)})
    with pytest.raises(Exception, match="eval_size"):
        resolve_run({"task": merge(SMALL, {"eval_size": half + 1})})


def test_the_lm_sections_defaults_are_the_documented_ones():
    """What a task gets for every key its file leaves out (the sections' docstrings say the same)."""
    from grpo_bench.tasks.lm.sections import LoraSection, ModelSection, SamplingSection, WarmstartSection
    m, lora, warm, samp = ModelSection(), LoraSection(), WarmstartSection(), SamplingSection()
    assert (m.source, m.layers, m.width, m.heads, m.dtype, m.cast_lm_head_to_fp32, m.gradient_checkpointing,
            m.shared_prefix, m.quantization) == ("tiny", 2, 128, 4, "auto", False, False, False, "")
    assert (lora.rank, lora.alpha, lora.dropout, lora.targets) == (8, 16, 0.0, None)
    assert (warm.steps, warm.batch, warm.lr, warm.seed, warm.scratchpad) == (0, 64, 3e-3, 0, 0.0)
    assert (samp.temperature, samp.top_p, samp.max_new_tokens, samp.shared_prefill) == (1.0, 1.0, 8, False)


def test_a_shipped_start_names_its_weights_in_the_run_id():
    from grpo_bench.tasks.lm import shipped
    c = resolve_run({"task": {"name": "arithmetic_scratchpad"}}).task
    assert c.weights_id() is not None and c.weights_id() == shipped.weights_id(c)


def test_held_out_reward_format_and_outcomes_add_up_per_member():
    """With rewards correct 1.0 and scratchpad_format 1.0 (what eval/format reads), each member's held-out reward is its accuracy plus its format rate,
    and its per-problem greedy outcomes count its correct answers: eval/reward and eval/format left at 0, another
    member's rows or the reward list taken for the outcomes fail."""
    raws = [{"task": {"name": "arithmetic_scratchpad", "pass_k": 0,
                      "rewards": {"correct": 1.0, "scratchpad_format": 1.0}}, "seed": s} for s in (0, 1)]
    cfgs = [resolve_run(r) for r in raws]
    task = get("task", "arithmetic")(cfgs[0].task, cfgs)
    perturb_adapter(task, scale=0.5)
    evals = task.evaluate()
    assert evals[0]["eval/accuracy"] != evals[1]["eval/accuracy"]
    for i, e in enumerate(evals):
        assert 0 < e["eval/accuracy"] and 0 < e["eval/format"] <= 1
        assert e["eval/reward"] == pytest.approx(e["eval/accuracy"] + e["eval/format"])
        greedy = task.outcomes[i]["greedy"]
        assert len(greedy) == 1000 and set(greedy) <= {0, 1} and sum(greedy) == round(1000 * e["eval/accuracy"])


def test_remaxs_greedy_baseline_scores_each_members_own_prompts():
    """greedy_rewards (ReMax's baseline) of a population of two: member i's row is what the same task gives for
    seed i alone, on the same rollout's prompts (the slices of a flat batch, per member)."""
    # rewards that read each answer's length and whether it finished, as well as its text
    raws = [{"task": {"name": "arithmetic_scratchpad", "prompts_per_step": 8, "pass_k": 0,
                      "rewards": {"correct": 1.0, "length": 0.1, "scratchpad_format": 0.2},
                      "sampling": {"max_new_tokens": 40}}, "group_size": 2, "seed": s} for s in (0, 1)]
    cfgs = [resolve_run(r) for r in raws]
    both = get("task", "arithmetic")(cfgs[0].task, cfgs)
    ro = both.rollout(0, 0, 2)
    together = both.greedy_rewards(ro)
    # each row scores some answer (an empty slice would fail the member and score it 0 without a test noticing)
    assert together.shape == (2, 8) and not torch.equal(together[0], together[1]) and not both.failed
    assert (together != 0).any(-1).all()
    for i in (0, 1):
        alone = get("task", "arithmetic")(cfgs[i].task, [cfgs[i]])
        mine = alone.rollout(0, 0, 2)
        assert mine.prompts[0] == ro.prompts[i]
        assert torch.equal(alone.greedy_rewards(mine)[0], together[i])


def test_a_members_memory_estimate_is_the_documented_one_and_cpu_runs_train_alone():
    """member_bytes: 24 fp32 values per hidden unit per layer per token (a prompt of 24 and the answer budget, for
    every completion of a step) and 64 MiB; population_cap: one member at a time on a CPU, the memory budget
    elsewhere (docs/config.md)."""
    from grpo_bench.tasks.arithmetic import Arithmetic
    cfg = resolve_run({"task": SMALL, "group_size": 3})
    tokens = 4 * 3 * (24 + 5)
    assert Arithmetic.member_bytes(cfg) == 4 * 24 * tokens * 32 * 1 + (64 << 20)
    deep = resolve_run({"task": {**SMALL, "model": {**SMALL["model"], "layers": 3}}, "group_size": 3})
    assert Arithmetic.member_bytes(deep) == 4 * 24 * tokens * 32 * 3 + (64 << 20)
    deep.task.model.source = "Qwen/Qwen2.5-0.5B-Instruct"   # a hub model, unknown until loaded: 4096 wide, 32 deep
    assert Arithmetic.member_bytes(deep) == 4 * 24 * tokens * 4096 * 32 + (64 << 20)
    cfg.device = "cpu"   # as the runner's plan resolves `auto` before it sizes populations
    assert Arithmetic.population_cap(cfg) == 1
    cfg.device = "cuda"
    assert Arithmetic.population_cap(cfg) == 1 << 30
    # `auto` sized before the plan resolves it: what it means here (no GPU: the CPU's one member)
    cfg.device = "auto"
    with mock.patch("torch.cuda.is_available", return_value=False):
        assert Arithmetic.population_cap(cfg) == 1
    with mock.patch("torch.cuda.is_available", return_value=True), mock.patch("os.cpu_count", return_value=2):
        assert Arithmetic.population_cap(cfg) == 1 << 30


def test_each_starts_headroom_is_what_its_default_recipe_runs_moved():
    """The headroom every arithmetic margin is read from (v3: 5% of it; v4: the odds at its end) is the committed
    default-recipe runs' mean greedy accuracy at step 0 and at the end, on the start it names."""
    from pathlib import Path
    import pandas as pd
    from grpo_bench.tasks.arithmetic import Arithmetic
    results = Path(__file__).resolve().parents[1] / "results"
    for (start, end, why) in (Arithmetic.headroom, *Arithmetic.HEADROOM.values()):
        d = results / why.split("results/")[1].split(" ")[0]
        s = pd.read_csv(d / "summary.csv")
        m = pd.read_parquet(d / "metrics.parquet", filters=[("metric", "==", "eval/accuracy")])
        runs = s[(s.variant == "grpo") & (s.status == "ok")]
        first = m[(m.variant == "grpo") & (m.step == 0)]
        assert len(runs) == len(first) == 5
        assert (start, end) == (round(first.value.mean(), 3), round(runs["final/eval/accuracy"].mean(), 3))


def test_the_tasks_rates_are_declared_on_their_own_bounds_and_more_is_better():
    """A figure draws a declared range as its axis and a report reads 'best' from the direction: a rate is in
    [0, 1], a gain in accuracy in [-1, 1], and higher is better for every held-out one."""
    from grpo_bench.tasks.arithmetic import Arithmetic
    declared = {m.name: m for m in Arithmetic.metrics}
    for name in ("eval/accuracy", "eval/pass@k", "eval/mean@k", "response/finished"):
        assert declared[name].range == (0, 1), name
    assert declared["eval/accuracy_gain"].range == (-1, 1)
    assert all(declared[n].higher_is_better for n in ("eval/accuracy", "eval/accuracy_gain", "eval/reward",
                                                       "eval/pass@k", "eval/mean@k"))
    assert declared["response/length_incorrect"].tail and declared["response/length_correct"].tail


def test_a_checkpoint_saved_with_dropout_trains_without_it(tmp_path):
    """A local GPT-2 saved with GPT-2's own dropout (0.1): the task switches the base's dropout off, so two passes
    in train mode (with gradients, as an inner step) give the same log-probs: only lora.dropout may draw masks."""
    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = models.prepare_tokenizer(build_char_tokenizer("0123456789=+ "))
    model = models.build_tiny(tok, n_layer=1, n_embd=24, n_head=3, seed=5, n_positions=40)
    model.config.resid_pdrop = model.config.embd_pdrop = model.config.attn_pdrop = 0.1
    model.save_pretrained(tmp_path / "drop")
    tok.save_pretrained(tmp_path / "drop")
    task, _ = make({"model": {"source": str(tmp_path / "drop")}})
    perturb_adapter(task)
    ro = task.rollout(0, 0, 3)
    first, second = task.logprobs(ro)[0], task.logprobs(ro)[0]   # with grad: train mode, as an inner step runs
    assert torch.equal(first, second) and first.requires_grad


def _fake_build(calls, delay=0.0, fail=False):
    """warmstart._build as a counted stand-in: a tiny untrained model after `delay` s (or an error), so the cache's
    own logic is what runs."""
    import time as _time

    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    def build(cfg, device, check=None):
        calls.append(cfg.warmstart.lr)
        _time.sleep(delay)
        if fail:
            raise RuntimeError("the SFT broke")
        tok = models.prepare_tokenizer(build_char_tokenizer())
        return models.build_tiny(tok, n_layer=1, n_embd=16, n_head=2, seed=0), tok, 0.25
    return build


def _warm_cfg():
    from grpo_bench.config.presets import merge

    return resolve_run({"task": merge(SMALL, {"warmstart": {"steps": 3}}), "group_size": 3}).task   # no task built


def test_a_warm_start_entry_is_built_once_under_the_name_its_spec_gives(tmp_path, monkeypatch):
    """Two builds of one config at once make one entry (the second waits on the lock, then reads it); the name is
    SHA-256 of the spec's sorted JSON, pinned for the SMALL config (a recipe change must bump VERSION, which renames
    every entry); another config is another entry beside it."""
    import threading

    from grpo_bench.tasks.lm import warmstart

    calls = []
    monkeypatch.setattr(warmstart, "_build", _fake_build(calls, delay=0.5))
    cfg = _warm_cfg()
    got = []
    threads = [threading.Thread(target=lambda: got.append(warmstart.checkpoint(cfg, torch.device("cpu"))))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 2 and got[0] == got[1]
    key = hashlib.sha256(json.dumps(warmstart.spec(cfg), sort_keys=True).encode()).hexdigest()[:16]
    assert got[0].name == f"warmstart-{key}" == "warmstart-6a91313b10c03ce0"
    assert json.loads((got[0] / "done.json").read_text())["spec"]["version"] == warmstart.VERSION
    cfg.warmstart.lr *= 2
    other = warmstart.checkpoint(cfg, torch.device("cpu"))   # the cache's directory exists by now
    assert other != got[0] and (other / "done.json").is_file() and len(calls) == 2


def test_a_failed_warm_start_leaves_no_entry_and_no_scratch(tmp_path, monkeypatch):
    """A build that fails leaves neither an entry nor its scratch directory (the cache's own directories made on the
    way); an entry left incomplete by another process (no done.json) is replaced by the next build."""
    from grpo_bench.tasks.lm import warmstart

    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "not" / "yet"))
    calls = []
    monkeypatch.setattr(warmstart, "_build", _fake_build(calls, fail=True))
    cfg = _warm_cfg()
    with pytest.raises(RuntimeError, match="the SFT broke"):
        warmstart.checkpoint(cfg, torch.device("cpu"))
    root = warmstart.cache_root()
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(warmstart, "_build", _fake_build(calls))
    cfg.warmstart.lr *= 2
    left = root / f"warmstart-{hashlib.sha256(json.dumps(warmstart.spec(cfg), sort_keys=True).encode()).hexdigest()[:16]}"
    left.mkdir()
    (left / "half-written").write_text("")
    assert warmstart.checkpoint(cfg, torch.device("cpu")) == left and len(calls) == 2
    assert (left / "done.json").is_file() and not (left / "half-written").exists()


# ---------------------------------------------- what mutation testing of tasks/arithmetic.py found unheld

def test_lora_dropout_of_one_is_refused():
    """p = 1 would zero every adapter's input and divide by 1 - p = 0."""
    from grpo_bench.config.presets import merge
    with pytest.raises(Exception, match=r"lora\.dropout: must be in \[0, 1\), got 1.0"):
        resolve_run({"task": merge(SMALL, {"lora": {"dropout": 1.0}})})
    resolve_run({"task": merge(SMALL, {"lora": {"dropout": 0.99}})})


def test_the_evaluations_chunks_and_streams_are_the_ones_the_committed_results_were_scored_with(monkeypatch):
    """Greedy generation in chunks of 256 problems per member, pass@k in chunks of 64 that each draw from the member's
    stream ("eval", n-th evaluation, first problem): the sizes and keys decide which samples a run's pass@k counts
    and (on the pinned CPU path) how its GEMMs round, so another chunking would change every committed LM result.
    The base model's accuracy (every adapter off) is read in chunks of 256 too."""
    from grpo_bench.tasks.lm import stacked
    task, _ = make({"eval_size": 300, "pass_k": 1})
    perturb_adapter(task)   # moved: the base's accuracy is a pass of its own
    calls, keys = [], []
    generate, streams = task._generate, task._streams
    monkeypatch.setattr(task, "_generate", lambda ids, attn, gens, *a, **k: calls.append(
        (len(ids), gens is not None, task.layers[0].mode == stacked.OFF)) or generate(ids, attn, gens, *a, **k))
    monkeypatch.setattr(task, "_streams", lambda *key: keys.append(key) or streams(*key))
    task.evaluate()
    task.evaluate()
    greedy, sampled, base = ([n for n, g, off in calls if (g, off) == kind] for kind in
                             ((False, False), (True, False), (False, True)))
    assert greedy == [256, 44] * 2 and sampled == [64, 64, 64, 64, 44] * 2 and base == [256, 44]
    assert keys == [("eval", e, s) for e in (1, 2) for s in (0, 64, 128, 192, 256)]


def test_every_stream_a_run_draws_from_is_keyed_by_what_it_is_for(monkeypatch):
    """The keys of the streams behind a rollout, the reference's samples (A*-PO), the held-out pass@k and the
    LoRA dropout masks: each counter starts at 1 and counts its own calls, so a run's numbers do not depend on how
    often another kind of draw happened (and the committed runs drew from these)."""
    from grpo_bench.numerics import rng
    task, _ = make({"pass_k": 1}, seeds=(4, 9))
    keys = []
    stream = rng.stream
    monkeypatch.setattr(rng, "stream", lambda seed, *key: keys.append((seed, *key)) or stream(seed, *key))
    ro = task.rollout(3, 1, 2)
    task.reference_rewards(ro, 2)
    task.reference_rewards(ro, 2)
    task.evaluate()
    task.logprobs(ro)
    task.logprobs(ro)
    with torch.no_grad():
        task.logprobs(ro)   # no gradient pass, no dropout masks drawn
    n = len(task.layers)
    assert keys == ([(s, "sample", 3, 1) for s in (4, 9)]
                    + [(s, "reference_samples", d) for d in (1, 2) for s in (4, 9)]
                    + [(s, "eval", 1, 0) for s in (4, 9)]
                    + [(s, "dropout", p, i) for p in (1, 2) for i in range(n) for s in (4, 9)])


def test_the_reference_samples_of_each_member_are_the_ones_it_draws_alone():
    """reference_rewards (A*-PO's V* estimate) of a population of two: member i's (B, n) rewards are what seed i
    alone gives, on the same prompts (each member's slice of the flat batch of B n samples)."""
    # rewards that read each sample's length and whether it finished, as well as its text
    raws = [{"task": {"name": "arithmetic_scratchpad", "prompts_per_step": 4, "pass_k": 0,
                      "rewards": {"correct": 1.0, "length": 0.1, "scratchpad_format": 0.2},
                      "sampling": {"max_new_tokens": 40}}, "group_size": 2, "seed": s} for s in (0, 1)]
    cfgs = [resolve_run(r) for r in raws]
    both = get("task", "arithmetic")(cfgs[0].task, cfgs)
    ro = both.rollout(0, 0, 2)
    together = both.reference_rewards(ro, 3)
    assert together.shape == (2, 4, 3) and not both.failed
    assert (together != 0).any(-1).any(-1).all() and not torch.equal(together[0], together[1])
    for i in (0, 1):
        alone = get("task", "arithmetic")(cfgs[i].task, [cfgs[i]])
        assert torch.equal(alone.reference_rewards(alone.rollout(0, 0, 2), 3)[0], together[i])


def test_a_members_length_of_correct_answers_is_missing_when_it_has_none():
    """response/length_correct is NaN (a run logs nothing) for a member with no right answer, not a mean of 0 tokens;
    the untrained scratch model answers nothing right."""
    import math
    task, _ = make(seeds=(0, 1))
    ro = task.rollout(0, 0, 3)
    assert ro.metrics["reward/correct"].tolist() == [0.0, 0.0]
    assert all(math.isnan(v) for v in ro.metrics["response/length_correct"].tolist())
    assert all(v > 0 for v in ro.metrics["response/length_incorrect"].tolist())


def test_sampling_is_in_eval_mode_whatever_mode_the_policy_was_left_in():
    """Rollouts sample without LoRA dropout even when the policy is in train mode (a gradient pass's): the sampler's
    log-probs are old log-probs, which are taken in eval mode."""
    task, _ = make({"lora": {"dropout": 0.5}})
    perturb_adapter(task, scale=1.0)
    task.policy.eval()
    quiet = task.rollout(0, 0, 3)
    task.policy.train()
    for layer in task.layers:   # masks a train-mode pass would draw
        layer.dropout_gens = [torch.Generator().manual_seed(1)]
    assert torch.equal(task.rollout(0, 0, 3).responses, quiet.responses)


def test_only_a_warm_start_of_one_or_more_steps_builds_a_checkpoint(monkeypatch):
    from grpo_bench.tasks.lm import warmstart
    calls = []
    checkpoint = warmstart.checkpoint
    monkeypatch.setattr(warmstart, "checkpoint", lambda cfg, device: calls.append(cfg.warmstart.steps) or
                        checkpoint(cfg, device))
    make()
    make({"warmstart": {"steps": 1, "batch": 2}})
    assert calls == [1]


def test_retiring_problems_leaves_the_rest_and_refuses_to_retire_the_last():
    """A member whose curriculum retired every problem but one draws only that one; retiring it too is refused
    (nothing left to draw). Two operands in [0, 1] make 4 problems, one held out with its twin."""
    from grpo_bench.tasks.lm.problems import Problem
    task, _ = make({"ops": {"add": [0, 1]}, "eval_size": 1, "pass_k": 0, "prompts_per_step": 8}, seeds=(0, 1))
    space = [Problem(a, "add", b) for a in (0, 1) for b in (0, 1)]
    left = [q for q in space if q not in task._exclude[0]]
    assert len(left) >= 2
    task.retire(0, left[1:])
    ro = task.rollout(0, 0, 2)
    assert ro.prompts[0] == [left[0]] * 8 and len(set(ro.prompts[1])) > 1
    with pytest.raises(RuntimeError, match="every training problem is retired"):
        task.retire(0, left[:1])
    task.retire(1, left[1:])   # member 1's retired problems are its own: they stay with it when member 0 goes
    task.keep([1])
    assert task.rollout(0, 0, 2).prompts[0] == [left[0]] * 8


def test_a_members_failed_first_evaluation_does_not_become_the_base_models_accuracy(monkeypatch):
    """The base model's greedy answers are taken from member 0's first evaluation when its adapters are untouched;
    if member 0's verifier raised there, its stand-in zeros are not the base's: the base is scored on its own, and
    member 1's accuracy gain is over the base's real accuracy (here 6 of 12 problems right)."""
    task, _ = make(seeds=(0, 1))
    right = [str(p.answer) for p in task.heldout]
    wrong = [str(p.answer + 1) for p in task.heldout]
    greedy = right[:6] + wrong[6:]
    monkeypatch.setattr(task, "_generate", lambda ids, attn, gens, n=1: torch.zeros(len(ids) * n, 1))
    monkeypatch.setattr(task, "_decode", lambda tokens: ((greedy * (len(tokens) // 12)) if len(tokens) % 12 == 0
                                                         else right[:len(tokens)], torch.ones(len(tokens), 3),
                                                         torch.ones(len(tokens), dtype=torch.bool)))
    correct, raised = task._correct, []

    def flaky(batch, texts, n=1):
        if not raised:
            raised.append(1)
            raise RuntimeError("the verifier broke")
        return correct(batch, texts, n)

    monkeypatch.setattr(task, "_correct", flaky)
    out = task.evaluate()
    assert 0 in task.failed and raised
    assert out[1]["eval/accuracy"] == 0.5 and out[1]["eval/accuracy_gain"] == 0.0


def test_the_base_answers_are_reused_only_while_member_0s_adapters_add_nothing():
    """_unmoved: every module of member 0 has A or B all zero and is in policy mode. One nonzero entry of one module's
    B, or the adapters switched off or to the reference, and the base needs a pass of its own."""
    from grpo_bench.tasks.lm import stacked
    task, _ = make({"model": {"layers": 2}}, seeds=(0, 1))
    assert task._unmoved()
    with torch.no_grad():
        task.layers[1].B[1].fill_(1.0)   # member 1 moved: member 0 is what counts
    assert task._unmoved()
    with torch.no_grad():
        task.layers[-1].B[0][0, 0] = 0.5
    assert not task._unmoved()
    with torch.no_grad():
        task.layers[-1].B[0].zero_()
        task.layers[-1].A[0].zero_()
        task.layers[-1].A[0][0, 0] = 1.0   # A nonzero in one entry, B zero: still no update
    assert task._unmoved()
    with torch.no_grad():
        task.layers[-1].A[0].fill_(1.0)
        task.layers[-1].A[0][0, 0] = 0.0    # one zero entry in A, B nonzero: an update
        task.layers[-1].B[0].fill_(1.0)
    assert not task._unmoved()
    with torch.no_grad():
        task.layers[-1].B[0].zero_()
    for mode in (stacked.OFF, stacked.REFERENCE):
        with stacked.adapters(task.layers, mode):
            assert not task._unmoved()


def test_gradient_checkpointing_is_non_reentrant_by_whichever_name_transformers_has(monkeypatch):
    """transformers 5.24 renamed gradient_checkpointing_enable to activation_checkpointing_enable (the old name warns);
    the task calls the new one where it exists and the old one on older releases, non-reentrant either way (the
    form torch recommends: the reentrant one needs the inputs to require gradients to reach the adapters)."""
    from transformers import PreTrainedModel
    calls = []
    monkeypatch.setattr(PreTrainedModel, "activation_checkpointing_enable",
                        lambda self, kwargs=None, **k: calls.append(("new", kwargs)))
    monkeypatch.setattr(PreTrainedModel, "gradient_checkpointing_enable",
                        lambda self, gradient_checkpointing_kwargs=None, **k: calls.append(
                            ("old", gradient_checkpointing_kwargs)))
    make({"model": {"gradient_checkpointing": True}})
    monkeypatch.setattr(PreTrainedModel, "activation_checkpointing_enable", None)   # as before 5.24
    make({"model": {"gradient_checkpointing": True}})
    make()
    assert calls == [("new", {"use_reentrant": False}), ("old", {"use_reentrant": False})]


def test_only_a_fused_backend_on_a_head_it_does_not_know_warns(monkeypatch):
    """A model whose logits are not known to be lm_head(last hidden state) takes the materialised logits, with a
    warning pointing at the code that built the task; backend torch takes them anyway and says nothing."""
    import inspect
    import warnings
    from grpo_bench.tasks.lm import models
    monkeypatch.setattr(models, "plain_head", lambda model: False)
    cfg = resolve_run({"task": SMALL, "group_size": 3})
    with pytest.warns(UserWarning, match="materialised") as seen:
        line = inspect.currentframe().f_lineno + 1
        get("task", "arithmetic")(cfg.task, [cfg])
    assert [(w.filename, w.lineno) for w in seen if "materialised" in str(w.message)] == [(__file__, line)]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*materialised")
        make(backend="torch")


# ---------------------------------------------- what mutation testing of tasks/lm/passes.py found unheld

def test_the_fused_head_runs_member_by_member_on_a_cpu(monkeypatch):
    """On a CPU the head's GEMM runs once per member on its own rows (the pinned MKL path rounds a GEMM by its row
    count, so one call over every member's rows would not give each run its numbers alone); a population of one is
    one call."""
    for seeds in ((0, 1), (0, 1, 2), (5,)):
        task, _ = make(seeds=seeds)
        ro = task.rollout(0, 0, 3)
        ids, attn, responses, mask = task._flat(ro)
        calls = []
        out = task._through_head(ids, attn, responses, mask, lambda h, w, bias, labels: calls.append(labels) or h,
                                 None, 3)
        if len(seeds) == 1:
            assert len(calls) == 1 and torch.equal(calls[0], responses) and out.shape[0] == len(responses)
        else:
            p = len(seeds)
            rows = len(responses) // p
            assert [len(c) for c in calls] == [rows] * p and len(out) == p
            assert all(torch.equal(c, responses[i * rows:(i + 1) * rows]) for i, c in enumerate(calls))


def test_a_shared_prompt_is_run_once_for_groups_of_two_or_more(monkeypatch):
    """model.shared_prefix takes the prompt-once path for a group of 2 or more (rows of one prompt in runs of
    `group`); a group of one, or the option off, is one pass over prompt and response."""
    task, _ = make({"model": {"shared_prefix": True}})
    ro = task.rollout(0, 0, 2)
    flat = task._flat(ro)
    seen = []
    once = task._prompt_once
    monkeypatch.setattr(task, "_prompt_once", lambda *a: seen.append(a[-1]) or once(*a))
    for group in (1, 2):
        task._through_head(*flat, lambda h, w, bias, labels: h, None, group)
    assert seen == [2]


def test_sum_pi_squared_is_the_eval_mode_one_pass_number_on_a_shared_prompt_too():
    """sum_v pi^2 with model.shared_prefix (each prompt once for its group, the rollout's G) is the one-pass number to
    fp32 rounding, and a policy left in train mode with LoRA dropout gives the eval-mode numbers (no dropout)."""
    numbers = []
    for shared in (False, True):
        task, _ = make({"model": {"shared_prefix": shared}, "sampling": {"max_new_tokens": 4}})
        perturb_adapter(task, scale=1.0)
        ro = task.rollout(0, 0, 3)
        numbers.append(task.sum_pi_squared(ro))
    torch.testing.assert_close(numbers[1], numbers[0], rtol=1e-5, atol=1e-6)
    task, _ = make({"lora": {"dropout": 0.5}})
    perturb_adapter(task, scale=1.0)
    ro = task.rollout(0, 0, 3)
    quiet = task.sum_pi_squared(ro)
    task.policy.train()
    for layer in task.layers:
        layer.dropout_gens = [torch.Generator().manual_seed(1)]
    assert torch.equal(task.sum_pi_squared(ro), quiet)


def test_a_gradient_pass_leaves_the_policy_in_eval_mode():
    """logprobs with a gradient trains (LoRA dropout) and hands the policy back in eval mode, as a sampler or a
    caller's generate expects it."""
    task, _ = make({"lora": {"dropout": 0.5}})
    ro = task.rollout(0, 0, 3)
    task.logprobs(ro)
    assert not task.policy.training


# ---------------------------------------------- what mutation testing of tasks/lm/models.py found unheld

def test_device_auto_is_the_gpu_where_there_is_one_and_cuda_without_one_is_refused():
    from grpo_bench.tasks.lm import models
    with mock.patch("torch.cuda.is_available", return_value=False):
        assert models.resolve_device("auto") == models.resolve_device("cpu") == torch.device("cpu")
        with pytest.raises(RuntimeError, match="device: cuda requested but torch.cuda.is_available"):
            models.resolve_device("cuda")
    with mock.patch("torch.cuda.is_available", return_value=True):
        assert models.resolve_device("auto") == models.resolve_device("cuda") == torch.device("cuda")


def test_the_qwen2_shaped_model_is_the_one_its_docstring_describes():
    """Untied head, grouped KV heads (n_head / 2, at least 1), an MLP of 2 x width, the tokenizer's vocabulary
    unless one is given, 128 positions; weights from its own seed, the caller's random state untouched."""
    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer
    tok = models.prepare_tokenizer(build_char_tokenizer())
    torch.manual_seed(0)
    m = models.build_qwen2(tok, n_layer=1, width=32, n_head=4, seed=3)
    assert torch.rand(1).item() == torch.rand(1, generator=torch.Generator().manual_seed(0)).item()
    c = m.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
            c.max_position_embeddings, c.tie_word_embeddings) == (len(tok), 32, 64, 4, 2, 128, False)
    assert m.lm_head.weight.data_ptr() != m.get_input_embeddings().weight.data_ptr()
    assert models.build_qwen2(tok, 1, 32, 2, seed=3).config.num_key_value_heads == 1
    assert models.build_qwen2(tok, 1, 32, 4, seed=3, vocab=1000).config.vocab_size == 1000
    same, other = (models.build_qwen2(tok, 1, 32, 4, seed=s) for s in (3, 4))
    assert torch.equal(same.lm_head.weight, m.lm_head.weight) and not torch.equal(other.lm_head.weight, m.lm_head.weight)


def test_a_tokenizer_is_prepared_to_pad_on_the_left_with_a_pad_token():
    from transformers import PreTrainedTokenizerFast
    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer
    tok = build_char_tokenizer()
    tok.padding_side = "right"
    pad = tok.pad_token
    assert models.prepare_tokenizer(tok) is tok and tok.padding_side == "left" and tok.pad_token == pad
    bare = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token=tok.eos_token)
    assert bare.pad_token is None
    assert models.prepare_tokenizer(bare).pad_token == tok.eos_token


def test_loading_quiets_transformers_progress_bars_and_restores_them():
    from transformers.utils import logging as hf_logging
    from grpo_bench.tasks.lm import models
    hf_logging.enable_progress_bar()
    with models.quiet_progress():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with models.quiet_progress():
            pass
        assert not hf_logging.is_progress_bar_enabled()   # off before: left off
    finally:
        hf_logging.enable_progress_bar()


def test_every_id_that_ends_a_completion_is_an_eos():
    """The tokenizer's EOS and the generation config's (an int, a list, or none), once each, sorted."""
    from types import SimpleNamespace as NS
    from grpo_bench.tasks.lm import models

    def ids(config_eos, tokenizer_eos):
        return models.eos_ids(NS(generation_config=NS(eos_token_id=config_eos)), NS(eos_token_id=tokenizer_eos))

    assert ids(7, 2) == [2, 7] and ids([9, 7], 2) == [2, 7, 9] and ids(7, 7) == [7]
    assert ids(None, 2) == [2] and ids(7, None) == [7] and ids(None, None) == []


def test_a_local_model_loads_in_the_devices_dtype_unless_one_is_asked_for(tmp_path):
    from grpo_bench.tasks.lm import models
    save_other_gpt2(tmp_path / "m")
    with mock.patch.object(models, "dtype_for", return_value=torch.bfloat16):   # as on a GPU
        assert models.load(str(tmp_path / "m"), torch.device("cpu"))[0].dtype == torch.bfloat16
        assert models.load(str(tmp_path / "m"), torch.device("cpu"), torch.float32)[0].dtype == torch.float32


def _warm_up_adapter(tmp_path):
    """A LoRA adapter directory over a local base, as build-start ships one, and the base merged with it in fp32."""
    import warnings
    from peft import LoraConfig, get_peft_model
    from grpo_bench.tasks.lm import models
    save_other_gpt2(tmp_path / "base")
    base, _ = models.load(str(tmp_path / "base"), torch.device("cpu"), torch.float32)
    with warnings.catch_warnings():   # peft calls an API transformers 5 deprecates
        warnings.simplefilter("ignore", FutureWarning)
        peft = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"], fan_in_fan_out=True))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    peft.save_pretrained(tmp_path / "adapter")
    config = tmp_path / "adapter" / models.ADAPTER
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": str(tmp_path / "base")}))
    return tmp_path / "adapter", peft.merge_and_unload().state_dict()


def test_a_warm_up_adapter_loads_merged_into_its_base_in_the_dtype_asked_for(tmp_path):
    """A shipped adapter (build-start's warm-up of a pretrained base) loads as its base with W + (alpha / r) B A
    merged in fp32 and cast once, in the dtype asked for or the device's; without a FutureWarning of peft's."""
    import warnings
    from grpo_bench.tasks.lm import models
    adapter, merged = _warm_up_adapter(tmp_path)
    models.check_local_source(str(adapter))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model, tok = models.load(str(adapter), torch.device("cpu"), torch.bfloat16)
    state = model.state_dict()
    assert set(state) == set(merged) and all(torch.equal(state[k], v.to(torch.bfloat16)) for k, v in merged.items())
    assert tok.get_vocab() == models.load(str(tmp_path / "base"), torch.device("cpu"))[1].get_vocab()
    with mock.patch.object(models, "dtype_for", return_value=torch.bfloat16):   # as on a GPU
        assert models.load(str(adapter), torch.device("cpu"))[0].dtype == torch.bfloat16


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": ""})),
     "adapter_config.json names no base_model_name_or_path"),
    (lambda d: (d / "adapter_model.safetensors").unlink(), "adapter_config.json without adapter_model.safetensors"),
    (lambda d: (d / "adapter_model.safetensors").write_bytes((d / "adapter_model.safetensors").read_bytes()[:-1]),
     "adapter_model.safetensors is cut short")], ids=["no base", "no weights", "cut short"])
def test_a_damaged_warm_up_adapter_is_refused_by_name(tmp_path, damage, words):
    from grpo_bench.tasks.lm import models
    adapter, _ = _warm_up_adapter(tmp_path)
    damage(adapter)
    with pytest.raises(ValueError, match=f"model.source: {re.escape(str(adapter))}: {words}"):
        models.check_local_source(str(adapter))


def test_a_packaged_gguf_loads_in_the_dtype_asked_for_with_the_tokenizers_pad_id(monkeypatch):
    """The GGUF path: its generation config gets the tokenizer's pad id where it has none (transformers warns at
    every generate() otherwise), and the model comes in the dtype asked for, else the device's."""
    from grpo_bench.tasks.lm import models, pretrained
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer
    tok = models.prepare_tokenizer(build_char_tokenizer("0123456789 "))
    model = models.build_tiny(tok, n_layer=1, n_embd=8, n_head=2, seed=0)
    model.generation_config.pad_token_id = None
    monkeypatch.setattr(pretrained, "load", lambda which: (model, tok) if which == "test_pad" else None)
    try:
        got, _ = models.load("gguf:test_pad", torch.device("cpu"), torch.bfloat16)
        assert got.dtype == torch.bfloat16 and got.generation_config.pad_token_id == tok.pad_token_id is not None
        with mock.patch.object(models, "dtype_for", return_value=torch.float16):
            assert models.load("gguf:test_pad", torch.device("cpu"))[0].dtype == torch.float16
    finally:
        models._load_gguf.cache_clear()


def test_attach_lora_switches_the_base_dropout_off_keeps_its_own_and_warns_of_nothing():
    """A GPT-2 with its own dropout (0.1): after attach_lora every base dropout is 0 and the adapter's is the one
    asked for; GPT-2's Conv1D stores weights transposed (fan_in_fan_out), a Llama's Linear does not; peft's call of
    an API transformers 5 deprecates does not reach the user as a FutureWarning."""
    import warnings
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from grpo_bench.tasks.lm import models
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=16,
                                      resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        peft = models.attach_lora(gpt2, rank=2, alpha=4, dropout=0.2, targets=None)
    assert [str(w.message) for w in seen] == []   # nor peft's note that it corrected fan_in_fan_out
    rates = {name: m.p for name, m in peft.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert rates and all(p == (0.2 if "lora_dropout" in name else 0.0) for name, p in rates.items())
    assert peft.peft_config["default"].fan_in_fan_out
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=20))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert not models.attach_lora(llama, 2, 4, 0.0, None).peft_config["default"].fan_in_fan_out
    assert [str(w.message) for w in seen] == []


def test_eager_attention_only_where_grouped_kv_heads_meet_a_cpu():
    """SDPA's CPU backward sums a KV head's gradient in a batch-dependent order: eager attention on a CPU for a model
    with fewer KV heads than query heads; SDPA kept on a GPU, for full multi-head attention, or with no KV count."""
    from types import SimpleNamespace as NS
    from grpo_bench.tasks.lm import models
    chosen = []

    def model(heads, kv):
        return NS(config=NS(num_attention_heads=heads, num_key_value_heads=kv),
                  set_attn_implementation=lambda name: chosen.append((heads, kv, name)))

    for device in ("cpu", "cuda"):
        for heads, kv in ((4, 2), (4, 4), (4, None)):
            models.batch_invariant_attention(model(heads, kv), torch.device(device))
    assert chosen == [(4, 2, "eager")]


def test_lora_factors_of_linear_and_embedding_modules():
    """Each adapted module's (A, B) for one adapter, whether peft named them lora_A/lora_B (a linear layer) or
    lora_embedding_A/B (an embedding): the update B A has the layer's own shape (an embedding's transposed)."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel
    from grpo_bench.tasks.lm import models
    model = get_peft_model(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=16)),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn", "wte"], fan_in_fan_out=True))
    shapes = sorted(tuple((b @ a).shape) for a, b in models.lora_factors(model, "default"))
    assert shapes == [(16, 20), (48, 16)]
    assert models.lora_factors(model, "ref") == []


def test_a_local_model_without_a_pad_id_gets_its_tokenizers(tmp_path):
    """GPT-2's generation config has no pad id: a model loaded from a directory gets the tokenizer's (its EOS), so
    transformers' own generate, which a user may call on it, pads without a warning."""
    import json
    from grpo_bench.tasks.lm import models
    save_other_gpt2(tmp_path / "m")
    config = tmp_path / "m" / "generation_config.json"
    saved = json.loads(config.read_text())
    config.write_text(json.dumps({k: v for k, v in saved.items() if k != "pad_token_id"}))
    model, tok = models.load(str(tmp_path / "m"), torch.device("cpu"))
    assert tok.pad_token_id is not None and model.generation_config.pad_token_id == tok.pad_token_id
