"""The fused GRPO loss kernel against the registry's own functions composed in fp64.

The reference is exactly what the trainer computes:
    aggregate(loss(logp, old, deltas, mask) + kl_coef * kl(logp, ref), mask, max_len=)
for every loss mode x KL estimator x aggregation, value, gradient w.r.t. logp and the
returned statistics.
"""
import math

import pytest
import torch

from grpo_bench import registry
from grpo_bench.logprobs import grpo_loss

pytest.importorskip("triton")
from grpo_bench.kernels import loss as L  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = torch.float32  # explicit everywhere: another test module sets the default dtype to fp64


def batch(b=2, g=3, t=19, seed=0, spread=0.4):
    """logp/old/ref (B, G, T) with ratios in and out of the clip range, some exactly 1,
    mixed-sign and zero deltas, ragged masks and one fully masked response."""
    gen = torch.Generator().manual_seed(seed)
    logp = -3 * torch.rand(b, g, t, generator=gen, dtype=F32)
    old = logp + spread * torch.randn(b, g, t, generator=gen, dtype=F32)
    old[:, :, ::4] = logp[:, :, ::4]  # ratio exactly 1: the tie of min(ratio*A, clip(ratio)*A)
    ref = logp + spread * torch.randn(b, g, t, generator=gen, dtype=F32)
    deltas = torch.randn(b, g, generator=gen, dtype=F32)
    deltas[0, 0] = 0.0
    lengths = torch.randint(1, t + 1, (b, g), generator=gen)
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).to(F32)
    mask[-1, -1] = 0.0
    return [x.to(DEVICE) for x in (logp, old, ref, deltas, mask)]


def compare(data, atol=2e-6, **kw):
    logp, old, ref, deltas, mask = data
    x = logp.clone().requires_grad_()
    value, stats = grpo_loss(x, old, ref, deltas, mask, backend="triton", return_stats=True, **kw)
    (g,) = torch.autograd.grad(value, x)
    xr = logp.double().requires_grad_()
    rvalue, rstats = grpo_loss(xr, old.double(), ref.double(), deltas.double(), mask.double(),
                               backend="torch", return_stats=True, **kw)
    (rg,) = torch.autograd.grad(rvalue, xr)
    assert value.shape == () and g.dtype == logp.dtype
    torch.testing.assert_close(value.double(), rvalue, rtol=1e-5, atol=atol)
    torch.testing.assert_close(g.double(), rg, rtol=1e-5, atol=atol)
    assert stats.keys() == rstats.keys()
    for k in stats:
        torch.testing.assert_close(stats[k].double(), rstats[k], rtol=1e-5, atol=atol, msg=k)
    return value, g


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(L, "BLOCK_T_MAX", 8)  # three T tiles, the last ragged
    monkeypatch.setattr(L, "MAX_PROGRAMS", 4)  # programs loop over the 6 responses


@pytest.mark.parametrize("loss", sorted(L.LOSSES))
@pytest.mark.parametrize("aggregate", L.AGGREGATES)
def test_every_combination(loss, aggregate, small_tiles):
    data = batch()
    for kl, coef in [("k1", 0.0), ("k1", 0.1), ("k2", 0.3), ("k3", 0.05)]:
        compare(data, loss=loss, kl=kl, kl_coef=coef, aggregate=aggregate, clip_low=0.2, clip_high=0.28)


def test_kernel_covers_the_registry():
    assert set(L.LOSSES) == set(registry.names("loss"))
    assert set(L.KLS) == set(registry.names("kl"))
    assert set(L.AGGREGATES) == set(registry.names("aggregate"))


def test_gspo_uses_the_sequence_ratio():
    # one response, ratio inside the trust region: loss = -A * exp(mean log-ratio) on every
    # token, so with token_mean each valid token's gradient is -A * ratio / length
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -9.0]], dtype=F32, device=DEVICE)
    old = logp - torch.tensor([[0.1, -0.05, 0.02, 0.0, 5.0]], dtype=F32, device=DEVICE)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=F32, device=DEVICE)  # the outlier is padding
    a = torch.tensor([1.5], dtype=F32, device=DEVICE)
    x = logp.clone().requires_grad_()
    v = grpo_loss(x, old, None, a, mask, loss="gspo", kl=None, kl_coef=0.0, aggregate="token_mean",
                  clip_low=0.2, clip_high=0.2, backend="triton")
    ratio = math.exp((0.1 - 0.05 + 0.02 + 0.0) / 4)
    torch.testing.assert_close(v.item(), -1.5 * ratio)
    (g,) = torch.autograd.grad(v, x)
    torch.testing.assert_close(g, torch.tensor([[-1.5 * ratio / 4] * 4 + [0.0]], dtype=F32, device=DEVICE))
    compare((logp, old, logp, a, mask), loss="gspo", kl="k3", kl_coef=0.1, aggregate="seq_mean_token_mean",
            clip_low=0.2, clip_high=0.2)


def test_gspo_clips_the_whole_sequence():
    logp = torch.zeros(1, 3, dtype=F32, device=DEVICE)
    old = torch.full((1, 3), -0.5, dtype=F32, device=DEVICE)  # ratio e^0.5 > 1.2 with A > 0: clipped
    x = logp.clone().requires_grad_()
    one, mask = torch.ones(1, dtype=F32, device=DEVICE), torch.ones(1, 3, dtype=F32, device=DEVICE)
    v, stats = grpo_loss(x, old, None, one, mask, loss="gspo", kl=None, kl_coef=0.0, aggregate="token_mean",
                         clip_low=0.2, clip_high=0.2, backend="triton", return_stats=True)
    torch.testing.assert_close(v.item(), -1.2)
    assert stats["clip/frac"].item() == 1.0
    assert (torch.autograd.grad(v, x)[0] == 0).all()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's numpy sees the infs
@pytest.mark.parametrize("aggregate", L.AGGREGATES)
def test_padding_values_never_leak(aggregate):
    # garbage under the mask (inf log-probs) must not reach the value or the gradient
    logp, old, ref, deltas, mask = batch(seed=1)
    kw = dict(loss="unclipped", kl="k3", kl_coef=0.1, aggregate=aggregate, clip_low=0.2, clip_high=0.2,
              backend="triton")
    x = logp.clone().requires_grad_()
    clean = grpo_loss(x, old, ref, deltas, mask, **kw)
    (g_clean,) = torch.autograd.grad(clean, x)
    dirty = torch.where(mask > 0, logp, torch.full_like(logp, float("inf"))).requires_grad_()
    v = grpo_loss(dirty, old, ref, deltas, mask, **kw)
    (g,) = torch.autograd.grad(v, dirty)
    assert torch.isfinite(v) and torch.isfinite(g).all()
    torch.testing.assert_close(v, clean)
    torch.testing.assert_close(g, g_clean)
    assert (g[mask == 0] == 0).all()


def test_fully_masked_batch():
    logp, old, ref, deltas, mask = batch(seed=2)
    for aggregate in L.AGGREGATES:
        value, g = compare((logp, old, ref, deltas, torch.zeros_like(mask)), loss="clipped", kl="k2",
                           kl_coef=0.1, aggregate=aggregate, clip_low=0.2, clip_high=0.2)
        assert value.item() == 0.0 and (g == 0).all()


def test_max_len_and_bool_mask():
    logp, old, ref, deltas, mask = batch(seed=3)
    compare((logp, old, ref, deltas, mask > 0), loss="clipped", kl="k3", kl_coef=0.2,
            aggregate="seq_mean_token_sum_norm", clip_low=0.1, clip_high=0.3, max_len=40)


def test_wide_ratios():
    # spread 3: ratios from ~e^-9 to ~e^9, so both clip sides and k3's exp are exercised
    compare(batch(seed=4, spread=3.0), atol=1e-5, loss="clipped", kl="k3", kl_coef=0.5,
            aggregate="token_mean", clip_low=0.2, clip_high=0.28)


def test_unknown_parts_are_rejected():
    data = batch()
    with pytest.raises(KeyError, match="valid"):
        grpo_loss(*data, loss="nope", kl="k1", kl_coef=0.1, aggregate="token_mean", clip_low=0.2,
                  clip_high=0.2, backend="triton")
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(data[0], data[1], None, data[3], data[4], loss="clipped", kl="k1", kl_coef=0.1,
                  aggregate="token_mean", clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="backend='torch'"):
        L.LossSpec("clipped", "k9", 0.1, "token_mean", 0.2, 0.2).check()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="full-size kernel checks need a GPU")
@pytest.mark.parametrize("loss, kl, aggregate", [("clipped", "k3", "token_mean"), ("gspo", "k2", "seq_mean_token_mean"),
                                                 ("unclipped", "k1", "seq_mean_token_sum_norm")])
def test_full_size_gpu(loss, kl, aggregate):
    compare(batch(b=64, g=16, t=4096, seed=5), atol=1e-6, loss=loss, kl=kl, kl_coef=0.05,
            aggregate=aggregate, clip_low=0.2, clip_high=0.28)

