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
    """logp/old/ref (B, G, T) with ratios in and out of the clip range, some exactly 1, some
    log-probs equal to the reference's, mixed-sign and zero deltas, ragged masks, a one-token
    response and one fully masked response."""
    gen = torch.Generator().manual_seed(seed)
    logp = -3 * torch.rand(b, g, t, generator=gen, dtype=F32)
    old = logp + spread * torch.randn(b, g, t, generator=gen, dtype=F32)
    old[:, :, 1::4] = logp[:, :, 1::4]  # ratio exactly 1: the tie of min(ratio*A, clip(ratio)*A) (not at t = 0,
    # the one-token response's token, whose log-ratio must not be 0)
    ref = logp + spread * torch.randn(b, g, t, generator=gen, dtype=F32)
    ref[:, :, 1::5] = logp[:, :, 1::5]  # log-ratio to the reference exactly 0: where abs's gradient is 0
    deltas = torch.randn(b, g, generator=gen, dtype=F32)
    deltas[0, 0] = 0.0
    lengths = torch.randint(1, t + 1, (b, g), generator=gen)
    lengths[0, 1] = 1  # a one-token response: GSPO's mean log-ratio over one token
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


def test_each_parts_constants_by_hand():
    """The table turns a part's parameters into the kernel's constants as its paper states them (bounds 1 - eps_low
    and 1 + eps_high, CISPO's missing lower bound as 0, dual-clip's cap, SAPO's temperatures); what a part does not
    set keeps the neutral value (no bound, temperature 1, no KL). Each part has a code of its own: two sharing one
    would run one part's branch for the other."""
    def consts(loss, kl=None, coef=0.0, gated=False, **params):
        return S.LossSpec(loss, tuple(sorted(params.items())), "token_mean", (), kl, coef, gated).constants()

    neutral = {"KL": 0, "COEF": 0.0, "GATED": False, "LO": 0.0, "HI": 1e30, "C": 1e30, "TP": 1.0, "TN": 1.0}
    for got, want in (
            (consts("naive"), {"LOSS": 0}),
            (consts("unclipped"), {"LOSS": 1}),
            (consts("clipped", clip_low=0.2, clip_high=0.28), {"LOSS": 2, "LO": 0.8, "HI": 1.28}),
            (consts("gspo", clip_low=3e-4, clip_high=4e-4), {"LOSS": 3, "LO": 0.9997, "HI": 1.0004}),
            (consts("dual_clip", clip_low=0.2, clip_high=0.25, clip_c=3), {"LOSS": 4, "LO": 0.8, "HI": 1.25, "C": 3.0}),
            (consts("cispo", clip_low=None, clip_high=4.0), {"LOSS": 5, "LO": 0.0, "HI": 5.0}),
            (consts("cispo", clip_low=0.3, clip_high=0.2), {"LOSS": 5, "LO": 0.7, "HI": 1.2}),
            (consts("sapo", tau_pos=1.0, tau_neg=1.05), {"LOSS": 6, "TP": 1.0, "TN": 1.05}),
            (consts("clipped", "k3", 0.04, True, clip_low=0.2, clip_high=0.2),
             {"LOSS": 2, "LO": 0.8, "HI": 1.2, "KL": 3, "COEF": 0.04, "GATED": True}),
            (consts("naive", "k1+", 0.5), {"LOSS": 0, "KL": 5, "COEF": 0.5})):
        assert got == pytest.approx(neutral | want, rel=1e-12), want
    codes = [code for code, _ in S.LOSSES.values()]
    assert len(set(codes)) == len(codes) and len(set(S.KLS.values())) == len(S.KLS) and 0 not in S.KLS.values()


def test_cispo_without_a_lower_bound(small_tiles):
    """CISPO as MiniMax-M1 and ScaleRL run it, clip_low null: ratios far below 1 keep their weight."""
    compare(batch(seed=19, spread=0.8), loss={"name": "cispo", "clip_high": 0.2}, aggregate="token_mean")


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
def test_kernel_weights_match_the_registry_aggregates(aggregate, small_tiles):
    # the kernel builds w_s from all lengths itself (more sequences than one BLOCK_S step, groups of 3, empty
    # responses and an empty group); the naive loss with A = -1 is logp itself, so the gradient is w_s on each
    # token, against the registry's aggregate differentiated in fp64
    b, g, t = 5, 3, 4
    lengths = torch.tensor([0, 0, 0, 2, 0, 1, 4, 4, 3, 0, 1, 0, 2, 2, 2])
    mask = (torch.arange(t) < lengths[:, None]).to(F32).view(b, g, t).to(DEVICE)
    agg = {"name": aggregate, "max_len": 6} if aggregate == "seq_mean_token_sum_norm" else aggregate
    block_s = L.BLOCK_S
    L.BLOCK_S = 4
    L.launch_consts.cache_clear()
    try:
        logp = torch.zeros(b, g, t, dtype=F32, device=DEVICE).requires_grad_()
        deltas = -torch.ones(b, g, dtype=F32, device=DEVICE)
        value, _ = grpo_loss(logp, logp.detach(), None, deltas, mask, loss="naive", aggregate=agg, backend="triton")
        (grad,) = torch.autograd.grad(value, logp)
    finally:
        L.BLOCK_S = block_s
        L.launch_consts.cache_clear()
    x = torch.zeros(b, g, t, dtype=torch.float64).requires_grad_()
    (want,) = torch.autograd.grad(registry.bind("aggregate", agg)(x, mask.double().cpu()), x)
    assert want[mask.cpu() > 0].min() > 0  # every token weighs something
    torch.testing.assert_close(grad.double().cpu(), want, rtol=1e-6, atol=0)


# --- held where mutation testing found them unheld (scripts/mutate.py)

def test_sapo_at_and_past_its_log_ratio_clamp():
    """SAPO clamps the log-ratio to [-20, 20], as verl and TRL do: on the closed interval a token has the gate's
    gradient, past it none, and its ratio is e^{+-20}. Zeros and nonzeros are checked exactly: at -20 the
    gradient is of order 1e-9, which a tolerance passes as zero. tau_pos 1e-8 keeps the gate unsaturated near
    e^20, where a tau of order 1 gives a sigmoid of exactly 1 and so no gradient to tell the bound by."""
    x = torch.tensor([-25.0, -20.5, -20.0, -19.5, 0.3, 19.5, 20.0, 20.5, 25.0], dtype=F32)
    logp = torch.zeros(2, 9, dtype=F32, device=DEVICE)
    old = (-x).expand(2, 9).contiguous().to(DEVICE)  # logp - old is x exactly
    adv = torch.tensor([1.0, -0.5], dtype=F32, device=DEVICE)
    mask = torch.ones(2, 9, dtype=F32, device=DEVICE)
    kw = dict(loss={"name": "sapo", "tau_pos": 1e-8, "tau_neg": 2.0}, aggregate="token_sum")
    _, g = compare((logp, old, old, adv, mask), **kw)
    xr = logp.double().requires_grad_()
    (rg,) = torch.autograd.grad(grpo_loss(xr, old.double(), None, adv.double(), mask.double(), backend="torch",
                                          **kw)[0], xr)
    torch.testing.assert_close(g.double(), rg, rtol=1e-4, atol=0)
    past = x.abs() > 20
    assert (g[:, past] == 0).all()
    assert (g[:, ~past & (x < 19)] != 0).all()  # -20 included
    assert (g[0, ~past & (x > 19)] != 0).all() and (g[1, x > 19] == 0).all()  # tau 2: sigmoid(2 e^19.5) is 1


@pytest.mark.parametrize("loss, params, region", [
    ("cispo", (("clip_low", 0.0), ("clip_high", 0.0)), None),
    ("dual_clip", (("clip_low", 0.2), ("clip_high", 0.2), ("clip_c", 1.0)), "dual")])
def test_a_ratio_exactly_on_a_bound_is_not_clipped(loss, params, region):
    """A ratio exactly on a bound is inside it, as the registry's parts count it: in neither of CISPO's
    regions, and not past dual-clip's cap, so it keeps its gradient. Bounds of exactly 1 (which validation
    refuses: the clip fractions are open intervals) put the tie on each token whose ratio is exp(0), the one
    ratio every device computes exactly; so the kernel gets the spec directly, and the reference is the
    registry's function called directly, in fp64."""
    from grpo_bench.algos import losses
    x = torch.tensor([0.0, 0.1, -0.1, 0.0, 0.0], dtype=F32)
    logp = torch.zeros(2, 5, dtype=F32, device=DEVICE)
    old = (-x).expand(2, 5).contiguous().to(DEVICE)
    adv = torch.tensor([1.0, -1.0], dtype=F32, device=DEVICE)
    mask = torch.ones(2, 5, dtype=F32, device=DEVICE)
    y = logp.clone().requires_grad_()
    value, stats = L.fused_grpo_loss(y, old, None, adv, mask, S.LossSpec(loss, params, "token_sum", (), None, 0.0, False))
    (g,) = torch.autograd.grad(value, y)
    yr = logp.double().requires_grad_()
    per_token, regions = getattr(losses, loss)(yr, old.double(), adv.double(), mask.double(), **dict(params))
    (rg,) = torch.autograd.grad(per_token.sum(), yr)
    torch.testing.assert_close(value.double(), per_token.sum().detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.double(), rg, rtol=1e-5, atol=1e-6)
    for side in ("low", "high") + ((region,) if region else ()):
        want = regions[side].double().mean().item()
        assert stats[f"clip/{side}_frac"].item() == pytest.approx(want), side
    ties = (x == 0).expand(2, 5)
    if loss == "cispo":  # 0.9 below, 1.1 above 1, in both rows
        assert stats["clip/low_frac"].item() == stats["clip/high_frac"].item() == pytest.approx(0.2)
    else:  # A = -1: the cap (-A * 1) is the loss of each tie, which keeps -A * ratio's gradient, 1
        assert stats["clip/dual_frac"].item() == pytest.approx(0.1) and (g[1][ties[1]] == 1).all()


@pytest.mark.parametrize("aggregate", S.AGGREGATES)
def test_a_batch_of_one_token(aggregate):
    """One token in the whole batch: the floors under the counts (at least one token, response, group) must
    leave a count of exactly one alone. Every aggregate's loss is then that token's own, divided by max_len
    for seq_mean_token_sum_norm: by hand for the naive loss, against fp64 for a clipped one with k2."""
    logp, old, ref, deltas, mask = batch(seed=11)
    mask = torch.zeros_like(mask)
    mask[1, 2, 3] = 1.0
    agg = {"name": aggregate, "max_len": 8} if aggregate == "seq_mean_token_sum_norm" else aggregate
    value, _ = compare((logp, old, ref, deltas, mask), loss="naive", aggregate=agg)
    by_hand = -logp[1, 2, 3].double() * deltas[1, 2].double() / (8 if aggregate.endswith("norm") else 1)
    torch.testing.assert_close(value.double(), by_hand, rtol=1e-6, atol=0)
    compare((logp, old, ref, deltas, mask), loss=LOSSES["clipped"], aggregate=agg, kl="k2", kl_coef=0.1)


class Spy:
    """Stands in for a Triton kernel: records each launch's grid and the keywords named, then launches."""

    def __init__(self, kernel, *keys):
        self.kernel, self.keys, self.launches = kernel, keys, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append((grid, *(kw[k] for k in self.keys)))
            return self.kernel[grid](*args, **kw)
        return launch


def test_the_launch_rule_by_hand(monkeypatch):
    """Tiles of at least 16 tokens and at most BLOCK_T_MAX, one program a response up to MAX_PROGRAMS; the
    lengths with 4 warps, the loss with 8 (NUM_WARPS, the H100 tuning), one reduce of 1,024-row blocks with 8;
    the gradient written only where it is wanted; scale_rows' tile and warps by the row's width, and at most
    1,024 programs."""
    monkeypatch.setattr(L, "MAX_PROGRAMS", 4)
    spies = {"_lengths": Spy(L._lengths, "BLOCK_T", "num_warps"),
             "_loss_fwd": Spy(L._loss_fwd, "BLOCK_T", "num_warps", "GP", "WRITE_GRAD"),
             "_reduce": Spy(L._reduce, "BLOCK", "num_warps")}
    for name, spy in spies.items():
        monkeypatch.setattr(L, name, spy)
    for s, t, block, grid in ((3, 3, 16, 3), (2, 17, 32, 2), (6, 1500, 1024, 4)):
        logp, old, ref, deltas, mask = batch(b=1, g=s, t=t)
        x = logp.requires_grad_()
        grpo_loss(x, old, ref, deltas, mask, loss="clipped", aggregate="token_mean", backend="triton")
        assert spies["_lengths"].launches.pop() == ((grid,), block, 4)
        assert spies["_loss_fwd"].launches.pop() == ((grid,), block, 8, 1, True)  # no groups but prompt_mean's
        assert spies["_reduce"].launches.pop() == ((1,), 1024, 8)
    for grad_on, needs in ((False, True), (True, False)):  # no gradient wanted: none written
        with torch.set_grad_enabled(grad_on):
            grpo_loss(logp.detach().requires_grad_(needs), old, ref, deltas, mask, loss="clipped",
                      aggregate="token_mean", backend="triton")
        assert spies["_loss_fwd"].launches.pop()[-1] is False
    scale = Spy(L._scale_rows, "BLOCK", "num_warps")
    monkeypatch.setattr(L, "_scale_rows", scale)
    two = torch.tensor(2.0, device=DEVICE)
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(2, 3, 1030, generator=gen, dtype=F32).to(DEVICE)
    for x, launch in ((torch.randn(5, 3, generator=gen, dtype=F32), ((5,), 16, 4)),
                      (torch.randn(1100, 3, generator=gen, dtype=F32), ((1024,), 16, 4)),
                      (torch.randn(2, 3, 1024, generator=gen, dtype=F32), ((6,), 1024, 4)),
                      (wide[:, :, :1000], ((6,), 1024, 4)),  # rows strided by 1,030: logits sliced on V
                      (torch.randn(3, 2, 1500, generator=gen, dtype=F32).transpose(0, 1), ((6,), 2048, 8)),
                      (torch.randn(1, 2, 5000, generator=gen, dtype=F32), ((2,), 4096, 8))):
        x = x.to(DEVICE)
        before = wide.clone()
        want = 2 * x
        L.scale_rows(x, two)
        assert scale.launches.pop() == launch and torch.equal(x, want), x.shape
        if x.data_ptr() == wide.data_ptr():  # the sliced rows' tails untouched
            assert torch.equal(wide[:, :, 1000:], before[:, :, 1000:])


def test_launch_constants_by_hand():
    """Groups padded to a power of two; BLOCK_S covers the batch's lengths in one step up to BLOCK_S, and never
    less than a group (prompt_mean reads whole groups a step); cached, so a call builds nothing."""
    spec = S.LossSpec("clipped", (("clip_low", 0.2), ("clip_high", 0.2)), "prompt_mean", (), "k3", 0.1, False)
    for group, n_seq, gp, block_s in ((3, 6, 4, 16), (1, 5000, 1, 1024), (0, 1, 1, 16), (2048, 100, 2048, 2048),
                                      (5, 600, 8, 1024)):
        consts = L.launch_consts(spec, group, n_seq)
        assert (consts["GP"], consts["BLOCK_S"]) == (gp, block_s), (group, n_seq)
        assert consts["AGG"] == 5 and "COEF" not in consts and consts["KL"] == 3
    assert L.launch_consts(spec, 3, 6) is L.launch_consts(spec, 3, 6)


def test_the_statistics_carry_no_gradient():
    """A statistic is data: one added to the loss must fail loudly, not pass a gradient the backward ignores."""
    logp, old, ref, deltas, mask = batch(seed=12)
    x = logp.clone().requires_grad_()
    value, stats = grpo_loss(x, old, ref, deltas, mask, loss="clipped", aggregate="token_mean", kl="k3",
                             kl_coef=0.1, backend="triton")
    assert value.requires_grad and not any(v.requires_grad for v in stats.values())
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(stats["kl/value"], x)


@pytest.mark.parametrize("shape", [(6, 19), (2, 1, 3, 19)])
def test_prompt_mean_groups_by_the_second_to_last_axis(shape):
    """prompt_mean's group is the axis before T, whatever the rank: a 2-D batch is one group, a 4-D one has
    groups of shape[-2] (the kernel's rows are responses, so it must be told)."""
    data = [x.reshape(shape[:-1] + x.shape[-1:]) if x.dim() == 3 else x.reshape(shape[:-1])
            for x in batch(b=2, g=3, t=19, seed=13)]
    compare(data, loss=LOSSES["clipped"], aggregate="prompt_mean", kl="k1", kl_coef=0.1)


def test_operands_strided_in_memory():
    """Every operand but logp as a view into a wider tensor whose other half is garbage: read by its strides
    (or copied to rows first), never as if it were contiguous."""
    logp, old, ref, deltas, mask = batch(seed=14)
    gate = (torch.rand(logp.shape, generator=torch.Generator().manual_seed(1)) > 0.3).to(F32).to(DEVICE)

    def strided(x):
        return torch.cat([x, torch.full_like(x, 7.0)], dim=-1)[..., :x.shape[-1]]

    views = [strided(x) for x in (old, ref, deltas, mask, gate)]
    assert not any(v.is_contiguous() for v in views)
    want = compare((logp, old, ref, deltas, mask), gate=gate, loss=LOSSES["dual_clip"], aggregate="token_mean",
                   kl="k3", kl_coef=0.1)
    got = compare((logp, *views[:4]), gate=views[4], loss=LOSSES["dual_clip"], aggregate="token_mean", kl="k3",
                  kl_coef=0.1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
