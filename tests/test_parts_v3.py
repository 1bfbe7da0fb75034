"""Registry v3: the off-policy corrections, entropy control, and the parts peers shipped since v2.

Each part against hand-computed values and its paper's (or its peer's) formula written out
here; where the peer's own code is importable it runs beside the registry on one batch:
verl 0.9.1 (core_algos, rollout_corr_helper; skipped when verl is absent) and TRL 1.16
(GRPOTrainer). AReaL's M2PO, ROLL's TOPR, NeMo-RL's NLL term and SkyRL's MaxRL are not
installable here: their functions are re-derived in this file from their source, cited.
"""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import close, rand_batch

from grpo_bench import registry
from grpo_bench.algos import Batch
from grpo_bench.algos.corrections import mismatch
from grpo_bench.algos.deltas import clip_deltas
from grpo_bench.errors import ConfigError
from grpo_bench.config.run import resolve_run
from grpo_bench.numerics.kernels.spec import LossSpec
from grpo_bench.numerics.logprobs import grpo_loss
from grpo_bench.numerics.kernels.spec import fused_names

E = math.e


pytestmark = pytest.mark.usefixtures("fp64")


def T(x):
    return torch.as_tensor(x, dtype=torch.float64).clone()   # lists or tensors, never an alias


def part(axis, name):
    return registry.get(axis, name)




# ================================================================== deltas

def test_gdpo_normalises_each_component_then_sums_with_the_task_weights():
    comps = T([[[1, 1, 1], [0, 1, 1], [1, 0, 1], [0, 0, 1]],      # correct, format, a flat third component
               [[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]]])     # a flat group
    w = [1.0, 0.5, 2.0]
    rewards = (comps * T(w)).sum(-1)
    s = 0.5 / (math.sqrt(1 / 3) + 1e-6)   # each binary column of the first group: mean 1/2, std sqrt(1/3)
    got = part("delta", "gdpo")(rewards, None, None, comps, reward_weights=w, batch_norm="none")
    close(got, [[1.5 * s, -0.5 * s, 0.5 * s, -1.5 * s], [0, 0, 0, 0]])
    assert (got[1] == 0).all()                                      # exactly: no signal
    # not GRPO on the weighted sum: z-scoring the total gives other advantages
    grpo = part("delta", "zscore")(rewards)
    assert not torch.allclose(got[0], grpo[0], atol=1e-3)
    # unit weights when none are given (verl's default), the total as the only component without components
    close(part("delta", "gdpo")(rewards, None, None, comps, batch_norm="none")[0], [2 * s, 0, 0, -2 * s])
    close(part("delta", "gdpo")(rewards, None, None, None, batch_norm="none"), grpo)


def test_gdpo_batch_norms():
    gen = torch.Generator().manual_seed(1)
    comps = torch.randint(0, 2, (3, 4, 2), generator=gen).double()
    lengths = torch.randint(1, 6, (3, 4), generator=gen).double()
    rewards = comps.sum(-1)
    x = part("delta", "gdpo")(rewards, lengths, None, comps, batch_norm="none")
    # TRL: (x - mean) / (std + eps) over responses, with its eps in both places
    y = part("delta", "gdpo")(rewards, lengths, None, comps, batch_norm="none", eps=1e-4)
    close(part("delta", "gdpo")(rewards, lengths, None, comps, batch_norm="responses", eps=1e-4),
          (y - y.mean()) / (y.std() + 1e-4))
    # verl: whitened over tokens, each response counted |o| times, Bessel over tokens, eps 1e-8 under the root
    n = lengths.sum()
    mean = (lengths * x).sum() / n
    var = (lengths * (x - mean) ** 2).sum() / (n - 1)
    close(part("delta", "gdpo")(rewards, lengths, None, comps), (x - mean) / torch.sqrt(var + 1e-8))
    with pytest.raises(ValueError, match="2 reward_weights for 3 reward components"):
        part("delta", "gdpo")(rewards, lengths, None, torch.cat([comps, comps[..., :1]], -1), reward_weights=[1, 1])


def test_gdpo_takes_the_task_weights_from_the_run_config():
    cfg = resolve_run({"task": {"name": "sort", "rewards": {"match": 1.0, "inclusion_order": 0.25}}, "delta": "gdpo"})
    assert cfg.delta["reward_weights"] == [1.0, 0.25]
    cfg = resolve_run({"task": "sort", "delta": {"name": "gdpo", "reward_weights": [2.0]}})
    assert cfg.delta["reward_weights"] == [2.0]                     # given wins over the task's


def test_maxrl_hand_values():
    r = T([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [-1, 1, 0, 0]])
    got = part("delta", "maxrl")(r)
    eps = 1e-6
    close(got[0], [0.75 / (0.25 + eps), -0.25 / (0.25 + eps), -0.25 / (0.25 + eps), -0.25 / (0.25 + eps)])
    close(got[1], [0.25 / (0.75 + eps)] * 3 + [-0.75 / (0.75 + eps)])
    close(got[2:], torch.zeros(2, 4))    # nothing solved; a mean of 0 from mixed signs
    # the paper's binary reading: a correct answer of a group with K of G correct gets (G - K) / K, a wrong one -1
    for k in (1, 2, 3):
        row = T([[1.0] * k + [0.0] * (4 - k)])
        close(part("delta", "maxrl")(row, eps=1e-300), [[(4 - k) / k] * k + [-1.0] * (4 - k)])


def test_advantage_clipping():
    d = T([[-3.0, -0.5, 0.5, 3.0]])
    close(clip_deltas(d, 1.0), [[-1.0, -0.5, 0.5, 1.0]])
    close(clip_deltas(d, [None, 2.0]), [[-3.0, -0.5, 0.5, 2.0]])
    close(clip_deltas(d, [-0.25, None]), [[-0.25, -0.25, 0.5, 3.0]])
    assert clip_deltas(d, None) is d
    assert resolve_run({"adv_clip": [-1, None]}).adv_clip == [-1, None]
    assert resolve_run({"adv_clip": 0.5}).adv_clip == 0.5   # any number > 0, not only those past 1
    assert resolve_run({"adv_clip": [None, None]}).adv_clip == [None, None]
    assert resolve_run({"adv_clip": [0, 1]}).adv_clip == [0, 1]
    for bad in (0, -1.0, [1.0, 0.5], [1], "x", [None, "y"], True, [False, 1.0], [float("nan"), 1.0], [1.0, 1.0],
                [0.5, 1.0, 2.0]):
        with pytest.raises(ConfigError, match="adv_clip: expected null, a number > 0 or a pair"):
            resolve_run({"adv_clip": bad})


# ================================================================== losses

def test_dro_hand_value_and_gradient():
    lp = torch.tensor([[[math.log(0.5)]]], requires_grad=True)
    old, a = T([[[math.log(0.25)]]]), T([[2.0]])
    loss, regions = part("loss", "dro")(lp, old, a, torch.ones(1, 1, 1), tau=0.1)
    lr = math.log(2.0)
    close(loss, [[[2 * math.log(2) + 0.05 * lr ** 2]]])
    loss.sum().backward()
    close(lp.grad, [[[-2.0 + 0.1 * lr]]])                           # -A + tau log r
    assert regions == {}


def test_topr_tapers_only_negative_responses():
    lp = T([[[math.log(0.5), math.log(0.5)], [math.log(0.5), math.log(0.5)]]]).requires_grad_()
    old = T([[[math.log(0.25), math.log(1.0)], [math.log(0.25), math.log(1.0)]]])   # ratios 2 and 1/2
    a = T([[1.5, -1.5]])
    loss, regions = part("loss", "topr")(lp, old, a, torch.ones(1, 2, 2))
    l2 = math.log(2)
    close(loss, [[[1.5 * l2, 1.5 * l2], [-1.5 * l2, -0.5 * 1.5 * l2]]])   # positive: -A log pi whatever the ratio
    loss.sum().backward()
    close(lp.grad, [[[-1.5, -1.5], [1.5, 0.75]]])                  # negative: sg(min(ratio, 1)) A
    assert regions["cap"].tolist() == [[[False, False], [True, False]]]
    # what the cap region counts (clip/cap_frac, clip/frac): a flat group's zero-advantage tokens and a ratio of
    # exactly 1 (every token of a rollout's first update) are not cut
    _, regions = part("loss", "topr")(lp.detach(), old, T([[0.0, -1.5]]), torch.ones(1, 2, 2))
    assert regions["cap"].tolist() == [[[False, False], [True, False]]]
    _, regions = part("loss", "topr")(lp.detach(), lp.detach(), a, torch.ones(1, 2, 2))
    assert not regions["cap"].any()


def test_topr_against_roll():
    """ROLL's _compute_topr_loss (roll/pipeline/rlvr/actor_pg_worker.py), split by score > 0 as ROLL does:
    with 0/1 rewards and group-centred deltas it is the registry's split by delta > 0."""
    gen = torch.Generator().manual_seed(2)
    scores = torch.randint(0, 2, (4, 4), generator=gen).double()
    scores[0] = 1.0                                                 # a solved group: no gradient either way
    adv = part("delta", "zscore")(scores)
    lp = (-3 * torch.rand(4, 4, 5, generator=gen)).requires_grad_()
    old = lp.detach() + 0.4 * torch.randn(4, 4, 5, generator=gen)
    ratio = torch.exp(lp - old)
    a = adv.unsqueeze(-1)
    pos = (scores > 0).double().unsqueeze(-1)
    roll = -a * lp * pos - torch.clamp(ratio, 0.0, 1.0).detach() * a * lp * (1 - pos)
    (g_roll,) = torch.autograd.grad(roll.sum(), lp)
    ours, _ = part("loss", "topr")(lp, old, adv, torch.ones_like(lp))
    (g_ours,) = torch.autograd.grad(ours.sum(), lp)
    close(g_ours, g_roll)


def test_positive_example_nll_term():
    lp = T([[[-1.0, -2.0], [-0.5, -4.0]], [[-3.0, -3.0], [-1.0, -1.0]]]).requires_grad_()
    mask = T([[[1, 1], [1, 0]], [[1, 1], [1, 1]]])
    d = T([[1.0, -1.0], [0.0, 0.5]])
    base, _ = grpo_loss(lp, lp.detach(), None, d, mask, loss="naive", aggregate="token_sum", backend="torch")
    value, stats = grpo_loss(lp, lp.detach(), None, d, mask, loss="naive", aggregate="token_sum", nll_coef=0.1,
                             backend="torch")
    nll = (1.0 + 2.0 + 1.0 + 1.0) / 4                                # delta > 0: responses (0, 0) and (1, 1)
    close(stats["loss/nll"], nll)
    close(value, base + 0.1 * nll)
    # NeMo-RL's rule, rewards > 0, given explicitly; no positive response: the term is 0
    _, stats = grpo_loss(lp, lp.detach(), None, d, mask, loss="naive", nll_coef=0.1, backend="torch",
                         positive=T([[0, 1], [0, 0]]))
    close(stats["loss/nll"], 0.5)                                    # only (0, 1)'s one token, -(-0.5)
    _, stats = grpo_loss(lp, lp.detach(), None, -d.abs(), mask, loss="naive", nll_coef=0.1, backend="torch")
    close(stats["loss/nll"], 0.0)


def test_nll_term_against_nemo_rl():
    """NeMo-RL ClippedPGLossFn (nemo_rl/algorithms/loss/loss_functions.py): loss + w * masked_mean(-logp,
    mask * [reward > 0]) normalised by the correct tokens."""
    logp, old, _, d, mask = rand_batch(seed=4)
    rewards = (d > 0).double() * torch.rand(d.shape, generator=torch.Generator().manual_seed(0))
    lp = logp.clone().requires_grad_()
    ours, _ = grpo_loss(lp, old, None, d, mask, loss="clipped", aggregate="token_mean", nll_coef=0.3,
                        positive=rewards > 0, backend="torch")
    correct = mask * (rewards > 0).double().unsqueeze(-1)
    x = logp.clone().requires_grad_()
    base, _ = grpo_loss(x, old, None, d, mask, loss="clipped", aggregate="token_mean", backend="torch")
    nemo = base + 0.3 * (-x * correct).sum() / correct.sum()
    close(ours, nemo)
    (g1,), (g2,) = torch.autograd.grad(ours, lp), torch.autograd.grad(nemo, x)
    close(g1, g2)


# ================================================================== aggregation

def test_prompt_mean_hand_values_and_trl_5375():
    """prompt 0: responses of 3 tokens (1 each) and 1 token (4); prompt 1: 2 tokens (2 each) and an empty one."""
    x = T([[[1, 1, 1], [4, 0, 0]], [[2, 2, 0], [9, 9, 9]]])
    m = T([[[1, 1, 1], [1, 0, 0]], [[1, 1, 0], [0, 0, 0]]])
    agg = lambda name: registry.get("aggregate", name)(x, m).item()  # noqa: E731
    assert agg("prompt_mean") == pytest.approx(((3 + 4) / 4 + 2) / 2)        # 1.875
    assert agg("token_mean") == pytest.approx(11 / 6)
    assert agg("seq_mean_token_mean") == pytest.approx((1 + 4 + 2) / 3)     # TRL's loss_type=grpo
    # equal lengths: all three are the same number (where trl#5375's "it is the same" holds)
    y = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    ones = torch.ones(2, 3, 4)
    vals = [registry.get("aggregate", n)(y, ones) for n in ("prompt_mean", "token_mean", "seq_mean_token_mean")]
    close(vals[0], vals[1])
    close(vals[0], vals[2])
    # a prompt with no token at all is not part of the batch
    m2 = m.clone()
    m2[1] = 0
    assert registry.get("aggregate", "prompt_mean")(x, m2).item() == pytest.approx(7 / 4)
    # a prompt of one token is a prompt: (4 + 2) / 2, not 6 over the one prompt with more tokens
    m3 = torch.zeros_like(m)
    m3[0, 1, 0] = m3[1, 0, 0] = m3[1, 0, 1] = 1
    assert registry.get("aggregate", "prompt_mean")(x, m3).item() == pytest.approx(3.0)


# ================================================================== corrections

def corr(name, lr, mask=None, deltas=None, logp=None, **params):
    """A correction on log rho = log pi_old - log pi_s given per token (sampler fixed at -1)."""
    lr = T(lr)
    sampler = torch.full_like(lr, -1.0)
    mask = torch.ones_like(lr) if mask is None else T(mask)
    deltas = torch.ones(lr.shape[:-1]) if deltas is None else T(deltas)
    logp = sampler + lr if logp is None else T(logp)
    return registry.get("correction", name)(logp, sampler + lr, sampler, deltas, mask, **params)


def test_token_and_sequence_tis():
    w, keep, reg = corr("token_tis", [[[1.0, -1.0, 0.0, 3.0]]], high=2.0)
    close(w[..., :3], [[[2.0, 1 / E, 1.0]]])
    assert keep.all() and reg["truncated"][..., :3].tolist() == [[[True, False, False]]]
    w, _, reg = corr("token_tis", [[[1.0, -1.0, 0.0]]], low=0.5, high=2.0)
    close(w, [[[2.0, 0.5, 1.0]]])
    assert reg["truncated"].tolist() == [[[True, True, False]]]
    # sequence: the product over unmasked tokens; the masked 3.0 is not part of it
    w, _, reg = corr("seq_tis", [[[0.5, -0.5, 0.25, 3.0], [1.0, 1.0, 0.0, 0.0]]], mask=[[[1, 1, 1, 0], [1, 1, 1, 1]]])
    close(w[0, 0], [math.exp(0.25)] * 4)
    close(w[0, 1], [2.0] * 4)                                        # e^2 truncated
    assert reg["truncated"][0, 1].all() and not reg["truncated"][0, 0].any()


def test_masked_is_icepop_and_decoupled():
    lr = [[[math.log(0.55), math.log(0.45), math.log(4.9), math.log(5.1), 0.0]]]
    w, keep, reg = corr("token_mis", lr)                             # IcePop's [0.5, 5]
    close(w, [[[0.55, 0.0, 4.9, 0.0, 1.0]]])
    assert keep.all() and reg["masked"].tolist() == [[[False, True, False, True, False]]]
    w2, _, _ = corr("decoupled", lr)                                # AReaL: only above the cap
    close(w2, [[[0.55, 0.45, 4.9, 0.0, 1.0]]])
    w, _, reg = corr("token_mis", [[[0.0, 1e-12, -1e-12]]], low=1.0, high=1.0)   # the bounds are kept
    close(w, [[[1.0, 0.0, 0.0]]])
    lp, old, sampler, d, mask = rand_batch(seed=5, mismatch_=1.0)
    for cap in (None, 1.5):
        a = registry.get("correction", "decoupled")(lp, old, sampler, d, mask, cap=cap)
        b = registry.get("correction", "token_mis")(lp, old, sampler, d, mask, low=None, high=cap)
        close(a[0], b[0])
    w, _, reg = corr("seq_mis", [[[1.0, 0.5], [0.5, 0.5]]], high=3.0)
    close(w, [[[0.0, 0.0], [E, E]]])                                  # e^1.5 > 3: the whole response
    assert reg["masked"][0, 0].all() and not reg["masked"][0, 1].any()


def test_rollout_rs_divergences_and_levels():
    lr = [[[1.0, -1.0, 0.0]]]                                         # log pi_old - log pi_s
    k3 = [E - 2, 1 / E, 0.0]
    _, keep, reg = corr("rollout_rs", lr, divergence="k3", level="token", high=0.5)
    assert keep.tolist() == [[[False, True, True]]] and reg["masked"].tolist() == [[[True, False, False]]]
    for level, stat in (("seq_mean", sum(k3) / 3), ("seq_sum", sum(k3)), ("seq_max", max(k3))):
        for high, kept in ((stat + 1e-9, True), (stat - 1e-9, False)):
            _, keep, _ = corr("rollout_rs", lr, divergence="k3", level=level, high=high)
            assert keep.all() == kept and keep.any() == kept, (level, high)
    _, keep, _ = corr("rollout_rs", lr, divergence="k2", level="token", high=0.4)   # k2 = 1/2, 1/2, 0
    assert keep.tolist() == [[[False, False, True]]]
    # k1 = log pi_s - log pi_old, bounded on exp(k1) = pi_s / pi_old; low null is 1 / high
    _, keep, _ = corr("rollout_rs", lr, divergence="k1", level="token", high=2.0)
    assert keep.tolist() == [[[False, False, True]]]
    _, keep, _ = corr("rollout_rs", lr, divergence="k1", level="token", low=0.3, high=3.0)
    assert keep.all()
    w, _, _ = corr("rollout_rs", lr, divergence="k3", level="token", high=0.5)
    assert (w == 1).all()                                            # rejection removes, it never reweights


def test_rollout_rs_k1_bounds_are_inclusive_and_low_defaults_to_one_over_high():
    """k1 keeps low <= pi_s / pi_old <= high, both ends included, and low null is 1 / high: with high 2 a
    ratio of 0.6 stays and 0.4 leaves (a default low of 1 would drop 0.6 too)."""
    old = T([[[-math.log(0.6), -math.log(0.4), -math.log(2.0), -math.log(0.5), -math.log(2.5)]]])
    zero = torch.zeros_like(old)   # log pi_s: the ratios' logs exactly, as the bounds' are taken
    _, keep, _ = registry.get("correction", "rollout_rs")(old, old, zero, torch.ones(1, 1), torch.ones_like(old),
                                                          divergence="k1", level="token", high=2.0)
    assert keep.tolist() == [[[True, False, True, True, False]]]
    # k2 and k3 keep a divergence equal to high
    _, keep, _ = corr("rollout_rs", [[[1.0, 1.25]]], divergence="k2", level="token", high=0.5)
    assert keep.tolist() == [[[True, False]]]


def test_geo_mask_is_rollout_rs_k1_seq_mean():
    lp, old, sampler, d, mask = rand_batch(seed=6, mismatch_=0.002)
    a = registry.get("correction", "geo_mask")(lp, old, sampler, d, mask)
    b = registry.get("correction", "rollout_rs")(lp, old, sampler, d, mask, divergence="k1", level="seq_mean",
                                                 low=0.999, high=1.001)
    assert torch.equal(a[1], b[1]) and a[1].any() and not a[1].all()
    geo = torch.exp(((sampler - old) * mask).sum(-1) / mask.sum(-1))   # the geometric mean of pi_s / pi_old
    assert torch.equal(a[1][..., 0], (geo >= 0.999) & (geo <= 1.001))


def test_opsm_masks_negative_far_off_policy_responses_only():
    sampler = T([[[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]]])
    logp = sampler - T([[[0.6, 0.6], [0.6, 0.6], [0.4, 0.4]]])       # mean log pi_s - log pi: 0.6, 0.6, 0.4
    w, keep, reg = registry.get("correction", "opsm")(logp, logp, sampler, T([[-1.0, 1.0, -1.0]]),
                                                      torch.ones(1, 3, 2), threshold=0.5)
    close(w, [[[0, 0], [1, 1], [1, 1]]])
    assert keep.all() and reg["masked"][0, 0].all() and not reg["masked"][0, 1:].any()


def test_opsm_drops_only_negative_responses_strictly_beyond_the_threshold():
    """DeepSeek-V3.2's eq. 9 masks when A < 0 and the divergence exceeds delta: a zero-advantage response
    (a flat group's) and one exactly at delta stay, and the mask's share counts neither."""
    sampler = torch.full((1, 3, 2), -1.0)
    logp = sampler - T([[[0.5, 0.5], [0.75, 0.75], [0.75, 0.75]]])   # divergences 0.5, 0.75, 0.75
    w, _, reg = registry.get("correction", "opsm")(logp, logp, sampler, T([[-1.0, 0.0, -2.0]]),
                                                   torch.ones(1, 3, 2), threshold=0.5)
    close(w, [[[1, 1], [1, 1], [0, 0]]])
    assert reg["masked"].tolist() == [[[False, False], [False, False], [True, True]]]


def test_opsm_against_trl_get_off_policy_mask():
    from trl import GRPOTrainer

    lp, old, sampler, d, mask = rand_batch(b=4, g=4, seed=7, mismatch_=0.8)
    w, _, _ = registry.get("correction", "opsm")(lp, old, sampler, d, mask, threshold=0.3)
    trl = GRPOTrainer.get_off_policy_mask(d.reshape(-1, 1), lp.reshape(16, -1), sampler.reshape(16, -1),
                                          mask.reshape(16, -1), off_policy_threshold=0.3)
    assert torch.equal(w[..., 0].reshape(-1, 1), trl) and (trl == 0).any() and (trl == 1).any()


def _areal_m2po_keep(log_rho, mask, threshold):
    """AReaL's _apply_m2po_masking / _get_m2po_loss_mask (areal/trainer/ppo/actor.py), transcribed."""
    m2 = (log_rho * log_rho).reshape(-1)
    on = (mask > 0).reshape(-1)
    sel = m2[on]
    if sel.numel() == 0:
        return mask > 0
    sorted_m2, idx = torch.sort(sel, descending=True)
    n = sel.numel()
    avg = sorted_m2.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=sel.dtype)
    below = torch.where(avg < threshold)[0]
    k = below[0].item() if len(below) else n - 1
    keep_sorted = torch.ones(n, dtype=torch.bool)
    keep_sorted[:k] = False
    out = torch.zeros_like(on)
    out[on] = keep_sorted[torch.argsort(idx)]
    return out.view_as(mask)


def test_m2po_hand_values_and_against_areal():
    lr = [[[0.3, 0.2, 0.1, 0.0]]]                                     # (log rho)^2 = .09 .04 .01 0
    # suffix means .035, .05/3, .005, 0: mask until the rest's mean is strictly below the threshold
    for threshold, masked in ((0.04, 0), (0.03, 1), (0.02, 1), (0.0125, 2), (0.004, 3), (0.0, 3)):
        _, keep, reg = corr("m2po", lr, threshold=threshold)
        assert keep.tolist() == [[[i >= masked for i in range(4)]]], threshold
        assert reg["masked"].sum() == masked
    # the paper's variant reads the current policy instead of the old one
    _, keep, _ = corr("m2po", [[[0.0, 0.0]]], logp=[[[-0.5, -1.0]]], threshold=0.01, against="current")
    assert keep.tolist() == [[[False, True]]]
    lp, old, sampler, d, mask = rand_batch(b=3, g=4, t=7, seed=8, mismatch_=0.3)
    mask[1, 2] = 0
    for thr in (0.2, 0.05, 0.02, 0.005):
        _, keep, _ = registry.get("correction", "m2po")(lp, old, sampler, d, mask, threshold=thr)
        want = _areal_m2po_keep(old - sampler, mask, thr)
        assert torch.equal(keep & (mask > 0), want), thr


def test_m2po_strict_threshold_and_ties_leave_in_token_order():
    """Powers of two keep every mean exact: (log rho)^2 = 1/4, 1/16, 1/64, 0, suffix means 0.08203125, 0.026,
    0.0078125, 0. At a threshold equal to the third mean, that suffix is not below it: three leave."""
    lr = [[[0.5, 0.25, 0.125, 0.0]]]
    _, keep, _ = corr("m2po", lr, threshold=0.0078125)
    assert keep.tolist() == [[[False, False, False, True]]]
    _, keep, _ = corr("m2po", lr, threshold=0.0078126)
    assert keep.tolist() == [[[False, False, True, True]]]
    # 100 tied tokens then 28 at 0: the suffix mean 0.25 (100 - i) / (128 - i) drops below 0.1 at i = 82, and
    # the 82 that leave are the first 82 in token order, on any device (torch's unstable sort reorders ties
    # from about 100 elements)
    lr = torch.cat([torch.full((100,), 0.5), torch.zeros(28)]).view(1, 4, 32)
    _, keep, _ = corr("m2po", lr, threshold=0.1)
    assert keep.reshape(-1).tolist() == [False] * 82 + [True] * 46


def test_mismatch_metrics_hand_values():
    old, sampler = T([[[1.0, -1.0, 0.0, 5.0]]]) - 2, torch.full((1, 1, 4), -2.0)
    m = mismatch(old, sampler, T([[[1, 1, 1, 0]]]))
    close(m["mismatch/kl"], 0.0)                                      # mean of log pi_s - log pi_old
    close(m["mismatch/k3"], (E - 2 + 1 / E) / 3)
    close(m["mismatch/ratio_max"], E)
    close(m["mismatch/ratio_min"], 1 / E)
    m = mismatch(old, sampler, torch.zeros(1, 1, 4))
    assert m["mismatch/ratio_max"] == 1 and m["mismatch/ratio_min"] == 1 and m["mismatch/kl"] == 0
    # log-ratios are clamped to [-20, 20] before exp, as verl's SAFETY_BOUND
    m = mismatch(T([[[25.0, -25.0]]]), torch.zeros(1, 1, 2), torch.ones(1, 1, 2))
    close(m["mismatch/ratio_max"], math.exp(20.0))
    close(m["mismatch/ratio_min"], math.exp(-20.0))
    close(m["mismatch/kl"], 0.0)


# ------------------------------------------------------------ composition

def test_composed_weight_is_detached_even_from_a_part_that_keeps_its_graph():
    """A user's correction may build its weight from the current policy: compose hands back a weight
    without a graph, so no gradient ever flows through an importance weight."""
    from grpo_bench.algos.corrections import compose
    lp = torch.zeros(1, 1, 2, requires_grad=True)
    part = SimpleNamespace(name="mine", obj=lambda logp, *a: (torch.exp(logp), torch.ones_like(logp) > 0, {}))
    w, _, _ = compose([(part, {})], lp, lp.detach(), None, torch.ones(1, 1), torch.ones(1, 1, 2))
    assert not w.requires_grad and torch.equal(w, torch.ones(1, 1, 2))


def test_corrections_compose_into_grpo_loss():
    lp, old, sampler, d, mask = rand_batch(seed=9, mismatch_=0.5)
    x = lp.clone().requires_grad_()
    base, stats0 = grpo_loss(x, old, None, d, mask, loss="naive", aggregate="token_sum", backend="torch")
    # no separate sampler: rho is 1, TIS changes nothing
    same, stats = grpo_loss(x, old, None, d, mask, loss="naive", aggregate="token_sum", backend="torch",
                            corrections=["token_tis"])
    assert same.item() == base.item() and stats["mismatch/kl"] == 0 and stats["correction/token_tis/truncated_frac"] == 0
    # weights multiply the policy term token by token; rejection leaves the normaliser
    value, stats = grpo_loss(x, old, None, d, mask, loss="naive", aggregate="token_sum", backend="torch",
                             sampler_logp=sampler, corrections=["token_tis", {"name": "seq_mis", "high": 1.5}])
    w = torch.exp(old - sampler).clamp(max=2.0)
    seq = torch.exp(((old - sampler) * mask).sum(-1, keepdim=True))
    w = w * torch.where(seq > 1.5, 0.0, seq)
    close(value, (-x * d.unsqueeze(-1) * w * mask).sum())
    (g,) = torch.autograd.grad(value, x)
    close(g, -d.unsqueeze(-1) * w * mask)                             # no gradient through the weight
    assert 0 < stats["correction/token_tis/truncated_frac"] < 1 and 0 < stats["correction/seq_mis/masked_frac"] < 1
    assert stats["mismatch/ratio_max"] > 1 > stats["mismatch/ratio_min"]
    value, stats = grpo_loss(x, old, None, d, mask, loss="naive", aggregate="token_mean", backend="torch",
                             sampler_logp=sampler, corrections=[{"name": "rollout_rs", "level": "token", "high": 0.02}])
    keep = (torch.exp(old - sampler) - 1 - (old - sampler)) <= 0.02
    kept = mask * keep
    close(value, (-x * d.unsqueeze(-1) * kept).sum() / kept.sum())
    close(stats["correction/rollout_rs/masked_frac"], ((~keep) & (mask > 0)).sum() / mask.sum())


def test_corrections_and_new_terms_are_never_fused():
    spec = LossSpec("clipped", (("clip_high", 0.2), ("clip_low", 0.2)), "token_mean", (), None, 0.0, False)
    assert spec.fusable()
    for term in ("correction", "entropy", "nll"):
        s = LossSpec("clipped", spec.loss_params, "token_mean", (), None, 0.0, False, (term,))
        assert not s.fusable()
        with pytest.raises(ValueError, match=f"the fused loss kernel has no {term} term; use backend='torch'"):
            s.check()


def test_list_shows_every_new_part_with_its_source():
    text = registry.describe(fused_names)
    new = {"correction": registry.names("correction"), "entropy_ctrl": ["fixed", "adaptive"],
           "delta": ["gdpo", "maxrl"], "loss": ["dro", "topr"], "aggregate": ["prompt_mean"],
           "filter": ["zero_variance", "no_positive_resample"]}
    for axis, names in new.items():
        assert f"\n{axis}:" in "\n" + text
        for name in names:
            assert registry.entry(axis, name).source, (axis, name)
            assert f"  {name} " in text
    assert len(new["correction"]) == 10   # nine of registry v3, snis of v4


# ================================================================== entropy

def test_entropy_bonus_is_a_token_mean_over_the_gated_mask():
    lp, old, _, d, mask = rand_batch(seed=10)
    h = torch.rand(lp.shape, generator=torch.Generator().manual_seed(1)).requires_grad_()
    gate = (torch.rand(lp.shape, generator=torch.Generator().manual_seed(2)) > 0.5).double()
    base, _ = grpo_loss(lp, old, None, d, mask, gate=gate, backend="torch")
    value, stats = grpo_loss(lp, old, None, d, mask, gate=gate, entropy=h, entropy_coef=0.2, backend="torch")
    eff = mask * gate
    close(stats["loss/entropy"], (h * eff).sum() / eff.sum())
    close(value, base - 0.2 * (h * eff).sum() / eff.sum())
    (g,) = torch.autograd.grad(value, h)
    close(g, -0.2 * eff / eff.sum())
    # coefficient 0: the value is the base's to the bit, the entropy still measured for a controller
    value, stats = grpo_loss(lp, old, None, d, mask, gate=gate, entropy=h, backend="torch")
    assert value.item() == base.item() and "loss/entropy" in stats


def test_entropy_controllers_hand_values():
    fixed, adaptive = registry.get("entropy_ctrl", "fixed"), registry.bind("entropy_ctrl", {
        "name": "adaptive", "target": 0.5, "coef_min": 0.03, "coef_max": 0.07, "delta": 0.01})
    assert fixed(0.05, None) == (0.05, 0.05) and fixed(0.05, 9.0) == (0.05, 0.05)
    state, applied = adaptive(0.05, None)
    assert (state, applied) == (0.05, 0.0)                           # nothing applied before a measurement
    trace = []
    for h in (0.4, 0.4, 0.4, 0.6, 0.6, 0.6, 0.6, 0.5):
        state, applied = adaptive(state, h)
        trace.append((round(state, 10), round(applied, 10)))
    assert trace == [(0.06, 0.06), (0.07, 0.07), (0.07, 0.07), (0.06, 0.0), (0.05, 0.0), (0.04, 0.0), (0.03, 0.0),
                     (0.04, 0.04)]


# ================================================================== filters

def _batch(rewards, g_len=3):
    r = T(rewards)
    b, g = r.shape
    return Batch(r, torch.ones(b, g, g_len), torch.full((b, g), g_len), torch.ones(b, g, dtype=torch.bool), g_len)


def test_zero_variance_drops_flat_groups_from_the_loss_without_redrawing():
    out = registry.get("filter", "zero_variance")(_batch([[1, 1, 1], [0, 1, 0], [0.5, 0.5, 0.5]]))
    assert out.mask.sum((1, 2)).tolist() == [0.0, 9.0, 0.0]
    assert out.keep is None and out.max_draws == 1 and torch.equal(out.rewards, T([[1, 1, 1], [0, 1, 0], [0.5] * 3]))


def test_no_positive_resample_retires_prompts_at_the_pass_rate():
    f = registry.bind("filter", {"name": "no_positive_resample", "threshold": 0.6})
    out = f(_batch([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1.1, 0.9, 1.0]]))
    assert out.retire.tolist() == [True, True, False, True] and torch.equal(out.mask, _batch([[0] * 3] * 4).mask)
    out = registry.get("filter", "no_positive_resample")(_batch([[1, 1, 1, 1, 1, 1, 1, 1, 1, 0]]))
    assert out.retire.tolist() == [True]                             # 0.9, ScaleRL's bound, is reached
    # a prompt another filter already retired stays retired beside the ones this one retires
    first = _batch([[0, 0, 0], [1, 1, 1]]).replace(retire=torch.tensor([True, False]))
    assert f(first).retire.tolist() == [True, True]


def test_sort_task_never_draws_a_retired_prompt_and_is_unchanged_without_one():
    from grpo_bench.engine.trainer import build_task

    cfg = resolve_run({"task": {"name": "sort", "prompts": None, "n": 2, "vocab": 2, "num_prompts": 12}})
    other = resolve_run({"task": {"name": "sort", "prompts": None, "n": 2, "vocab": 2, "num_prompts": 12}, "seed": 1})
    task, fresh = build_task([cfg, other]), build_task([cfg, other])
    assert torch.equal(task.rollout(0, 0, 2).prompts, fresh.rollout(0, 0, 2).prompts)
    task.retire(0, torch.tensor([[0, 0], [1, 1]]))
    for epoch in range(5):
        ro = task.rollout(epoch, 0, 2)
        assert {tuple(p) for p in ro.prompts[0].tolist()} <= {(0, 1), (1, 0)}
        # a member's curriculum is its own: the other member still draws every prompt
        assert torch.equal(ro.prompts[1], fresh.rollout(epoch, 0, 2).prompts[1])
    with pytest.raises(RuntimeError, match="every prompt is retired"):
        task.retire(0, torch.tensor([[0, 1], [1, 0]]))
    fixed = build_task([resolve_run({"task": "sort"})])
    with pytest.raises(RuntimeError, match="needs a stream of random prompts"):
        fixed.retire(0, torch.tensor([[1, 0, 2]]))


# ================================================================== tasks

def test_arithmetic_components_retire_and_the_fp32_head_option():
    from grpo_bench.engine.trainer import build_task

    cfg = resolve_run({"task": {"name": "arithmetic", "prompts_per_step": 3, "pass_k": 0,
                                "rewards": {"correct": 1.0, "format": 0.1, "length": 0.5}},
                       "group_size": 2, "backend": "chunked"})
    task = build_task([cfg])
    ro = task.rollout(0, 0, 2)
    assert ro.components.shape == (1, 3, 2, 3)
    close(ro.components.double() @ T([1.0, 0.1, 0.5]), ro.rewards.double(), rtol=1e-6, atol=1e-6)
    assert (ro.components[..., 2] < 0).all() and ro.take(torch.tensor([[2, 0]])).components.shape == (1, 2, 2, 3)
    n = len(task._exclude[0])
    task.retire(0, ro.prompts[0][:2])
    assert set(ro.prompts[0][:2]) <= task._exclude[0] and len(task._exclude[0]) > n
    for name in ("arithmetic", "countdown"):  # a gym preset too: there the cast was once a silent no-op
        with pytest.raises(ConfigError, match="model.cast_lm_head_to_fp32: needs backend chunked"):
            resolve_run({"task": {"name": name, "model": {"cast_lm_head_to_fp32": True}}, "backend": "torch"})


def test_fp32_lm_head_changes_only_a_bf16_model():
    from grpo_bench.tasks.lm import models
    from grpo_bench.engine.trainer import build_task

    def task_for(fp32):
        cfg = resolve_run({"task": {"name": "arithmetic", "prompts_per_step": 3, "pass_k": 0,
                                    "model": {"source": "tiny-scratch", "layers": 1, "width": 32, "heads": 2,
                                              "cast_lm_head_to_fp32": fp32}},
                           "group_size": 2, "backend": "chunked"})
        return build_task([cfg])

    plain, up = task_for(False), task_for(True)
    ro = plain.rollout(0, 0, 2)
    with torch.no_grad():
        assert torch.equal(plain.logprobs(ro)[0], up.logprobs(ro)[0])      # an fp32 model: nothing changes
        for t in (plain, up):
            t.policy.to(torch.bfloat16)
        p, b, g, tt = ro.responses.shape
        ids = torch.cat([ro.extra["prompt_ids"][0].repeat_interleave(g, 0), ro.responses.view(-1, tt)], 1)
        attn = torch.cat([ro.extra["prompt_mask"][0].repeat_interleave(g, 0), ro.mask.view(-1, tt).long()], 1)
        hidden = models.last_hidden(plain.policy, input_ids=ids, attention_mask=attn,
                                    position_ids=models.positions(attn))[:, -tt - 1:-1]
        w = plain.policy.get_output_embeddings().weight
        exact = torch.log_softmax(hidden.double() @ w.double().T, -1).gather(-1, ro.responses.view(-1, tt, 1))[..., 0]
        on = ro.mask.view(-1, tt) > 0
        err = {name: (t.logprobs(ro)[0].view(-1, tt).double() - exact)[on].abs().max().item()
               for name, t in (("bf16", plain), ("fp32", up))}
    assert err["fp32"] < 1e-4 < err["bf16"]


def test_trainer_runs_every_new_key_and_is_deterministic():
    from grpo_bench.engine.trainer import train

    cfg = {"task": {"name": "sort", "rewards": {"match": 1.0, "inclusion_order": 0.5}}, "group_size": 4,
           "epochs": 3, "inner_steps": 2, "delta": "gdpo", "adv_clip": 1.0, "nll_coef": 0.1,
           "corrections": ["opsm", {"name": "m2po", "against": "current", "threshold": 1e-4}],
           "entropy_coef": 0.01, "entropy_ctrl": {"name": "adaptive", "target": 10.0, "delta": 0.01},
           "filters": ["no_positive_resample", "zero_variance"]}
    runs = []
    for _ in range(2):
        torch.set_num_threads(1)
        rows = []
        train(resolve_run(cfg), rows)
        runs.append([r for r in rows if not r[1].startswith("time/")])
    assert runs[0] == runs[1]
    by = {}
    for step, k, v in runs[0]:
        by.setdefault(k, []).append(v)
    assert all(math.isfinite(v) for vs in by.values() for v in vs)
    assert by["mismatch/kl"] == [0.0] * 6                            # the trainer samples itself: no mismatch
    assert max(by["correction/m2po/masked_frac"]) > 0                 # the inner steps' drift is caught
    assert by["entropy/coef"] == pytest.approx([0.0, 0.02, 0.03, 0.04, 0.05, 0.06])   # TRL: 0 before a measurement
    assert all(v <= 1.0 for v in by["delta/abs_mean"]) and "loss/nll" in by and "loss/entropy" in by


# ================================================================== TRL 1.16

B, G, TT, PP = 8, 4, 6, 3


class EntropyStub(torch.nn.Module):
    """TRL's log-prob function stubbed by a bigram with fp64 weights, entropy differentiable."""

    def __init__(self, vocab, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g, dtype=torch.float64))

    def __call__(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
                 compute_aux_loss=False, **_):
        prev, tgt = input_ids[:, -logits_to_keep - 1:-1], input_ids[:, -logits_to_keep:]
        lp = torch.log_softmax(self.w[prev], dim=-1)
        return lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1), -(lp.exp() * lp).sum(-1) if compute_entropy else None, None


@pytest.fixture(scope="module")
def trl_env(tmp_path_factory):
    from grpo_bench.tasks.lm.models import build_tiny
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    d = tmp_path_factory.mktemp("tiny")
    build_tiny(tok, n_layer=1, n_embd=16, n_head=2, seed=0).save_pretrained(d)
    return tok, d


def trl_trainer(trl_env, tmp_path, **kw):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from grpo_bench.algos import rewards as lm_rewards

    tok, d = trl_env
    funcs = kw.pop("reward_funcs", [lm_rewards.length_penalty])
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=kw.pop("bs", B), num_generations=G,
                      max_completion_length=kw.pop("max_len", TT), use_cpu=True, report_to=[], save_strategy="no",
                      disable_tqdm=True, **kw)
    return GRPOTrainer(AutoModelForCausalLM.from_pretrained(d), reward_funcs=funcs, args=args,
                       train_dataset=Dataset.from_dict({"prompt": ["1+2=", "3+4="]}), processing_class=tok)


def trl_batch(stub, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 3, 1, 6, 5, 2, 6, 4])
    cm = (torch.arange(TT)[None] < lengths[:, None]).long()
    batch = {"prompt_ids": torch.randint(4, vocab, (B, PP), generator=g), "prompt_mask": torch.ones(B, PP, dtype=torch.long),
             "completion_ids": torch.randint(4, vocab, (B, TT), generator=g), "completion_mask": cm,
             "advantages": torch.randn(B, generator=g, dtype=torch.float64), "num_items_in_batch": cm.sum()}
    with torch.no_grad():
        lp = stub(None, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1), None, TT)[0]
    batch["old_per_token_logps"] = lp - 0.3 * torch.randn(B, TT, generator=g, dtype=torch.float64)
    return batch


def _ours_on(stub, batch, **kw):
    logp, ent, _ = stub(None, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1), None, TT,
                        compute_entropy=True)
    return grpo_loss(logp, batch["old_per_token_logps"], None, batch["advantages"],
                     batch["completion_mask"].double(), entropy=ent, backend="torch", **kw)


@pytest.mark.parametrize("loss_type,aggregate", [("grpo", "seq_mean_token_mean"), ("dapo", "token_mean")])
def test_entropy_bonus_matches_trl(loss_type, aggregate, trl_env, tmp_path):
    """TRL's bonus is a token mean whatever loss_type aggregates the policy term with: so is ours."""
    tok = trl_env[0]
    theirs = trl_trainer(trl_env, tmp_path, loss_type=loss_type, entropy_coef=0.1)
    stub = EntropyStub(len(tok))
    batch = trl_batch(stub, len(tok))
    theirs._get_per_token_logps_and_entropies = stub
    theirs.current_gradient_accumulation_steps = 1
    theirs.model.train()
    want = theirs._compute_loss(theirs.model, batch)
    (want_g,) = torch.autograd.grad(want, stub.w)
    got, _ = _ours_on(stub, batch, loss="clipped", aggregate=aggregate, entropy_coef=0.1)
    (got_g,) = torch.autograd.grad(got, stub.w)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    close(got_g, want_g, rtol=1e-10, atol=1e-13)
    base, _ = _ours_on(stub, batch, loss="clipped", aggregate=aggregate)
    assert abs(got.item() - base.item()) > 1e-3                       # the bonus is there to compare


def test_adaptive_entropy_matches_trl_step_by_step(trl_env, tmp_path):
    tok = trl_env[0]
    stub = EntropyStub(len(tok))
    batch = trl_batch(stub, len(tok))
    h0 = _ours_on(stub, batch)[1]["loss/entropy"].item()
    theirs = trl_trainer(trl_env, tmp_path, loss_type="dapo", entropy_coef=0.02, use_adaptive_entropy=True,
                         entropy_target=h0 * 0.9, entropy_coef_delta=0.01, entropy_coef_min=0.0, entropy_coef_max=0.035)
    theirs._get_per_token_logps_and_entropies = stub
    theirs.current_gradient_accumulation_steps = 1
    theirs.model.train()
    ctrl = registry.bind("entropy_ctrl", {"name": "adaptive", "target": h0 * 0.9, "delta": 0.01, "coef_min": 0.0,
                                          "coef_max": 0.035})
    state, applied = ctrl(0.02, None)
    states, applieds = [], []
    for scale in (1.0, 2.0, 2.0, 2.0, 0.125, 1.0):                    # sharper logits: lower entropy
        with torch.no_grad():
            stub.w.mul_(scale)
        want = theirs._compute_loss(theirs.model, batch)
        got, stats = _ours_on(stub, batch, loss="clipped", aggregate="token_mean", entropy_coef=applied)
        assert got.item() == pytest.approx(want.item(), rel=1e-12)
        state, applied = ctrl(state, stats["loss/entropy"].item())
        assert state == pytest.approx(theirs.entropy_coef, abs=1e-15)
        states.append(round(state, 12))
        applieds.append(applied)
    # down while entropy is above the target, up to the cap below it, down again: every branch compared
    assert states == [0.01, 0.02, 0.03, 0.035, 0.025, 0.015], states
    assert applieds[0] == 0 and applieds[3] == 0.035 and applieds[-1] == 0


def _trl_vllm_is(old, sampler, mask, mode, clip_min, clip_max):
    """TRL 1.16's vLLM importance weights (GRPOTrainer._generate_and_score_completions), transcribed:
    it runs only with a vLLM server, so its body is copied here rather than called."""
    diff = torch.nan_to_num((old - sampler) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    hi = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)


TRL_MODES = {"token_truncate": "token_tis", "token_mask": "token_mis", "sequence_truncate": "seq_tis",
             "sequence_mask": "seq_mis"}


@pytest.mark.parametrize("mode", TRL_MODES)
def test_trl_vllm_importance_sampling_modes_in_trls_own_loss(mode, trl_env, tmp_path):
    """The four modes' weights, fed to TRL's own _compute_loss as its vLLM path does, against grpo_loss."""
    tok = trl_env[0]
    stub = EntropyStub(len(tok))
    batch = trl_batch(stub, len(tok))
    g = torch.Generator().manual_seed(5)
    old, mask = batch["old_per_token_logps"], batch["completion_mask"].double()
    sampler = old + 0.1 * torch.randn(old.shape, generator=g, dtype=torch.float64)
    theirs = trl_trainer(trl_env, tmp_path, loss_type="dapo")
    theirs.use_vllm = theirs.vllm_importance_sampling_correction = True   # its loss multiplies by the weights
    theirs._get_per_token_logps_and_entropies = stub
    theirs.current_gradient_accumulation_steps = 1
    theirs.model.train()
    for clip_min, clip_max in ((None, 1.1), (0.95, 1.05), (0.9, None)):
        ratio = _trl_vllm_is(old, sampler, mask, mode, clip_min, clip_max)
        ours = {"name": TRL_MODES[mode], "low": clip_min, "high": clip_max}
        w, _, _ = registry.bind("correction", ours)(old, old, sampler, batch["advantages"].view(-1), mask)
        close(w * mask, ratio.expand_as(w) * mask)
        log_raw = (old - sampler) * mask
        raw = torch.exp(log_raw.sum(-1, keepdim=True) if mode.startswith("seq") else log_raw)
        cut = (ratio == 0) if mode.endswith("mask") else (ratio != raw)
        assert (cut.expand_as(mask) & (mask > 0)).any()              # the bounds act on this batch
        want = theirs._compute_loss(theirs.model, batch | {"importance_sampling_ratio": ratio})
        got, _ = _ours_on(stub, batch, loss="clipped", aggregate="token_mean", sampler_logp=sampler,
                          corrections=[ours])
        assert got.item() == pytest.approx(want.item(), rel=1e-12), (clip_min, clip_max)


def test_off_policy_sequence_mask_in_trls_own_loss(trl_env, tmp_path):
    """TRL reads sampling_per_token_logps when a batch carries them (vLLM), its old log-probs otherwise."""
    tok = trl_env[0]
    stub = EntropyStub(len(tok))
    batch = trl_batch(stub, len(tok))
    sampler = batch["old_per_token_logps"] + 0.5 * torch.randn(B, TT, generator=torch.Generator().manual_seed(6),
                                                               dtype=torch.float64)
    theirs = trl_trainer(trl_env, tmp_path, loss_type="grpo", off_policy_mask_threshold=0.05)
    theirs._get_per_token_logps_and_entropies = stub
    theirs.current_gradient_accumulation_steps = 1
    theirs.model.train()
    for extra, samp in (({"sampling_per_token_logps": sampler}, sampler), ({}, None)):
        want = theirs._compute_loss(theirs.model, batch | extra)
        got, stats = _ours_on(stub, batch, loss="clipped", aggregate="seq_mean_token_mean", sampler_logp=samp,
                              corrections=[{"name": "opsm", "threshold": 0.05}])
        assert got.item() == pytest.approx(want.item(), rel=1e-12)
        assert 0 < stats["correction/opsm/masked_frac"] < 1


def test_gdpo_matches_trl_normalize_then_sum(trl_env, tmp_path):
    gen = torch.Generator().manual_seed(11)
    comps = torch.randint(0, 2, (4, G, 2), generator=gen).float()
    comps[0] = 1.0                                                    # a flat group
    flat = comps.reshape(16, 2)

    def fa(prompts, completions, **kwargs):
        return flat[:len(completions), 0].tolist()

    def fb(prompts, completions, **kwargs):
        return flat[:len(completions), 1].tolist()

    theirs = trl_trainer(trl_env, tmp_path, bs=16, max_len=2, reward_funcs=[fa, fb], reward_weights=[1.0, 0.5],
                         multi_objective_aggregation="normalize_then_sum")
    theirs.model.train()
    out = theirs._generate_and_score_completions([{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="]
                                                  for _ in range(G)])
    ours = registry.get("delta", "gdpo")((comps * T([1.0, 0.5]).float()).sum(-1), None, None, comps, eps=1e-4,
                                         reward_weights=[1.0, 0.5], batch_norm="responses")
    close(ours.reshape(-1), out["advantages"], rtol=1e-5, atol=1e-6)
    assert ours.abs().max() > 0.5


# ================================================================== verl 0.9.1

def _verl():
    return pytest.importorskip("verl.trainer.ppo.core_algos")


class _Cfg(dict):
    """verl reads its actor config both as attributes and with .get()."""
    __getattr__ = dict.__getitem__


def test_gdpo_matches_verl():
    core = _verl()
    gen = torch.Generator().manual_seed(12)
    b, g, t, p = 3, 4, 5, 2
    comps = torch.randint(0, 2, (b, g, 2), generator=gen).double()
    comps[1] = T([1.0, 0.0])                                          # a flat group
    lengths = torch.randint(1, t + 1, (b, g), generator=gen)
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).double().reshape(b * g, t)
    adv, _ = core.compute_gdpo_outcome_advantage(
        token_level_rewards=torch.zeros(b * g, t), response_mask=mask, index=np.repeat(np.arange(b), g),
        config={"gdpo_reward_keys": ["a", "c"], "gdpo_reward_weights": [1.0, 0.5]},
        non_tensor_batch={"a": comps[..., 0].reshape(-1).numpy(), "c": comps[..., 1].reshape(-1).numpy()},
        batch={"prompts": torch.zeros(b * g, p), "attention_mask": torch.cat([torch.ones(b * g, p), mask], 1).long()})
    ours = registry.get("delta", "gdpo")(comps @ T([1.0, 0.5]), lengths.double(), None, comps, reward_weights=[1.0, 0.5])
    close(adv[:, 0], ours.reshape(-1), rtol=1e-5, atol=1e-5)         # verl scores in fp32
    assert torch.equal(adv != 0, mask.bool() & (ours.reshape(-1, 1) != 0))


def test_dro_matches_verl():
    core = _verl()
    lp, old, _, d, mask = rand_batch(seed=13)
    lp = lp.reshape(12, -1).requires_grad_()
    old, mask, adv = old.reshape(12, -1), mask.reshape(12, -1), d.reshape(12, 1).expand(12, old.shape[-1])
    cfg = SimpleNamespace(policy_loss=SimpleNamespace(dro_beta=0.3), global_batch_info={})
    want, _ = core.compute_policy_loss_dro(old, lp, adv, mask, "token-mean", config=cfg)
    got = registry.get("aggregate", "token_mean")(registry.get("loss", "dro")(lp, old, d.reshape(12), mask,
                                                                               tau=0.3)[0], mask)
    close(got, want)
    close(torch.autograd.grad(got, lp)[0], torch.autograd.grad(want, lp)[0])


VERL_IS = [("token", 2.0, {"name": "token_tis", "high": 2.0}), ("sequence", 2.0, {"name": "seq_tis", "high": 2.0}),
           ("token", "0.5_5.0", {"name": "token_mis"}), ("sequence", "0.8_1.5", {"name": "seq_mis", "low": 0.8,
                                                                                   "high": 1.5})]


@pytest.mark.parametrize("level,threshold,ours", VERL_IS, ids=[c[2]["name"] for c in VERL_IS])
def test_is_weights_and_the_decoupled_loss_match_verl(level, threshold, ours):
    """verl's decoupled mode: IS weights pi_old / pi_rollout times vanilla PPO (ratio pi / pi_old, dual clip 3)."""
    core = _verl()
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    lp, old, sampler, d, mask = rand_batch(seed=14, mismatch_=0.15)
    n, t = 12, lp.shape[-1]
    proto, _, _ = compute_rollout_correction_and_rejection_mask(old.reshape(n, t), sampler.reshape(n, t),
                                                                mask.reshape(n, t), rollout_is=level,
                                                                rollout_is_threshold=threshold)
    w_verl = proto.batch["rollout_is_weights"]
    w, _, _ = registry.bind("correction", ours)(lp, old, sampler, d, mask)
    close(w.reshape(n, t) * mask.reshape(n, t), w_verl)
    assert (w_verl != 1).any() and (w_verl > 0).any()
    x = lp.reshape(n, t).clone().requires_grad_()
    cfg = _Cfg(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, global_batch_info={})
    want, _ = core.compute_policy_loss_vanilla(old.reshape(n, t), x, d.reshape(n, 1).expand(n, t), mask.reshape(n, t),
                                               "token-mean", config=cfg, rollout_is_weights=w_verl)
    y = lp.clone().requires_grad_()
    got, _ = grpo_loss(y, old, None, d, mask, loss={"name": "dual_clip", "clip_high": 0.28}, aggregate="token_mean",
                       sampler_logp=sampler, corrections=[ours], backend="torch")
    close(got, want)
    close(torch.autograd.grad(got, y)[0].reshape(n, t), torch.autograd.grad(want, x)[0])


VERL_RS = [(f"{lvl}_{k}", k, lvl) for lvl in ("token", "seq_sum", "seq_mean", "seq_max") for k in ("k1", "k2", "k3")
           if not (lvl == "seq_max" and k == "k1")]


@pytest.mark.parametrize("option,k,level", VERL_RS, ids=[c[0] for c in VERL_RS])
def test_rejection_sampling_matches_verl(option, k, level):
    _verl()
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    lp, old, sampler, d, mask = rand_batch(seed=15, mismatch_=0.1)
    n, t = 12, lp.shape[-1]
    lr = (old - sampler).reshape(n, t)
    k1_like = k == "k1"
    stats = {"k1": -lr, "k2": 0.5 * lr ** 2, "k3": torch.exp(lr) - 1 - lr}[k]
    # a threshold near the middle of the statistic, so that some pass and some do not
    m = mask.reshape(n, t).bool()
    mid = stats[m].median().item() if level == "token" else None
    if level != "token":
        seq = {"seq_sum": (stats * mask.reshape(n, t)).sum(-1), "seq_mean": (stats * mask.reshape(n, t)).sum(-1) /
               mask.reshape(n, t).sum(-1), "seq_max": stats.masked_fill(~m, -1e9).max(-1).values}[level]
        mid = seq.median().item()
    if k1_like:
        spec, params = f"{math.exp(mid) * 0.99}_{math.exp(mid) * 1.5}", {"low": math.exp(mid) * 0.99,
                                                                          "high": math.exp(mid) * 1.5}
    else:
        spec, params = mid, {"high": mid}
    want, _ = compute_rollout_rejection_mask(lr, mask.reshape(n, t), rollout_rs=option, rollout_rs_threshold=spec)
    _, keep, _ = registry.get("correction", "rollout_rs")(lp, old, sampler, d, mask, divergence=k, level=level, **params)
    got = (keep.reshape(n, t) & m).double()
    assert torch.equal(got, want.double()), option
    assert 0 < want.sum() < mask.sum()


def test_entropy_aggregation_differs_from_verls_by_convention():
    """verl aggregates the entropy term with loss_agg_mode (agg_loss); TRL, and this suite, take a token mean."""
    core = _verl()
    h = torch.rand(12, 6, generator=torch.Generator().manual_seed(3))
    mask = (torch.arange(6) < torch.randint(1, 7, (12, 1), generator=torch.Generator().manual_seed(4))).double()
    token = core.agg_loss(h, mask, "token-mean")
    close(token, (h * mask).sum() / mask.sum())
    assert abs(core.agg_loss(h, mask, "seq-mean-token-mean") - token) > 1e-3


# ================================================================== config

@pytest.mark.parametrize("cfg,message", [
    ({"corrections": "token_tis"}, "<config>: corrections: expected list, got 'token_tis'"),
    ({"corrections": ["nope"]}, "<config>: corrections.0: unknown correction 'nope'; valid: decoupled, geo_mask, "),
    ({"corrections": [{"name": "token_tis", "high": -1}]}, "<config>: corrections.0.high: must be > 0, got -1.0"),
    ({"corrections": [{"name": "rollout_rs", "level": "seq"}]}, "<config>: corrections.0.level: unknown 'seq'; valid: "),
    ({"entropy_ctrl": {"name": "adaptive", "target": -1}}, "<config>: entropy_ctrl.target: must be >= 0"),
    ({"entropy_coef": -0.1}, "<config>: entropy_coef: must be >= 0, got -0.1"),
    ({"nll_coef": -1}, "<config>: nll_coef: must be >= 0, got -1"),
    ({"delta": {"name": "gdpo", "batch_norm": "group"}}, "<config>: delta.batch_norm: unknown 'group'; valid: tokens, "),
])
def test_bad_new_keys_are_one_line(cfg, message):
    with pytest.raises(ConfigError) as e:
        resolve_run({"task": "sort", **cfg})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)



def test_a_recipe_hands_its_bound_parts_to_the_loss_without_a_lookup(monkeypatch):
    """Recipe.loss gives compose_loss the entries it bound once: after the first step no part is found by name
    again (a registry lookup that raised would surface here), and the value is grpo_loss's from the names."""
    from grpo_bench.config.run import resolve_run
    from grpo_bench.engine.recipe import Recipe
    from grpo_bench.numerics.logprobs import grpo_loss
    cfg = resolve_run({"task": "sort", "loss": {"name": "clipped", "clip_high": 0.28}, "aggregate": "token_mean",
                       "kl_coef": 0.05, "kl": "k3", "kl_placement": "loss", "corrections": ["token_tis"],
                       "backend": "torch"})
    recipe = Recipe(cfg)
    lp, old, sampler, d, mask = rand_batch(seed=4, mismatch_=0.5)
    ref = old - 0.1
    first, _ = recipe.loss(lp, old, ref, d, mask, sampler_logp=sampler)

    def no_lookup(*a, **k):
        raise AssertionError(f"looked up again: {a}")
    monkeypatch.setattr(registry, "entry", no_lookup)
    monkeypatch.setattr(registry, "get", no_lookup)
    again, _ = recipe.loss(lp, old, ref, d, mask, sampler_logp=sampler)
    monkeypatch.undo()
    want, _ = grpo_loss(lp, old, ref, d, mask, loss={"name": "clipped", "clip_high": 0.28}, aggregate="token_mean",
                        kl="k3", kl_coef=0.05, corrections=["token_tis"], sampler_logp=sampler, backend="torch")
    assert again.item() == first.item() == want.item()
