"""Registry v4: the parts verl and TRL added in 2026 (issue 30).

The Optimal Token Baseline (per-token deltas from the old policy's sum of squared
probabilities), GTPO (per-token deltas: conflict tokens and an entropy filter), A*-PO (a delta
from the reference's samples and a loss regressed onto log pi / pi_ref) and self-normalised
IS (a correction). Each against numbers worked out by hand here; where the peer's own code is
importable it runs beside the registry on one batch: verl 0.9.1's
compute_optimal_token_baseline_advantage, compute_multi_turn_optimal_token_baseline_advantage
and compute_rollout_correction_weights (skipped when verl is absent), TRL 1.16's
A2POTrainer.compute_loss and A2POTrainer._estimate_optimal_values. GTPO's code is not
installable (an Unsloth trainer): its conflict masks are re-derived below as a plain loop from
github.com/winstonsmith1897/GTPO (gtpo/gtpo_training.py, build_conflict_mask). Per-token deltas
go through every loss and correction (the same numbers as the response's delta when they are
constant over it); sum of pi^2 on the LM task is tests/test_arithmetic_fused.py's.
"""
import contextlib
import copy
import math
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import close, rand_batch, needs

from grpo_bench import registry
from grpo_bench.algos.deltas import Extra
from grpo_bench.config.run import resolve_run
from grpo_bench.numerics.kernels.spec import LossSpec
from grpo_bench.numerics.logprobs import grpo_loss
from grpo_bench.engine.recipe import Recipe
from grpo_bench.numerics.kernels.spec import fused_names


pytestmark = pytest.mark.usefixtures("fp64")


def T(x):
    return torch.as_tensor(x, dtype=torch.float64)




def otb(rewards, logp, sum_pi_sq, mask, **params):
    return registry.get("delta", "optimal_token_baseline")(T(rewards), None, None, None,
                                                            Extra(mask=T(mask), logp=T(logp), sum_pi_sq=T(sum_pi_sq)),
                                                            **params)


# ================================================================== Optimal Token Baseline

def test_otb_hand_values():
    """Two groups. First: r = 1 over 3 tokens with pi = 0.5, sum pi^2 = 0.5 (w = 0.5 each, W = 0.5, 1, 1.5);
    r = 0 over 2 tokens, pi = 0.8, 0.2, sum pi^2 = 0.68, 0.5 (w = 0.08, 1.1, W = 0.08, 1.18). The third
    token is the first response's alone: zero_tail gives it baseline 0."""
    eps = 1e-8
    h = math.log(0.5)
    logp = [[[h, h, h], [math.log(0.8), math.log(0.2), 0.0]],
            [[h, h, 0.0], [h, h, 0.0]]]
    spsq = [[[0.5, 0.5, 0.5], [0.68, 0.5, 0.0]],
            [[0.5, 0.5, 0.0], [0.75, 0.75, 0.0]]]
    mask = [[[1, 1, 1], [1, 1, 0]], [[1, 1, 0], [1, 1, 0]]]
    # second group: r = 2 and 0, two tokens each, w = 0.5 and 0.75 (W = 0.5, 1 and 0.75, 1.5): no tail
    b0 = (1 * 0.5) / (0.5 + 0.08 + eps)
    b1 = (1 * 1.0) / (1.0 + 1.18 + eps)
    c0 = (2 * 0.5) / (0.5 + 0.75 + eps)
    c1 = (2 * 1.0) / (1.0 + 1.5 + eps)
    want = [[[1 - b0, 1 - b1, 1.0], [-b0, -b1, 0.0]], [[2 - c0, 2 - c1, 0.0], [-c0, -c1, 0.0]]]
    got = otb([[1.0, 0.0], [2.0, 0.0]], logp, spsq, mask)
    close(got, want)
    # without zero_tail the lone tail token's baseline is its own return: A = r * eps / (W + eps)
    close(otb([[1.0, 0.0], [2.0, 0.0]], logp, spsq, mask, zero_tail=False)[0, 0, 2], eps / (1.5 + eps))
    # the baseline weighs by W, not by the token's own w: a plain group mean would be 0.5
    assert abs(got[0, 0, 1] - 0.5) > 0.03


def test_otb_ties_single_responses_and_flat_groups():
    h = math.log(0.5)
    lp = [[[h, h], [h, h], [h, 0.0]]]
    sp = [[[0.5, 0.5], [0.5, 0.5], [0.5, 0.0]]]
    mask = [[[1, 1], [1, 1], [1, 0]]]
    # two longest responses tie: no zero tail, every baseline is the W-weighted mean
    got = otb([[1.0, 0.0, 4.0]], lp, sp, mask)
    b0 = (1 + 0 + 4) * 0.5 / (1.5 + 1e-8)
    b1 = (1 + 0) * 1.0 / (2.0 + 1e-8)
    close(got, [[[1 - b0, 1 - b1], [-b0, -b1], [4 - b0, 0.0]]])
    # a tie past every other response's end (lengths 3, 3, 1): their last token's baseline is their W-weighted
    # mean (W = 1.5 each), not the zero tail's 0
    lp3 = [[[h, h, h], [h, h, h], [h, 0.0, 0.0]]]
    sp3 = [[[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.0, 0.0]]]
    got = otb([[1.0, 0.0, 4.0]], lp3, sp3, [[[1, 1, 1], [1, 1, 1], [1, 0, 0]]])
    close(got[0, :2, 2], [1 - 1.5 / (3.0 + 1e-8), -1.5 / (3.0 + 1e-8)])
    # a group of one: no baseline (verl's N == 1 branch)
    close(otb([[3.0]], [[[h, h]]], [[[0.5, 0.5]]], [[[1, 1]]]), [[[3.0, 3.0]]])
    # a flat group: r * eps / (sum W + eps), verl's numbers, not exactly 0
    flat = otb([[1.0, 1.0, 1.0]], lp, sp, mask)
    assert flat.abs().max() < 1e-7 and (flat[0, :, 0] > 0).all()
    with pytest.raises(ValueError, match="needs extra=.*sum_pi_sq"):
        registry.get("delta", "optimal_token_baseline")(T([[1.0, 0.0]]))


def _otb_batch(seed=0, b=3, g=4, t=6):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b, g), generator=gen)
    lengths[0] = torch.tensor([t, 2, 3, 1])           # one response longer than the rest: a zero tail
    lengths[1] = torch.tensor([t, t, 2, 4])           # two tie for the longest
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).double()
    logits = 2 * torch.randn(b, g, t, 7, generator=gen)
    p = torch.softmax(logits, -1)
    tok = torch.randint(0, 7, (b, g, t), generator=gen)
    logp = torch.log(p.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
    rewards = torch.randint(0, 2, (b, g), generator=gen).double()
    rewards[1] = torch.tensor([1.0, 0.0, 1.0, 0.0])   # the tied longest disagree: their tail's baseline is not 0
    rewards[2] = 1.0                                  # a flat group
    return rewards, logp, p.square().sum(-1), mask


@pytest.mark.parametrize("fn", ["compute_optimal_token_baseline_advantage",
                                "compute_multi_turn_optimal_token_baseline_advantage"])
@pytest.mark.parametrize("zero_tail", [True, False])
def test_otb_matches_verl(fn, zero_tail):
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    rewards, logp, spsq, mask = _otb_batch(seed=3)
    b, g, t = mask.shape
    n = b * g
    m = mask.reshape(n, t)
    # verl's outcome reward sits on the last response token
    last = (m.sum(-1).long() - 1).clamp(min=0)
    scores = torch.zeros(n, t).scatter(1, last.unsqueeze(-1), rewards.reshape(n, 1))
    want, _ = getattr(core, fn)(token_level_rewards=scores, response_mask=m, index=np.repeat(np.arange(b), g),
                                old_log_probs=logp.reshape(n, t), sum_pi_squared=spsq.reshape(n, t),
                                handle_zero_tail=zero_tail)
    got = otb(rewards, logp, spsq, mask, zero_tail=zero_tail)
    close(got.reshape(n, t), want, rtol=1e-12, atol=1e-12)
    assert (want[:4, 1:] != 0).any() and (want.abs() > 0.05).any()
    if zero_tail:   # the lone longest response's tail has advantage r: its baseline is 0
        assert torch.equal(want[0, 3:], rewards[0, 0].expand(t - 3))


def test_sum_pi_squared_chunked_against_fp64():
    from grpo_bench.numerics.kernels.chunked import chunked_sum_pi_squared
    from grpo_bench.numerics.kernels.linear import linear_sum_pi_squared

    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(3, 5, 40, generator=gen, dtype=torch.float32)
    logits[0, 0, :39] = -math.inf                               # a certain token: sum pi^2 = 1
    for tau in (1.0, 0.7):
        p = torch.softmax(logits.double() / tau, -1)
        got = chunked_sum_pi_squared(logits, tau, rows=4)       # several chunks
        assert got.dtype == torch.float32 and got.shape == (3, 5)
        close(got, p.square().sum(-1), rtol=1e-5, atol=1e-6)
        assert got[0, 0] == 1.0
    h = torch.randn(2, 6, 16, generator=gen, dtype=torch.float32)
    w = torch.randn(50, 16, generator=gen, dtype=torch.float32) / 2
    bias = torch.randn(50, generator=gen, dtype=torch.float32)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        hx, wx, bx = h.to(dtype), w.to(dtype), bias.to(dtype)
        want = torch.softmax(torch.nn.functional.linear(hx.double(), wx.double(), bx.double()) / 0.7, -1)
        got = linear_sum_pi_squared(hx, wx, bx, temperature=0.7, rows=5)
        close(got, want.square().sum(-1), rtol=tol, atol=tol)


def test_sort_task_gives_sum_pi_squared_of_its_policy():
    from grpo_bench.engine.trainer import build_task

    cfg = resolve_run({"task": {"name": "sort", "prompts": None, "num_prompts": 3}, "group_size": 4})
    task = build_task([cfg])
    ro = task.rollout(0, 0, 4)
    got = task.sum_pi_squared(ro)
    assert got.shape == ro.responses.shape
    p = torch.softmax(task.policy(ro.prompts).double(), -1)              # (P, B, n, V)
    close(got, p.square().sum(-1).unsqueeze(2).expand_as(got), rtol=1e-6, atol=1e-7)
    assert (got > 1 / task.cfg.vocab - 1e-6).all() and (got < 1).all()  # between uniform and certain


# ================================================================== GTPO

def gtpo(rewards, ids, mask, entropy, **params):
    return registry.get("delta", "gtpo")(T(rewards), None, None, None,
                                         Extra(mask=T(mask), ids=torch.tensor(ids), entropy=T(entropy)), **params)


def test_gtpo_hand_values():
    """Two positive responses (r = 1) and two negative ones. Conflict tokens: shared by a positive and a
    negative response at a position, in the run from the first token and the run from the last.

        +  5 1 2 9   forward run 5 1 2 9, backward run 9 2 1 5   lambda 4 4 4 4
        +  5 1 3 9   forward 5 1,         backward 9             lambda 2 2 1 2
        -  5 1 7 9   forward 5 1,         backward 9             lambda 0 0 1 0
        -  5 4 2 9   forward 5,           backward 9 2           lambda 0 1 0 0
    """
    ids = [[[5, 1, 2, 9], [5, 1, 3, 9], [5, 1, 7, 9], [5, 4, 2, 9]]]
    ent = [[[0.2] * 4, [0.5] * 4, [0.9] * 4, [0.1, 0.3, 0.4, 0.4]]]  # mean entropies 0.2, 0.5, 0.9, 0.3
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    got = gtpo([[1.0, 1.0, 0.0, 0.0]], ids, [[[1] * 4] * 4], ent)
    want = [[[(a - 0.02) * 4] * 4,
             [(a - 0.05) * x for x in (2, 2, 1, 2)],
             [0.0] * 4,                                              # mean entropy 0.9 > 0.7: dropped
             [(-a - 0.03) * x for x in (0, 1, 0, 0)]]]
    close(got, want)
    # conflict_weight and gamma are the parameters they say
    close(gtpo([[1.0, 1.0, 0.0, 0.0]], ids, [[[1] * 4] * 4], ent, conflict_weight=1.0, gamma=0.0)[0, 0], [a] * 4)


def test_gtpo_runs_from_the_end_are_aligned_at_each_response_end():
    # + 1 3 8 (3 tokens) and - 2 4 3 8: the same two last tokens, at different positions from the start
    got = gtpo([[1.0, 0.0]], [[[1, 3, 8, 0], [2, 4, 3, 8]]], [[[1, 1, 1, 0], [1, 1, 1, 1]]], [[[0.0] * 4] * 2])
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    close(got, [[[a, 2 * a, 2 * a, 0.0], [-a, -a, 0.0, 0.0]]])
    # a flat group keeps only the entropy penalty, on every token
    flat = gtpo([[1.0, 1.0]], [[[1, 3, 8, 0], [2, 4, 3, 8]]], [[[1, 1, 1, 0], [1, 1, 1, 1]]], [[[0.5] * 4] * 2])
    close(flat, [[[-0.05, -0.05, -0.05, 0.0], [-0.05] * 4]])


def test_gtpo_a_shorter_response_ends_its_run_and_the_threshold_keeps_its_own_level():
    """+ 5 7 7 against - 7 (one token): they share the last token, and the run from the end stops where the
    shorter response has no token (its padding, read through the clamped reversal, is its own 7 again). A mean
    entropy exactly at the threshold is kept (d_i = 0 only above it)."""
    ids, mask = [[[5, 7, 7], [7, 0, 0]]], [[[1, 1, 1], [1, 0, 0]]]
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    got = gtpo([[1.0, 0.0]], ids, mask, [[[0.5] * 3, [0.5] * 3]], threshold=0.5, gamma=0.1)
    close(got, [[[a - 0.05, a - 0.05, 2 * (a - 0.05)], [0.0] * 3]])
    assert torch.equal(gtpo([[1.0, 0.0]], ids, mask, [[[0.5] * 3, [0.5] * 3]], threshold=0.4999)[0, 0], T([0.0] * 3))


def _gtpo_loop(rewards, ids, mask, entropy, threshold=0.7, gamma=0.1, w=2.0, eps=1e-4):
    """GTPO's per-token advantages as its code builds them (build_conflict_mask and the entropy
    shaping of UnslothEfficientGTPO.forward), one response and one position at a time."""
    out = torch.zeros(ids.shape)
    for b in range(ids.shape[0]):
        r = rewards[b]
        a = torch.zeros_like(r) if (r == r[0]).all() else (r - r.mean()) / (r.std() + eps)
        n = [int(x) for x in mask[b].sum(-1)]
        toks = [ids[b, g, :n[g]].tolist() for g in range(len(n))]
        pos = [g for g in range(len(n)) if a[g] > 0]
        neg = [g for g in range(len(n)) if a[g] < 0]
        for g in range(len(n)):
            lam = [1.0] * n[g]
            if g in pos or g in neg:
                for from_end in (False, True):
                    def at(j, k, from_end=from_end):
                        return toks[j][n[j] - 1 - k] if from_end else toks[j][k]
                    for k in range(n[g]):
                        tok = at(g, k)
                        if not (any(k < n[j] and at(j, k) == tok for j in pos)
                                and any(k < n[j] and at(j, k) == tok for j in neg)):
                            break                                         # the run ends
                        lam[n[g] - 1 - k if from_end else k] *= w if g in pos else 0.0
            h = float(entropy[b, g, :n[g]].mean()) if n[g] else 0.0
            adv = float(a[g]) - gamma * h if h <= threshold else 0.0
            out[b, g, :n[g]] = adv * torch.tensor(lam)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_gtpo_against_its_code_as_a_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    b, g, t = 4, 5, 6
    lengths = torch.randint(0, t + 1, (b, g), generator=gen)
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).double()
    ids = torch.randint(0, 3, (b, g, t), generator=gen)               # three tokens: many shared runs
    ids[0] = ids[0, :1].clone()                                        # a group of equal responses
    rewards = torch.randint(0, 3, (b, g), generator=gen).double()
    rewards[1] = 2.0
    # mean entropies about the threshold: each response's level, and some noise about it
    ent = 1.2 * torch.rand(b, g, 1, generator=gen) + 0.1 * torch.rand(b, g, t, generator=gen)
    got = registry.get("delta", "gtpo")(rewards, None, None, None, Extra(mask=mask, ids=ids, entropy=ent))
    want = _gtpo_loop(rewards, ids, mask, ent)
    close(got, want)
    # not vacuous: conflicts were found, and some responses were dropped for their entropy
    plain = registry.get("delta", "gtpo")(rewards, None, None, None, Extra(mask=mask, ids=ids, entropy=ent),
                                          conflict_weight=1.0)
    assert not torch.allclose(got, plain)
    assert ((ent * mask).sum(-1) / mask.sum(-1).clamp(min=1) > 0.7).any()


# ================================================================== A*-PO

def test_a2po_delta_hand_values():
    # reference samples scored 1, 0, 0, 1: V* = 0.5 log((2 e^2 + 2) / 4)
    v = 0.5 * math.log((2 * math.exp(2) + 2) / 4)
    x = Extra(mask=torch.ones(2, 2, 3), ref_rewards=T([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))
    got = registry.get("delta", "a2po")(T([[1.0, 0.0], [1.0, 0.0]]), None, None, None, x)
    close(got, [[1 - v, -v], [1.0, 0.0]])
    # beta1 -> 0: V* -> the best reference reward; large beta1: their mean
    close(registry.get("delta", "a2po")(T([[1.0]]), None, None, None, x._replace(ref_rewards=T([[1.0, 0.0]])),
                                        beta1=1e-3), [[0.0]], atol=1e-3, rtol=0)
    close(registry.get("delta", "a2po")(T([[1.0]]), None, None, None, x._replace(ref_rewards=T([[1.0, 0.0]])),
                                        beta1=1e4), [[0.5]], atol=1e-4, rtol=0)


def test_a2po_loss_hand_values_and_gradient():
    lp = T([[[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]]]).requires_grad_()
    ref = T([[[-1.5, -1.0, -3.0], [-1.0, -1.0, -1.0]]])
    mask = T([[[1, 1, 0], [1, 1, 1]]])
    a = T([[0.2, -0.1]])
    per_token, regions = registry.get("loss", "a2po")(lp, ref, a, mask, beta2=0.5)
    s0, s1 = 0.5 * (0.5 - 1.0), 0.5 * 1.5           # beta2 * sum of the log-ratio over each response
    close(per_token[0, 0, :2], [(s0 - 0.2) ** 2] * 2)
    close(per_token[0, 1], [(s1 + 0.1) ** 2] * 3)
    assert regions == {}
    # seq_mean_token_mean is the mean over responses of the squared error (TRL's .mean())
    value = registry.get("aggregate", "seq_mean_token_mean")(per_token, mask)
    close(value, ((s0 - 0.2) ** 2 + (s1 + 0.1) ** 2) / 2)
    (g,) = torch.autograd.grad(value, lp)
    close(g, [[[0.5 * 2 * (s0 - 0.2) * 0.5] * 2 + [0.0], [0.5 * 2 * (s1 + 0.1) * 0.5] * 3]])


def test_a2po_loss_is_handed_the_reference_and_the_recipe_computes_it():
    lp, old, _, d, mask = rand_batch(seed=4)
    ref = old - 0.4
    got, _ = grpo_loss(lp, old, ref, d, mask, loss={"name": "a2po", "beta2": 0.2}, aggregate="seq_mean_token_mean",
                       backend="auto")
    want = registry.get("aggregate", "seq_mean_token_mean")(registry.get("loss", "a2po")(lp, ref, d, mask,
                                                                                         beta2=0.2)[0], mask)
    close(got, want)
    against_old = registry.get("aggregate", "seq_mean_token_mean")(registry.get("loss", "a2po")(lp, old, d, mask,
                                                                                                beta2=0.2)[0], mask)
    assert abs(got - against_old) > 1e-3
    with pytest.raises(ValueError, match="needs ref_logp"):
        grpo_loss(lp, old, None, d, mask, loss="a2po")
    # the trainer computes the reference's log-probs for it with no KL term, and hands them to the loss
    r = Recipe.from_config(resolve_run({"task": "sort", "delta": "a2po", "loss": "a2po", "group_size": 1}))
    assert r.use_ref and r.loss_ref and not r.kl_in_loss and r.extra_needs == ("ref_rewards",) and r.ref_samples == 8
    plain = Recipe.from_config(resolve_run({"task": "sort"}))
    assert not plain.use_ref and not plain.loss_ref and plain.extra_needs == () and plain.ref_samples is None


def _trl_a2po():
    needs("trl")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import trl.experimental.a2po.a2po_trainer as mod
    return mod


def test_a2po_loss_matches_trl_compute_loss():
    mod = _trl_a2po()
    lp, _, _, _, mask = rand_batch(b=1, g=5, t=6, seed=6)
    ref = lp.detach() + 0.3 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
    rewards, v_star = T([1.0, 0.0, 1.0, 1.0, 0.0]), T([0.4, 0.4, 0.1, 0.7, 0.0])
    seq = (lp * mask).sum(-1).reshape(-1).clone().requires_grad_()      # TRL's _get_sequence_logps
    stub = SimpleNamespace(args=SimpleNamespace(beta2=0.3), model=SimpleNamespace(training=True),
                           _metrics={"train": defaultdict(list)}, _get_sequence_logps=lambda *a: seq)
    inputs = {"input_ids": None, "attention_mask": None, "logits_to_keep": 6,
              "ref_logps": (ref * mask).sum(-1).reshape(-1), "rewards": rewards, "v_star": v_star}
    want = mod.A2POTrainer.compute_loss(stub, None, inputs)
    x = lp.clone().requires_grad_()
    got, _ = grpo_loss(x, lp.detach(), ref, (rewards - v_star).view(1, 5), mask,
                       loss={"name": "a2po", "beta2": 0.3}, aggregate="seq_mean_token_mean", backend="torch")
    close(got, want)
    (g_want,) = torch.autograd.grad(want, seq)                          # d/d sequence log-prob
    (g_got,) = torch.autograd.grad(got, x)
    close(g_got, g_want.view(1, 5, 1) * mask)                           # every token of a response: the same
    assert want > 0.01


def test_a2po_value_matches_trl_estimate_optimal_values(monkeypatch):
    mod = _trl_a2po()
    n = 4
    ref_rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]])

    class Tok:
        def __call__(self, texts, **kw):
            class Enc(dict):
                def to(self, device):
                    return self
            return Enc(input_ids=torch.zeros(len(texts), 2, dtype=torch.long), attention_mask=torch.ones(len(texts), 2))

        def batch_decode(self, ids, **kw):
            return ["c"] * ids.shape[0]

    class Ref:
        def generate(self, input_ids, **kw):
            return torch.zeros(input_ids.shape[0] * n, 3, dtype=torch.long)

    monkeypatch.setattr(mod, "unwrap_model_for_generation", contextlib.contextmanager(lambda m, acc, **kw: (yield m)))
    stub = SimpleNamespace(args=SimpleNamespace(beta1=0.5, num_value_samples=n, per_device_train_batch_size=3,
                                                max_prompt_length=8, filter_all_incorrect=False),
                           train_dataset=[{"prompt": f"p{i}"} for i in range(3)], eval_dataset=None,
                           accelerator=SimpleNamespace(prepare=lambda x: x, device="cpu"), processing_class=Tok(),
                           ref_model=Ref(), value_generation_config=None,
                           _calculate_rewards=lambda prompts, completions, **kw: ref_rewards.reshape(-1))
    mod.A2POTrainer._estimate_optimal_values(stub)
    v_trl = T([stub._optimal_values[f"p{i}"] for i in range(3)])
    r = T([[1.0], [0.0], [1.0]])
    got = registry.get("delta", "a2po")(r, None, None, None, Extra(mask=torch.ones(3, 1, 2), ref_rewards=ref_rewards))
    close(got, r - v_trl.view(3, 1), rtol=1e-6, atol=1e-6)              # TRL scores in fp32
    assert v_trl[1] == 0 and v_trl[2] > v_trl[0] > 0.5


def test_sort_task_samples_the_reference_for_a2po():
    from grpo_bench.engine.trainer import build_task

    cfg = resolve_run({"task": {"name": "sort", "prompts": None, "num_prompts": 3}, "group_size": 2})
    task = build_task([cfg])
    ro = task.rollout(0, 0, 2)
    first = task.reference_rewards(ro, 5)
    assert first.shape == (1, 3, 5) and ((first >= 0) & (first <= 1)).all()
    assert not torch.equal(first, task.reference_rewards(ro, 5))        # each call draws afresh
    # the reference, not the policy: a reference certain of the sorted answer scores 1 every time
    target = ro.prompts.sort(-1).values
    task.reference.forward = lambda prompts: 50.0 * torch.nn.functional.one_hot(target, task.cfg.vocab).float()
    assert (task.reference_rewards(ro, 5) == 1).all()


# ================================================================== self-normalised IS

def test_snis_hand_values():
    lp = torch.zeros(1, 2, 3)
    sampler = torch.zeros(1, 2, 3)
    old = torch.log(T([[[3.0, 0.5, 1.0], [1.0, 1.5, 9.0]]]))            # rho = pi_old / pi_s
    mask = T([[[1, 1, 1], [1, 1, 0]]])
    d = torch.zeros(1, 2)
    snis = registry.get("correction", "snis")
    # token, truncated at 2: weights 2, 0.5, 1, 1, 1.5 over the mask, mean 6 / 5
    w, keep, regions = snis(lp, old, sampler, d, mask)
    close((w * mask)[0], T([[2.0, 0.5, 1.0], [1.0, 1.5, 0.0]]) / 1.2)
    assert keep.all() and regions["truncated"][0, 0, 0] and not regions["truncated"][0, 1, 1]
    # token, masked outside [0.6, 2]: 0, 0, 1, 1, 1.5, mean 3.5 / 5
    w, _, _ = snis(lp, old, sampler, d, mask, mode="mask", low=0.6)
    close((w * mask)[0], T([[0.0, 0.0, 1.0], [1.0, 1.5, 0.0]]) / 0.7)
    # sequence: prod rho = 1.5 and 1.5 (truncated at 2 where needed); one weight per response
    old2 = torch.log(T([[[3.0, 0.5, 1.0], [1.0, 4.0, 9.0]]]))
    w, _, _ = snis(lp, old2, sampler, d, mask, level="sequence")      # 1.5 and 2 (4 truncated), mean 1.75
    close((w * mask)[0], T([[1.5, 1.5, 1.5], [2.0, 2.0, 0.0]]) / 1.75)
    # an empty response is not a sequence of the mean; a mean of 0 is left alone
    w, _, _ = snis(lp, old2, sampler, d, T([[[1, 1, 1], [0, 0, 0]]]), level="sequence")
    close(w[0, 0], [1.0] * 3)
    w, _, _ = snis(lp, torch.full((1, 2, 3), -30.0), sampler, d, mask, mode="mask", low=0.5)
    assert (w == 0).all()


def test_snis_leaves_a_mean_of_exactly_1e_8_alone(monkeypatch):
    """verl normalises only a batch mean above 1e-8 (exp cannot make 1e-8 exactly: the weights are given)."""
    from grpo_bench.algos import corrections
    one = torch.ones(1, 1, 1)
    for mean, want in ((1e-8, 1e-8), (2e-8, 1.0)):
        monkeypatch.setattr(corrections, "token_tis", lambda *a, mean=mean, **k: (torch.full_like(one, mean), one > 0, {}))
        w, _, _ = registry.get("correction", "snis")(one, one, one, torch.zeros(1, 1), one)
        assert w.item() == want


VERL_SNIS = [("token", 2.0, {}), ("sequence", 2.0, {"level": "sequence"}),
             ("token", "0.5_5.0", {"mode": "mask", "low": 0.5, "high": 5.0}),
             ("sequence", "0.8_1.5", {"level": "sequence", "mode": "mask", "low": 0.8, "high": 1.5})]


@pytest.mark.parametrize("level,threshold,ours", VERL_SNIS, ids=["token_tis", "seq_tis", "token_mis", "seq_mis"])
def test_snis_matches_verl_rollout_is_batch_normalize(level, threshold, ours):
    pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    lp, old, sampler, d, mask = rand_batch(seed=14, mismatch_=0.3)
    mask[1, 2] = 0.0                                                   # an empty response
    n, t = 12, lp.shape[-1]
    want, metrics = compute_rollout_correction_weights(
        (old - sampler).reshape(n, t), mask.reshape(n, t), rollout_is=level, rollout_is_threshold=threshold,
        rollout_is_batch_normalize=True)
    w, _, _ = registry.bind("correction", {"name": "snis", **ours})(lp, old, sampler, d, mask)
    # verl's masked_mean divides by the token count + 1e-8: relative differences of 1e-8 / count
    close(w.reshape(n, t) * mask.reshape(n, t), want, rtol=1e-8, atol=1e-10)
    assert metrics["rollout_is_batch_norm_factor"] != 1.0 and (want > 0).any()
    # not the weights without the normalisation
    raw, _ = compute_rollout_correction_weights((old - sampler).reshape(n, t), mask.reshape(n, t), rollout_is=level,
                                                rollout_is_threshold=threshold)
    assert not torch.allclose(raw, want)


def test_snis_weights_multiply_the_policy_term():
    lp, old, sampler, d, mask = rand_batch(seed=9)
    w, _, _ = registry.get("correction", "snis")(lp, old, sampler, d, mask)
    got, stats = grpo_loss(lp, old, None, d, mask, loss="clipped", aggregate="token_mean", sampler_logp=sampler,
                           corrections=["snis"], backend="auto")
    per_token, _ = registry.get("loss", "clipped")(lp, old, d, mask)
    close(got, registry.get("aggregate", "token_mean")(per_token * w, mask))
    assert "correction/snis/truncated_frac" in stats


# ================================================================== per-token deltas

def _constant_over_tokens(d, mask):
    return d.unsqueeze(-1).expand(mask.shape).clone()


@pytest.mark.parametrize("name", registry.names("loss"))
def test_every_loss_takes_per_token_deltas(name):
    """Per-token deltas that are the response's delta on each token: the numbers of the response's delta."""
    lp, old, _, d, mask = rand_batch(seed=11)
    d3 = _constant_over_tokens(d, mask)
    fn = registry.get("loss", name)
    torch.manual_seed(0)   # clip_cov draws
    want, want_regions = fn(lp, old, d, mask)
    torch.manual_seed(0)
    got, regions = fn(lp, old, d3, mask)
    on = mask > 0
    close(got[on], want[on])
    assert regions.keys() == want_regions.keys()
    for k in regions:
        assert torch.equal(regions[k][on], want_regions[k][on]), k


@pytest.mark.parametrize("name", registry.names("correction"))
def test_every_correction_takes_per_token_deltas(name):
    lp, old, sampler, d, mask = rand_batch(seed=12, mismatch_=0.6)
    d3 = _constant_over_tokens(d, mask)
    fn = registry.get("correction", name)
    want, got = fn(lp, old, sampler, d, mask), fn(lp, old, sampler, d3, mask)
    for x, y in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
        assert torch.equal(x, y) if x.dtype == torch.bool else torch.allclose(x, y, rtol=1e-12, atol=1e-12)


def test_per_token_deltas_through_the_composition_and_never_the_fused_kernel():
    lp, old, sampler, d, mask = rand_batch(seed=13)
    d3 = _constant_over_tokens(d, mask)
    d3[0, 0, 0] += 1.0                                                   # and one that is not constant
    for agg in registry.names("aggregate"):
        spec = {"name": agg, "max_len": 6} if agg == "seq_mean_token_sum_norm" else agg
        a, _ = grpo_loss(lp, old, None, _constant_over_tokens(d, mask), mask, loss="clipped", aggregate=spec,
                         nll_coef=0.1)
        b, _ = grpo_loss(lp, old, None, d, mask, loss="clipped", aggregate=spec, nll_coef=0.1)
        close(a, b)
    x = lp.clone().requires_grad_()
    value, _ = grpo_loss(x, old, None, d3, mask, loss="naive", aggregate="token_sum")
    (g,) = torch.autograd.grad(value, x)
    close(g, -d3 * mask)                                                 # each token's own delta
    spec = LossSpec("clipped", (("clip_high", 0.2), ("clip_low", 0.2)), "token_mean", (), None, 0.0, False,
                    ("token_deltas",))
    assert not spec.fusable()
    with pytest.raises(ValueError, match="no token_deltas term"):
        spec.check()


# ================================================================== trainer, registry, config

V4_RUNS = {
    "optimal_token_baseline": {"delta": "optimal_token_baseline"},
    "gtpo": {"delta": {"name": "gtpo", "threshold": 5.0}, "loss": "unclipped"},
    "a2po": {"delta": {"name": "a2po", "samples": 3}, "loss": "a2po", "group_size": 1},
    "snis": {"corrections": [{"name": "snis", "level": "sequence"}], "sampler": {"precision": "bf16"}},
}


@pytest.mark.parametrize("case", list(V4_RUNS))
def test_trainer_runs_every_new_part_and_is_deterministic(case):
    from grpo_bench.engine.trainer import train

    raw = {"task": {"name": "sort", "prompts": None, "num_prompts": 4}, "group_size": 4, "epochs": 3,
           "inner_steps": 2, "eval_every": 0, **V4_RUNS[case]}
    runs = []
    for _ in range(2):
        rows = []
        train(resolve_run(copy.deepcopy(raw)), rows)
        runs.append([r for r in rows if not r[1].startswith("time/")])
    assert runs[0] == runs[1]
    m = {(s, k): v for s, k, v in runs[0]}
    assert any(k == "delta/abs_mean" and v > 0 for (_, k), v in m.items())
    assert any(k == "grad/norm" and v > 0 for (_, k), v in m.items()), "the policy never moved"
    if case == "snis":
        assert any(k == "correction/snis/truncated_frac" for (_, k) in m)


def test_the_trainer_asks_the_task_only_for_what_a_part_needs(monkeypatch):
    from grpo_bench.tasks.sort import SortTask
    from grpo_bench.engine.trainer import train

    asked = []
    for method in ("sum_pi_squared", "reference_rewards"):
        orig = getattr(SortTask, method)
        monkeypatch.setattr(SortTask, method, lambda self, *a, _o=orig, _m=method: asked.append(_m) or _o(self, *a))
    raw = {"task": {"name": "sort", "prompts": None, "num_prompts": 3}, "group_size": 3, "epochs": 2, "eval_every": 0}
    train(resolve_run(copy.deepcopy(raw)))
    assert asked == []
    train(resolve_run({**raw, "delta": "optimal_token_baseline"}))
    assert asked == ["sum_pi_squared"] * 2
    asked.clear()
    train(resolve_run({**raw, "delta": {"name": "a2po", "samples": 2}, "loss": "a2po"}))
    assert asked == ["reference_rewards"] * 2


def test_list_shows_the_four_with_their_sources_and_peers():
    text = registry.describe(fused_names)
    new = {("delta", "optimal_token_baseline"): "verl adv_estimator=optimal_token_baseline",
           ("delta", "gtpo"): "huggingface/trl#5226", ("delta", "a2po"): "TRL experimental A2POTrainer",
           ("loss", "a2po"): "TRL experimental A2POTrainer", ("correction", "snis"): "verl rollout_is_batch_normalize"}
    for (axis, name), peer in new.items():
        e = registry.entry(axis, name)
        assert peer in e.source and "arXiv" in e.source or axis == "correction", (axis, name)
        assert f"  {name} " in text and peer in text
    assert registry.entry("delta", "optimal_token_baseline").traits["token_level"]
    assert registry.entry("delta", "gtpo").traits["token_level"]


def test_the_name_map_has_the_new_rows():
    from helpers import ROOT

    doc = (ROOT / "docs" / "registry.md").read_text()
    for row in ("`optimal_token_baseline`", "tir_optimal_token_baseline", "rollout_is_batch_normalize", "`snis`",
                "a2po", "GTPO", "`gtpo`"):
        assert row in doc, row
