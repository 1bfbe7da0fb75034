"""grpo_bench.numerics.logprobs: the public entry points and their backend dispatch.

The kernels themselves are checked against fp64 in tests/test_kernels_*.py; here: every
backend gives the same numbers through the public functions, shapes and dtypes of the
results, and the errors a user meets.
"""
import pytest
import torch
import torch.nn.functional as F

from grpo_bench.numerics.logprobs import grpo_loss, linear_logprobs, resolve_backend, selective_log_softmax, token_logprobs
from helpers import needs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = torch.float32  # explicit everywhere: another test module sets the default dtype to fp64
BACKENDS = ["torch", "chunked", "triton", "auto"]


def logits_and_labels(*lead, v=53, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(*lead, v, generator=gen, dtype=torch.float32)
    return x.to(dtype).to(DEVICE), torch.randint(0, v, lead, generator=gen).to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lead", [(), (7,), (2, 5), (2, 3, 4)], ids=["scalar", "N", "BxL", "4d"])
def test_backends_agree(backend, lead):
    x, y = logits_and_labels(*lead)
    want = torch.log_softmax(x.double(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    xg = x.clone().requires_grad_()
    lp, ent = token_logprobs(xg, y, backend=backend, with_entropy=True)
    assert lp.shape == ent.shape == y.shape and lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp.double(), want, rtol=1e-5, atol=1e-5)
    p = torch.softmax(x.double(), -1)
    torch.testing.assert_close(ent.double(), -(p * p.log()).sum(-1), rtol=1e-5, atol=1e-5)
    (g,) = torch.autograd.grad(lp.sum() + ent.sum(), xg)
    xr = x.double().requires_grad_()
    lsm = torch.log_softmax(xr, -1)
    (rg,) = torch.autograd.grad(lsm.gather(-1, y.unsqueeze(-1)).sum() - (lsm.exp() * lsm).sum(), xr)
    torch.testing.assert_close(g.double(), rg, rtol=1e-5, atol=1e-5)


def test_without_entropy_and_low_precision():
    x, y = logits_and_labels(3, 4, dtype=torch.bfloat16)
    ref = torch.log_softmax(x.float(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    for backend in BACKENDS:
        lp, ent = token_logprobs(x, y, backend=backend)
        assert ent is None and lp.dtype == torch.float32
        torch.testing.assert_close(lp, ref, rtol=1e-5, atol=1e-5)


def test_selective_log_softmax_is_trl_compatible():
    x, y = logits_and_labels(2, 6, dtype=torch.float16)
    xg = x.clone().requires_grad_()
    out = selective_log_softmax(xg, y)  # TRL's order: (logits, index)
    assert out.dtype == torch.float32 and out.shape == y.shape
    torch.testing.assert_close(out, torch.log_softmax(x.float(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1))
    (g,) = torch.autograd.grad(out.sum(), xg)
    assert g.dtype == torch.float16 and torch.isfinite(g).all()


def test_backend_resolution():
    cpu = torch.zeros(1, dtype=F32)
    assert resolve_backend("auto", cpu) == "chunked"
    assert resolve_backend("torch", cpu) == "torch"
    if torch.cuda.is_available():
        assert resolve_backend("auto", cpu.cuda()) == "triton"
    with pytest.raises(ValueError, match="auto, torch, chunked, triton"):
        token_logprobs(*logits_and_labels(2), backend="cuda")
    with pytest.raises(ValueError, match="valid"):
        z = torch.zeros(1, 2, dtype=F32)
        grpo_loss(z, z, z, torch.zeros(1, dtype=F32), torch.ones(1, 2, dtype=F32), backend="fast")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        x, y = logits_and_labels(2, v=5)
        token_logprobs(x.cpu(), y.cpu(), backend="triton")  # CPU tensors even where CUDA exists


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_logprobs(backend):
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(2, 5, 12, generator=gen, dtype=torch.float32).to(DEVICE)
    w = torch.randn(40, 12, generator=gen, dtype=torch.float32).to(DEVICE)
    b = torch.randn(40, generator=gen, dtype=torch.float32).to(DEVICE)
    y = torch.randint(0, 40, (2, 5), generator=gen).to(DEVICE)
    hg = h.clone().requires_grad_()
    lp, ent = linear_logprobs(hg, w, y, backend=backend, with_entropy=True, bias=b)
    rlp, rent = token_logprobs(F.linear(h, w, b), y, backend="torch", with_entropy=True)
    torch.testing.assert_close(lp, rlp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, rent, rtol=1e-5, atol=1e-5)
    assert hg.grad is None and torch.autograd.grad(lp.sum(), hg)[0].shape == h.shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_logprobs_with_a_temperature(backend):
    # the sampler's distribution softmax((h W^T + b) / T), written here in fp64; T = 2 too, in case a
    # division is skipped for one particular value
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(2, 5, 12, generator=gen, dtype=torch.float32)
    w = torch.randn(40, 12, generator=gen, dtype=torch.float32)
    b = torch.randn(40, generator=gen, dtype=torch.float32)
    y = torch.randint(0, 40, (2, 5), generator=gen)
    for temperature in (0.7, 2.0):
        z = torch.log_softmax((h.double() @ w.double().T + b.double()) / temperature, -1)
        lp, ent = linear_logprobs(h.to(DEVICE), w.to(DEVICE), y.to(DEVICE), backend=backend, with_entropy=True,
                                  bias=b.to(DEVICE), temperature=temperature)
        want = z.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(lp.cpu().double(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent.cpu().double(), -(z.exp() * z).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grpo_loss_every_backend_against_the_formula(backend):
    # DAPO's objective written out here (token-level mean of the clip-higher surrogate, k3 in
    # the loss), not the registry's composition: every backend is held to it
    gen = torch.Generator().manual_seed(4)
    logp = -torch.rand(2, 4, 9, generator=gen, dtype=torch.float32)
    old = logp + 0.3 * torch.randn(2, 4, 9, generator=gen, dtype=torch.float32)
    ref = logp + 0.3 * torch.randn(2, 4, 9, generator=gen, dtype=torch.float32)
    deltas = torch.randn(2, 4, generator=gen, dtype=torch.float32)
    mask = (torch.rand(2, 4, 9, generator=gen) > 0.2).float()
    args = [t.to(DEVICE) for t in (logp, old, ref, deltas, mask)]
    kw = dict(loss={"name": "clipped", "clip_low": 0.2, "clip_high": 0.28}, kl="k3", kl_coef=0.04,
              aggregate="token_mean")
    x = args[0].clone().requires_grad_()
    value, stats = grpo_loss(x, *args[1:], backend=backend, **kw)
    (g,) = torch.autograd.grad(value, x)

    y = logp.double().requires_grad_()
    r = torch.exp(y - old.double())
    a = deltas.double()[..., None]
    surrogate = torch.minimum(r * a, torch.clamp(r, 0.8, 1.28) * a)
    d = ref.double() - y
    per_token = -surrogate + 0.04 * (torch.exp(d) - d - 1)
    on = mask > 0
    want = per_token[on].sum() / on.sum()
    (want_g,) = torch.autograd.grad(want, y)
    torch.testing.assert_close(value.double().cpu(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.double().cpu(), want_g, rtol=1e-5, atol=1e-6)
    low = (a < 0) & (r < 0.8)
    high = (a > 0) & (r > 1.28)
    assert low[on].any() and high[on].any()
    assert stats["clip/low_frac"].item() == pytest.approx(low[on].double().mean().item())
    assert stats["clip/high_frac"].item() == pytest.approx(high[on].double().mean().item())
    assert stats["clip/frac"].item() == pytest.approx((low | high)[on].double().mean().item())


def test_kl_off_needs_no_reference():
    logp = torch.zeros(1, 3, dtype=F32, device=DEVICE)
    for backend in BACKENDS:
        v, stats = grpo_loss(logp, logp, None, torch.ones(1, dtype=F32, device=DEVICE),
                             torch.ones(1, 3, dtype=F32, device=DEVICE),
                             loss="clipped", kl="k3", kl_coef=0.0, aggregate="token_mean", backend=backend)
        assert v.item() == -1.0 and "kl/value" not in stats


def test_public_name():
    import grpo_bench
    assert grpo_bench.selective_log_softmax is selective_log_softmax


def test_each_backend_runs_its_own_implementation(monkeypatch):
    # the numbers agree by design, so which code ran is checked directly
    import grpo_bench.numerics.logprobs as LP
    ran = []
    for name in ["_torch_logprobs", "chunked_logprobs", "fused_linear_logprobs"]:
        real = getattr(LP, name)
        monkeypatch.setattr(LP, name, lambda *a, _n=name, _f=real, **k: ran.append((_n, k.get("use_triton"))) or _f(*a, **k))
    x, y = logits_and_labels(2, 3, v=7)
    for backend, want in [("torch", "_torch_logprobs"), ("chunked", "chunked_logprobs")] + \
            ([("auto", "chunked_logprobs")] if DEVICE == "cpu" else []):
        ran.clear()
        token_logprobs(x, y, backend=backend)
        assert [n for n, _ in ran] == [want], backend
    h, w = torch.randn(2, 3, 4, dtype=F32, device=DEVICE), torch.randn(7, 4, dtype=F32, device=DEVICE)
    for backend, want in [("torch", [("_torch_logprobs", None)]), ("chunked", [("fused_linear_logprobs", False)]),
                          ("triton", [("fused_linear_logprobs", True)])]:
        ran.clear()
        lp, ent = linear_logprobs(h, w, y, backend=backend)
        assert ran == want and ent is None, backend   # no entropy unless asked for


def test_auto_picks_triton_only_when_every_tensor_is_on_cuda():
    class Cuda:  # what resolve_backend reads of a tensor
        is_cuda = True

    import grpo_bench.numerics.logprobs as LP
    cpu = torch.zeros(1)
    needs("triton")
    LP._has_triton.cache_clear()  # looked up afresh, not as an earlier test left it
    assert resolve_backend("auto", Cuda(), Cuda()) == "triton"
    assert resolve_backend("auto", Cuda(), cpu) == "chunked" and resolve_backend("auto", cpu) == "chunked"


def test_kl_needs_a_coefficient():
    # kl named without kl_coef adds nothing: the coefficient defaults to 0
    gen = torch.Generator().manual_seed(5)
    logp, ref = -torch.rand(2, 3, 4, generator=gen), -torch.rand(2, 3, 4, generator=gen)
    d, mask = torch.randn(2, 3, generator=gen), torch.ones(2, 3, 4)
    with_kl, stats = grpo_loss(logp, logp, ref, d, mask, loss="clipped", kl="k3", backend="torch")
    without, _ = grpo_loss(logp, logp, None, d, mask, loss="clipped", backend="torch")
    assert with_kl == without and "kl/value" not in stats


@pytest.mark.parametrize("backend", BACKENDS)
def test_clip_share_of_a_single_token(backend):
    # one unmasked token, clipped: every share is of that one token
    logp = torch.tensor([[0.0, 0.0]], dtype=F32, device=DEVICE)
    old = torch.tensor([[-1.0, 0.0]], dtype=F32, device=DEVICE)      # ratio e > 1.2, with A > 0
    mask = torch.tensor([[1.0, 0.0]], dtype=F32, device=DEVICE)
    one = torch.ones(1, dtype=F32, device=DEVICE)
    _, stats = grpo_loss(logp, old, logp, one, mask, loss="clipped", kl="k2", kl_coef=0.1, aggregate="token_mean",
                         backend=backend)
    assert stats["clip/frac"].item() == stats["clip/high_frac"].item() == 1.0 and stats["clip/low_frac"].item() == 0.0
    assert stats["kl/value"].item() == 0.0


def _loss_inputs(seed=6):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(2, 3, 5, generator=gen)
    old = logp + 0.2 * torch.randn(2, 3, 5, generator=gen)
    deltas = torch.tensor([[1.0, -0.5, 0.0], [-1.0, 2.0, 0.5]])
    mask = (torch.rand(2, 3, 5, generator=gen) > 0.3).float()
    mask[..., 0] = 1.0
    entropy = torch.rand(2, 3, 5, generator=gen)
    return logp, old, deltas, mask, entropy


@pytest.mark.parametrize("backend", ["torch", "chunked"])
def test_entropy_and_nll_terms_against_their_token_means(backend):
    """value = policy - c_H * H + c_NLL * NLL, H the token mean of the entropy over the mask, NLL the token mean
    of -log p over the positive responses' tokens; either term named without its coefficient adds nothing (but
    H is still reported); a 0-d tensor coefficient (vmap's) of 0 keeps the term, worth 0."""
    logp, old, deltas, mask, entropy = _loss_inputs()
    kw = dict(loss="clipped", aggregate="seq_mean_token_mean", backend=backend)
    base, base_stats = grpo_loss(logp, old, None, deltas, mask, **kw)
    on = mask > 0
    h = entropy[on].double().mean()
    pos = (deltas > 0)[..., None] & on
    nll = (-logp)[pos].double().mean()
    v, stats = grpo_loss(logp, old, None, deltas, mask, entropy=entropy, entropy_coef=0.1, nll_coef=0.3, **kw)
    torch.testing.assert_close(v.double(), base.double() - 0.1 * h + 0.3 * nll, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats["loss/entropy"].double(), h, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(stats["loss/nll"].double(), nll, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(stats["loss/policy"], base_stats["loss/policy"])
    # positive= overrides deltas > 0: the second group's responses alone
    chosen = torch.tensor([[False, False, False], [True, True, True]])
    v2, stats2 = grpo_loss(logp, old, None, deltas, mask, nll_coef=0.3, positive=chosen, **kw)
    nll2 = (-logp)[chosen[..., None] & on].double().mean()
    torch.testing.assert_close(v2.double(), base.double() + 0.3 * nll2, rtol=1e-5, atol=1e-6)
    # named without a coefficient: nothing added, the entropy still reported, no NLL statistic
    v3, stats3 = grpo_loss(logp, old, None, deltas, mask, entropy=entropy, **kw)
    torch.testing.assert_close(v3, base)
    assert "loss/nll" not in stats3 and stats3["loss/entropy"].item() == pytest.approx(h.item(), rel=1e-6)
    # an entropy coefficient without an entropy: no term, no statistic
    v4, stats4 = grpo_loss(logp, old, None, deltas, mask, entropy_coef=0.1, **kw)
    torch.testing.assert_close(v4, base)
    assert "loss/entropy" not in stats4
    # statistics carry no graph whatever has one
    x, ent = logp.clone().requires_grad_(), entropy.clone().requires_grad_()
    _, live = grpo_loss(x, old, None, deltas, mask, entropy=ent, entropy_coef=0.1, nll_coef=0.3, **kw)
    assert live and not any(s.requires_grad for s in live.values())


def test_the_entropy_mean_follows_the_gate_and_a_tensor_coefficient_keeps_the_term():
    from grpo_bench import registry
    from grpo_bench.numerics.logprobs import compose_loss
    logp, old, deltas, mask, entropy = _loss_inputs(7)
    gate = torch.zeros_like(mask)
    gate[0] = 1.0   # the first group's tokens only
    parts = dict(loss=(registry.entry("loss", "clipped"), {"clip_low": 0.2, "clip_high": 0.2}),
                 aggregate=(registry.entry("aggregate", "token_mean"), {}), backend="torch")
    v, stats = compose_loss(logp, old, None, deltas, mask, gate=gate, entropy=entropy,
                            entropy_coef=torch.tensor(0.2), **parts)
    h = entropy[(mask * gate) > 0].double().mean()
    torch.testing.assert_close(stats["loss/entropy"].double(), h, rtol=1e-6, atol=1e-7)
    base, _ = compose_loss(logp, old, None, deltas, mask, gate=gate, **parts)
    torch.testing.assert_close(v.double(), base.double() - 0.2 * h, rtol=1e-5, atol=1e-6)
    # a KL part without a coefficient: the term is there, worth 0, and its value reported
    ref = logp - 0.1
    vk, sk = compose_loss(logp, old, ref, deltas, mask, gate=gate, kl=(registry.entry("kl", "k1"), {}), **parts)
    torch.testing.assert_close(vk, base)
    torch.testing.assert_close(sk["kl/value"], torch.tensor(0.1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "chunked"])
def test_sum_pi_squared_at_temperature_one_unless_given(backend):
    from grpo_bench.numerics.logprobs import linear_sum_pi_squared, token_sum_pi_squared
    gen = torch.Generator().manual_seed(8)
    h, w, b = torch.randn(2, 3, 6, generator=gen), torch.randn(11, 6, generator=gen), torch.randn(11, generator=gen)
    z = (h.double() @ w.double().T + b.double())
    for t in (None, 0.7):
        want = torch.softmax(z / (t or 1.0), -1).pow(2).sum(-1)
        kw = {} if t is None else {"temperature": t}
        got = token_sum_pi_squared(z.float(), backend=backend, **kw)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
        got = linear_sum_pi_squared(h, w, backend=backend, bias=b, **kw)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_the_fused_loss_refuses_only_the_terms_it_lacks():
    """backend='triton' runs the fused kernel, which has no entropy or NLL term: asked for one it says so; an
    entropy with a coefficient of 0 (or none at all) is no term, and the kernel runs."""
    needs("triton")
    logp, old, deltas, mask, entropy = _loss_inputs(9)
    kw = dict(loss="clipped", aggregate="token_mean", backend="triton")
    for extra, term in [({"entropy": entropy, "entropy_coef": 0.1}, "entropy"), ({"nll_coef": 0.1}, "nll")]:
        with pytest.raises(ValueError, match=f"no {term} term"):
            grpo_loss(logp, old, None, deltas, mask, **extra, **kw)
    want, _ = grpo_loss(logp, old, None, deltas, mask, **{**kw, "backend": "torch"})
    for extra in ({"entropy": entropy}, {"entropy": entropy, "entropy_coef": 0.0}, {"entropy_coef": 0.1}):
        got, _ = grpo_loss(logp, old, None, deltas, mask, **extra, **kw)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_which_losses_are_handed_the_reference():
    from grpo_bench import registry
    from grpo_bench.numerics.logprobs import loss_needs_ref
    needing = [n for n in registry.names("loss") if loss_needs_ref(n)]
    assert "a2po" in needing and "clipped" not in needing and len(needing) < len(registry.names("loss"))


def test_composed_terms_need_their_coefficient_and_masked_minus_inf_stays_out():
    """compose_loss (what a Recipe calls) adds no entropy or NLL term without its coefficient; a padded position's
    -inf log-prob, masked, changes neither the value nor any gradient (0 * inf would be nan)."""
    from grpo_bench import registry
    from grpo_bench.numerics.logprobs import compose_loss
    logp, old, deltas, mask, entropy = _loss_inputs(10)
    parts = dict(loss=(registry.entry("loss", "clipped"), {"clip_low": 0.2, "clip_high": 0.2}),
                 aggregate=(registry.entry("aggregate", "seq_mean_token_mean"), {}), backend="torch")
    base, _ = compose_loss(logp, old, None, deltas, mask, **parts)
    v, stats = compose_loss(logp, old, None, deltas, mask, entropy=entropy, **parts)
    assert torch.equal(v, base) and "loss/nll" not in stats
    padded = logp.masked_fill(mask == 0, float("-inf")).requires_grad_()
    v, _ = compose_loss(padded, old.masked_fill(mask == 0, float("-inf")), None, deltas, mask, **parts)
    (g,) = torch.autograd.grad(v, padded)
    assert torch.equal(v, base) and torch.isfinite(g).all() and (g[mask == 0] == 0).all()


def test_sum_pi_squared_runs_each_backends_own_path(monkeypatch):
    import grpo_bench.numerics.logprobs as LP
    ran = []
    for name in ["rows_sum_pi_squared", "chunked_sum_pi_squared"]:
        real = getattr(LP, name)
        monkeypatch.setattr(LP, name, lambda *a, _n=name, _f=real, **k: ran.append(_n) or _f(*a, **k))
    x, _ = logits_and_labels(2, 3, v=7)
    for backend, want in [("torch", "rows_sum_pi_squared"), ("chunked", "chunked_sum_pi_squared")]:
        ran.clear()
        LP.token_sum_pi_squared(x, backend=backend)
        assert ran == [want], backend
