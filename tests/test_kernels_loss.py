"""The fused GRPO loss kernel against the registry's own functions composed in fp64.

The reference is exactly what the trainer computes:
    aggregate(gate * loss(logp, old, deltas, mask) + kl_coef * kl(logp, ref, old), mask)
for every fused loss x aggregation, every KL estimator and the gate, value, gradient
w.r.t. logp and the returned statistics; and once against the GRPO objective written out
in this file, so that a mistake shared by the registry and the kernel cannot pass.
"""
import math

import pytest
import torch
from helpers import needs

from grpo_bench import registry
from grpo_bench.numerics.logprobs import grpo_loss

needs("triton")
from grpo_bench.numerics.kernels import loss as L  # noqa: E402
from grpo_bench.numerics.kernels import spec as S  # noqa: E402

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


def compare(data, atol=2e-6, gate=None, **kw):
    logp, old, ref, deltas, mask = data
    x = logp.clone().requires_grad_()
    value, stats = grpo_loss(x, old, ref, deltas, mask, backend="triton", gate=gate, **kw)
    (g,) = torch.autograd.grad(value, x)
    xr = logp.double().requires_grad_()
    rvalue, rstats = grpo_loss(xr, old.double(), ref.double(), deltas.double(), mask.double(), backend="torch",
                               gate=None if gate is None else gate.double(), **kw)
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


# every fused loss with parameters that put ratios on both sides of its bounds
LOSSES = {
    "naive": "naive", "unclipped": "unclipped",
    "clipped": {"name": "clipped", "clip_low": 0.2, "clip_high": 0.28},
    "gspo": {"name": "gspo", "clip_low": 0.05, "clip_high": 0.05},
    "dual_clip": {"name": "dual_clip", "clip_low": 0.2, "clip_high": 0.2, "clip_c": 1.5},
    "cispo": {"name": "cispo", "clip_low": 0.3, "clip_high": 0.2},
    "sapo": {"name": "sapo", "tau_pos": 1.5, "tau_neg": 2.0},
}
KLS = sorted(S.KLS)


def test_the_table_names_registered_parts():
    assert set(LOSSES) == set(S.LOSSES) and set(S.LOSSES) <= set(registry.names("loss"))
    assert set(S.KLS) <= set(registry.names("kl"))
    assert set(S.AGGREGATES) == set(registry.names("aggregate"))


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("aggregate", S.AGGREGATES)
def test_every_loss_and_aggregation(loss, aggregate, small_tiles):
    data = batch(spread=0.6)
    kl = KLS[(sorted(LOSSES).index(loss) + S.AGGREGATES.index(aggregate)) % len(KLS)]
    agg = {"name": aggregate, "max_len": 23} if aggregate == "seq_mean_token_sum_norm" else aggregate
    compare(data, loss=LOSSES[loss], aggregate=agg)
    compare(data, loss=LOSSES[loss], aggregate=agg, kl=kl, kl_coef=0.1)


@pytest.mark.parametrize("kl", KLS)
def test_every_kl(kl, small_tiles):
    data = batch(seed=6, spread=0.8)
    compare(data, loss=LOSSES["clipped"], aggregate="token_mean", kl=kl, kl_coef=0.3)
    compare(data, loss="naive", aggregate="seq_mean_token_mean", kl=kl, kl_coef=0.05)


def test_gate(small_tiles):
    data = batch(seed=7)
    gate = (torch.rand(data[0].shape, generator=torch.Generator().manual_seed(0)) > 0.5).to(F32).to(DEVICE)
    for loss in ["clipped", "gspo", "cispo"]:
        compare(data, gate=gate, loss=LOSSES[loss], aggregate="token_mean", kl="k3", kl_coef=0.1)


def test_against_the_formula_written_here():
    # clipped PPO + k3 with seq_mean_token_mean, from the GRPO paper's objective, not from the registry
    logp, old, ref, deltas, mask = [x.double().cpu() for x in batch(seed=8, spread=0.5)]
    lo, hi, beta = 0.8, 1.28, 0.07
    x = logp.clone().requires_grad_()
    total, n = 0.0, 0
    for b in range(logp.shape[0]):
        for i in range(logp.shape[1]):
            toks = [t for t in range(logp.shape[2]) if mask[b, i, t] > 0]
            if not toks:
                continue
            a = deltas[b, i]
            terms = []
            for t in toks:
                r = torch.exp(x[b, i, t] - old[b, i, t])
                surrogate = torch.minimum(r * a, r.clamp(lo, hi) * a)
                k3 = torch.exp(ref[b, i, t] - x[b, i, t]) - (ref[b, i, t] - x[b, i, t]) - 1
                terms.append(-surrogate + beta * k3)
            total = total + torch.stack(terms).mean()
            n += 1
    want = total / n
    (want_g,) = torch.autograd.grad(want, x)
    y = logp.float().to(DEVICE).requires_grad_()
    got, _ = grpo_loss(y, old.float().to(DEVICE), ref.float().to(DEVICE), deltas.float().to(DEVICE),
                       mask.float().to(DEVICE), loss={"name": "clipped", "clip_low": 0.2, "clip_high": 0.28},
                       aggregate="seq_mean_token_mean", kl="k3", kl_coef=beta, backend="triton")
    (g,) = torch.autograd.grad(got, y)
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.double().cpu(), want_g, rtol=1e-5, atol=1e-6)


def test_gspo_uses_the_sequence_ratio():
    # one response, ratio inside the trust region: loss = -A * exp(mean log-ratio) on every
    # token, so with token_mean each valid token's gradient is -A * ratio / length
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -9.0]], dtype=F32, device=DEVICE)
    old = logp - torch.tensor([[0.1, -0.05, 0.02, 0.0, 5.0]], dtype=F32, device=DEVICE)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=F32, device=DEVICE)  # the outlier is padding
    a = torch.tensor([1.5], dtype=F32, device=DEVICE)
    x = logp.clone().requires_grad_()
    v, _ = grpo_loss(x, old, None, a, mask, loss={"name": "gspo", "clip_low": 0.2, "clip_high": 0.2},
                     aggregate="token_mean", backend="triton")
    ratio = math.exp((0.1 - 0.05 + 0.02 + 0.0) / 4)
    torch.testing.assert_close(v.item(), -1.5 * ratio)
    (g,) = torch.autograd.grad(v, x)
    torch.testing.assert_close(g, torch.tensor([[-1.5 * ratio / 4] * 4 + [0.0]], dtype=F32, device=DEVICE))


def test_gspo_clips_the_whole_sequence():
    logp = torch.zeros(1, 3, dtype=F32, device=DEVICE)
    old = torch.full((1, 3), -0.5, dtype=F32, device=DEVICE)  # ratio e^0.5 > 1.2 with A > 0: clipped
    x = logp.clone().requires_grad_()
    one, mask = torch.ones(1, dtype=F32, device=DEVICE), torch.ones(1, 3, dtype=F32, device=DEVICE)
    v, stats = grpo_loss(x, old, None, one, mask, loss={"name": "gspo", "clip_low": 0.2, "clip_high": 0.2},
                         aggregate="token_mean", backend="triton")
    torch.testing.assert_close(v.item(), -1.2)
    assert stats["clip/frac"].item() == 1.0 and stats["clip/high_frac"].item() == 1.0
    assert (torch.autograd.grad(v, x)[0] == 0).all()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's numpy sees the infs
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("kl", ["k3", "k3_is", "k2"])
def test_padding_values_never_leak(backend, kl):
    # garbage under the mask (-inf log-probs) must reach neither the value nor the gradient, on any backend
    logp, old, ref, deltas, mask = batch(seed=1)
    kw = dict(loss="unclipped", kl=kl, kl_coef=0.1, aggregate="seq_mean_token_mean", backend=backend)
    x = logp.clone().requires_grad_()
    clean, _ = grpo_loss(x, old, ref, deltas, mask, **kw)
    (g_clean,) = torch.autograd.grad(clean, x)
    dirty = torch.where(mask > 0, logp, torch.full_like(logp, -float("inf"))).requires_grad_()
    v, _ = grpo_loss(dirty, old, ref, deltas, mask, **kw)
    (g,) = torch.autograd.grad(v, dirty)
    assert torch.isfinite(v) and torch.isfinite(g).all()
    torch.testing.assert_close(v, clean)
    torch.testing.assert_close(g, g_clean)
    assert (g[mask == 0] == 0).all()


def test_fully_masked_batch():
    logp, old, ref, deltas, mask = batch(seed=2)
    for aggregate in S.AGGREGATES:
        value, g = compare((logp, old, ref, deltas, torch.zeros_like(mask)), loss="clipped", kl="k2",
                           kl_coef=0.1, aggregate=aggregate)
        assert value.item() == 0.0 and (g == 0).all()


def test_bool_mask():
    logp, old, ref, deltas, mask = batch(seed=3)
    compare((logp, old, ref, deltas, mask > 0), loss=LOSSES["clipped"], kl="k3", kl_coef=0.2,
            aggregate={"name": "seq_mean_token_sum_norm", "max_len": 40})


def test_wide_ratios():
    # spread 3: ratios from ~e^-9 to ~e^9, so both clip sides and k3's exp are exercised
    compare(batch(seed=4, spread=3.0), atol=1e-5, loss=LOSSES["dual_clip"], kl="k3", kl_coef=0.5,
            aggregate="token_mean")


def test_unknown_parts_are_rejected():
    data = batch()
    with pytest.raises(KeyError, match="valid"):
        grpo_loss(*data, loss="nope", aggregate="token_mean", backend="triton")
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(data[0], data[1], None, data[3], data[4], loss="clipped", kl="k1", kl_coef=0.1)
    with pytest.raises(ValueError, match="backend='torch'"):
        grpo_loss(*data, loss="gmpo", aggregate="token_mean", backend="triton")
    # auto falls back to the torch composition for a part the kernel lacks
    value, _ = grpo_loss(*data, loss="gmpo", aggregate="token_mean", backend="auto")
    torch.testing.assert_close(value, grpo_loss(*data, loss="gmpo", aggregate="token_mean", backend="torch")[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="full-size kernel checks need a GPU")
@pytest.mark.parametrize("loss, kl, aggregate", [("clipped", "k3", "token_mean"), ("gspo", "k2", "seq_mean_token_mean"),
                                                 ("unclipped", "k1", "seq_mean_token_sum_norm")])
def test_full_size_gpu(loss, kl, aggregate):
    compare(batch(b=64, g=16, t=4096, seed=5), atol=1e-6, loss=LOSSES[loss], kl=kl, kl_coef=0.05, aggregate=aggregate)


def test_grad_output_scales_the_gradient_written_in_the_forward():
    # the forward writes d loss / d logp for grad_output 1; the backward scales it (and only then)
    logp, old, ref, deltas, mask = batch(seed=9)
    kw = dict(loss=LOSSES["clipped"], aggregate="seq_mean_token_mean", kl="k3", kl_coef=0.1)
    x = logp.clone().requires_grad_()
    value, _ = grpo_loss(x, old, ref, deltas, mask, backend="triton", **kw)
    (g,) = torch.autograd.grad(value * -3.0, x)
    xr = logp.double().requires_grad_()
    rvalue, _ = grpo_loss(xr, old.double(), ref.double(), deltas.double(), mask.double(), backend="torch", **kw)
    (rg,) = torch.autograd.grad(rvalue * -3.0, xr)
    torch.testing.assert_close(g.double(), rg, rtol=1e-5, atol=1e-7)


def test_one_backward_and_no_grad():
    logp, old, ref, deltas, mask = batch(seed=10)
    kw = dict(loss="clipped", aggregate="token_mean", backend="triton")
    x = logp.clone().requires_grad_()
    value, _ = grpo_loss(x, old, ref, deltas, mask, **kw)
    value.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once per forward"):
        value.backward()
    with torch.no_grad():
        v2, _ = grpo_loss(x, old, ref, deltas, mask, **kw)
    assert v2.item() == value.item() and not v2.requires_grad


@pytest.mark.parametrize("aggregate", S.AGGREGATES)
def test_kernel_weights_match_seq_weights(aggregate, small_tiles):
    # the kernel builds w_s from all lengths itself (more sequences than one BLOCK_S step, groups of 3);
    # token_sum on per-token losses of 1 at each token exposes w_s * len_s for each sequence
    b, g, t = 5, 3, 4
    lengths = torch.tensor([0, 0, 0, 2, 0, 1, 4, 4, 3, 0, 1, 0, 2, 2, 2])
    mask = (torch.arange(t) < lengths[:, None]).to(F32).view(b, g, t).to(DEVICE)
    monkeypatch_block = L.BLOCK_S
    L.BLOCK_S = 4
    L.launch_consts.cache_clear()
    try:
        logp = torch.zeros(b, g, t, dtype=F32, device=DEVICE).requires_grad_()
        deltas = -torch.ones(b, g, dtype=F32, device=DEVICE)  # naive loss: -logp * A = logp, d/dlogp = 1
        agg = {"name": aggregate, "max_len": 6} if aggregate == "seq_mean_token_sum_norm" else aggregate
        value, _ = grpo_loss(logp, logp.detach(), None, deltas, mask, loss="naive", aggregate=agg, backend="triton")
        (grad,) = torch.autograd.grad(value, logp)
    finally:
        L.BLOCK_S = monkeypatch_block
        L.launch_consts.cache_clear()
    w = L.seq_weights(aggregate, lengths.to(torch.float64), t, 6 if aggregate.endswith("norm") else None, g)
    torch.testing.assert_close(grad.double().cpu(), (w.view(b, g, 1) * mask.double().cpu()), rtol=1e-6, atol=0)
