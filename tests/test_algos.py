"""Each GRPO part against hand-computed values and exact expectations."""
import math

import pytest
import torch

from grpo_bench import registry



@pytest.fixture(autouse=True)
def fp64():
    # exact comparisons; restored so that other test modules keep fp32
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def delta(name, r):
    return registry.get("delta", name)(torch.tensor(r, dtype=torch.float64))


def test_delta_hand_values():
    r = [[1.0, 2.0, 3.0, 6.0]]  # mean 3, unbiased std sqrt(14/3)
    assert delta("raw", r).tolist() == r
    assert delta("centered", r).tolist() == [[-2.0, -1.0, 0.0, 3.0]]
    std = math.sqrt(14 / 3)
    torch.testing.assert_close(delta("zscore", r), torch.tensor([[-2.0, -1.0, 0.0, 3.0]]) / (std + 1e-6))
    # leave-one-out: 1 - (2+3+6)/3, 2 - (1+3+6)/3, ...
    torch.testing.assert_close(delta("rloo", r), torch.tensor([[1 - 11 / 3, 2 - 10 / 3, 3 - 3.0, 6 - 2.0]]))
    assert delta("max", [[1.0, 3.0, 3.0, 0.5]]).tolist() == [[0.0, 3.0, 3.0, 0.0]]


def test_deltas_are_per_group():
    r = torch.tensor([[0.0, 1.0], [10.0, 30.0]])
    assert registry.get("delta", "centered")(r).tolist() == [[-0.5, 0.5], [-10.0, 10.0]]


@pytest.mark.parametrize("value", [0.0, 0.1, 1 / 3, 7.0, -2.5])
def test_zscore_of_equal_rewards_is_zero(value):
    out = delta("zscore", [[value] * 5, [1.0, 0.0, 0.0, 0.0, 0.0]])
    assert out[0].tolist() == [0.0] * 5
    assert torch.isfinite(out).all() and out[1, 0] > 0


def _logps(seed=0, shape=(2, 3, 4)):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g) * 3
    new = old + 0.3 * torch.randn(shape, generator=g)
    return new, old


def test_losses_hand_values():
    logp = torch.tensor([[[math.log(0.5), math.log(0.2)]]])
    old = torch.tensor([[[math.log(0.4), math.log(0.4)]]])
    d = torch.tensor([[2.0]])
    get = lambda n: registry.get("loss", n)  # noqa: E731
    torch.testing.assert_close(get("naive")(logp, old, d), -2 * logp)
    torch.testing.assert_close(get("unclipped")(logp, old, d), torch.tensor([[[-2 * 1.25, -2 * 0.5]]]))
    # ratios 1.25 and 0.5; positive advantage: clip at 1.2 above, min picks 0.5 below
    torch.testing.assert_close(get("clipped")(logp, old, d, clip_low=0.2, clip_high=0.2), torch.tensor([[[-2.4, -1.0]]]))
    # negative advantage: min(-r, -clip(r)) = -max(r, clip(r))... times |d|
    torch.testing.assert_close(get("clipped")(logp, old, -d, clip_low=0.2, clip_high=0.2), torch.tensor([[[2.5, 1.6]]]))
    # clip-higher (DAPO): upper bound 1.28 lets the 1.25 ratio through
    torch.testing.assert_close(get("clipped")(logp, old, d, clip_low=0.2, clip_high=0.28), torch.tensor([[[-2.5, -1.0]]]))


def test_naive_and_unclipped_gradients_coincide_at_ratio_one():
    base, _ = _logps()
    d = torch.randn(2, 3)
    grads = []
    for name in ["naive", "unclipped", "clipped"]:
        logp = base.clone().requires_grad_()
        registry.get("loss", name)(logp, base.detach(), d).mean().backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[0], grads[2])


def test_clipped_has_zero_gradient_where_clip_is_active():
    logp, old = _logps(1)
    d = torch.randn(2, 3)
    logp.requires_grad_()
    registry.get("loss", "clipped")(logp, old, d, clip_low=0.1, clip_high=0.1).sum().backward()
    ratio = (logp - old).exp().detach()
    adv = d.unsqueeze(-1).expand_as(ratio)
    active = ((adv > 0) & (ratio > 1.1)) | ((adv < 0) & (ratio < 0.9))
    assert active.any() and (~active).any()
    assert (logp.grad[active] == 0).all()
    # elsewhere it is the unclipped gradient: -delta * ratio
    torch.testing.assert_close(logp.grad[~active], (-adv * ratio)[~active])


def test_gspo_sequence_ratio_and_gradient():
    logp, old = _logps(2, (1, 2, 3))
    mask = torch.tensor([[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]])
    d = torch.tensor([[1.0, -1.0]])
    logp.requires_grad_()
    per_tok = registry.get("loss", "gspo")(logp, old, d, mask, clip_low=10.0, clip_high=10.0)  # no clipping
    loss = registry.get("aggregate", "seq_mean_token_mean")(per_tok, mask)
    loss.backward()
    # the sequence-level objective written directly: s_i = exp(mean_t log ratio over the response)
    lp = logp.detach().clone().requires_grad_()
    s = (((lp - old) * mask).sum(-1) / mask.sum(-1)).exp()
    ref = -(s * d).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(logp.grad, lp.grad)
    assert (logp.grad[0, 0, 2] == 0)


def test_aggregations_hand_values():
    x = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]])
    m = torch.tensor([[[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]])
    agg = lambda n, **kw: registry.get("aggregate", n)(x, m, **kw).item()  # noqa: E731
    assert agg("token_mean") == pytest.approx(10 / 4)
    assert agg("seq_mean_token_mean") == pytest.approx((2 + 4) / 2)
    assert agg("seq_mean_token_sum_norm") == pytest.approx((6 / 3 + 4 / 3) / 2)
    assert agg("seq_mean_token_sum_norm", max_len=10) == pytest.approx((6 / 10 + 4 / 10) / 2)


def test_aggregation_ignores_inf_on_masked_tokens_and_empty_responses():
    x = torch.tensor([[[1.0, float("inf")], [float("nan"), 5.0]]])
    m = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    for name in registry.names("aggregate"):
        assert torch.isfinite(registry.get("aggregate", name)(x, m))
    assert registry.get("aggregate", "seq_mean_token_mean")(x, m).item() == 1.0


def test_aggregations_match_loops():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 5, generator=g)
    m = (torch.rand(3, 4, 5, generator=g) > 0.4).double()
    tok = sum(x[b, i, t] for b in range(3) for i in range(4) for t in range(5) if m[b, i, t]) / m.sum()
    seqs = [sum(x[b, i, t] * m[b, i, t] for t in range(5)) / m[b, i].sum() for b in range(3) for i in range(4) if m[b, i].sum()]
    sums = [sum(x[b, i, t] * m[b, i, t] for t in range(5)) / 5 for b in range(3) for i in range(4)]
    torch.testing.assert_close(registry.get("aggregate", "token_mean")(x, m), tok)
    torch.testing.assert_close(registry.get("aggregate", "seq_mean_token_mean")(x, m), sum(seqs) / len(seqs))
    torch.testing.assert_close(registry.get("aggregate", "seq_mean_token_sum_norm")(x, m), sum(sums) / len(sums))


# ----------------------------------------------------------------------------- KL

P_LOGITS = torch.tensor([0.3, -1.2, 2.0, 0.1, -0.4], dtype=torch.float64)
Q_LOGITS = torch.tensor([-0.5, 0.7, 1.1, 0.0, 0.9], dtype=torch.float64)


def _exact(estimator, theta):
    """E_{x ~ p} of the estimator, summed exactly over the support, samples not differentiated."""
    logp = torch.log_softmax(theta, -1)
    logq = torch.log_softmax(Q_LOGITS, -1)
    weights = logp.exp().detach()
    return (weights * registry.get("kl", estimator)(logp, logq)).sum()


def test_kl_estimator_means_against_exact_kl():
    p, q = torch.softmax(P_LOGITS, -1), torch.softmax(Q_LOGITS, -1)
    kl = (p * (p / q).log()).sum()
    torch.testing.assert_close(_exact("k1", P_LOGITS), kl)
    torch.testing.assert_close(_exact("k3", P_LOGITS), kl)
    torch.testing.assert_close(_exact("k2", P_LOGITS), 0.5 * (p * (p / q).log() ** 2).sum())
    assert (registry.get("kl", "k3")(torch.log(p), torch.log(q)) >= 0).all()


def test_kl_estimator_expected_gradients():
    # What each estimator's gradient is in expectation: k1 -> 0, k2 -> grad KL(p||q), k3 -> grad KL(q||p).
    def grad(f):
        theta = P_LOGITS.clone().requires_grad_()
        f(theta).backward()
        return theta.grad

    fwd = lambda t: (torch.softmax(t, -1) * (torch.log_softmax(t, -1) - torch.log_softmax(Q_LOGITS, -1))).sum()  # noqa: E731
    rev = lambda t: (torch.softmax(Q_LOGITS, -1) * (torch.log_softmax(Q_LOGITS, -1) - torch.log_softmax(t, -1))).sum()  # noqa: E731
    torch.testing.assert_close(grad(lambda t: _exact("k1", t)), torch.zeros(5))
    torch.testing.assert_close(grad(lambda t: _exact("k2", t)), grad(fwd))
    torch.testing.assert_close(grad(lambda t: _exact("k3", t)), grad(rev))


def test_kl_sample_mean_converges():
    g = torch.Generator().manual_seed(0)
    p, q = torch.softmax(P_LOGITS, -1), torch.softmax(Q_LOGITS, -1)
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    kl = (p * (p / q).log()).sum()
    for name in ["k1", "k3"]:
        est = registry.get("kl", name)(p.log()[x], q.log()[x]).mean()
        assert abs(est - kl) < 0.01


def test_every_part_has_a_description_and_list_shows_parameters():
    text = registry.describe()
    for axis in ["delta", "loss", "aggregate", "kl", "task"]:
        for name in registry.names(axis):
            assert registry.entry(axis, name).doc, (axis, name)
            assert name in text
    assert "clip_low=0.2" in text and "eps=1e-06" in text


def test_unknown_part_lists_valid_names():
    with pytest.raises(KeyError, match="valid: centered, max, raw, rloo, zscore"):
        registry.get("delta", "nope")
