"""Each GRPO part against hand-computed values, its paper's formula re-derived here, and the
gradient property its paper states; KL estimators against exact expectations."""
import math
import statistics

import pytest
import torch

from grpo_bench import registry
from grpo_bench.algos import Batch
from grpo_bench.numerics.kernels.spec import fused_names


pytestmark = pytest.mark.usefixtures("fp64")


def T(x):
    return torch.tensor(x, dtype=torch.float64)


def delta(name, r, lengths=None, greedy=None, **params):
    return registry.get("delta", name)(T(r), None if lengths is None else T(lengths),
                                       None if greedy is None else T(greedy), **params)


def loss(name, logp, old, d, mask=None, **params):
    mask = torch.ones_like(logp) if mask is None else mask
    return registry.get("loss", name)(logp, old, d, mask, **params)


# ---------------------------------------------------------------------------- deltas


def test_delta_hand_values():
    r = [[1.0, 2.0, 3.0, 6.0]]  # mean 3, unbiased std sqrt(14/3)
    assert delta("raw", r).tolist() == r
    assert delta("centered", r).tolist() == [[-2.0, -1.0, 0.0, 3.0]]
    std = math.sqrt(14 / 3)
    torch.testing.assert_close(delta("zscore", r), T([[-2.0, -1.0, 0.0, 3.0]]) / (std + 1e-6))
    # leave-one-out: 1 - (2+3+6)/3, 2 - (1+3+6)/3, ...
    torch.testing.assert_close(delta("rloo", r), T([[1 - 11 / 3, 2 - 10 / 3, 3 - 3.0, 6 - 2.0]]))
    assert delta("max", [[1.0, 3.0, 3.0, 0.5]]).tolist() == [[0.0, 3.0, 3.0, 0.0]]


def test_deltas_are_per_group():
    assert delta("centered", [[0.0, 1.0], [10.0, 30.0]]).tolist() == [[-0.5, 0.5], [-10.0, 10.0]]


def test_batch_std_uses_the_group_mean_and_the_batch_std():
    r = [[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 1.0, 1.0]]
    sd = statistics.stdev([x for g in r for x in g])  # unbiased, over all 8 rewards
    want = [[(x - statistics.mean(g)) / (sd + 1e-6) for x in g] for g in r]
    torch.testing.assert_close(delta("batch_std", r), T(want))
    # TRL's scale_rewards="batch": (r - group mean) / (batch std + 1e-4)
    torch.testing.assert_close(delta("batch_std", r, eps=1e-4), T([[(x - statistics.mean(g)) / (sd + 1e-4) for x in g]
                                                                 for g in r]))


def test_passk_only_the_best_learns_from_the_gap():
    r = [[1.0, 3.0, 2.0, 0.0], [2.0, 5.0, 5.0, 1.0]]
    out = delta("passk", r, normalize=False)
    assert out.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # a tie at the top: gap 0
    sd = statistics.stdev(r[0])
    torch.testing.assert_close(delta("passk", r)[0, 1], T(1.0 / (sd + 1e-6)))


def test_opo_length_weighted_baseline():
    # baseline (2*1 + 4*0 + 6*1) / 12 = 2/3
    torch.testing.assert_close(delta("opo", [[1.0, 0.0, 1.0]], lengths=[[2, 4, 6]]),
                               T([[1 / 3, -2 / 3, 1 / 3]]))
    # equal lengths: the plain group mean
    torch.testing.assert_close(delta("opo", [[1.0, 0.0, 2.0]], lengths=[[3, 3, 3]]), delta("centered", [[1.0, 0.0, 2.0]]))


def _whiten_over_tokens(values, lengths, eps=1e-8):
    """verl's masked_whiten re-derived: each response's value repeated on each of its tokens."""
    tokens = [v for v, n in zip(values, lengths) for _ in range(int(n))]
    mean = statistics.mean(tokens)
    var = statistics.variance(tokens)  # Bessel-corrected over tokens
    return [(v - mean) / math.sqrt(var + eps) for v in values]


def test_reinforce_pp_is_token_weighted_batch_whitening():
    r, lengths = [[1.0, 0.0], [0.5, 1.0]], [[3, 1], [2, 4]]
    want = _whiten_over_tokens([1.0, 0.0, 0.5, 1.0], [3, 1, 2, 4])
    torch.testing.assert_close(delta("reinforce_pp", r, lengths=lengths), T([want[:2], want[2:]]))
    centred = [0.5, -0.5, -0.25, 0.25]
    want = _whiten_over_tokens(centred, [3, 1, 2, 4])
    torch.testing.assert_close(delta("reinforce_pp_baseline", r, lengths=lengths), T([want[:2], want[2:]]))


def test_gpg_rescales_by_the_share_of_responses_that_count():
    r = [[1.0, 0.0], [1.0, 1.0]]  # the second group is flat: its advantages are 0
    assert delta("gpg", r).tolist() == [[1.0, -1.0], [0.0, 0.0]]               # alpha = 4 / 2
    torch.testing.assert_close(delta("gpg", r, count="reward"), T([[2 / 3, -2 / 3], [0.0, 0.0]]))  # 4 / 3 rewards
    torch.testing.assert_close(delta("gpg", r, f_norm=2.0), T([[0.5, -0.5], [0.0, 0.0]]))


def test_remax_subtracts_the_greedy_reward():
    assert delta("remax", [[1.0, 0.0], [0.5, 0.5]], greedy=[0.25, 1.0]).tolist() == [[0.75, -0.25], [-0.5, -0.5]]
    with pytest.raises(ValueError, match="greedy"):
        delta("remax", [[1.0, 0.0]])


GROUP_CENTRED = ["centered", "zscore", "batch_std", "rloo", "opo", "gpg", "passk"]


@pytest.mark.parametrize("name", GROUP_CENTRED)
@pytest.mark.parametrize("value", [0.0, 0.1, 1 / 3, 7.0, -2.5])
def test_equal_rewards_give_exactly_zero(name, value):
    out = delta(name, [[value] * 5, [1.0, 0.0, 0.0, 0.0, 0.0]], lengths=[[1, 2, 3, 4, 5]] * 2)
    assert out[0].tolist() == [0.0] * 5
    assert torch.isfinite(out).all() and out[1, 0] > 0


# ---------------------------------------------------------------------------- losses


def _logps(seed=0, shape=(2, 3, 4), spread=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g) * 3
    new = old + spread * torch.randn(shape, generator=g)
    return new, old


def test_losses_hand_values():
    logp = T([[[math.log(0.5), math.log(0.2)]]])
    old = T([[[math.log(0.4), math.log(0.4)]]])
    d = T([[2.0]])
    torch.testing.assert_close(loss("naive", logp, old, d)[0], -2 * logp)
    torch.testing.assert_close(loss("unclipped", logp, old, d)[0], T([[[-2 * 1.25, -2 * 0.5]]]))
    # ratios 1.25 and 0.5; positive advantage: clip at 1.2 above, min picks 0.5 below
    torch.testing.assert_close(loss("clipped", logp, old, d)[0], T([[[-2.4, -1.0]]]))
    # negative advantage: min(-r, -clip(r)) = -max(r, clip(r))... times |d|
    torch.testing.assert_close(loss("clipped", logp, old, -d)[0], T([[[2.5, 1.6]]]))
    # clip-higher (DAPO): upper bound 1.28 lets the 1.25 ratio through
    torch.testing.assert_close(loss("clipped", logp, old, d, clip_high=0.28)[0], T([[[-2.5, -1.0]]]))
    # CISPO: weights clamp(1.25, -, 1.2) = 1.2 and 0.5 (no lower bound), on log pi
    torch.testing.assert_close(loss("cispo", logp, old, d, clip_high=0.2)[0], T([[[-2 * 1.2, -2 * 0.5]]]) * logp)
    # SAPO: -A * sigmoid(tau (r - 1)) * 4 / tau, tau_pos = 1 for A > 0
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    torch.testing.assert_close(loss("sapo", logp, old, d)[0], T([[[-2 * 4 * sig(0.25), -2 * 4 * sig(-0.5)]]]))
    torch.testing.assert_close(loss("sapo", logp, old, -d)[0],
                               T([[[2 * 4 / 1.05 * sig(1.05 * 0.25), 2 * 4 / 1.05 * sig(-1.05 * 0.5)]]]))


# a2po is a regression onto log pi / pi_ref, not a surrogate of the policy gradient (its gradient at
# pi = pi_ref is tests/test_parts_v4.py's)
ALL_BUT_RANDOM = [n for n in registry.names("loss") if n != "clip_cov"
                  and "ref_logp" not in registry.entry("loss", n).traits.get("needs", ())]


@pytest.mark.parametrize("name", ALL_BUT_RANDOM)
def test_every_loss_is_the_policy_gradient_at_ratio_one(name):
    # at the old policy (the first inner step) every surrogate's gradient is REINFORCE's
    base, _ = _logps(spread=0.0)
    mask = torch.ones_like(base)
    mask[0, 0, 2:] = 0
    d = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
    agg = registry.get("aggregate", "seq_mean_token_mean")
    grads = []
    for n in ["naive", name]:
        logp = base.clone().requires_grad_()
        agg(loss(n, logp, base.detach(), d, mask)[0], mask).backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("name", ["clipped", "dual_clip", "clip_cov"])
def test_clip_has_zero_gradient_exactly_where_its_region_says(name):
    logp, old = _logps(1, spread=0.5)
    d = torch.randn(2, 3, generator=torch.Generator().manual_seed(2))
    logp.requires_grad_()
    per_tok, regions = loss(name, logp, old, d, clip_low=0.1, clip_high=0.1)
    per_tok.sum().backward()
    ratio = (logp - old).exp().detach()
    adv = d.unsqueeze(-1).expand_as(ratio)
    low, high = (adv < 0) & (ratio < 0.9), (adv > 0) & (ratio > 1.1)
    assert low.any() and high.any() and (~(low | high)).any()
    assert torch.equal(regions["low"], low) and torch.equal(regions["high"], high)
    cut = low | high | regions.get("dual", torch.zeros_like(low)) | regions.get("cov", torch.zeros_like(low))
    assert (logp.grad[cut] == 0).all()
    torch.testing.assert_close(logp.grad[~cut], (-adv * ratio)[~cut])  # elsewhere the unclipped gradient


def test_dual_clip_caps_negative_advantages_and_equals_trl_two_sided():
    logp, old = _logps(3, shape=(3, 4, 6), spread=1.5)   # ratios from ~0.01 to ~100
    d = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
    x = logp.clone().requires_grad_()
    out, regions = loss("dual_clip", x, old, d, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    ratio = (logp - old).exp()
    adv = d.unsqueeze(-1).expand_as(ratio)
    dual = (adv < 0) & (ratio > 3.0)
    assert dual.any() and torch.equal(regions["dual"], dual)
    torch.testing.assert_close(out[dual], (-adv * 3.0)[dual])   # the bound: -A * c, never more
    assert (out[adv < 0] <= (-adv * 3.0)[adv < 0] + 1e-12).all()
    # TRL's two-sided clip (INTELLECT-2), written out: -min(min(r, delta) * A, clip(r) * A)
    y = logp.clone().requires_grad_()
    r = (y - old).exp()
    trl = -torch.minimum(torch.clamp(r, max=3.0) * adv, r.clamp(0.8, 1.28) * adv)
    torch.testing.assert_close(out, trl)
    out.sum().backward()
    trl.sum().backward()
    torch.testing.assert_close(x.grad, y.grad)
    assert (x.grad[dual] == 0).all()


def test_gspo_sequence_ratio_and_gradient():
    logp, old = _logps(2, (1, 2, 3))
    mask = T([[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]])
    d = T([[1.0, -1.0]])
    logp.requires_grad_()
    per_tok, _ = loss("gspo", logp, old, d, mask, clip_low=0.9, clip_high=10.0)  # no clipping here
    value = registry.get("aggregate", "seq_mean_token_mean")(per_tok, mask)
    value.backward()
    # the sequence-level objective written directly: s_i = exp(mean_t log ratio over the response)
    lp = logp.detach().clone().requires_grad_()
    s = (((lp - old) * mask).sum(-1) / mask.sum(-1)).exp()
    ref = -(s * d).mean()
    ref.backward()
    torch.testing.assert_close(value, ref)
    torch.testing.assert_close(logp.grad, lp.grad)
    assert logp.grad[0, 0, 2] == 0


def test_gspo_clips_whole_sequences():
    # sequence ratios beyond the clip: a sequence clipped as a whole gets no gradient at all
    old = T([[[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]]])
    logp = (old + T([[[0.3, 0.1], [-0.3, -0.1], [0.01, 0.0]]])).requires_grad_()
    d = T([[1.0, -1.0, 1.0]])          # s = e^0.2 with A > 0: high; s = e^-0.2 with A < 0: low; s ~ 1: inside
    per_tok, regions = loss("gspo", logp, old, d, clip_low=0.1, clip_high=0.1)
    per_tok.sum().backward()
    assert regions["high"][0, 0].all() and regions["low"][0, 1].all() and not regions["high"][0, 2].any()
    assert (logp.grad[0, :2] == 0).all() and (logp.grad[0, 2] != 0).all()
    torch.testing.assert_close(per_tok[0, 0], T([-1.1, -1.1]))


def test_gmpo_against_its_formula():
    logp, old = _logps(5, (2, 2, 5), spread=0.6)
    mask = torch.ones_like(logp)
    mask[1, 1, 3:] = 0
    d = T([[1.5, -0.5], [-2.0, 0.7]])
    x = logp.clone().requires_grad_()
    per_tok, regions = loss("gmpo", x, old, d, mask, clip_low=0.4, clip_high=0.4)
    value = registry.get("aggregate", "seq_mean_token_mean")(per_tok, mask)
    value.backward()
    # GMPO: -A * (prod_t clip_sign(rho_t))^(1/|o|) with clipping that only ever lowers the objective
    y = logp.clone().requires_grad_()
    total = 0
    for b in range(2):
        for g in range(2):
            a = d[b, g].item()
            logs = []
            for t in range(5):
                if mask[b, g, t]:
                    lr = y[b, g, t] - old[b, g, t]
                    clipped = lr.clamp(-0.4, 0.4)
                    logs.append(torch.minimum(lr, clipped) if a > 0 else torch.maximum(lr, clipped))
            total = total - a * torch.exp(torch.stack(logs).mean())
    ref = total / 4
    ref.backward()
    torch.testing.assert_close(value, ref)
    torch.testing.assert_close(x.grad, y.grad)
    lr = logp - old
    adv = d.unsqueeze(-1).expand_as(lr)
    assert torch.equal(regions["high"], (adv > 0) & (lr > 0.4)) and regions["high"].any()


def test_cispo_weight_carries_no_gradient():
    logp, old = _logps(6, spread=0.8)
    d = torch.randn(2, 3, generator=torch.Generator().manual_seed(7))
    x = logp.clone().requires_grad_()
    per_tok, regions = loss("cispo", x, old, d, clip_low=0.2, clip_high=0.3)
    per_tok.sum().backward()
    w = (logp - old).exp().clamp(0.8, 1.3)
    adv = d.unsqueeze(-1).expand_as(w)
    torch.testing.assert_close(per_tok, -w * adv * logp)
    # the gradient is the weight times the policy gradient: no d weight / d logp term, and
    # tokens beyond the clip keep their gradient (unlike PPO's)
    torch.testing.assert_close(x.grad, -w * adv)
    assert regions["high"].any() and (x.grad[regions["high"]] != 0).all()


def test_sapo_gate_slope():
    logp, old = _logps(8, spread=0.5)
    d = torch.randn(2, 3, generator=torch.Generator().manual_seed(9))
    x = logp.clone().requires_grad_()
    loss("sapo", x, old, d, tau_pos=2.0, tau_neg=3.0)[0].sum().backward()
    r = (logp - old).exp()
    adv = d.unsqueeze(-1).expand_as(r)
    tau = torch.where(adv > 0, 2.0, 3.0)
    s = torch.sigmoid(tau * (r - 1))
    # d/dlogp [-A * 4/tau * sigmoid(tau (r - 1))] = -A * 4 s (1 - s) r: 1 at r = 1, decaying away from it
    torch.testing.assert_close(x.grad, -adv * 4 * s * (1 - s) * r)


def test_vespo_gamma_weight():
    logp = T([[[-1.0, -2.0, -0.5]]])
    old = T([[[-1.2, -1.9, -0.5]]])
    x = logp.clone().requires_grad_()
    per_tok, _ = loss("vespo", x, old, T([[2.0]]))
    w = math.exp(0.2 - 0.1)                             # product of token ratios
    phi = math.exp(3.0) * w ** 2 * math.exp(-3.0 * w)   # k_pos 2, lambda_pos 3
    torch.testing.assert_close(per_tok, -phi * 2.0 * logp)
    per_tok.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(logp, -phi * 2.0))   # phi is a constant weight
    neg, _ = loss("vespo", logp, old, T([[-2.0]]))
    phi_neg = math.exp(2.0) * w ** 3 * math.exp(-2.0 * w)  # k_neg 3, lambda_neg 2
    torch.testing.assert_close(neg, phi_neg * 2.0 * logp)


def test_dppo_drops_tokens_outside_the_probability_trust_region():
    old = T([[[math.log(0.5), math.log(0.5), math.log(0.5), math.log(0.5)]]])
    # pi - pi_old = +0.3, +0.1, -0.3, -0.1
    logp = T([[[math.log(0.8), math.log(0.6), math.log(0.2), math.log(0.4)]]])
    for a, valid in [(1.0, [False, True, True, True]), (-1.0, [True, True, False, True])]:
        x = logp.clone().requires_grad_()
        per_tok, regions = loss("dppo_tv", x, old, T([[a]]), clip_low=0.2, clip_high=0.2)
        per_tok.sum().backward()
        ratio = (logp - old).exp()
        want = torch.where(T(valid) > 0, -a * ratio, torch.zeros_like(ratio))
        torch.testing.assert_close(x.grad, want)        # truncated-IS weight (no grad) on valid tokens
        assert (regions["high" if a > 0 else "low"] == ~torch.tensor(valid)).all()
    # truncation: the IS weight stops at clip_c
    x = logp.clone().requires_grad_()
    loss("dppo_tv", x, old, T([[1.0]]), clip_low=1.0, clip_high=1.0, clip_c=1.1)[0].sum().backward()
    torch.testing.assert_close(x.grad, -(logp - old).exp().clamp(max=1.1))


def test_dppo_kl_uses_the_binary_kl():
    old = T([[[math.log(0.5), math.log(0.5)]]])
    logp = T([[[math.log(0.9), math.log(0.55)]]])
    bkl = [0.5 * math.log(0.5 / p) + 0.5 * math.log(0.5 / (1 - p)) for p in (0.9, 0.55)]
    assert bkl[0] > 0.2 > bkl[1]
    _, regions = loss("dppo_kl", logp, old, T([[1.0]]), clip_low=0.2, clip_high=0.2)
    assert regions["high"].tolist() == [[[True, False]]]
    _, regions = loss("dppo_kl", logp, old, T([[-1.0]]), clip_low=0.2, clip_high=0.2)
    assert not regions["low"].any()  # p >= q with a negative advantage: always kept


def test_kl_cov_penalises_the_highest_covariance_tokens():
    logp = T([[[-0.1, -2.0, -3.0], [-0.2, -1.0, -4.0]]])
    old = logp - 0.05
    d = T([[1.0, -1.0]])
    x = logp.clone().requires_grad_()
    per_tok, regions = loss("kl_cov", x, old, d, kl_cov_ratio=0.34, ppo_kl_coef=2.0)  # 2 of 6 tokens
    adv = d.unsqueeze(-1).expand_as(logp)
    cov = (adv - adv.mean()) * (logp - logp.mean())
    top = cov.reshape(-1).topk(2).indices
    hit = torch.zeros(6, dtype=torch.bool)
    hit[top] = True
    assert torch.equal(regions["cov"].reshape(-1), hit)
    ratio = (logp - old).exp()
    want = -adv * ratio + 2.0 * (logp - old).abs() * hit.view_as(logp)
    torch.testing.assert_close(per_tok, want)


def test_clip_cov_cuts_a_random_share_of_in_band_tokens():
    logp, old = _logps(10, shape=(4, 4, 8), spread=0.05)
    d = torch.randn(4, 4, generator=torch.Generator().manual_seed(11)) * 20   # covariances well above 1
    x = logp.clone().requires_grad_()
    torch.manual_seed(0)
    per_tok, regions = loss("clip_cov", x, old, d, clip_cov_ratio=0.05, clip_cov_lb=1.0, clip_cov_ub=1e9)
    per_tok.sum().backward()
    assert regions["cov"].sum() == int(0.05 * 128)
    assert (x.grad[regions["cov"]] == 0).all() and (per_tok[regions["cov"]] == 0).all()
    torch.manual_seed(0)
    assert torch.equal(loss("clip_cov", logp, old, d, clip_cov_ratio=0.05, clip_cov_ub=1e9)[1]["cov"], regions["cov"])


# ----------------------------------------------------------------------- aggregate


def agg(name, x, m, **kw):
    return registry.get("aggregate", name)(x, m, **kw).item()


def test_aggregations_hand_values():
    x = T([[[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]])
    m = T([[[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]])
    assert agg("token_mean", x, m) == pytest.approx(10 / 4)
    assert agg("token_sum", x, m) == pytest.approx(10)
    assert agg("seq_mean_token_mean", x, m) == pytest.approx((2 + 4) / 2)
    assert agg("seq_mean_token_sum", x, m) == pytest.approx((6 + 4) / 2)
    assert agg("seq_mean_token_sum_norm", x, m) == pytest.approx((6 / 3 + 4 / 3) / 2)
    assert agg("seq_mean_token_sum_norm", x, m, max_len=10) == pytest.approx((6 / 10 + 4 / 10) / 2)


def test_empty_responses_are_not_part_of_the_batch():
    # one rule for every aggregation: an empty response adds nothing and is not counted
    x = T([[[1.0, 2.0, float("inf")], [4.0, float("nan"), 0.0], [7.0, 7.0, 7.0]]])
    m = T([[[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    without = (x[:, :2], m[:, :2])
    for name in registry.names("aggregate"):
        kw = {"max_len": 5} if name == "seq_mean_token_sum_norm" else {}
        assert agg(name, x, m, **kw) == pytest.approx(agg(name, *without, **kw)), name
    assert agg("seq_mean_token_mean", x, m) == pytest.approx((1.5 + 4) / 2)


def test_aggregations_match_loops():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 5, generator=g)
    m = (torch.rand(3, 4, 5, generator=g) > 0.4).double()
    m[0, 0] = 0  # one empty response
    seqs = [(b, i) for b in range(3) for i in range(4) if m[b, i].sum()]
    s = lambda b, i: sum(x[b, i, t] * m[b, i, t] for t in range(5))  # noqa: E731
    torch.testing.assert_close(T(agg("token_mean", x, m)), sum(s(b, i) for b, i in seqs) / m.sum())
    torch.testing.assert_close(T(agg("token_sum", x, m)), sum(s(b, i) for b, i in seqs))
    torch.testing.assert_close(T(agg("seq_mean_token_mean", x, m)), sum(s(b, i) / m[b, i].sum() for b, i in seqs) / len(seqs))
    torch.testing.assert_close(T(agg("seq_mean_token_sum", x, m)), sum(s(b, i) for b, i in seqs) / len(seqs))
    torch.testing.assert_close(T(agg("seq_mean_token_sum_norm", x, m, max_len=7)),
                               sum(s(b, i) / 7 for b, i in seqs) / len(seqs))


def test_luspo_is_gspo_summed_per_response():
    # TRL loss_type=luspo: mean over responses of |o_i| * (GSPO's per-sequence loss)
    logp, old = _logps(12, (1, 3, 4))
    mask = T([[[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]])
    d = T([[0.5, -1.0, 2.0]])
    x = logp.clone().requires_grad_()
    per_tok, _ = loss("gspo", x, old, d, mask, clip_low=0.2, clip_high=0.2)
    value = registry.get("aggregate", "seq_mean_token_sum")(per_tok, mask)
    y = logp.clone().requires_grad_()
    lr = (y - old) * mask
    s = torch.exp(lr.sum(-1) / mask.sum(-1))
    seq_loss = -torch.minimum(s * d, s.clamp(0.8, 1.2) * d)
    ref = (seq_loss * mask.sum(-1)).mean()
    torch.testing.assert_close(value, ref)
    value.backward()
    ref.backward()
    torch.testing.assert_close(x.grad, y.grad)


# ----------------------------------------------------------------------------- KL

P_LOGITS = T([0.3, -1.2, 2.0, 0.1, -0.4])
Q_LOGITS = T([-0.5, 0.7, 1.1, 0.0, 0.9])


def _exact(estimator, theta):
    """E_{x ~ p} of the estimator, summed exactly over the support, samples not differentiated;
    the sampling policy (old) is p itself, detached."""
    logp = torch.log_softmax(theta, -1)
    logq = torch.log_softmax(Q_LOGITS, -1)
    weights = logp.exp().detach()
    return (weights * registry.get("kl", estimator)(logp, logq, logp.detach())).sum()


def _grad(f):
    theta = P_LOGITS.clone().requires_grad_()
    f(theta).backward()
    return theta.grad


def _fwd(t):  # KL(p || q)
    return (torch.softmax(t, -1) * (torch.log_softmax(t, -1) - torch.log_softmax(Q_LOGITS, -1))).sum()


def _rev(t):  # KL(q || p)
    return (torch.softmax(Q_LOGITS, -1) * (torch.log_softmax(Q_LOGITS, -1) - torch.log_softmax(t, -1))).sum()


def test_kl_estimator_means_against_exact_kl():
    p, q = torch.softmax(P_LOGITS, -1), torch.softmax(Q_LOGITS, -1)
    kl = (p * (p / q).log()).sum()
    for name in ["k1", "k3", "k1+", "k3+", "k3_is", "low_var_kl"]:
        torch.testing.assert_close(_exact(name, P_LOGITS), kl, msg=name)
    torch.testing.assert_close(_exact("k2", P_LOGITS), 0.5 * (p * (p / q).log() ** 2).sum())
    torch.testing.assert_close(_exact("abs", P_LOGITS), (p * (p / q).log().abs()).sum())
    assert (registry.get("kl", "k3")(torch.log(p), torch.log(q)) >= 0).all()


def test_kl_estimator_expected_gradients():
    # k1 -> 0, k2 and the straight-through ones -> grad KL(p||q), k3 -> grad KL(q||p),
    # k3_is (importance-corrected, samples from the detached old policy) -> grad KL(p||q)
    torch.testing.assert_close(_grad(lambda t: _exact("k1", t)), torch.zeros(5))
    for name in ["k2", "k1+", "k3+", "k3_is"]:
        torch.testing.assert_close(_grad(lambda t: _exact(name, t)), _grad(_fwd), msg=name)
    torch.testing.assert_close(_grad(lambda t: _exact("k3", t)), _grad(_rev))


def test_straight_through_values_and_token_gradients():
    logp, ref = _logps(13)
    for st, base in [("k1+", "k1"), ("k3+", "k3")]:
        x = logp.clone().requires_grad_()
        v = registry.get("kl", st)(x, ref)
        torch.testing.assert_close(v, registry.get("kl", base)(logp, ref))
        v.sum().backward()
        torch.testing.assert_close(x.grad, logp - ref)   # k2's gradient, token by token


def test_low_var_kl_clamps():
    logp = T([-30.0, 0.0, -1.0]).requires_grad_()
    ref = T([0.0, -30.0, -1.5])
    out = registry.get("kl", "low_var_kl")(logp, ref)
    assert out[:2].tolist() == [10.0, 10.0]                    # e^20 - 21 and e^-20 + 19, both capped at 10
    torch.testing.assert_close(out[2], registry.get("kl", "k3")(logp, ref)[2])
    out.sum().backward()
    assert logp.grad[:2].tolist() == [0.0, 0.0]                # past the cap: no gradient, never inf
    torch.testing.assert_close(logp.grad[2], T(1 - math.exp(-0.5)))


def test_kl_sample_mean_converges():
    g = torch.Generator().manual_seed(0)
    p, q = torch.softmax(P_LOGITS, -1), torch.softmax(Q_LOGITS, -1)
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    kl = (p * (p / q).log()).sum()
    for name in ["k1", "k3"]:
        est = registry.get("kl", name)(p.log()[x], q.log()[x]).mean()
        assert abs(est - kl) < 0.01


# ------------------------------------------------------------------------ control


def test_adaptive_kl_controller():
    f = registry.get("kl_ctrl", "adaptive")
    # KL at twice the target: the error is clipped to +0.2
    assert f(0.1, 0.2, 100, target=0.1, horizon=1000.0) == pytest.approx(0.1 * (1 + 0.2 * 100 / 1000))
    assert f(0.1, 0.09, 50, target=0.1, horizon=1000.0) == pytest.approx(0.1 * (1 - 0.1 * 50 / 1000))
    assert f(0.1, 0.0, 50, target=0.1, horizon=1000.0) == pytest.approx(0.1 * (1 - 0.2 * 50 / 1000))
    assert registry.get("kl_ctrl", "fixed")(0.3, 5.0, 100) == 0.3


def test_reference_schedules():
    hard, soft = registry.get("ref_update", "hard"), registry.get("ref_update", "soft")
    assert [hard(e, every=3) for e in range(7)] == [0, 0, 0, 1, 0, 0, 1]
    assert [soft(e, every=2, alpha=0.25) for e in range(5)] == [0, 0, 0.25, 0, 0.25]
    assert registry.get("ref_update", "frozen")(10) == 0


# ------------------------------------------------------------------------ filters


def _batch(rewards, lengths, finished, max_len=8, entropy=None):
    rewards = T(rewards)
    lengths = torch.tensor(lengths)
    mask = (torch.arange(max_len) < lengths.unsqueeze(-1)).double()
    return Batch(rewards, mask, lengths, torch.tensor(finished), max_len, entropy=entropy)


def test_dynamic_sampling_keeps_groups_with_signal():
    b = _batch([[1.0, 1.0], [0.0, 1.0], [0.3, 0.3]], [[1, 2]] * 3, [[True, True]] * 3)
    out = registry.get("filter", "dynamic_sampling")(b, max_draws=7)
    assert out.keep.tolist() == [False, True, False] and out.max_draws == 7


def test_mask_truncated_removes_whole_responses():
    b = _batch([[1.0, 0.0]], [[3, 8]], [[True, False]])
    out = registry.get("filter", "mask_truncated")(b)
    assert out.mask[0, 0].sum() == 3 and out.mask[0, 1].sum() == 0


def test_overlong_punishment_is_linear_in_the_overflow():
    lengths = list(range(1, 9))
    b = _batch([[0.0] * 8], [lengths], [[True] * 8], max_len=8)
    out = registry.get("filter", "overlong_punish")(b, cache=4)
    # zero up to 8 - 4 tokens, then -1/4 per token beyond, -1 at the budget
    assert out.rewards[0].tolist() == [0, 0, 0, 0, -0.25, -0.5, -0.75, -1.0]
    out = registry.get("filter", "overlong_punish")(b, cache=2, max_len=6)
    assert out.rewards[0].tolist() == [0, 0, 0, 0, -0.5, -1.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="cache"):
        registry.get("filter", "overlong_punish")(b, cache=8)


def test_top_entropy_gates_all_but_the_highest_entropy_tokens():
    ent = T([[[0.1, 0.9, 0.5, 0.7, 0.0, 0.0, 0.0, 0.0], [0.3, 0.2, 0.8, 0.6, 0.4, 0.0, 0.0, 0.0]]])
    b = _batch([[1.0, 0.0]], [[4, 5]], [[True, True]], entropy=ent)
    out = registry.get("filter", "top_entropy")(b, rho=0.2)    # 9 tokens, the top 20% by entropy
    assert out.gate.nonzero().tolist() == [[0, 0, 1], [0, 1, 2]]
    assert torch.equal(out.mask, b.mask)                      # still counted in the normaliser
    assert torch.equal(registry.get("filter", "top_entropy")(b, rho=1.0).gate, b.mask)
    # bf16 entropies (a bf16 trainer's) are compared in fp32: torch.quantile takes no bf16
    assert torch.equal(registry.get("filter", "top_entropy")(b.replace(entropy=ent.bfloat16()), rho=0.2).gate, out.gate)


# ------------------------------------------------------------------------ registry


def test_every_part_has_a_description_a_source_and_list_shows_parameters():
    text = registry.describe(fused_names)
    for axis in registry.AXES:
        for name in registry.names(axis):
            e = registry.entry(axis, name)
            assert e.doc, (axis, name)
            assert e.source or axis == "task", (axis, name)
            assert f"  {name} " in text
    assert "clip_low=0.2" in text and "eps=1e-06" in text and "max_len=None" in text
    assert "[fused]" in text and "stage=step" in text


def test_unknown_part_lists_valid_names():
    with pytest.raises(KeyError, match="valid: a2po, batch_std, centered, gdpo, gpg"):
        registry.get("delta", "nope")


def test_a_part_with_the_wrong_signature_is_refused():
    # refused at registration by the part contract (one line naming the part, its file and the axis's signature)
    with pytest.raises((TypeError, registry.PartContractError), match="positional arguments must be"):
        registry.register("loss", "bad_signature")(lambda logp, old_logp, deltas: None)
    with pytest.raises((TypeError, registry.PartContractError), match="type annotation and a default"):
        def no_default(logp, old_logp, deltas, mask, *, eps): ...
        registry.register("loss", "bad_default")(no_default)
    assert "bad_signature" not in registry.names("loss")


def test_bind_fills_parameters_and_checks_them():
    agg = registry.bind("aggregate", "seq_mean_token_sum_norm", context={"max_len": 4})
    x, m = torch.ones(1, 1, 2), torch.ones(1, 1, 2)
    assert agg(x, m).item() == 0.5                            # 2 / (1 response * 4)
    assert registry.bind("aggregate", {"name": "seq_mean_token_sum_norm", "max_len": 8}, {"max_len": 4})(x, m) == 0.25
    with pytest.raises(ValueError, match="clip_high: must be > 0"):
        registry.bind("loss", {"name": "clipped", "clip_high": -1.0})
    with pytest.raises(ValueError, match="has no parameter 'tau'; valid: clip_low, clip_high"):
        registry.bind("loss", {"name": "clipped", "tau": 1.0})


def test_the_docs_example_part_works():
    # the "Adding a part" example of docs/extending.md, run as written: registered, configurable, checked, trainable
    import re
    from pathlib import Path

    from grpo_bench.algos import losses
    from grpo_bench.errors import ConfigError
    from grpo_bench.config.run import resolve_run

    page = (Path(__file__).resolve().parent.parent / "docs" / "extending.md").read_text()
    code = re.search(r"## Adding a part.*?```python\n(.*?)```", page, re.S).group(1)
    try:
        exec(code, dict(vars(losses)))
        assert "my_clip" in registry.names("loss")
        logp, old = _logps(14, spread=0.5)
        d = torch.randn(2, 3, generator=torch.Generator().manual_seed(15))
        torch.testing.assert_close(loss("my_clip", logp, old, d, clip=0.2)[0], loss("clipped", logp, old, d)[0])
        cfg = resolve_run({"task": "sort", "loss": {"name": "my_clip", "clip": 0.1}})
        assert cfg.loss == {"name": "my_clip", "clip": 0.1}
        with pytest.raises(ConfigError, match="loss.clip: must be < 1"):
            resolve_run({"task": "sort", "loss": {"name": "my_clip", "clip": 1.5}})
    finally:
        registry._REGISTRY["loss"].pop("my_clip", None)


# ------------------------------------------------------------------ contracts


def test_masked_helpers():
    from grpo_bench.algos import masked_mean, masked_sum
    x = T([[[1.0, 2.0, float("inf")], [4.0, 5.0, 6.0]]])
    m = T([[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    assert masked_sum(x, m).item() == 3.0 and masked_mean(x, m).item() == 1.5   # inf under the mask: not read
    assert masked_mean(x, m, dim=-1).tolist() == [[1.5, 0.0]]                   # no token: 0, not nan
    assert masked_mean(x, m, dim=-1, keepdim=True).shape == (1, 2, 1)
    assert masked_sum(x, m, dim=-1).shape == (1, 2) and masked_sum(x, m, dim=-1, keepdim=True).shape == (1, 2, 1)


def test_one_token_aggregates_to_itself():
    x, m = T([[[2.5, 9.0]]]), T([[[1.0, 0.0]]])
    for name in ["token_mean", "token_sum", "seq_mean_token_mean", "seq_mean_token_sum"]:
        assert agg(name, x, m) == 2.5, name
    assert agg("seq_mean_token_sum_norm", x, m, max_len=1) == 2.5


# the papers' (or verl's / TRL's) defaults: what `loss: clipped` without parameters means
DEFAULTS = {
    ("delta", "zscore"): {"eps": 1e-6}, ("delta", "batch_std"): {"eps": 1e-6},
    ("delta", "passk"): {"normalize": True, "eps": 1e-6}, ("delta", "reinforce_pp"): {"eps": 1e-8},
    ("delta", "reinforce_pp_baseline"): {"eps": 1e-8}, ("delta", "gpg"): {"f_norm": 1.0, "count": "advantage"},
    ("loss", "clipped"): {"clip_low": 0.2, "clip_high": 0.2},
    ("loss", "dual_clip"): {"clip_low": 0.2, "clip_high": 0.2, "clip_c": 3.0},
    ("loss", "gspo"): {"clip_low": 3e-4, "clip_high": 4e-4}, ("loss", "gmpo"): {"clip_low": 0.4, "clip_high": 0.4},
    ("loss", "cispo"): {"clip_low": None, "clip_high": 4.0}, ("loss", "sapo"): {"tau_pos": 1.0, "tau_neg": 1.05},
    ("loss", "vespo"): {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0},
    ("loss", "dppo_tv"): {"clip_low": 0.2, "clip_high": 0.2, "clip_c": 20.0},
    ("loss", "dppo_kl"): {"clip_low": 0.2, "clip_high": 0.2, "clip_c": 20.0},
    ("loss", "clip_cov"): {"clip_low": 0.2, "clip_high": 0.2, "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0,
                           "clip_cov_ub": 5.0},
    ("loss", "kl_cov"): {"kl_cov_ratio": 2e-4, "ppo_kl_coef": 1.0},
    ("aggregate", "seq_mean_token_sum_norm"): {"max_len": None},
    ("kl_ctrl", "adaptive"): {"target": 0.1, "horizon": 10000.0},
    ("ref_update", "hard"): {"every": 10}, ("ref_update", "soft"): {"every": 1, "alpha": 0.6},
    ("filter", "dynamic_sampling"): {"max_draws": 4}, ("filter", "overlong_punish"): {"cache": 4, "max_len": None},
    ("filter", "top_entropy"): {"rho": 0.2},
    ("delta", "gdpo"): {"eps": 1e-6, "reward_weights": None, "batch_norm": "tokens"}, ("delta", "maxrl"): {"eps": 1e-6},
    ("loss", "dro"): {"tau": 0.1}, ("loss", "topr"): {"positive_weight": 1.0, "negative_weight": 1.0},
    ("correction", "token_tis"): {"low": None, "high": 2.0}, ("correction", "seq_tis"): {"low": None, "high": 2.0},
    ("correction", "token_mis"): {"low": 0.5, "high": 5.0}, ("correction", "seq_mis"): {"low": None, "high": 3.0},
    ("correction", "decoupled"): {"cap": 5.0}, ("correction", "geo_mask"): {"low": 0.999, "high": 1.001},
    ("correction", "rollout_rs"): {"divergence": "k3", "level": "seq_mean", "low": None, "high": 0.01},
    ("correction", "opsm"): {"threshold": 0.5}, ("correction", "m2po"): {"threshold": 0.04, "against": "old"},
    ("entropy_ctrl", "adaptive"): {"target": 0.2, "coef_min": 0.0, "coef_max": 1.0, "delta": 0.005},
    ("filter", "no_positive_resample"): {"threshold": 0.9, "pass_reward": 1.0},
    ("delta", "optimal_token_baseline"): {"eps": 1e-8, "zero_tail": True},
    ("delta", "gtpo"): {"threshold": 0.7, "gamma": 0.1, "conflict_weight": 2.0, "eps": 1e-4},
    ("delta", "a2po"): {"beta1": 0.5, "samples": 8}, ("loss", "a2po"): {"beta2": 1e-3},
    ("correction", "snis"): {"level": "token", "mode": "truncate", "low": None, "high": 2.0},
}


def test_defaults_are_the_sources_values():
    for axis in registry.AXES:
        if axis in ("task", "reward"):
            continue
        for name in registry.names(axis):
            assert registry.resolve_params(axis, name, {}) == DEFAULTS.get((axis, name), {}), (axis, name)


@pytest.mark.parametrize("axis,name,param,ok,bad", [
    ("loss", "clipped", "clip_low", [1e-9, 0.999], [0.0, 1.0]),            # (0, 1)
    ("loss", "clipped", "clip_high", [1e-9, 5.0], [0.0, -0.1]),            # > 0
    ("loss", "cispo", "clip_low", [None, 0.5], [0.0, 1.0]),                # null or (0, 1)
    ("loss", "dual_clip", "clip_c", [1.000001, 10.0], [1.0, 0.5]),         # > 1
    ("loss", "vespo", "k_pos", [0.0, 2.0], [-1e-9]),                       # >= 0
    ("aggregate", "seq_mean_token_sum_norm", "max_len", [None, 1], [0]),   # null or >= 1
    ("filter", "overlong_punish", "max_len", [None, 1], [0]),
    ("filter", "overlong_punish", "cache", [1], [0]),
    ("filter", "top_entropy", "rho", [0.0, 1.0], [-0.1, 1.1]),             # [0, 1]
    ("ref_update", "hard", "every", [1], [0]),
    ("ref_update", "soft", "alpha", [0.0, 1.0], [1.1]),
    ("delta", "gpg", "count", ["reward"], ["tokens"]),
])
def test_parameter_bounds(axis, name, param, ok, bad):
    for v in ok:
        assert registry.resolve_params(axis, name, {param: v})[param] == v
    for v in bad:
        with pytest.raises(ValueError, match=f"^{param}: "):
            registry.resolve_params(axis, name, {param: v})


GROUP_PARTS = {("delta", n) for n in ["centered", "zscore", "batch_std", "rloo", "max", "passk", "opo",
                                      "reinforce_pp_baseline", "gpg", "gdpo", "maxrl", "optimal_token_baseline",
                                      "gtpo"]} | \
    {("filter", n) for n in ["dynamic_sampling", "zero_variance", "no_positive_resample"]}


def test_parts_that_compare_a_group_refuse_one_response():
    from grpo_bench.errors import ConfigError
    from grpo_bench.config.run import resolve_run
    for axis in ("delta", "filter"):
        for name in registry.names(axis):
            cfg = {"task": "sort", "group_size": 1, "delta": "raw"}
            cfg |= {"delta": name} if axis == "delta" else {"filters": [name]}
            if name == "remax":
                continue  # compares with the greedy answer, not within a group
            if (axis, name) in GROUP_PARTS:
                with pytest.raises(ConfigError, match="group_size: must be >= 2"):
                    resolve_run(cfg)
            else:
                assert resolve_run(cfg).group_size == 1, (axis, name)


@pytest.mark.parametrize("name", registry.names("delta"))
def test_deltas_never_write_into_the_rewards(name):
    # a caller that edits its advantages in place must not change the rewards it logs
    from grpo_bench.algos.deltas import Extra
    src = T([[1.0, 0.0, 2.0], [0.5, 0.5, 0.5]])
    keep = src.clone()
    tok = torch.full((2, 3, 4), -0.5)
    extra = Extra(mask=torch.ones(2, 3, 4), ids=torch.zeros(2, 3, 4, dtype=torch.long), logp=tok, entropy=-tok,
                  sum_pi_sq=-tok, ref_rewards=T([[1.0, 0.0], [0.0, 0.0]]))
    res = registry.get("delta", name)(src, T([[1, 2, 3]] * 2), T([0.5, 0.0]), None, extra)
    res.add_(100.0)
    assert torch.equal(src, keep), name


def test_whitening_equal_rewards_is_zero_not_nan():
    # every reward of the batch equal: variance 0, and eps keeps 0 / sqrt(0 + eps) at 0
    for name in ["reinforce_pp", "reinforce_pp_baseline"]:
        out = delta(name, [[0.5, 0.5], [0.5, 0.5]], lengths=[[1, 2], [3, 4]])
        assert out.tolist() == [[0.0, 0.0], [0.0, 0.0]], name


def test_reference_schedules_from_the_first_epoch_on():
    hard, soft = registry.get("ref_update", "hard"), registry.get("ref_update", "soft")
    # every = 1: a refresh before every rollout but the first (the reference starts equal to the policy)
    assert [hard(e, every=1) for e in range(4)] == [0, 1, 1, 1]
    assert [soft(e, every=1, alpha=0.5) for e in range(4)] == [0, 0.5, 0.5, 0.5]
    assert [hard(e) for e in range(21)].count(1.0) == 2 and [soft(e) for e in range(3)] == [0, 0.6, 0.6]


@pytest.mark.parametrize("name,params", [
    ("clipped", {"clip_low": 0.5, "clip_high": 1.0}), ("gspo", {"clip_low": 0.5, "clip_high": 1.0}),
    ("dual_clip", {"clip_low": 0.5, "clip_high": 1.0, "clip_c": 2.0}), ("cispo", {"clip_low": 0.5, "clip_high": 1.0}),
    ("clip_cov", {"clip_low": 0.5, "clip_high": 1.0, "clip_cov_lb": 1e9, "clip_cov_ub": 2e9}),
])
def test_a_ratio_exactly_on_the_bound_is_not_clipped(name, params):
    # ratios of exactly 2 and 0.5 (exp(+-log 2) is exact), the bounds 1 + 1.0 and 1 - 0.5: the clip
    # leaves the token's value and gradient as they are, so it is in no region
    l2 = math.log(2.0)
    old = T([[[-l2, -l2], [0.0, 0.0], [-l2, -l2], [0.0, 0.0]]])
    logp = T([[[0.0, 0.0], [-l2, -l2], [0.0, 0.0], [-l2, -l2]]]).requires_grad_()
    d = T([[1.0, -1.0, -1.0, 0.0]])   # ratio 2 with A > 0, 0.5 with A < 0, 2 with A < 0 (the dual cap), 0.5 with A = 0
    per_tok, regions = loss(name, logp, old, d, **params)
    per_tok[:, :3].sum().backward()
    for k, r in regions.items():
        assert not r.any(), (name, k, r)
    if name != "cispo":
        assert (logp.grad[:, :3] != 0).all(), name


def test_gmpo_log_ratio_on_the_bound_is_not_clipped():
    logp = T([[[0.5, 0.5], [-0.5, -0.5], [-0.5, -0.5]]]).requires_grad_()
    old = torch.zeros(1, 3, 2)
    per_tok, regions = loss("gmpo", logp, old, T([[1.0, -1.0, 0.0]]), clip_low=0.5, clip_high=0.5)
    assert not regions["low"].any() and not regions["high"].any()
    per_tok[:, :2].sum().backward()
    assert (logp.grad[:, :2] != 0).all()


def test_filters_return_changed_copies():
    import dataclasses
    b = _batch([[1.0, 0.0]], [[3, 8]], [[True, False]])
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.mask = b.mask * 0   # a filter cannot edit the batch another filter or the trainer still holds
    out = registry.get("filter", "mask_truncated")(b)
    assert out is not b and b.mask[0, 1].sum() == 8 and b.max_draws == 1 and b.keep is None and b.gate is None


def test_opo_without_lengths_falls_back_to_the_group_mean():
    # a group whose responses all have length 0 (every token filtered): the plain mean
    out = delta("opo", [[1.0, 0.0, 2.0], [1.0, 0.0, 0.0]], lengths=[[0, 0, 0], [1, 1, 2]])
    torch.testing.assert_close(out[0], T([0.0, -1.0, 1.0]))
    torch.testing.assert_close(out[1], T([0.75, -0.25, -0.25]))
    # one token in the whole group: its response's reward is the baseline (a total of 1 is still a weighting)
    torch.testing.assert_close(delta("opo", [[1.0, 0.0, 0.0]], lengths=[[1, 0, 0]]), T([[0.0, -1.0, -1.0]]))


def test_gpg_counts_a_single_nonzero_reward():
    torch.testing.assert_close(delta("gpg", [[1.0, 0.0]], count="reward"), T([[1.0, -1.0]]))   # alpha = 2 / 1


def test_top_entropy_edge_cases():
    f = registry.get("filter", "top_entropy")
    b = _batch([[1.0, 0.0]], [[4, 5]], [[True, True]])
    assert f(b, rho=0.2) is b                                        # no entropy: nothing to gate on
    ent = torch.rand(1, 2, 8, generator=torch.Generator().manual_seed(0)).double()
    empty = _batch([[1.0, 0.0]], [[0, 0]], [[True, True]], entropy=ent)
    assert f(empty, rho=0.2) is empty                                # no token at all
    for dtype in (torch.float16, torch.bfloat16):                    # low precision: compared in fp32
        half = _batch([[1.0, 0.0]], [[4, 5]], [[True, True]], entropy=ent.to(dtype))
        gate = f(half, rho=0.5).gate
        assert gate.sum() >= 4 and gate.dtype == half.mask.dtype
    # a gate already set (an earlier step filter) is narrowed, never widened
    full = _batch([[1.0, 0.0]], [[4, 5]], [[True, True]], entropy=ent)
    earlier = torch.zeros_like(full.mask)
    earlier[0, 1] = full.mask[0, 1]
    out = f(full.replace(gate=earlier), rho=1.0)
    assert torch.equal(out.gate, earlier)


def test_dppo_bounds_are_inclusive():
    # pi - pi_old exactly +-0.5 (probabilities 1 and 0.5: exact in binary), bounds 0.5: kept, not cut
    l2 = math.log(2.0)
    logp = T([[[0.0], [-l2]]])
    old = T([[[-l2], [0.0]]])
    per_tok, regions = loss("dppo_tv", logp, old, T([[1.0, -1.0]]), clip_low=0.5, clip_high=0.5, clip_c=2.0)
    assert not regions["low"].any() and not regions["high"].any()
    assert not regions["cap"].any()                       # the first token's ratio is exactly clip_c = 2
    torch.testing.assert_close(per_tok, T([[[-2.0 * 0.0], [0.5 * -l2]]]))


def test_dppo_kl_bounds_are_inclusive():
    # as dppo_tv: a divergence exactly at the bound is kept. Negative advantage, q = pi_old = 1 (log 0):
    # the binary KL is -log p exactly (its (1 - q) term is 0), and p < q, so only the bound decides
    logp, old = T([[[-0.25]]]), T([[[0.0]]])
    _, regions = loss("dppo_kl", logp, old, T([[-1.0]]), clip_low=0.25, clip_high=0.2)
    assert not regions["low"].any()
    _, regions = loss("dppo_kl", logp, old, T([[-1.0]]), clip_low=0.2499, clip_high=0.2)
    assert regions["low"].all()
    # positive advantage, p = 1 > q = 1/2: KL(Bern(1/2) || Bern(1)) = 1/2 log(1/2) + 1/2 log(1/2 / 0), with
    # verl's 1e-8 guard on the 1 - p and 1 - q, here in the order the float rounding makes exact (torch's
    # log on a tensor of the same shape: a libm log may differ from it in the last bit)
    l2 = math.log(2.0)
    bkl = 0.5 * -l2 + 0.5 * torch.log(T([[[(0.5 + 1e-8) / 1e-8]]])).item()
    logp, old = T([[[0.0]]]), T([[[-l2]]])
    _, regions = loss("dppo_kl", logp, old, T([[1.0]]), clip_low=0.2, clip_high=bkl)
    assert not regions["high"].any()
    _, regions = loss("dppo_kl", logp, old, T([[1.0]]), clip_low=0.2, clip_high=bkl - 1e-9)
    assert regions["high"].all()


def test_dppo_caps_the_log_ratio_at_20_before_clip_c():
    # as verl: exp of the log-ratio clamped to [-20, 20], so a clip_c above e^20 never binds and
    # log-ratios of +-21 weigh e^+-20, not e^+-21 (the gradient of -A w log pi is -A w). Both tokens
    # are inside the trust region: +21 moves p by e^-1, and -21 lowers p under a positive advantage
    logp, old = T([[[-1.0, -22.0]]]), T([[[-22.0, -1.0]]])
    for name in ("dppo_tv", "dppo_kl"):
        x = logp.clone().requires_grad_()
        per_tok, regions = loss(name, x, old, T([[1.0]]), clip_low=1.0, clip_high=1.0, clip_c=math.exp(20.5))
        per_tok.sum().backward()
        torch.testing.assert_close(x.grad, T([[[-math.exp(20.0), -math.exp(-20.0)]]]), rtol=1e-12, atol=0.0)
        assert not regions["cap"].any() and not regions["high"].any()


def test_clip_cov_band_is_open():
    # covariances exactly 2 on both tokens (centred log-probs +-1 times centred advantages +-2, all exact),
    # ratio 1 (no PPO clip): a band with 2 as either end takes no token, one just around 2 takes one
    logp = T([[[-1.0], [-3.0]]])
    d = T([[2.0, -2.0]])
    for lb, ub, cut in [(2.0, 5.0, 0), (1.0, 2.0, 0), (1.999, 2.001, 1)]:
        _, regions = loss("clip_cov", logp, logp.clone(), d, clip_cov_ratio=0.5, clip_cov_lb=lb, clip_cov_ub=ub)
        assert regions["cov"].sum() == cut, (lb, ub)


def test_kl_cov_picks_unmasked_tokens_by_covariance():
    logp = T([[[-0.1, -2.0, -3.0], [-0.2, -1.0, -4.0]]])
    old = logp - 0.05
    d = T([[1.0, -1.0]])
    mask = T([[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]])
    adv = d.unsqueeze(-1).expand_as(logp)
    on = mask > 0
    cov = (adv - adv[on].mean()) * (logp - logp[on].mean())
    cov[~on] = -float("inf")
    # the smallest share: one token, the highest covariance among the unmasked ones
    _, regions = loss("kl_cov", logp, old, d, mask, kl_cov_ratio=1e-6, ppo_kl_coef=1.0)
    assert regions["cov"].sum() == 1 and regions["cov"].reshape(-1)[cov.reshape(-1).argmax()]
    # a larger share never reaches a masked token, however high its covariance would be
    _, regions = loss("kl_cov", logp, old, d, mask, kl_cov_ratio=0.99)
    assert regions["cov"].sum() == 4 and not regions["cov"][~on].any()
    _, regions = loss("kl_cov", logp, old, d, torch.zeros_like(mask), kl_cov_ratio=0.5)
    assert not regions["cov"].any()


def test_clip_cov_cuts_candidates_only():
    logp, old = _logps(16, shape=(2, 3, 4), spread=0.05)
    d = torch.randn(2, 3, generator=torch.Generator().manual_seed(17)) * 20
    mask = torch.ones_like(logp)
    mask[0, 0, 2:] = 0
    adv = d.unsqueeze(-1).expand_as(logp)
    on = mask > 0
    cov = (adv - adv[on].mean()) * (logp - logp[on].mean())
    ratio = (logp - old).exp()
    inside = ~(((adv < 0) & (ratio < 0.9)) | ((adv > 0) & (ratio > 1.1)))
    candidates = on & inside & (cov > 1.0) & (cov < 30.0)
    assert 2 <= candidates.sum() < on.sum()
    torch.manual_seed(0)
    _, regions = loss("clip_cov", logp, old, d, mask, clip_low=0.1, clip_high=0.1, clip_cov_ratio=0.99,
                      clip_cov_lb=1.0, clip_cov_ub=30.0)
    assert torch.equal(regions["cov"], candidates)   # a share large enough to take every candidate
    _, regions = loss("clip_cov", logp, old, d, mask, clip_low=0.1, clip_high=0.1, clip_cov_ratio=1e-6,
                      clip_cov_lb=1.0, clip_cov_ub=30.0)
    assert regions["cov"].sum() == 1 and (regions["cov"] & candidates).sum() == 1


def test_vespo_clamps_each_token_log_ratio():
    # per token to [-20, 20] before the sum: 25 and -15 make 5 (not 10); then phi = w^k e^(lambda (1 - w))
    logp = T([[[0.0, -15.0]]])
    old = T([[[-25.0, 0.0]]])
    x = logp.clone().requires_grad_()
    per_tok, _ = loss("vespo", x, old, T([[1.0]]), k_pos=0.5, lambda_pos=0.0)
    w = math.exp(5.0)
    phi = math.exp(1e-4 + 0.5 * 5.0 - 1e-4 * w)   # lambda is kept >= 1e-4
    torch.testing.assert_close(per_tok, -phi * logp)
    neg, _ = loss("vespo", T([[[-25.0, 0.0]]]), T([[[0.0, -15.0]]]), T([[1.0]]), k_pos=0.5, lambda_pos=0.0)
    torch.testing.assert_close(neg, -math.exp(1e-4 + 0.5 * -5.0 - 1e-4 * math.exp(-5.0)) * T([[[-25.0, 0.0]]]))
    # an overflowing weight is 0, not inf
    big, _ = loss("vespo", T([[[-1.0]]]), T([[[-21.0]]]), T([[1.0]]), k_pos=3000.0, lambda_pos=0.0)
    assert big.item() == 0.0   # exp(3000 * 20 - 1e-4 * e^20) overflows


def test_vespo_caps_the_sequence_log_weight_at_20():
    # two tokens of log-ratio 12 (each under the per-token clamp) make 24, capped at 20. k is picked so
    # that phi = exp(lambda + k log w - lambda w) is about 1 at log w = 20 (at 24 it would underflow to 0)
    lam = 1e-3
    k = lam * (math.exp(20.0) - 1.0) / 20.0
    logp, old = T([[[-1.0, -2.0]]]), T([[[-13.0, -14.0]]])
    per_tok, _ = loss("vespo", logp, old, T([[1.0]]), k_pos=k, lambda_pos=lam)
    phi = math.exp(lam + k * 20.0 - lam * math.exp(20.0))
    assert 0.5 < phi < 2.0
    torch.testing.assert_close(per_tok, -phi * logp)


def test_sapo_clamps_the_log_ratio_at_20():
    # as verl and TRL: log-ratios of +-21 gate like +-20, with no gradient past the clamp. A tiny tau_pos
    # keeps the gate off saturation at r = e^20, so the upper end shows in the value too
    logp, old = T([[[-22.0, -1.0]]]), T([[[-1.0, -22.0]]])
    for tau in (1.0, 1e-8):
        x = logp.clone().requires_grad_()
        per_tok, _ = loss("sapo", x, old, T([[1.0]]), tau_pos=tau)
        gate = [1.0 / (1.0 + math.exp(-tau * (math.exp(s) - 1.0))) for s in (-20.0, 20.0)]
        torch.testing.assert_close(per_tok, T([[[-g * 4.0 / tau for g in gate]]]), rtol=1e-12, atol=0.0)
        per_tok.sum().backward()
        assert (x.grad == 0).all()


def test_dppo_kl_keeps_a_token_whose_probability_did_not_move():
    # only a move in the advantage's direction is bounded: log-probs 1e-17 apart give p = q = 1 in
    # floating point but a binary KL of 1e-17, above bounds of 1e-18; the token stays on both sides
    logp, old = T([[[-1e-17]]]), T([[[0.0]]])
    for a in (1.0, -1.0):
        per_tok, regions = loss("dppo_kl", logp, old, T([[a]]), clip_low=1e-18, clip_high=1e-18)
        assert not regions["low"].any() and not regions["high"].any()
        assert per_tok.item() == -a * 1.0 * -1e-17      # weight: ratio exp(-1e-17) = 1
