"""grpo_loss_from_logits: the one-kernel logits -> GRPO loss (kernels/logits_loss.py) against the
composition token_logprobs + grpo_loss in fp64 (torch backend), value, statistics and the
gradient on the logits, for every fused loss, aggregation and KL estimator; plus what the
kernel does differently from that composition: masked rows and zero-gradient rows it never
reads for a gradient, a gradient written in the forward (grad_output scaling, one backward,
no gradient under no_grad), the gradient written into the logits themselves.
"""
import pytest

from helpers import needs
import torch

from grpo_bench.numerics.logprobs import grpo_loss, grpo_loss_from_logits, token_logprobs

needs("triton")
from grpo_bench.numerics.kernels import logits_loss as LL  # noqa: E402
from grpo_bench.numerics.kernels import spec as S  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = torch.float32
SHIPPED_TILES = LL.TILES  # the fixture below shrinks them for every test
LOSSES = {
    "naive": "naive", "unclipped": "unclipped",
    "clipped": {"name": "clipped", "clip_low": 0.2, "clip_high": 0.28},
    "gspo": {"name": "gspo", "clip_low": 0.05, "clip_high": 0.05},
    "dual_clip": {"name": "dual_clip", "clip_low": 0.2, "clip_high": 0.2, "clip_c": 1.5},
    "cispo": {"name": "cispo", "clip_low": 0.3, "clip_high": 0.2},
    "sapo": {"name": "sapo", "tau_pos": 1.5, "tau_neg": 2.0},
}


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setattr(LL, "TILES", [(1 << 62, (16, 1, 0, True))])  # V = 37: three tiles, the last ragged
    monkeypatch.setattr(LL, "MAX_PROGRAMS", 5)  # programs loop over the rows
    monkeypatch.delenv("GRPO_BENCH_LOGITS_LOSS_CFG", raising=False)


def batch(b=2, g=3, t=6, v=37, seed=0, spread=0.4, dtype=torch.bfloat16):
    """logits (B, G, T, V), labels, old/ref near the true log-probs (ratios both sides of the clip
    bounds), mixed-sign and zero deltas, ragged masks, one fully masked response."""
    gen = torch.Generator().manual_seed(seed)
    x = (2 * torch.randn(b, g, t, v, generator=gen)).to(dtype)
    y = torch.randint(0, v, (b, g, t), generator=gen)
    lp = torch.log_softmax(x.double(), -1).gather(-1, y[..., None])[..., 0]
    old = (lp + spread * torch.randn(lp.shape, generator=gen, dtype=torch.float64)).to(F32)
    ref = (lp + spread * torch.randn(lp.shape, generator=gen, dtype=torch.float64)).to(F32)
    deltas = torch.randn(b, g, generator=gen, dtype=F32)
    deltas[0, 1] = 0.0
    lengths = torch.randint(1, t + 1, (b, g), generator=gen)
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).to(F32)
    mask[-1, -1] = 0.0
    return [z.to(DEVICE) for z in (x, y, old, ref, deltas, mask)]


def reference(x, y, old, ref, deltas, mask, g=1.0, gate=None, **kw):
    xr = x.detach().double().requires_grad_()
    lp = token_logprobs(xr, y, backend="torch")[0]
    value, stats = grpo_loss(lp, old.double(), ref.double(), deltas.double(), mask.double(), backend="torch",
                             gate=None if gate is None else gate.double(), **kw)
    (grad,) = torch.autograd.grad(value * g, xr)
    return value, stats, grad


def compare(data, g=1.0, rtol=1e-5, gate=None, **kw):
    x, y, old, ref, deltas, mask = data
    xa = x.clone().requires_grad_()
    value, stats = grpo_loss_from_logits(xa, y, old, ref, deltas, mask, backend="triton", gate=gate, **kw)
    (grad,) = torch.autograd.grad(value * g, xa)
    rvalue, rstats, rgrad = reference(x, y, old, ref, deltas, mask, g, gate, **kw)
    assert grad.dtype == x.dtype and grad.shape == x.shape
    torch.testing.assert_close(value.double(), rvalue, rtol=rtol, atol=1e-6)
    assert stats.keys() == rstats.keys()
    for k in stats:
        torch.testing.assert_close(stats[k].double(), rstats[k].double(), rtol=rtol, atol=1e-6, msg=k)
    # the gradient is rounded once to the logits' dtype: bf16 keeps 8 bits
    tol = 1e-5 if x.dtype == F32 else 8e-3
    torch.testing.assert_close(grad.double(), rgrad, rtol=tol, atol=tol * rgrad.abs().max().item())
    return value, grad


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_every_loss(loss):
    # each loss once with a KL estimator (rotating) and once without; gspo takes the composition
    kl = sorted(S.KLS)[sorted(LOSSES).index(loss) % len(S.KLS)]
    data = batch(seed=1, spread=0.6)
    compare(data, loss=LOSSES[loss], aggregate="seq_mean_token_mean")
    compare(data, loss=LOSSES[loss], aggregate="token_mean", kl=kl, kl_coef=0.1)


@pytest.mark.parametrize("aggregate", S.AGGREGATES)
def test_every_aggregation(aggregate):
    agg = {"name": aggregate, "max_len": 9} if aggregate == "seq_mean_token_sum_norm" else aggregate
    compare(batch(seed=2), loss=LOSSES["clipped"], aggregate=agg, kl="k3", kl_coef=0.04)


@pytest.mark.parametrize("kl", sorted(S.KLS))
def test_every_kl(kl):
    compare(batch(seed=3, spread=0.8, b=1), loss=LOSSES["dual_clip"], aggregate="seq_mean_token_sum", kl=kl,
            kl_coef=0.3)


def test_fp32_logits_and_gate():
    data = batch(seed=4, dtype=F32)
    gate = (torch.rand(data[1].shape, generator=torch.Generator().manual_seed(0)) > 0.5).to(F32).to(DEVICE)
    compare(data, gate=gate, loss=LOSSES["cispo"], aggregate="prompt_mean", kl="k3", kl_coef=0.1)


def test_grad_output_scales_the_stored_gradient():
    compare(batch(seed=5, dtype=F32), g=-2.5, loss=LOSSES["clipped"], aggregate="seq_mean_token_mean", kl="k2",
            kl_coef=0.1)


def test_masked_rows_are_never_read():
    # NaN logits under the mask (and in a fully masked response) reach neither the value nor the
    # gradient: the kernel does not read those rows, it writes their gradient as zeros
    x, y, old, ref, deltas, mask = batch(seed=6, dtype=F32)
    dirty = torch.where(mask[..., None] > 0, x, torch.full_like(x, float("nan")))
    kw = dict(loss=LOSSES["clipped"], aggregate="seq_mean_token_mean", kl="k3", kl_coef=0.1)
    value, grad = compare((x, y, old, ref, deltas, mask), **kw)
    xa = dirty.clone().requires_grad_()
    v2, _ = grpo_loss_from_logits(xa, y, old, ref, deltas, mask, backend="triton", **kw)
    (g2,) = torch.autograd.grad(v2, xa)
    assert torch.isfinite(v2) and torch.isfinite(g2).all()
    assert v2.item() == value.item()
    assert torch.equal(g2, grad) and (g2[mask == 0] == 0).all()


def test_zero_gradient_rows_and_empty_batch():
    x, y, old, ref, deltas, mask = batch(seed=7)
    # no KL and a zero advantage: every token's dL/dlogp is 0, the gradient pass is skipped
    value, grad = compare((x, y, old, ref, torch.zeros_like(deltas), mask), loss="unclipped",
                          aggregate="token_mean")
    assert value.item() == 0.0 and (grad == 0).all()
    for aggregate in S.AGGREGATES:
        value, grad = compare((x, y, old, ref, deltas, torch.zeros_like(mask)), loss="clipped", kl="k2",
                              kl_coef=0.1, aggregate=aggregate)
        assert value.item() == 0.0 and (grad == 0).all()


def test_strided_logits_and_inplace():
    # Liger's layout: logits (R, T + 1, V), the last position unused, read in place through a view
    x, y, old, ref, deltas, mask = batch(seed=8, b=1, dtype=F32)
    kw = dict(loss=LOSSES["clipped"], aggregate="seq_mean_token_mean", kl="k3", kl_coef=0.04)
    padded = torch.cat([x[0], x[0, :, :1]], 1)  # (G, T + 1, V)
    value, want = compare((x, y, old, ref, deltas, mask), **kw)
    base = padded.clone().requires_grad_()
    v2, _ = grpo_loss_from_logits(base[:, :-1], y[0], old[0], ref[0], deltas[0], mask[0], backend="triton", **kw)
    (g2,) = torch.autograd.grad(v2, base)
    assert v2.item() == value.item() and torch.equal(g2[:, :-1], want[0]) and (g2[:, -1] == 0).all()
    # inplace: the gradient lands in the logits' own storage (a non-leaf, as a head's output is)
    leaf = x.clone().requires_grad_()
    logits = leaf * 1.0
    v3, _ = grpo_loss_from_logits(logits, y, old, ref, deltas, mask, backend="triton", inplace=True, **kw)
    (g3,) = torch.autograd.grad(v3, leaf)
    assert v3.item() == value.item() and torch.equal(g3, want) and torch.equal(logits.detach(), want)
    with pytest.raises(ValueError, match="leaf"):
        grpo_loss_from_logits(leaf, y, old, ref, deltas, mask, backend="triton", inplace=True, **kw)
    # logits an op kept for its own backward (tanh keeps its output) must not be overwritten silently
    capped = leaf.tanh()
    v4, _ = grpo_loss_from_logits(capped, y, old, ref, deltas, mask, backend="triton", inplace=True, **kw)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(v4, leaf)


def test_one_backward_and_no_grad():
    x, y, old, ref, deltas, mask = batch(seed=9)
    kw = dict(loss="clipped", aggregate="token_mean", backend="triton")
    xa = x.clone().requires_grad_()
    value, _ = grpo_loss_from_logits(xa, y, old, ref, deltas, mask, **kw)
    value.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once per forward"):
        value.backward()
    with torch.no_grad():
        v2, _ = grpo_loss_from_logits(xa, y, old, ref, deltas, mask, **kw)
    assert v2.item() == value.item()


def test_configs_agree(monkeypatch):
    # every configuration of the GPU sweep's list computes the same numbers (interpreter: tiles shrunk 64x)
    data = batch(seed=10, b=1, v=300)
    kw = dict(loss=LOSSES["clipped"], aggregate="seq_mean_token_mean", kl="k3", kl_coef=0.04)
    want = compare(data, **kw)
    # bitwise in the interpreter (tiles shrunk 64x); on a GPU another tile width sums the lse in another order
    shrink, cuda = (1, True) if DEVICE == "cuda" else (64, False)
    for block, warps, per_sm, reverse in LL.CONFIGS:
        assert LL.valid((block, warps, per_sm, reverse))
        monkeypatch.setattr(LL, "TILES", [(1 << 62, (block // shrink, warps, per_sm, reverse))])
        xa = data[0].clone().requires_grad_()
        v, _ = grpo_loss_from_logits(xa, *data[1:], backend="triton", **kw)
        (g,) = torch.autograd.grad(v, xa)
        if cuda:
            torch.testing.assert_close(v, want[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(g.float(), want[1].float(), rtol=1e-3, atol=1e-5)
        else:
            assert v.item() == want[0].item() and torch.equal(g, want[1])
    assert not LL.valid((3000, 8, 0, True)) and not LL.valid((65536, 4, 0, True))


def test_env_config_is_checked(monkeypatch):
    for bad in ("1000,8,0,1", "4096,16", "big,8,0,1"):
        monkeypatch.setenv("GRPO_BENCH_LOGITS_LOSS_CFG", bad)
        with pytest.raises(ValueError, match="GRPO_BENCH_LOGITS_LOSS_CFG"):
            LL.config(50_257)
    monkeypatch.setenv("GRPO_BENCH_LOGITS_LOSS_CFG", "4096,16,2,0")
    assert LL.config(50_257) == (4096, 16, 2, False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="full-size kernel checks need a GPU")
@pytest.mark.parametrize("v", [50_257, 151_936])
def test_full_size_gpu(v, monkeypatch):
    monkeypatch.undo()
    compare(batch(b=4, g=8, t=64, v=v, seed=11), rtol=2e-5, loss=LOSSES["clipped"], aggregate="seq_mean_token_mean",
            kl="k3", kl_coef=0.04)


def test_a_kl_named_without_a_coefficient_adds_nothing_and_needs_no_reference():
    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(2, 3, 4, 9, generator=gen)
    labels = torch.randint(0, 9, (2, 3, 4), generator=gen)
    old = token_logprobs(logits, labels, backend="torch")[0].detach() + 0.1
    deltas, mask = torch.randn(2, 3, generator=gen), torch.ones(2, 3, 4)
    want, _ = grpo_loss_from_logits(logits, labels, old, None, deltas, mask, backend="torch")
    for kw in ({"kl": "k3"}, {"kl": "k3", "kl_coef": 0.0}):
        got, stats = grpo_loss_from_logits(logits, labels, old, None, deltas, mask, backend="torch", **kw)
        assert torch.equal(got, want) and "kl/value" not in stats
    with pytest.raises(ValueError, match="needs ref_logp"):
        grpo_loss_from_logits(logits, labels, old, None, deltas, mask, kl="k3", kl_coef=0.1, backend="torch")


# --- held where mutation testing found them unheld (scripts/mutate.py)

def test_the_shipped_tiles_by_vocabulary(monkeypatch):
    """2,048-wide tiles with 8 warps up to V = 65,536 (GPT-2's 50,257 among them), 4,096 with 16 past it (Qwen's
    151,936); one program a row, each row walked backwards; every entry valid."""
    monkeypatch.setattr(LL, "TILES", SHIPPED_TILES)
    for v, want in ((37, (2048, 8, 0, True)), (50_257, (2048, 8, 0, True)), (65_536, (2048, 8, 0, True)),
                    (65_537, (4096, 16, 0, True)), (151_936, (4096, 16, 0, True))):
        assert LL.config(v) == want, v
    assert all(LL.valid(cfg) for _, cfg in SHIPPED_TILES)


def test_programs_per_sm_by_hand(monkeypatch):
    """per_sm programs on each SM of a CUDA device, never more than the rows or MAX_PROGRAMS; one program a row
    for per_sm 0 or off CUDA. A device object needs no GPU, and _sms is the only call that would."""
    monkeypatch.setattr(LL, "_sms", lambda index: {0: 132, 1: 66}[index])
    cuda0, cuda1, cpu = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")
    monkeypatch.setattr(LL, "MAX_PROGRAMS", 1 << 20)
    assert LL._programs(10_000, 2, cuda0) == 264 and LL._programs(10_000, 2, cuda1) == 132
    assert LL._programs(100, 2, cuda0) == 100 and LL._programs(10_000, 0, cuda0) == 10_000
    assert LL._programs(10_000, 2, cpu) == 10_000
    monkeypatch.setattr(LL, "MAX_PROGRAMS", 50)
    assert LL._programs(10_000, 2, cuda0) == 50 and LL._programs(10_000, 0, cpu) == 50
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert LL._programs(10_000, 1, torch.device("cuda")) == 50 and LL._programs(40, 1, torch.device("cuda")) == 40
    monkeypatch.setattr(LL, "MAX_PROGRAMS", 1 << 20)
    assert LL._programs(10_000, 1, torch.device("cuda")) == 66  # an unnumbered device is the current one


def test_valid_configurations_up_to_their_edges():
    """Power-of-two tiles from 16 to 65,536, warps a power of two up to 32, programs per SM not negative, and at
    most MAX_PER_THREAD (64) values a thread per tile."""
    assert LL.valid((16, 1, 0, True)) and LL.valid((65_536, 32, 0, False)) and LL.valid((2048, 1, 0, True))
    assert LL.valid((8192, 4, 7, True))  # 64 a thread: the edge
    for bad in ((8, 1, 0, True), (15, 1, 0, True), (24, 1, 0, True), (131_072, 32, 0, True), (2048, 3, 0, True),
                (2048, 64, 0, True), (2048, 8, -1, True), (4096, 1, 0, True), (16_384, 4, 0, True)):
        assert not LL.valid(bad), bad


def test_an_out_of_range_label_reads_nothing():
    """A label of -1 or V (padding conventions) reads no logit, its neighbour row's included: log p is -inf, so
    under the unclipped loss its ratio is 0, exactly as a finite log-prob against an old one of +inf."""
    x, y, old, ref, deltas, mask = batch(seed=13, dtype=F32)
    mask = torch.ones_like(mask)
    bad, far = y.clone(), old.clone()
    bad[0, 0, 2], bad[1, 2, 5] = -1, x.shape[-1]
    far[0, 0, 2] = far[1, 2, 5] = float("inf")
    kw = dict(loss="unclipped", aggregate="token_mean", backend="triton")
    got, want = [], []
    for labels, o, out in ((bad, old, got), (y, far, want)):
        xa = x.clone().requires_grad_()
        value, _ = grpo_loss_from_logits(xa, labels, o, ref, deltas, mask, **kw)
        out += [value, torch.autograd.grad(value, xa)[0]]
    assert torch.isfinite(got[0]) and got[0].item() == want[0].item() and torch.equal(got[1], want[1])
    assert (got[1][0, 0, 2] == 0).all() and (got[1][1, 2, 5] == 0).all() and got[1].abs().sum() > 0


class Spy:
    """Stands in for a Triton kernel: records each launch's grid and the keywords named, then launches."""

    def __init__(self, kernel, *keys):
        self.kernel, self.keys, self.launches, self.run = kernel, keys, [], True

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append((grid, *(kw[k] for k in self.keys)))
            if self.run:
                self.kernel[grid](*args, **kw)
        return launch


# the 1,500-token case skips the loss kernel, so the reductions after it read buffers it never wrote: whatever
# memory held, now and then an inf or NaN (warned under load, 2026-12-04); the test reads only the launches
@pytest.mark.filterwarnings("ignore:(invalid value|overflow) encountered:RuntimeWarning")
def test_the_launch_rule_by_hand(monkeypatch):
    """The lengths: tiles of 16 tokens up to BLOCK_T_MAX, a program a response up to MAX_PROGRAMS, 4 warps. The
    loss: TILES' tile, warps and direction, its group only for prompt_mean, the gradient written only when one
    is wanted."""
    monkeypatch.setattr(LL, "TILES", [(1 << 62, (32, 2, 0, False))])
    spies = {"_lengths": Spy(LL._lengths, "BLOCK_T", "num_warps"),
             "_logits_loss_fwd": Spy(LL._logits_loss_fwd, "BLOCK_V", "num_warps", "REVERSE", "GP", "WRITE_GRAD")}
    for name, spy in spies.items():
        monkeypatch.setattr(LL, name, spy)
    for g, t, block_t, grid in ((3, 3, 16, 3), (2, 17, 32, 2), (7, 1500, 1024, 5)):
        x, y, old, ref, deltas, mask = batch(b=1, g=g, t=t, v=9, dtype=F32)
        spies["_logits_loss_fwd"].run = t < 1000  # 10,500 rows take minutes in the interpreter
        for aggregate, gp in (("token_mean", 1), ("prompt_mean", triton_next_pow2(g))):
            for grad_on in (True, False):
                xa = x.clone().requires_grad_(grad_on)
                grpo_loss_from_logits(xa, y, old, ref, deltas, mask, loss="clipped", aggregate=aggregate,
                                      backend="triton")
                assert spies["_lengths"].launches.pop() == ((grid,), block_t, 4)
                assert spies["_logits_loss_fwd"].launches.pop() == ((min(g * t, 5),), 32, 2, False, gp, grad_on)


def triton_next_pow2(n):
    return 1 << (n - 1).bit_length()


def test_k3_is_reads_the_old_log_probs_under_every_loss():
    """k3_is weighs k3 by pi / pi_old, so it reads pi_old even where the policy term does not (naive)."""
    data = batch(seed=14, dtype=F32, spread=0.8)
    for loss in ("naive", "unclipped"):
        compare(data, loss=loss, aggregate="token_mean", kl="k3_is", kl_coef=0.5)


def test_a_gradient_of_exactly_one_is_written():
    """A row's gradient pass is skipped only where dL/dlogp is exactly 0; the naive loss on one token with an
    advantage of -1 under token_sum has dL/dlogp exactly 1, a value the skip must not take for 0."""
    x, y, old, ref, deltas, mask = batch(seed=15, b=1, g=2, t=1, dtype=F32)
    data = (x, y, old, ref, torch.full_like(deltas, -1.0), torch.ones_like(mask))
    _, grad = compare(data, loss="naive", aggregate="token_sum")
    assert (grad != 0).all()


def test_no_gradient_wanted_leaves_the_logits_alone():
    """inplace=True writes into the logits only when a gradient is wanted: not under no_grad (where tanh, which
    kept its output for its backward, must still differentiate), not for logits that require none."""
    x, y, old, ref, deltas, mask = batch(seed=16, dtype=F32)
    kw = dict(loss=LOSSES["clipped"], aggregate="token_mean", backend="triton", inplace=True)
    leaf = x.clone().requires_grad_()
    capped = leaf.tanh()
    before = capped.detach().clone()
    with torch.no_grad():
        grpo_loss_from_logits(capped, y, old, ref, deltas, mask, **kw)
    assert torch.equal(capped.detach(), before)
    (grad,) = torch.autograd.grad(capped.sum(), leaf)  # tanh's saved output untouched, its version too
    fresh = x.clone().requires_grad_()
    assert torch.equal(grad, torch.autograd.grad(fresh.tanh().sum(), fresh)[0])
    plain = x.clone()
    value, _ = grpo_loss_from_logits(plain, y, old, ref, deltas, mask, **kw)  # a leaf, but wanting no gradient
    assert torch.equal(plain, x) and not value.requires_grad


def test_logits_strided_along_the_vocabulary_are_read_as_logits():
    """The kernel walks V with unit stride: logits every 2nd or 3rd column of a wider buffer, or transposed,
    are copied to that layout first; with unit stride but padded rows (Liger's layout), inplace writes the
    gradient into the caller's own storage."""
    x, y, old, ref, deltas, mask = batch(seed=17, dtype=F32)
    kw = dict(loss=LOSSES["clipped"], aggregate="seq_mean_token_mean", kl="k3", kl_coef=0.04)
    value, want = compare((x, y, old, ref, deltas, mask), **kw)
    for k in (2, 3):
        wide = torch.zeros(*x.shape[:-1], k * x.shape[-1]).index_copy(-1, torch.arange(0, k * x.shape[-1], k), x)
        xa = wide.requires_grad_()
        v, _ = grpo_loss_from_logits(xa[..., ::k], y, old, ref, deltas, mask, backend="triton", **kw)
        (g,) = torch.autograd.grad(v, xa)
        assert v.item() == value.item() and torch.equal(g[..., ::k], want) and (g[..., 1::k] == 0).all(), k
    xt = x.transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_()
    v, _ = grpo_loss_from_logits(xt, y, old, ref, deltas, mask, backend="triton", **kw)
    assert v.item() == value.item() and torch.equal(torch.autograd.grad(v, xt)[0], want)
    leaf = torch.cat([x, x[..., :1, :]], -2).requires_grad_()
    padded = leaf * 1.0
    grpo_loss_from_logits(padded[..., :-1, :], y, old, ref, deltas, mask, backend="triton", inplace=True, **kw)
    assert torch.equal(padded.detach()[..., :-1, :], want)


def test_the_kernel_entry_point_refuses_what_it_cannot_compute_and_hands_back_its_statistics_as_data():
    """Called directly (as a head does), a spec with a term the kernel lacks is refused, not silently dropped;
    GSPO is handed back (None); the statistics carry no gradient, so one used in a loss fails loudly."""
    x, y, old, ref, deltas, mask = batch(seed=18, dtype=F32)
    spec = S.LossSpec("clipped", (("clip_high", 0.28), ("clip_low", 0.2)), "token_mean", (), "k3", 0.1, False,
                      extra_terms=("entropy",))
    with pytest.raises(ValueError, match="no entropy term"):
        LL.fused_logits_loss(x, y, old, ref, deltas, mask, spec, None, False)
    gspo = S.LossSpec("gspo", (("clip_high", 0.05), ("clip_low", 0.05)), "token_mean", (), None, 0.0, False)
    assert LL.fused_logits_loss(x, y, old, ref, deltas, mask, gspo, None, False) is None
    xa = x.clone().requires_grad_()
    value, stats = grpo_loss_from_logits(xa, y, old, ref, deltas, mask, loss="clipped", aggregate="token_mean",
                                         kl="k3", kl_coef=0.1, backend="triton")
    assert value.requires_grad and not any(v.requires_grad for v in stats.values())
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(stats["kl/value"], xa)
