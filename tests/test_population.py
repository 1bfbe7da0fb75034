"""Populations: P runs stacked on a leading axis give every run the numbers it has alone.

Runs of a population share every part and shape and may differ in seeds and numbers. The
central contract, tested on both tasks: every metric row of a run trained inside a
population equals, to the bit, the row of the same run trained alone (a population of one,
the same code). Seed-matched runs of different variants share their random streams (common
random numbers); different seeds do not (tests/test_sort.py, tests/test_arithmetic.py).
"""
import copy
import math

import pytest
import torch

from grpo_bench.config.run import resolve_run
from grpo_bench.numerics import rng
from grpo_bench.engine.optim import StackedOptimizer, clip_grad_norm
from grpo_bench.sweep.worker import RunSpec, populations, population_key
from grpo_bench.engine.trainer import NonFiniteLoss, train, train_population

SORT = {"task": {"name": "sort", "prompts": None, "n": 4, "vocab": 6, "num_prompts": 5, "dim": 8},
        "group_size": 4, "epochs": 4, "inner_steps": 3, "eval_every": 2}
LM = {"task": {"name": "arithmetic", "ops": {"add": [0, 99]}, "prompts_per_step": 3, "eval_size": 12, "pass_k": 2,
               "model": {"source": "tiny-scratch", "layers": 1, "width": 32, "heads": 2},
               "sampling": {"max_new_tokens": 4}},
      "group_size": 3, "epochs": 3, "inner_steps": 2, "eval_every": 2}


pytestmark = pytest.mark.usefixtures("one_thread")


def _untimed(rows):
    return [r for r in rows if not r[1].startswith("time/")]


def _both_ways(raws, kept=None):
    """(rows and results inside one population, rows and results of each run alone). kept: two lists, filled
    with each run's per-problem held-out outcomes inside the population and alone."""
    cfgs = [resolve_run(copy.deepcopy(r)) for r in raws]
    rows = [[] for _ in cfgs]
    kept = kept or ([], [])
    kept[0][:] = [[] for _ in cfgs]
    together = train_population(cfgs, rows, outcomes=kept[0])
    alone = []
    for raw in raws:
        r = []
        kept[1].append([])
        try:
            out = train(resolve_run(copy.deepcopy(raw)), r, kept[1][-1])
        except NonFiniteLoss as e:
            out = e
        alone.append((out, r))
    return list(zip(together, rows)), alone


SORT_CASES = {
    "seeds": [{}] * 8,
    # members differ in numbers: learning rate, clip bounds, beta, decay, the clipping norm
    "numbers": [{"lr": 1e-3 * (i + 1), "loss": {"name": "clipped", "clip_high": 0.2 + 0.04 * i},
                 "kl_coef": 0.01 * (i + 1), "weight_decay": 0.01 * i, "max_grad_norm": 0.5 + i,
                 "optimizer": "adamw"} for i in range(4)],
    "kl_reward_adaptive_refresh": [{"kl_coef": 0.05, "kl_placement": "reward", "kl_ctrl": "adaptive",
                                    "ref_update": {"name": "soft", "every": 2, "alpha": 0.5 + 0.1 * i}}
                                   for i in range(3)],
    # a member whose mix weight is 0 keeps its reference while the others mix theirs
    "soft_reference_with_alpha_0": [{"kl_coef": 0.05, "ref_update": {"name": "soft", "every": 1, "alpha": a}}
                                    for a in (0.0, 0.5, 1.0)],
    # per-member parts: dynamic sampling's redraws, the entropy quantile, clip_cov's random draws
    "per_member_parts": [{"filters": [{"name": "dynamic_sampling", "max_draws": 3},
                                      {"name": "top_entropy", "rho": 0.5}], "loss": "clip_cov"}] * 3,
    "remax_and_sgd": [{"delta": "remax", "optimizer": "sgd", "lr": 0.05, "inner_steps": 1}] * 3,
    # a sampler two updates old, in bf16, and a correction fed by its log-probs
    "stale_bf16_sampler": [{"sampler": {"precision": "bf16", "staleness": 2}, "corrections": ["token_tis"],
                            "lr": 0.01 * (i + 1)} for i in range(3)],
    # registry v4: per-token deltas from the task's sum of pi^2 and the sampled ids and entropies, the
    # reference's samples for A*-PO's V*, self-normalised IS weights
    "optimal_token_baseline": [{"delta": {"name": "optimal_token_baseline", "eps": 1e-8 * (i + 1)}} for i in range(3)],
    "gtpo": [{"delta": {"name": "gtpo", "threshold": 5.0, "gamma": 0.1 * i}, "loss": "unclipped"} for i in range(3)],
    "a2po": [{"delta": {"name": "a2po", "samples": 3, "beta1": 0.5 + 0.1 * i}, "loss": "a2po", "group_size": 1}
             for i in range(3)],
    "snis": [{"sampler": {"precision": "bf16"}, "corrections": [{"name": "snis", "level": "sequence"}],
              "lr": 0.01 * (i + 1)} for i in range(3)],
}


@pytest.mark.parametrize("case", list(SORT_CASES))
def test_sort_population_equals_runs_alone(case):
    raws = [{**SORT, **over, "seed": s} for s, over in zip([3, 0, 7, 1, 4, 2, 6, 5], SORT_CASES[case])]
    together, alone = _both_ways(raws)
    for (res_p, rows_p), (res_a, rows_a) in zip(together, alone):
        assert _untimed(rows_p) == _untimed(rows_a)    # every metric row, to the bit
        assert res_p == res_a
        assert len(rows_p) > 50


def test_lm_population_equals_runs_alone():
    raws = [{**LM, "seed": s, "kl_coef": 0.05, "ref_update": {"name": "hard", "every": 2},
             "loss": {"name": "clipped", "clip_high": 0.2 + 0.1 * i}, "sampler": {"staleness": 1},
             "corrections": ["token_mis"]} for i, s in enumerate([2, 0, 1])]
    kept = ([], [])
    together, alone = _both_ways(raws, kept)
    for (res_p, rows_p), (res_a, rows_a) in zip(together, alone):
        assert _untimed(rows_p) == _untimed(rows_a)
        assert res_p == res_a and "final/eval/pass@k" in res_p
    assert kept[0] == kept[1] and all(len(k) == 3 * 12 for k in kept[0])   # every problem of 3 evaluations


@pytest.mark.parametrize("over", [{"delta": "optimal_token_baseline"},
                                  {"delta": {"name": "a2po", "samples": 2}, "loss": "a2po", "group_size": 1}],
                         ids=["optimal_token_baseline", "a2po"])
def test_lm_population_equals_runs_alone_with_what_deltas_ask_the_task_for(over):
    # sum of pi^2 through the fused head, the reference adapter's samples: each member's own, as alone
    raws = [{**LM, "seed": s, "lr": 0.01 * (i + 1), **over} for i, s in enumerate([2, 0])]
    together, alone = _both_ways(raws)
    for (res_p, rows_p), (res_a, rows_a) in zip(together, alone):
        assert _untimed(rows_p) == _untimed(rows_a)
        assert res_p == res_a


def test_a_non_finite_member_fails_alone_and_the_others_go_on():
    # member 1's learning rate blows its loss up; members 0 and 2 finish with the numbers they have alone
    raws = [{**SORT, "optimizer": "sgd", "lr": lr, "epochs": 6, "seed": s}
            for s, lr in [(0, 0.05), (1, 1e30), (2, 0.05), (3, 0.05)]]
    together, alone = _both_ways(raws)
    (r0, rows0), (r1, rows1), (r2, rows2), (r3, rows3) = together
    assert isinstance(r1, NonFiniteLoss) and isinstance(alone[1][0], NonFiniteLoss)
    assert "epoch 0" in str(r1)   # early: the others train on for epochs without it
    assert str(r1) == str(alone[1][0]) and _untimed(rows1) == _untimed(alone[1][1])   # up to its failure
    for (res, rows), (res_a, rows_a) in [((r0, rows0), alone[0]), ((r2, rows2), alone[2]), ((r3, rows3), alone[3])]:
        assert res == res_a and _untimed(rows) == _untimed(rows_a) and "final/reward" in res


def test_members_must_share_their_structure():
    cfgs = [resolve_run({**SORT, "seed": 0}), resolve_run({**SORT, "seed": 1, "loss": "naive"})]
    with pytest.raises(ValueError, match="share every part and shape"):
        train_population(cfgs)


# --------------------------------------------------------------------- the optimiser


def test_a_narrowed_optimizer_keeps_each_survivors_own_rate_decay_and_moments():
    """After keep() (a member failed), each member left steps as torch.optim.AdamW does on it alone, with its own lr
    and weight decay and its moments so far: a list left unnarrowed would give member 2 member 1's decay."""
    gen = torch.Generator().manual_seed(0)
    lr, wd = [1e-2, 3e-3, 1e-2], [0.0, 0.3, 0.1]
    stacked = [torch.randn(3, 6, generator=gen).requires_grad_()]
    alone = [stacked[0][i].detach().clone().requires_grad_() for i in range(3)]
    torch_opts = [torch.optim.AdamW([q], lr=lr[i], weight_decay=wd[i], fused=True) for i, q in enumerate(alone)]
    opt = StackedOptimizer(stacked, "adamw", lr, wd)

    def step(params, members):
        grad = torch.randn(3, 6, generator=gen)
        params[0].grad = grad[members].clone()
        opt.step()
        for i in members:
            alone[i].grad = grad[i].clone()
            torch_opts[i].step()
    step(stacked, [0, 1, 2])
    opt.keep([0, 2])
    narrowed = [stacked[0].detach()[[0, 2]].clone().requires_grad_()]
    opt.rebind(narrowed)
    assert [(g[0], g[1]) for g in opt.groups()] == [(1e-2, 0.0), (1e-2, 0.1)]
    for _ in range(2):
        step(narrowed, [0, 2])
    assert torch.equal(narrowed[0][0], alone[0]) and torch.equal(narrowed[0][1], alone[2])


@pytest.mark.parametrize("batched", [False, True], ids=["cpu", "device_paths"])
@pytest.mark.parametrize("kind", ["adam", "adamw", "sgd"])
def test_stacked_optimizer_equals_torch_on_each_member(kind, batched, monkeypatch):
    """One optimiser over (P, ...) parameters equals torch.optim's on each member alone, to the bit,
    each member with its own learning rate and weight decay. On the device paths members 0-1 and 3-4,
    which share theirs, go through one fused call each, over slices whose odd sizes (7, 1031) put the
    CPU kernel's vector tail elsewhere than alone: equal within rounding there (bitwise on CUDA)."""
    monkeypatch.setattr(rng, "DEVICE_PATHS", batched)
    gen = torch.Generator().manual_seed(0)
    lr, wd = [1e-2, 1e-2, 3e-3, 1e-2, 1e-2], [0.1, 0.1, 0.1, 0.05, 0.05]
    stacked = [torch.randn(5, 5, 4, generator=gen).requires_grad_(), torch.randn(5, 7, generator=gen).requires_grad_(),
               torch.randn(5, 1031, generator=gen).requires_grad_()]
    alone = [[p[i].detach().clone().requires_grad_() for p in stacked] for i in range(5)]
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[kind]
    torch_opts = [cls(ps, lr=lr[i], weight_decay=wd[i], fused=True) for i, ps in enumerate(alone)]
    opt = StackedOptimizer(stacked, kind, lr, wd)
    one = lambda *i: [slice(j, j + 1) for j in i]  # noqa: E731
    assert [g[2] for g in opt.groups()] == ([[slice(0, 2)], [slice(2, 3)], [slice(3, 5)]] if batched else
                                            [one(0, 1), one(2), one(3, 4)])
    for _ in range(4):
        grads = [torch.randn(p.shape, generator=gen) for p in stacked]
        for p, g in zip(stacked, grads):
            p.grad = g.clone()
        for i, ps in enumerate(alone):
            for p, g in zip(ps, grads):
                p.grad = g[i].clone()
        opt.step()
        for o in torch_opts:
            o.step()
    for i in range(5):
        for p, q in zip(stacked, alone[i]):
            if batched:
                torch.testing.assert_close(p[i], q, rtol=1e-6, atol=1e-7)
            else:
                assert torch.equal(p[i], q)
    assert not torch.equal(stacked[0][0], alone[1][0])  # a member's update is its own, not a neighbour's


def test_clipping_is_each_members_own_global_norm():
    gen = torch.Generator().manual_seed(1)
    params = [torch.zeros(3, 4, 2, requires_grad=True), torch.zeros(3, 6, requires_grad=True)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * torch.tensor([0.01, 1.0, 10.0]).view(-1, *[1] * (p.dim() - 1))
    want = [math.sqrt(sum(float((p.grad[i] ** 2).sum()) for p in params)) for i in range(3)]
    before = [p.grad.clone() for p in params]
    norms = clip_grad_norm(params, [1.0, 0.0, 2.0])
    assert norms.tolist() == pytest.approx(want, rel=1e-6)
    for i, limit in enumerate([1.0, math.inf, 2.0]):
        scale = min(1.0, limit / (want[i] + 1e-6))
        for p, b in zip(params, before):
            torch.testing.assert_close(p.grad[i], b[i] * scale)
    # a member under its limit, and one with none (0), keep their gradient exactly
    assert torch.equal(params[0].grad[0], before[0][0]) and torch.equal(params[0].grad[1], before[0][1])


# -------------------------------------------------------------------- stacked LoRA


def test_stacked_lora_is_pefts_lora():
    """A population's adapter computes what peft's LoRA computes with the same A and B: outputs and gradients."""
    from grpo_bench.tasks.lm import models, stacked
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = models.prepare_tokenizer(build_char_tokenizer())
    peft_model = models.attach_lora(models.build_tiny(tok, 2, 32, 2, seed=0), rank=4, alpha=8, dropout=0.0,
                                    targets=["c_attn", "c_proj", "c_fc"])
    mine = models.build_tiny(tok, 2, 32, 2, seed=0)
    layers = stacked.attach(mine, ["c_attn", "c_proj", "c_fc"], 4, 8, 0.0, seeds=[0])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for (a, b), layer in zip(models.lora_factors(peft_model, "default"), layers):
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            layer.A.copy_(a[None])
            layer.B.copy_(b[None])
    ids = torch.randint(3, len(tok), (5, 9), generator=gen)
    want = peft_model(input_ids=ids).logits
    got = mine(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    want.square().mean().backward()
    got.square().mean().backward()
    for (a, b), layer in zip(models.lora_factors(peft_model, "default"), layers):
        torch.testing.assert_close(layer.A.grad[0], a.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(layer.B.grad[0], b.grad, rtol=1e-4, atol=1e-6)


def test_lora_dropout_by_hand_each_members_own_mask_per_element():
    """In train mode with p > 0, member m's input is masked element by element (rows x features) from its own stream
    (keep where u >= p) and rescaled by 1 / (1 - p) before A, as peft's dropout on the LoRA branch; the base's product
    sees the input unmasked; in eval mode, or on the reference, or without streams, no mask."""
    from grpo_bench.tasks.lm import stacked

    torch.manual_seed(0)
    base = torch.nn.Linear(6, 3)
    layer = stacked.StackedLoRA(base, rank=2, alpha=4, dropout=0.4, gens=[torch.Generator().manual_seed(s) for s in (1, 2)])
    with torch.no_grad():
        layer.B.copy_(torch.randn(layer.B.shape))
    x = torch.ones(2 * 4, 6)   # two members' 4 rows, every row the same: only masks tell them apart
    layer.train()
    layer.dropout_gens = [torch.Generator().manual_seed(s) for s in (10, 20)]
    got = layer(x)
    want = []
    for m, seed in enumerate((10, 20)):
        keep = (torch.rand(4, 6, generator=torch.Generator().manual_seed(seed)) >= 0.4).float()
        xm = x[4 * m:4 * (m + 1)] * keep / 0.6
        want.append(base(x[4 * m:4 * (m + 1)]) + 2.0 * (xm @ layer.A[m].T) @ layer.B[m].T)
    torch.testing.assert_close(got, torch.cat(want), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got[0], got[1])   # rows of one member draw their own masks
    plain = torch.cat([base(x[4 * m:4 * (m + 1)]) + 2.0 * (x[4 * m:4 * (m + 1)] @ layer.A[m].T) @ layer.B[m].T
                       for m in range(2)])
    layer.eval()
    torch.testing.assert_close(layer(x), plain, rtol=1e-6, atol=1e-6)
    layer.train()
    layer.mix([1.0, 1.0])   # the reference is now a copy of the policy: it never drops
    with stacked.adapters([layer], stacked.REFERENCE):
        torch.testing.assert_close(layer(x), plain, rtol=1e-6, atol=1e-6)
    layer.dropout_gens = None
    torch.testing.assert_close(layer(x), plain, rtol=1e-6, atol=1e-6)


def test_adapters_start_as_pefts_from_each_members_stream():
    """A linear layer's A_m ~ U(-1/sqrt(in), 1/sqrt(in)) from member m's stream for that layer (kaiming_uniform with
    a = sqrt(5)), B_m = 0; an embedding's A_m = 0, B_m ~ N(0, 1): peft's initialisations, drawn by hand."""
    from grpo_bench.tasks.lm import models, stacked
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = models.prepare_tokenizer(build_char_tokenizer())
    model = models.build_tiny(tok, 1, 16, 2, seed=0)
    layers = stacked.attach(model, ["c_fc"], 4, 8, 0.0, seeds=[3, 7])
    n_in = 16
    for m, seed in enumerate((3, 7)):
        u = torch.rand(4, n_in, generator=rng.stream(seed, "lora", "transformer.h.0.mlp.c_fc"))
        assert torch.equal(layers[0].A[m], (u * 2 - 1) * (1 / math.sqrt(n_in)))
    assert not torch.equal(layers[0].A[0], layers[0].A[1]) and not layers[0].B.any()
    emb = stacked.StackedLoRA(torch.nn.Embedding(10, 6), 3, 3, 0.0, [torch.Generator().manual_seed(5)])
    assert not emb.A.any() and torch.equal(emb.B[0], torch.randn(6, 3, generator=torch.Generator().manual_seed(5)))


def test_on_a_cpu_each_members_rows_are_their_own_products_and_generation_warns_of_nothing(monkeypatch):
    """Two members on a CPU: every adapted layer's base product and the LM head's run once per member on its rows
    (the pinned MKL path rounds a GEMM by its row count: a member's numbers must not depend on the others'); one
    member, one product. Generation reads the KV cache by transformers' own name (no deprecation warning)."""
    import warnings

    from grpo_bench.tasks.lm import models, stacked
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = models.prepare_tokenizer(build_char_tokenizer())
    one = stacked.MemberHead._one
    for seeds in ([0, 1], [0]):
        model = models.build_tiny(tok, 1, 16, 2, seed=0)
        layers = stacked.attach(model, ["c_fc"], 2, 4, 0.0, seeds=seeds)   # one adapted layer
        head = model.get_output_embeddings()
        assert isinstance(head, stacked.MemberHead) and head.members_of is layers[0]
        rows = {"base": [], "head": []}
        base_forward = layers[0].base.forward
        monkeypatch.setattr(layers[0].base, "forward", lambda x: rows["base"].append(x.shape[0]) or base_forward(x))
        monkeypatch.setattr(stacked.MemberHead, "_one", lambda self, x: rows["head"].append(x.shape[0]) or one(self, x))
        ids = torch.randint(3, len(tok), (6, 5), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            model(input_ids=ids)
        per = [6 // len(seeds)] * len(seeds)
        assert rows == {"base": per, "head": per}, rows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        tokens = stacked.generate(model, ids, torch.ones_like(ids), 4, torch.tensor([tok.eos_token_id]),
                                  tok.pad_token_id, gens, 1.0, 1.0)
    assert tokens.shape == (6, 4)


def test_the_reference_mix_reports_each_members_rank_cut():
    """mix(weights) moves each member's reference towards its policy by its own weight (0: unchanged, 1: a copy)
    and returns each member's rank-cut error (0 for a copy or an unchanged one), each computed here by hand."""
    from grpo_bench.tasks.lm import models, stacked

    torch.manual_seed(0)
    layer = stacked.StackedLoRA(torch.nn.Linear(8, 8), 2, 4, 0.0, [torch.Generator().manual_seed(s) for s in range(3)])
    with torch.no_grad():
        layer.B.copy_(torch.randn(layer.B.shape))
    assert layer.mix([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0] and torch.equal(layer.ref_A, layer.A)
    with torch.no_grad():
        layer.A.add_(torch.randn(layer.A.shape))
        layer.B.add_(torch.randn(layer.B.shape))
    want = [models.mix_low_rank(layer.A[i], layer.B[i], layer.ref_A[i], layer.ref_B[i], w) for i, w in enumerate((0.3, 0.7))]
    kept = layer.ref_A[2].clone()
    cut = layer.mix([0.3, 0.7, 0.0])
    assert cut == [want[0][2], want[1][2], 0.0] and 0 < want[0][2] != want[1][2] > 0
    for i, (a, b, _) in enumerate(want):
        assert torch.equal(layer.ref_A[i], a) and torch.equal(layer.ref_B[i], b)
    assert torch.equal(layer.ref_A[2], kept)
    layer.keep([2, 0])
    assert layer.A.is_leaf and layer.A.shape[0] == 2 and torch.equal(layer.ref_A[1], want[0][0])


def test_generation_by_hand_against_full_passes_without_a_cache():
    """Left-padded prompts, sampled with each member's Gumbel noise (u from its own stream, one (rows, V) draw a step)
    at temperature 0.7: every token is argmax(logits / T + g) of a full pass over prompt and tokens so far (no KV
    cache), its log-prob log_softmax(logits / T) there; after a row's first EOS it writes pad with log-prob 0."""
    from grpo_bench.tasks.lm import models, stacked
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = models.prepare_tokenizer(build_char_tokenizer())
    model = models.build_tiny(tok, 1, 16, 2, seed=3)
    stacked.attach(model, ["c_attn"], 2, 4, 0.0, seeds=[0, 1])
    ids = torch.tensor([[tok.pad_token_id, 5, 6, 7], [8, 9, 10, 11]] * 2)
    attention = (ids != tok.pad_token_id).long()
    seeds, steps, tau = (4, 9), 6, 0.7

    def by_hand(eos):
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        seq, att = ids.clone(), attention.clone()
        tokens = torch.full((4, steps), tok.pad_token_id)
        logps, done = torch.zeros(4, steps), torch.zeros(4, dtype=torch.bool)
        for t in range(steps):
            with torch.no_grad():
                logits = model(input_ids=seq, attention_mask=att, position_ids=models.positions(att)).logits[:, -1]
            u = torch.cat([torch.rand(2, logits.shape[-1], generator=g) for g in gens])
            nxt = (logits / tau - torch.log(-torch.log(u))).argmax(-1)
            lp = torch.log_softmax(logits / tau, -1).gather(-1, nxt[:, None])[:, 0]
            tokens[:, t] = torch.where(done, tok.pad_token_id, nxt)
            logps[:, t] = torch.where(done, 0.0, lp)
            done |= torch.isin(nxt, torch.tensor(eos, dtype=nxt.dtype))
            if done.all():
                return tokens[:, :t + 1], logps[:, :t + 1]
            seq, att = torch.cat([seq, nxt[:, None]], 1), torch.cat([att, torch.ones(4, 1, dtype=att.dtype)], 1)
        return tokens, logps

    free, _ = by_hand([])   # no EOS: every row runs all the steps
    eos = [int(free[0, 1]), int(free[1, 2])]   # row 0 ends at its 2nd token at the latest, row 1 at its 3rd
    want, want_lp = by_hand(eos)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    got, got_lp = stacked.generate(model, ids, attention, steps, torch.tensor(eos), tok.pad_token_id, gens, tau, 1.0,
                                   with_logprobs=True)
    assert torch.equal(got[:, :want.shape[1]], want) and (got[:, want.shape[1]:] == tok.pad_token_id).all()
    torch.testing.assert_close(got_lp[:, :want.shape[1]], want_lp, rtol=1e-5, atol=1e-5)
    assert (got[0, 2:] == tok.pad_token_id).all() and (got_lp[0, 2:] == 0).all() and (got_lp[0, :2] < 0).all()


def test_nucleus_sampling_by_exact_expectation():
    """top_p keeps the fewest most probable tokens whose tempered mass reaches top_p and samples them in proportion:
    p = (0.5, 0.3, 0.15, 0.05) at top_p 0.6 keeps the first two (token 0 drawn 5/8 of the time); at temperature 0.5
    the tempered first token alone (0.685) reaches it; two tokens of 0.5 at top_p 0.5 keep one, the mass before the
    second having reached it; top_p 1 samples every token."""
    from grpo_bench.tasks.lm import stacked

    n = 4000
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])).repeat(n, 1)

    def draws(z, tau, top_p):
        return stacked._next_tokens(z, [torch.Generator().manual_seed(0)], tau, top_p)

    got = draws(logits, 1.0, 0.6)
    assert set(got.tolist()) == {0, 1} and abs((got == 0).float().mean().item() - 5 / 8) < 4 * (15 / 64 / n) ** 0.5
    assert set(draws(logits, 0.5, 0.6).tolist()) == {0}
    assert set(draws(logits, 1.0, 1.0).tolist()) == {0, 1, 2, 3}
    tie = torch.tensor([0.0, 0.0, -math.inf, -math.inf]).repeat(200, 1)   # softmax: exactly 0.5 and 0.5
    assert len(set(draws(tie, 1.0, 0.5).tolist())) == 1 and set(draws(tie, 1.0, 0.51).tolist()) == {0, 1}
    assert torch.equal(stacked._next_tokens(logits[:3], None, 0.7, 0.6), torch.zeros(3, dtype=torch.long))   # greedy


# ------------------------------------------------------------------------- the runner


def _spec(i, **over):
    cfg = {**SORT, "seed": i % 4, **over}
    return RunSpec(f"r{i}", "v", {}, cfg["seed"], cfg)


def test_runner_groups_compatible_runs_and_balances_workers():
    a = [_spec(i) for i in range(10)]
    b = [_spec(i, lr=0.5, loss={"name": "clipped", "clip_high": 0.3}) for i in range(10, 14)]   # numbers only
    c = [_spec(i, loss="naive") for i in range(14, 20)]                                           # another part
    assert population_key(a[0]) == population_key(b[0]) != population_key(c[0])
    pops = populations(a + b + c, size=8, workers=2)
    # 14 compatible runs in 2 of 7 and 6 in 1: three populations for two workers, so the largest splits again
    assert sorted(len(p) for p in pops) == [4, 5, 5, 6]
    assert len(pops) % 2 == 0 and [len(p) for p in pops] == sorted((len(p) for p in pops), reverse=True)
    for pop in pops:
        assert len({population_key(s) for s in pop}) == 1
    assert sorted(s.run_id for p in pops for s in p) == sorted(s.run_id for s in a + b + c)
    # one worker: the fewest populations of at most `size`
    assert sorted(len(p) for p in populations(a + b + c, size=8, workers=1)) == [6, 7, 7]
    assert [len(p) for p in populations(a[:3], size=1, workers=2)] == [1, 1, 1]


@pytest.mark.parametrize("page", ["docs/populations.md"])
def test_the_docs_recipe_example_trains_a_policy_of_its_own(page):
    """The Recipe loop in docs/populations.md (README links it): the composition in a trainer that is not grpo_bench's."""
    from helpers import ROOT

    text = (ROOT / page).read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 30   # a short example, not a second trainer
    scope: dict = {}
    exec(compile(code, page, "exec"), scope)
    # from a uniform policy (1/5 of positions right) to most of them, with the KL term in the loss
    assert scope["rewards"].mean().item() > 0.6 and scope["stats"]["kl/value"].item() > 0
    assert scope["recipe"].kl_in_loss and scope["loss"].requires_grad


# ------------------------------------------------- a member's own error (issue 31)


def _prompts(seed, epochs, cfg=SORT):
    """Every prompt (as a tuple) that `seed` draws in its first draw of each epoch."""
    from grpo_bench.numerics import rng
    t = cfg["task"]
    return {e: [tuple(r) for r in torch.randint(0, t["vocab"], (t["num_prompts"], t["n"]),
                                                 generator=rng.stream(seed, "prompts", e, 0)).tolist()]
            for e in range(epochs)}


def _prompt_only(seed, epoch, others, cfg=SORT):
    """A prompt that `seed` draws at `epoch` and no seed of `others` draws in any epoch, nor the held-out set."""
    from grpo_bench.tasks.sort import SortTask
    task = SortTask(resolve_run({**cfg, "seed": 0}).task, [resolve_run({**cfg, "seed": 0})])
    taken = {tuple(r) for r in task.eval_set.tolist()}
    taken |= {p for s in others for ps in _prompts(s, cfg["epochs"], cfg).values() for p in ps}
    taken |= {p for e, ps in _prompts(seed, cfg["epochs"], cfg).items() if e < epoch for p in ps}
    return next(p for p in _prompts(seed, epoch + 1, cfg)[epoch] if p not in taken)


def _reward_module(tmp_path, monkeypatch, name, body):
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:reward"


@pytest.mark.parametrize("what", ["raises", "inf for every completion", "inf for one completion"])
def test_a_members_reward_error_fails_only_that_member(tmp_path, monkeypatch, what):
    """A reward that fails on a prompt only seed 1 draws (at epoch 2) fails seed 1 alone, with the error it has
    alone; the others finish with the numbers they have alone. Before: the whole population failed."""
    bad = _prompt_only(1, 2, [0, 2, 3])
    if what == "raises":
        action = "raise ValueError(f'cannot score {p}')"
    elif what == "inf for every completion":
        action = "return [float('inf')] * len(completions)"
    else:
        action = "return [float('inf')] + [1.0] * (len(completions) - 1)"
    name = "member_reward_" + what.replace(" ", "_")
    spec = _reward_module(tmp_path, monkeypatch, name, f"""
BAD = {bad!r}
def reward(prompts, completions, **kw):
    for p in prompts:
        if tuple(p) == BAD:
            {action}
    return [float(sum(c)) for c in completions]
""")
    task = {**SORT["task"], "rewards": {spec: 1.0, "match": 1.0}}
    raws = [{**SORT, "task": task, "seed": s, "lr": 0.01 * (s + 1)} for s in [0, 1, 2, 3]]
    together, alone = _both_ways_any(raws)
    (r1, rows1), (a1, arows1) = together[1], alone[1]
    kind = ValueError if what == "raises" else FloatingPointError
    assert isinstance(r1, kind) and isinstance(a1, kind) and str(r1) == str(a1), (r1, a1)
    assert "cannot score" in str(r1) if what == "raises" else "finite" in str(r1)
    assert _untimed(rows1) == _untimed(arows1) and max(step for step, _, _ in rows1) < 2 * SORT["inner_steps"] + 1
    for i in (0, 2, 3):
        (res, rows), (res_a, rows_a) = together[i], alone[i]
        assert isinstance(res, dict) and res == res_a and _untimed(rows) == _untimed(rows_a)


def _both_ways_any(raws):
    """_both_ways, where a run alone may raise anything."""
    cfgs = [resolve_run(copy.deepcopy(r)) for r in raws]
    rows = [[] for _ in cfgs]
    together = train_population(cfgs, rows)
    alone = []
    for raw in raws:
        r = []
        try:
            out = train(resolve_run(copy.deepcopy(raw)), r)
        except Exception as e:
            out = e
        alone.append((out, r))
    return list(zip(together, rows)), alone


def test_a_reward_error_in_a_redraw_fails_the_member_that_asked_for_it_and_no_other(tmp_path, monkeypatch):
    """Dynamic sampling: seed 1's first-draw groups all score 1.0 (nothing kept), so it asks for a second draw,
    whose prompt the reward cannot score: seed 1 fails as it does alone. Seed 0 keeps every group of its first
    draw; the population draws a second one for it too, whose prompt also raises, but alone seed 0 never
    draws it: not its failure."""
    from grpo_bench.numerics import rng

    cfg = {**SORT, "filters": [{"name": "dynamic_sampling", "max_draws": 3}]}
    t = cfg["task"]

    def drawn(seed, epoch, draw):
        return [tuple(r) for r in torch.randint(0, t["vocab"], (t["num_prompts"], t["n"]),
                                                 generator=rng.stream(seed, "prompts", epoch, draw)).tolist()]

    first = {s: drawn(s, 0, 0) for s in (0, 1)}
    second = {s: drawn(s, 0, 1) for s in (0, 1)}
    elsewhere = {p for s in (0, 1) for e in range(1, cfg["epochs"]) for d in range(3) for p in drawn(s, e, d)}
    bad = [next(p for p in second[s] if p not in elsewhere and p not in first[0] + first[1]) for s in (0, 1)]
    spec = _reward_module(tmp_path, monkeypatch, "member_reward_redraw", f"""
UNIFORM = {set(first[1])!r}
BAD = {set(bad)!r}
def reward(prompts, completions, **kw):
    for p in prompts:
        if tuple(p) in BAD:
            raise ValueError(f'cannot score {{p}}')
    return [1.0 if tuple(p) in UNIFORM else float(sum(c)) for p, c in zip(prompts, completions)]
""")
    raws = [{**cfg, "task": {**t, "rewards": {spec: 1.0}}, "seed": s} for s in (0, 1)]
    together, alone = _both_ways_any(raws)
    (r1, rows1), (a1, arows1) = together[1], alone[1]
    assert isinstance(r1, ValueError) and str(r1) == str(a1) and _untimed(rows1) == _untimed(arows1)
    (r0, rows0), (a0, arows0) = together[0], alone[0]
    assert isinstance(r0, dict) and r0 == a0 and _untimed(rows0) == _untimed(arows0)
    draws0 = [v for _, m, v in rows0 if m == "filter/draws"]
    assert draws0 and set(draws0) == {1.0}                     # seed 0 never asked for a second draw


def test_a_member_whose_own_evaluation_raises_fails_there_and_the_others_go_on(monkeypatch):
    """A scoring error in one member's held-out evaluation (task.failed after evaluate) fails that member with
    it, logging none of that evaluation; the others finish as they do alone."""
    from grpo_bench.engine import trainer

    real, calls = trainer._evaluate, []

    def evaluate(task, mid_run):
        out = real(task, mid_run)
        calls.append(mid_run)
        if len(calls) == 2 and len(out) == 3:  # the population's second evaluation: member 1's scoring raised
            task.failed = {1: ValueError("cannot score a held-out answer")}
        return out

    raws = [{**SORT, "seed": s, "lr": 0.01 * (s + 1)} for s in (0, 1, 2)]
    cfgs = [resolve_run(copy.deepcopy(r)) for r in raws]
    rows = [[] for _ in cfgs]
    monkeypatch.setattr(trainer, "_evaluate", evaluate)
    together = train_population(cfgs, rows)
    monkeypatch.setattr(trainer, "_evaluate", real)
    assert isinstance(together[1], ValueError) and "held-out" in str(together[1])
    evals1 = sorted({step for step, m, _ in rows[1] if m.startswith("eval/")})
    assert len(evals1) == 1                                     # the first evaluation only
    for i in (0, 2):
        alone = []
        assert together[i] == train(resolve_run(copy.deepcopy(raws[i])), alone)
        assert _untimed(rows[i]) == _untimed(alone)


def test_a_rollout_filter_that_draws_sees_its_members_stream_of_each_draw():
    """A rollout-stage part that draws from torch's generator gets, at each draw of an epoch, the stream of its
    member's seed and ("rollout", epoch, draw): the first draw's numbers are not the second's."""
    from grpo_bench import registry
    from grpo_bench.algos.filters import Batch
    from grpo_bench.numerics import rng

    seen = []

    @registry.register("filter", "coin_keep", stage="rollout", needs_group=True, per_member="draws its own coins")
    def coin_keep(batch: Batch) -> Batch:
        """Keep each group on a coin flip."""
        u = torch.rand(batch.rewards.shape[0])
        if batch.rewards.shape == (SORT["task"]["num_prompts"], SORT["group_size"]):  # not the loader's probe
            seen.append(u)
        return batch.replace(keep=u < 0.5, max_draws=3)

    try:
        train(resolve_run({**SORT, "epochs": 1, "seed": 5, "filters": [{"name": "coin_keep"}]}), [])
    finally:
        registry._REGISTRY["filter"].pop("coin_keep", None)
    assert len(seen) >= 2
    for d, u in enumerate(seen):
        g = torch.Generator().manual_seed(rng.stream_seed(5, "part", "rollout", 0, d))
        assert torch.equal(u, torch.rand(len(u), generator=g)), d


def test_an_lm_members_reward_error_fails_only_that_member(tmp_path, monkeypatch):
    from grpo_bench.engine.trainer import build_task
    cfgs = [resolve_run({**LM, "seed": s}) for s in (0, 1, 2)]
    task = build_task(cfgs)
    drawn = [[task._render(q) for e in range(LM["epochs"]) for q in task.rollout(e, 0, 2).prompts[i]]
             for i in range(3)]
    bad = next(t for t in drawn[1][3:6] if t not in drawn[0] + drawn[2])     # seed 1's, at epoch 1
    spec = _reward_module(tmp_path, monkeypatch, "lm_member_reward", f"""
def reward(prompts, completions, **kw):
    if {bad!r} in prompts:
        raise ValueError("cannot score this problem")
    return [0.5] * len(completions)
""")
    task_cfg = {**LM["task"], "rewards": {spec: 1.0, "correct": 1.0}}
    together, alone = _both_ways_any([{**LM, "task": task_cfg, "seed": s} for s in (0, 1, 2)])
    (r1, rows1), (a1, arows1) = together[1], alone[1]
    assert isinstance(r1, ValueError) and str(r1) == str(a1) == "cannot score this problem"
    assert _untimed(rows1) == _untimed(arows1)
    for i in (0, 2):
        (res, rows), (res_a, rows_a) = together[i], alone[i]
        assert isinstance(res, dict) and res == res_a and _untimed(rows) == _untimed(rows_a)


def test_a_reward_that_never_returns_times_out_and_fails_only_its_member(tmp_path, monkeypatch):
    """A reward call waited forever; now it has GRPO_BENCH_REWARD_TIMEOUT seconds, and its run fails alone."""
    bad = _prompt_only(1, 1, [0, 2])
    spec = _reward_module(tmp_path, monkeypatch, "member_reward_hangs", f"""
import time
BAD = {bad!r}
def reward(prompts, completions, **kw):
    if any(tuple(p) == BAD for p in prompts):
        time.sleep(3600)
    return [float(sum(c)) for c in completions]
""")
    monkeypatch.setenv("GRPO_BENCH_REWARD_TIMEOUT", "0.5")
    task = {**SORT["task"], "rewards": {spec: 1.0}}
    together, alone = _both_ways_any([{**SORT, "task": task, "seed": s} for s in [0, 1, 2]])
    (r1, rows1), (a1, arows1) = together[1], alone[1]
    assert type(r1).__name__ == "RewardTimeout" and str(r1) == str(a1) and "within 0.5 s" in str(r1)
    assert _untimed(rows1) == _untimed(arows1)
    for i in (0, 2):
        assert isinstance(together[i][0], dict) and together[i][0] == alone[i][0]


# ------------------------------------------- members that differ, against the same runs alone (issue 31)

DIFFER = {
    # a part run member by member must get its member's numbers: each rho, clip_cov bound and lr is another
    "top_entropy_clip_cov_dynamic_sampling": [
        {"filters": [{"name": "dynamic_sampling", "max_draws": 3}, {"name": "top_entropy", "rho": rho}],
         "loss": {"name": "clip_cov", "clip_cov_ratio": ratio, "clip_cov_lb": lb, "clip_high": 0.1 + 0.05 * i},
         "lr": 0.002 * (i + 1)}
        for i, (rho, ratio, lb) in enumerate([(0.2, 0.02, -1.0), (0.5, 0.2, 0.0), (0.9, 0.5, 0.5)])],
    "kl_cov": [{"loss": {"name": "kl_cov", "kl_cov_ratio": ratio, "ppo_kl_coef": coef}, "lr": 0.003 * (i + 1)}
               for i, (ratio, coef) in enumerate([(0.05, 0.5), (0.3, 2.0), (0.8, 5.0)])],
    # each member's adaptive controller sees only its own entropy: other targets, starts and steps
    "entropy_controller": [{"entropy_coef": c, "entropy_ctrl": {"name": "adaptive", "target": t, "delta": d},
                            "lr": 0.004 * (i + 1)}
                           for i, (c, t, d) in enumerate([(0.0, 1.55, 0.01), (0.05, 1.56, 0.02), (0.2, 1.6, 0.05)])],
}


@pytest.mark.parametrize("case", list(DIFFER))
def test_members_that_differ_get_their_own_numbers(case):
    raws = [{**SORT, **over, "seed": s} for s, over in zip([2, 0, 1], DIFFER[case])]
    together, alone = _both_ways(raws)
    for (res_p, rows_p), (res_a, rows_a) in zip(together, alone):
        assert isinstance(res_p, dict) and res_p == res_a and _untimed(rows_p) == _untimed(rows_a)
    # the members did differ: no two share their metric rows
    untimed = [tuple(_untimed(rows)) for _, rows in together]
    assert len(set(untimed)) == len(untimed)
    if case == "entropy_controller":   # the coefficients each controller applied went their own ways
        coefs = [[v for _, m, v in rows if m == "entropy/coef"] for _, rows in together]
        assert all(len(c) > 3 for c in coefs) and len({tuple(c) for c in coefs}) == 3
        # entropies near the targets: a controller that read another member's entropy would switch elsewhere
        assert any(0.0 in c and max(c) > 0 for c in coefs), coefs


def test_a_member_failing_beside_a_lagging_sampler_leaves_the_others_their_numbers():
    """A sampler two updates old keeps a history per member: after one member fails, the survivors' history
    must stay theirs."""
    raws = [{**SORT, "sampler": {"precision": "bf16", "staleness": 2}, "corrections": ["token_tis"],
             "optimizer": "sgd", "lr": lr, "epochs": 6, "seed": s}
            for s, lr in [(0, 0.05), (1, 1e30), (2, 0.08)]]
    together, alone = _both_ways(raws)
    assert isinstance(together[1][0], NonFiniteLoss) and str(together[1][0]) == str(alone[1][0])
    assert _untimed(together[1][1]) == _untimed(alone[1][1])
    for i in (0, 2):
        (res, rows), (res_a, rows_a) = together[i], alone[i]
        assert isinstance(res, dict) and res == res_a and _untimed(rows) == _untimed(rows_a)


@pytest.mark.parametrize("case", ["per_member_draws", "entropy_controller"])
def test_after_the_first_member_fails_the_others_keep_their_seeds_and_recipes(case):
    """Member 0 diverges at its first step, so every survivor moves down one index: its per-member random
    draws (clip_cov, dynamic sampling's redraws) must still come from its own seed and its controller must
    still be its own, as alone."""
    over = {"per_member_draws": DIFFER["top_entropy_clip_cov_dynamic_sampling"],
            "entropy_controller": DIFFER["entropy_controller"]}[case]
    raws = [{**SORT, **o, "optimizer": "sgd", "lr": lr, "epochs": 6, "seed": s}
            for o, s, lr in zip(over, [2, 0, 1], [1e30, 0.05, 0.08])]
    together, alone = _both_ways(raws)
    assert isinstance(together[0][0], NonFiniteLoss) and "epoch 0" in str(together[0][0])
    for i in (1, 2):
        (res, rows), (res_a, rows_a) = together[i], alone[i]
        assert isinstance(res, dict) and res == res_a and _untimed(rows) == _untimed(rows_a)


def test_time_per_step_is_the_populations_divided_by_its_members(monkeypatch):
    """time/step_s is what a step cost each run: the population's wall time over the members alive. A clock that
    ticks one second a reading makes a population's steps cost what one run's do, P times over."""
    from grpo_bench.engine import trainer

    class Clock:
        def __init__(self):
            self.t = 0.0

        def perf_counter(self):
            self.t += 1.0
            return self.t

    def times(raws, together):
        monkeypatch.setattr(trainer.time, "perf_counter", Clock().perf_counter)
        if together:
            rows = [[] for _ in raws]
            train_population([resolve_run(copy.deepcopy(r)) for r in raws], rows)
        else:
            rows = [[]]
            train(resolve_run(copy.deepcopy(raws[0])), rows[0])
        return [[(s, v) for s, m, v in r if m == "time/step_s"] for r in rows]

    raws = [{**SORT, "seed": s, "optimizer": "sgd", "lr": lr} for s, lr in [(0, 0.05), (1, 1e30), (2, 0.05), (3, 0.05)]]
    pop = times(raws, True)
    one = times(raws[:1], False)[0]
    assert [s for s, _ in pop[0]] == [s for s, _ in one] and len(one) == SORT["epochs"] * SORT["inner_steps"]
    failed_at = len(pop[1])   # member 1 diverges early: the step it diverged at was shared by four, later ones by three
    assert failed_at < len(one)
    for k, (step, v) in enumerate(one):
        p = 4 if k <= failed_at else 3
        for m in (pop[0], pop[2], pop[3]):
            assert m[k] == (step, pytest.approx(v / p)), (k, step, v, p)


def test_lm_sampling_and_pass_at_k_noise_is_the_seeds_and_shared_across_variants():
    """Common random numbers on the LM beyond the prompts: the sampled completions of a rollout and the k
    samples behind pass@k come from the seed's streams, so two variants of one seed draw the same ones (the
    same untrained policy here: lr does not act before a step) and two seeds draw others."""
    from grpo_bench.engine.trainer import build_task

    def draws(seed, lr):
        cfg = resolve_run({**LM, "seed": seed, "lr": lr, "task": {**LM["task"], "eval_size": 40, "pass_k": 4,
                                                                   "sampling": {"max_new_tokens": 6}}})
        task = build_task([cfg])
        ro = task.rollout(0, 0, cfg.group_size)
        task.policy.eval()
        sampled, generate = [], task._generate

        def spy(ids, attn, gens, *args, **kw):   # what evaluate samples for pass@k (gens: the k samples' streams)
            out = generate(ids, attn, gens, *args, **kw)
            if gens is not None:
                sampled.append(out.clone())
            return out

        task._generate = spy
        task.evaluate()
        return ro.responses, torch.cat(sampled)

    a_resp, a_eval = draws(0, 1e-3)
    b_resp, b_eval = draws(0, 1e-1)   # another variant, same seed
    c_resp, c_eval = draws(1, 1e-3)   # same variant, another seed
    assert torch.equal(a_resp, b_resp) and torch.equal(a_eval, b_eval)
    assert not torch.equal(a_resp, c_resp) and not torch.equal(a_eval, c_eval)


# --------------------------------------------------------------- the device paths (what a GPU runs)


def _hash_reference(seed: int, key: tuple, i: int) -> int:
    """rng.bits32 in plain Python integers, written from the hash's definition (lowbias32, three keyed rounds)."""
    import hashlib

    def mix(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)
    h = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")
    lo, hi = seed & 0xFFFFFFFF, seed >> 32
    k0 = mix(mix(lo ^ (h & 0xFFFFFFFF)) ^ hi)
    k1 = mix(mix(hi ^ (h >> 32)) ^ lo ^ 0x85EBCA6B)
    return mix(((mix(mix(i ^ k0) + k1)) & 0xFFFFFFFF) ^ k0)


def test_device_streams_draw_d_is_the_streams_element_d():
    """DeviceStreams' draw d of member p is uniform((seeds[p], *key, d)), d = 0, 1, ... in call order: what makes a
    token's sampling noise the same whichever population draws it."""
    seeds = torch.tensor([3, 11])
    s = rng.DeviceStreams(seeds, "sample", 5)
    got = [s.rand(2, 4) for _ in range(3)]
    assert all(torch.equal(g, rng.uniform(seeds, ("sample", 5, d), (2, 4))) for d, g in enumerate(got))
    assert len(s) == 2


def test_randint_takes_every_bound_its_product_fits_and_refuses_the_rest():
    """(bits32 * high) >> 32 stays inside int64 while high < 2**31; high 1 draws only 0."""
    seeds = torch.arange(4)
    assert torch.equal(rng.randint(seeds, ("r",), (8,), 1), torch.zeros(4, 8, dtype=torch.int64))
    top = rng.randint(seeds, ("r",), (4096,), 2**31 - 1)
    assert top.min() >= 0 and top.max() < 2**31 - 1 and top.max() > 2**30   # no wrap-around into negatives
    for bad in (0, -3, 2**31):
        with pytest.raises(ValueError, match=rf"high: expected 0 < high < 2\*\*31, got {bad}"):
            rng.randint(seeds, ("r",), (8,), bad)


def test_device_streams_are_the_hash_and_uniform():
    """rng's counter-based streams: each element is the keyed hash of its index (a full-width Python reference,
    so the split 16-bit multiply is exact), a seed's numbers do not depend on the other seeds drawn beside it,
    and the uniforms and integers are evenly spread."""
    seeds = torch.tensor([0, 7, 2**40 + 3])
    bits = rng.bits32(seeds, ("sample", 4, 1), (3, 5))
    for p, s in enumerate(seeds.tolist()):
        assert bits[p].flatten().tolist() == [_hash_reference(s, ("sample", 4, 1), i) for i in range(15)]
    assert torch.equal(rng.bits32(seeds[1:2], ("sample", 4, 1), (3, 5))[0], bits[1])   # alone as in a population
    assert not torch.equal(rng.bits32(seeds, ("sample", 4, 2), (3, 5)), bits)          # another draw: other numbers
    u = rng.uniform(torch.arange(64), ("u",), (4096,))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.003 and abs(u.var().item() - 1 / 12) < 0.002
    r = rng.randint(torch.arange(64), ("r",), (4096,), 6)
    counts = torch.bincount(r.flatten(), minlength=6).double()
    chi2 = ((counts - counts.mean()) ** 2 / counts.mean()).sum().item()
    assert r.min() == 0 and r.max() == 5 and chi2 < 20.5  # 5 degrees of freedom: p = 0.001


def _aten_ops_per_epoch(p: int, raw: dict = SORT) -> list[int]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))
    cfgs = [resolve_run({**raw, "seed": s, "epochs": 4, "eval_every": 0, "log_every": 100}) for s in range(p)]
    marks = []
    with Count():
        train_population(cfgs, on_epoch=lambda _: marks.append(Count.n))
    return [b - a for a, b in zip(marks, marks[1:-1])]  # the last epoch logs


def test_device_paths_do_the_same_work_at_every_population_size(monkeypatch):
    """On the paths a GPU takes, an epoch makes as many ATen calls (about: kernel launches) at P = 2 as at
    P = 6: nothing loops over members. A draw or an optimizer view per member fails it; so do the CPU paths."""
    monkeypatch.setattr(rng, "DEVICE_PATHS", True)
    small, large = _aten_ops_per_epoch(2), _aten_ops_per_epoch(6)
    assert small == large and len(small) == 2
    monkeypatch.setattr(rng, "DEVICE_PATHS", False)
    assert _aten_ops_per_epoch(6)[0] > _aten_ops_per_epoch(2)[0]


def test_an_lm_population_on_the_device_paths_does_the_same_work_at_every_size(monkeypatch):
    """The LM's epoch (generation with each member's sampling stream, stacked LoRA, the head, old log-probs, inner
    steps) on a GPU's paths: as many ATen calls at P = 2 as at P = 4 (every row here runs to max_new_tokens, so the
    decode loop's length is the same). A LoRA product, a head GEMM or a draw per member fails it, as the CPU's
    member-by-member products do (they keep a member's bits its own there)."""
    monkeypatch.setattr(rng, "DEVICE_PATHS", True)
    small, large = _aten_ops_per_epoch(2, LM), _aten_ops_per_epoch(4, LM)
    assert small == large and len(small) == 2
    monkeypatch.setattr(rng, "DEVICE_PATHS", False)
    assert _aten_ops_per_epoch(4, LM)[0] > _aten_ops_per_epoch(2, LM)[0]


def test_device_paths_keep_common_random_numbers(monkeypatch):
    """On the device paths a run's numbers are still its own: seed 1 trains the same inside a population of
    three as alone (to rounding: the CPU's fused optimizer rounds a run of members by a ulp here and there)."""
    monkeypatch.setattr(rng, "DEVICE_PATHS", True)
    together, alone = _both_ways([{**SORT, "seed": s, "eval_every": 0} for s in (5, 1, 9)])
    (_, rows_p), (_, rows_a) = together[1], alone[1]
    assert [r[:2] for r in _untimed(rows_p)] == [r[:2] for r in _untimed(rows_a)]
    for (_, name, a), (_, _, b) in zip(_untimed(rows_p), _untimed(rows_a)):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6), name


def test_a_graphed_step_reads_each_epochs_inputs(monkeypatch):
    """cuda_graphs: the step a CUDA graph replays, run on the CPU through the graph's own copies of its inputs,
    gives every row and failure of the eager steps: each epoch's tensors reach the copies (stale ones would
    train on epoch 0's batch), the step index reaches the failure message, bad members are found."""
    from grpo_bench.engine.graphs import StepGraph
    monkeypatch.setattr(StepGraph, "devices", ("cuda", "cpu"))
    calls = []   # the graphed step ran (a task that says it cannot be graphed would leave both runs eager)
    monkeypatch.setattr(StepGraph, "__call__", lambda self, inputs, call=StepGraph.__call__: calls.append(1)
                        or call(self, inputs))
    raws = [{**SORT, "seed": s, "optimizer": "sgd", "lr": lr, "log_every": 2}
            for s, lr in [(0, 0.05), (1, 1e30), (2, 0.05)]]
    runs = []
    for graphs in (False, True):
        cfgs = [resolve_run({**copy.deepcopy(r), "cuda_graphs": graphs}) for r in raws]
        rows = [[] for _ in cfgs]
        results = train_population(cfgs, rows)
        runs.append(([_untimed(r) for r in rows], [r if isinstance(r, dict) else str(r) for r in results]))
    assert runs[0] == runs[1] and "non-finite loss" in runs[0][1][1] and len(calls) > 10


def test_lm_device_streams_keep_common_random_numbers(monkeypatch):
    """The LM on the device paths (its sampling noise from rng.DeviceStreams, one draw a token for every member):
    seed 1's samples are its own, the same inside a population as alone, and other than seed 0's."""
    monkeypatch.setattr(rng, "DEVICE_PATHS", True)
    together, alone = _both_ways([{**LM, "seed": s, "epochs": 2, "eval_every": 0} for s in (0, 1)])
    untimed = [[r for r in _untimed(rows) if r[1] in ("reward/mean", "response/length")] for _, rows in together]
    assert untimed[1] == [r for r in _untimed(alone[1][1]) if r[1] in ("reward/mean", "response/length")]
    assert untimed[0] != untimed[1]
    streams = rng.DeviceStreams(torch.tensor([4, 4]), "sample", 0, 0)
    first, second = streams.rand(3), streams.rand(3)
    assert torch.equal(first[0], first[1]) and not torch.equal(first, second)  # a seed's own, drawn in order


def _graph_calls(monkeypatch, **over) -> tuple[int, int]:
    """(StepGraph calls, task.logprobs calls) of one sort run with cuda_graphs on, a StepGraph allowed on the CPU."""
    from grpo_bench.engine.graphs import StepGraph
    from grpo_bench.tasks.sort import SortTask
    monkeypatch.setattr(StepGraph, "devices", ("cuda", "cpu"))
    calls, logprobs = [], []
    monkeypatch.setattr(StepGraph, "__call__", lambda self, inputs, call=StepGraph.__call__: calls.append(1)
                        or call(self, inputs))
    monkeypatch.setattr(SortTask, "logprobs", lambda self, *a, f=SortTask.logprobs, **k: logprobs.append(1)
                        or f(self, *a, **k))
    train(resolve_run({**SORT, "eval_every": 0, "cuda_graphs": True, **over}), [])
    return len(calls), len(logprobs)


def test_a_step_is_graphed_only_where_it_is_static(monkeypatch):
    """cuda_graphs captures the inner step when there are at least two of them (one step reuses its log-probs as
    the old ones) and the task says its step can be captured; a graphed step computes its log-probs once, inside
    the graph, as an eager step does."""
    graphed, logprobs = _graph_calls(monkeypatch, inner_steps=2)
    assert graphed == SORT["epochs"] * 2
    monkeypatch.undo()
    assert _graph_calls(monkeypatch, inner_steps=2, cuda_graphs=False) == (0, logprobs)
    monkeypatch.undo()
    assert _graph_calls(monkeypatch, inner_steps=1)[0] == 0
    monkeypatch.undo()
    from grpo_bench.tasks.sort import SortTask
    monkeypatch.delattr(SortTask, "graphable")   # a task that does not say so is never captured
    assert _graph_calls(monkeypatch, inner_steps=2)[0] == 0


DIVERGES = {**SORT, "optimizer": "sgd", "eval_every": 0, "epochs": 2}   # lr 1e30: its loss is NaN from step 1


def _diverged(inner_steps: int, log_every: int, lrs=(0.05, 1e30), on_epoch=None, **over):
    cfgs = [resolve_run({**DIVERGES, "seed": s, "lr": lr, "inner_steps": inner_steps, "log_every": log_every,
                         **over}) for s, lr in enumerate(lrs)]
    rows = [[] for _ in cfgs]
    return train_population(cfgs, rows, on_epoch=on_epoch), rows


@pytest.mark.parametrize("inner_steps", [2, 4])
def test_a_failure_is_found_at_its_step_whenever_it_is_checked(inner_steps):
    """Between host syncs a member's failure waits on the device: checked only at the end of the epoch (nothing
    is logged before), it names the same epoch, inner step and value as when every step is checked, and the
    member logs nothing from that step on."""
    every, deferred = _diverged(inner_steps, 1), _diverged(inner_steps, 2 * inner_steps)
    assert str(every[0][1]) == str(deferred[0][1]) == "non-finite loss nan at epoch 0, inner step 1"
    assert {s for s, _, _ in every[1][1]} == {0} and deferred[1][1] == []
    assert every[0][0] == deferred[0][0] and "final/reward" in every[0][0]


def test_a_population_whose_every_member_fails_mid_epoch_ends_there(monkeypatch):
    """Nothing runs after the last member fails: no more inner steps, no evaluation, no progress tick."""
    from grpo_bench.tasks.sort import SortTask
    evaluations, ticks = [], []
    monkeypatch.setattr(SortTask, "evaluate", lambda self, f=SortTask.evaluate: evaluations.append(1) or f(self))
    results, rows = _diverged(4, 1, lrs=(1e30, 1e30), on_epoch=ticks.append, eval_every=1)
    assert [str(r) for r in results] == ["non-finite loss nan at epoch 0, inner step 1"] * 2
    assert [{s for s, _, _ in r} for r in rows] == [{0}, {0}]
    assert len(evaluations) == 1 and ticks == []   # the evaluation before training only


def test_a_population_whose_every_member_fails_in_an_evaluation_ends_there(monkeypatch):
    """Every member's mid-run evaluation raises: each run ends with its error, and no epoch runs after it."""
    from grpo_bench.tasks.sort import SortTask
    evaluations = []

    def evaluate(self, f=SortTask.evaluate):
        evaluations.append(1)
        out = f(self)
        if len(evaluations) == 2:   # the first mid-run one
            self.failed.update({i: RuntimeError(f"member {i} cannot be scored") for i in range(len(out))})
        return out

    monkeypatch.setattr(SortTask, "evaluate", evaluate)
    cfgs = [resolve_run({**SORT, "seed": s}) for s in (0, 1)]
    rows = [[] for _ in cfgs]
    results = train_population(cfgs, rows)
    assert [str(r) for r in results] == ["member 0 cannot be scored", "member 1 cannot be scored"]
    assert len(evaluations) == 2 and max(s for r in rows for s, _, _ in r) == SORT["eval_every"] * 3 - 1


def test_a_member_whose_greedy_rewards_raise_fails_alone(monkeypatch):
    """ReMax's greedy baseline is scored after the rollout, member by member: a member whose greedy reward raised
    fails, and the others train on as they do alone."""
    from grpo_bench.tasks.sort import SortTask

    def greedy_rewards(self, ro, f=SortTask.greedy_rewards):
        out = f(self, ro)
        if len(self.seeds) == 2:
            self.failed[1] = RuntimeError("the greedy answer cannot be scored")
        return out

    monkeypatch.setattr(SortTask, "greedy_rewards", greedy_rewards)
    raws = [{**SORT, "delta": "remax", "eval_every": 0, "seed": s} for s in (0, 1)]
    cfgs = [resolve_run(copy.deepcopy(r)) for r in raws]
    rows = [[] for _ in cfgs]
    results = train_population(cfgs, rows)
    assert str(results[1]) == "the greedy answer cannot be scored" and rows[1] == []
    alone = []
    assert results[0] == train(resolve_run(copy.deepcopy(raws[0])), alone)
    assert _untimed(rows[0]) == _untimed(alone)


def test_a_run_does_not_depend_on_what_drew_from_torchs_generator_before(monkeypatch):
    """A task that draws from torch's global generator as it builds (a user's, initialising a layer) draws the
    same numbers whatever the process drew before: the trainer seeds it from the run's seed."""
    from grpo_bench.engine import trainer
    build = trainer.build_task

    def drawing(cfgs):
        task = build(cfgs)
        with torch.no_grad():
            for p in task.policy.parameters():
                p.add_(torch.randn_like(p))
        return task

    monkeypatch.setattr(trainer, "build_task", drawing)
    runs = []
    for before in (1, 2):
        torch.manual_seed(before)
        rows = []
        runs.append((train(resolve_run({**SORT, "eval_every": 0}), rows), _untimed(rows)))
    assert runs[0] == runs[1]


def test_population_map_takes_none_anywhere_and_picks_the_device_from_the_tensors():
    from grpo_bench.engine.trainer import Population
    pop = Population([resolve_run({**SORT, "seed": s}) for s in (0, 1)])
    out = pop.map(lambda missing, x, numbers: x * 2 if missing is None else x, None, torch.ones(2, 3),
                  per_member=False)
    assert torch.equal(out, torch.full((2, 3), 2.0)) and pop._on_device == (None, None)  # CPU: nothing copied
