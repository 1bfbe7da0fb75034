"""The fused LM-head log-prob against hidden @ W^T + log_softmax in fp64: values and the
gradients of hidden, weight and bias, with the rows split into several chunks (chunked schedule)
and with rows and vocabulary split into tiles (tiled schedule, the Triton backend)."""
import pytest
import torch
import torch.nn.functional as F

from grpo_bench.numerics.kernels.linear import default_rows, fused_linear_logprobs, tile_shape
from helpers import needs

needs("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


def reference(hidden, weight, bias, labels, temperature=1.0):
    z = F.linear(hidden.double(), weight.double(), None if bias is None else bias.double())
    lp = torch.log_softmax(z / temperature, -1)
    p = lp.exp()
    return lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(p * lp).sum(-1)


def inputs(b, l, h, v, dtype, with_bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, l, h, generator=gen, dtype=torch.float32)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float32) / h ** 0.5 * 2
    bias = torch.randn(v, generator=gen, dtype=torch.float32) if with_bias else None
    labels = torch.randint(0, v, (b, l), generator=gen)
    cast = [t if t is None else t.to(dtype).to(DEVICE) for t in (hidden, weight, bias)]
    return (*cast, labels.to(DEVICE))


@pytest.mark.parametrize("use_triton", [False, True], ids=["chunked", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias,temperature", [(False, 1.0), (True, 1.0), (False, 0.7)],
                         ids=["", "bias", "T0.7"])
def test_matches_fp64_reference(use_triton, dtype, with_bias, temperature):
    hidden, weight, bias, labels = inputs(2, 5, 16, 100, dtype, with_bias)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight) + ((bias,) if with_bias else ())]
    lp, ent = fused_linear_logprobs(leaves[0], leaves[1], labels, with_entropy=True,
                                    bias=leaves[2] if with_bias else None, use_triton=use_triton, rows=3,
                                    temperature=temperature)
    rleaves = [t.detach().double().requires_grad_() for t in leaves]
    rlp, rent = reference(rleaves[0], rleaves[1], rleaves[2] if with_bias else None, labels, temperature)
    # values: bf16 inputs give bf16 logits before the fp32 softmax, as in a bf16 model
    vtol = TOL[dtype] if dtype != torch.float32 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp.double(), rlp, **vtol)
    torch.testing.assert_close(ent.double(), rent, **vtol)
    a = torch.randn(labels.shape, dtype=torch.float64, device=DEVICE)
    grads = torch.autograd.grad((lp.double() * a).sum() + ent.double().sum(), leaves)
    rgrads = torch.autograd.grad((rlp * a).sum() + rent.sum(), rleaves)
    for g, rg, leaf in zip(grads, rgrads, leaves):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape
        scale = rg.abs().max().item()  # compare relative to the tensor's largest entry
        torch.testing.assert_close(g.double() / scale, rg / scale, **TOL[dtype])


# (rows, cols) of the tiled schedule at N = 10, V = 100: one tile; rows split (dW in an fp32
# accumulator); vocabulary split with every row (dh in an fp32 accumulator, dW written per tile,
# the label's logit found in a later tile); both split, with a last tile 4 wide
TILES = {"one": (None, None), "rows": (3, None), "cols": (None, 32), "both": (4, 48)}


@pytest.mark.parametrize("tiles", TILES, ids=list(TILES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias,temperature", [(False, 1.0), (True, 0.7)], ids=["", "bias-T0.7"])
def test_tiled_schedule_matches_fp64(tiles, dtype, with_bias, temperature):
    rows, cols = TILES[tiles]
    hidden, weight, bias, labels = inputs(2, 5, 16, 100, dtype, with_bias, seed=5)
    labels[0, :3] = torch.tensor([0, 99, 96])  # first and last column; 96: in the 4-wide last tile
    leaves = [t.clone().requires_grad_() for t in (hidden, weight) + ((bias,) if with_bias else ())]
    lp, ent = fused_linear_logprobs(leaves[0], leaves[1], labels, with_entropy=True,
                                    bias=leaves[2] if with_bias else None, use_triton=True, rows=rows, cols=cols,
                                    temperature=temperature)
    rleaves = [t.detach().double().requires_grad_() for t in leaves]
    rlp, rent = reference(rleaves[0], rleaves[1], rleaves[2] if with_bias else None, labels, temperature)
    torch.testing.assert_close(lp.double(), rlp, **TOL[dtype])
    torch.testing.assert_close(ent.double(), rent, **TOL[dtype])
    a = torch.randn(labels.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    for objective in ("both", "entropy only"):  # entropy only: the log-prob's incoming gradient is None
        out = ent.double().sum() + ((lp.double() * a).sum() if objective == "both" else 0)
        want = rent.sum() + ((rlp * a).sum() if objective == "both" else 0)
        grads = torch.autograd.grad(out, leaves, retain_graph=True)
        rgrads = torch.autograd.grad(want, rleaves, retain_graph=True)
        for g, rg, leaf in zip(grads, rgrads, leaves):
            assert g.dtype == leaf.dtype and g.shape == leaf.shape
            scale = rg.abs().max().item()
            torch.testing.assert_close(g.double() / scale, rg / scale, **TOL[dtype], msg=lambda m: f"{objective}: {m}")


@pytest.mark.parametrize("frozen", ["weight", "hidden"])
def test_tiled_schedule_one_leaf(frozen):
    # a frozen head (LoRA elsewhere) skips dW; frozen hidden states skip dh; three tiles each way
    hidden, weight, _, labels = inputs(3, 7, 8, 33, torch.float32, False, seed=7)
    x = hidden.clone().requires_grad_(frozen == "weight")
    w = weight.clone().requires_grad_(frozen == "hidden")
    leaf = x if frozen == "weight" else w
    lp, ent = fused_linear_logprobs(x, w, labels, use_triton=True, rows=8, cols=12)
    assert ent is None
    xr, wr = hidden.double().requires_grad_(), weight.double().requires_grad_()
    rlp, _ = reference(xr, wr, None, labels)
    torch.testing.assert_close(lp.double(), rlp, rtol=1e-5, atol=1e-5)
    (g,) = torch.autograd.grad(lp.sum(), leaf)
    (rg,) = torch.autograd.grad(rlp.sum(), xr if frozen == "weight" else wr)
    torch.testing.assert_close(g.double(), rg, rtol=1e-5, atol=1e-5)


def test_tiled_schedule_without_rows():
    # N = 0 (an empty micro-batch): empty log-probs, and a zero gradient, not an uninitialised one
    w = torch.randn(33, 8, device=DEVICE).requires_grad_()
    x = torch.zeros(0, 8, device=DEVICE).requires_grad_()
    lp, _ = fused_linear_logprobs(x, w, torch.zeros(0, dtype=torch.long, device=DEVICE), use_triton=True)
    assert lp.shape == (0,)
    gx, gw = torch.autograd.grad(lp.sum(), (x, w))
    assert gx.shape == (0, 8) and torch.equal(gw, torch.zeros_like(w))


def test_fold_ignores_the_tiles_padding():
    # the kernels read a tile up to a bound divisible by 16, into the buffer's padding columns:
    # NaN and +inf there must change neither the log-sum-exp nor the gradient, nor be written over
    head = pytest.importorskip("grpo_bench.numerics.kernels.head")
    gen = torch.Generator().manual_seed(8)
    buf = torch.full((3, 128), float("nan"), device=DEVICE)
    buf[1, 40:] = float("inf")
    tile = buf[:, :37]  # 37 wide: the kernels read 48 columns
    tile.copy_(torch.randn(3, 37, generator=gen).to(DEVICE))
    labels = torch.tensor([0, 36, 5], device=DEVICE)
    state = torch.empty(4, 3, device=DEVICE)
    logp, ent = torch.empty(3, device=DEVICE), torch.empty(3, device=DEVICE)
    cfg = head.CONFIGS["default"]
    head.fold(tile, labels, state, logp, ent, 0, 1.0, first=True, last=True, cfg=cfg)
    ls = torch.log_softmax(tile.double(), -1)
    torch.testing.assert_close(logp.double(), ls.gather(1, labels[:, None])[:, 0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent.double(), -(ls.exp() * ls).sum(-1), rtol=1e-6, atol=1e-6)
    g = torch.ones(3, device=DEVICE)
    head.grad(tile, labels, state[:2], None, g, None, 0, 1.0, cfg)
    want = -ls.exp()
    want[torch.arange(3), labels] += 1
    torch.testing.assert_close(tile.double(), want, rtol=1e-6, atol=1e-6)
    assert torch.isinf(buf[1, 48:]).all() and torch.isnan(buf[0, 48:]).all()  # beyond the bound: untouched


def test_hidden_only_and_odd_chunks():
    # weight frozen: no dW work; chunks of 4 rows over 3 x 7 = 21 rows
    hidden, weight, _, labels = inputs(3, 7, 8, 33, torch.float32, False, seed=1)
    for use_triton in (False, True):
        x = hidden.clone().requires_grad_()
        lp, ent = fused_linear_logprobs(x, weight, labels, use_triton=use_triton, rows=4)
        assert ent is None
        xr = hidden.double().requires_grad_()
        rlp, _ = reference(xr, weight, None, labels)
        torch.testing.assert_close(lp.double(), rlp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.autograd.grad(lp.sum(), x)[0].double(),
                                   torch.autograd.grad(rlp.sum(), xr)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_triton", [False, True], ids=["chunked", "triton"])
def test_temperature_divides_the_fp32_logits(use_triton):
    # the sampler divides fp32(bf16 logits) by T; dividing the bf16 hidden states by T first
    # rounds them to other values, which the comparison below must be able to tell apart
    hidden, weight, _, labels = inputs(3, 4, 32, 50, torch.bfloat16, False, seed=3)
    x = hidden.clone().requires_grad_()
    lp, ent = fused_linear_logprobs(x, weight, labels, with_entropy=True, use_triton=use_triton, rows=5,
                                    temperature=0.7)
    xr = hidden.clone().requires_grad_()
    want = torch.log_softmax(F.linear(xr, weight).float() / 0.7, -1)
    rlp = want.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    rent = -(want.exp() * want).sum(-1)
    torch.testing.assert_close(lp, rlp, rtol=0, atol=2e-6)
    torch.testing.assert_close(ent, rent, rtol=0, atol=2e-6)
    wrong = torch.log_softmax(F.linear(hidden / 0.7, weight).float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert (wrong - rlp).abs().max() > 1e-3
    # the gradient: autograd through the fp32 division, cast back to bf16 at the GEMM
    a = torch.randn(labels.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    (g,) = torch.autograd.grad((lp * a).sum() + ent.sum(), x)
    (rg,) = torch.autograd.grad((rlp * a).sum() + rent.sum(), xr)
    torch.testing.assert_close(g.float(), rg.float(), rtol=2e-2, atol=2e-2 * rg.abs().max().item())


def test_chunk_rule():
    # GPU: a sixteenth of the rows, capped at 1 GiB of fp32 logits (1,766 rows of 151,936),
    # never below Liger's rule (logits about the size of the hidden states), within [1, N]
    assert default_rows(8192, 151_936, 896, "cuda") == 512
    assert default_rows(131_072, 151_936, 896, "cuda") == (1 << 30) // (4 * 151_936) == 1766
    assert default_rows(16, 151_936, 896, "cuda") == 1  # n / 16 = 1 = Liger's rule here
    assert default_rows(1024, 50_257, 8192, "cuda") == 256  # Liger: 1024 / ceil(50,257 / 8,192) -> 256 > 64
    assert default_rows(8, 10, 1000, "cuda") == 8
    assert default_rows(1, 50_257, 64, "cuda") == 1
    # CPU: 64 rows for the GEMM's sake, never above N / 16 (nor below 1), the whole of small logits
    assert default_rows(8192, 151_936, 128, "cpu") == 64
    assert default_rows(320, 151_936, 128, "cpu") == 20
    assert default_rows(5, 151_936, 128, "cpu") == 1
    assert default_rows(1024, 52, 128, "cpu") == 1024


def test_tile_rule():
    mib = 1 << 20
    # the benchmark's sizes: every row in one tile, the vocabulary in equal tiles, 128-aligned, within 256 MiB
    for v, want in ((50_257, (16_384, 7_296)), (151_936, (16_384, 8_064))):
        rows, cols = tile_shape(16_384, v, 2, 256 * mib, 4096)
        assert (rows, cols) == want and cols % 128 == 0 and rows * cols * 2 <= 256 * mib
        tiles = -(-v // cols)
        assert v - (tiles - 1) * cols > 0.8 * cols  # the last tile is not a sliver
    # too many rows for a 4,096-wide tile: rows are split instead, the tile still within budget
    rows, cols = tile_shape(131_072, 151_936, 2, 256 * mib, 4096)
    assert rows < 131_072 and cols >= 4096 and rows * cols * 2 <= 256 * mib
    # a small vocabulary: one tile, padded to 128; a given row count keeps its cols within budget
    assert tile_shape(8, 10, 2, 256 * mib, 4096) == (8, 128)
    assert tile_shape(1024, 151_936, 2, 256 * mib, 4096, rows=100_000) == (1024, 76_032)
    with pytest.raises(ValueError, match="head.py.*valid: default"):
        fused_linear_logprobs(torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long), use_triton=True,
                              config="nope")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="full-size kernel checks need a GPU")
def test_full_size_gpu():
    hidden, weight, _, labels = inputs(4, 1024, 896, 151_936, torch.bfloat16, False, seed=2)
    x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, _ = fused_linear_logprobs(x, w, labels, use_triton=True)
    xr, wr = hidden.float().requires_grad_(), weight.float().requires_grad_()
    rlp = torch.log_softmax(F.linear(xr, wr).float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(lp, rlp, rtol=3e-2, atol=3e-2)
    gx, gw = torch.autograd.grad(lp.sum(), (x, w))
    rgx, rgw = torch.autograd.grad(rlp.sum(), (xr, wr))
    for g, rg in ((gx, rgx), (gw, rgw)):
        s = rg.abs().max()
        torch.testing.assert_close(g.float() / s, rg / s, rtol=3e-2, atol=3e-2)


# --- held where mutation testing found them unheld (scripts/mutate.py)

class Spy:
    """Stands in for a Triton kernel: records each launch's grid and the keywords named, then launches."""

    def __init__(self, kernel, *keys):
        self.kernel, self.keys, self.launches = kernel, keys, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append((grid, *(kw[k] for k in self.keys)))
            self.kernel[grid](*args, **kw)
        return launch


def test_each_shipped_config_is_the_launch_it_names(monkeypatch):
    """The tiled schedule takes head.CONFIGS[config]: its tile budget and narrowest tile reach tile_shape, its
    (BLOCK, warps) the fold and gradient kernels, a block capped at the tile's width rounded up to a power of two
    (V = 5,000: 5,008 read, so 8,192) and at 16 below; the gradient's grid covers that width in blocks."""
    from grpo_bench.numerics.kernels import head, linear

    shapes, real = [], linear.tile_shape
    monkeypatch.setattr(linear, "tile_shape", lambda *a: shapes.append(a[3:5]) or real(*a))
    fwd, bwd = Spy(head._fold_fwd, "BLOCK", "num_warps"), Spy(head._grad_tile, "BLOCK", "num_warps")
    monkeypatch.setattr(head, "_fold_fwd", fwd)
    monkeypatch.setattr(head, "_grad_tile", bwd)
    mib = 1 << 20
    for v, config, tile, want_fwd, want_bwd in (
            (5000, "default", 256, ((2,), 1024, 4), ((2, 5), 1024, 4)),
            (5000, "tile128", 128, ((2,), 1024, 4), ((2, 5), 1024, 4)),
            (5000, "wide", 256, ((2,), 2048, 8), ((2, 2), 4096, 8)),
            (5, "default", 256, ((2,), 16, 4), ((2, 1), 16, 4))):
        hidden, weight, _, labels = inputs(1, 2, 8, v, torch.float32, False, seed=9)
        h = hidden.requires_grad_()
        lp, _ = fused_linear_logprobs(h, weight, labels, use_triton=True, config=config)
        lp.sum().backward()
        assert shapes.pop() == (tile * mib, 4096), config
        assert fwd.launches.pop() == want_fwd and bwd.launches.pop() == want_bwd, (v, config)


def _fp64_head(z, labels, temperature, g, ge):
    """log p(label), entropy and d(sum g log p + ge H)/dz of the tempered logits z, in fp64."""
    z = z.detach().double().requires_grad_()
    ls = torch.log_softmax(z / temperature, -1)
    lp, ent = ls.gather(1, labels[:, None])[:, 0], -(ls.exp() * ls).sum(-1)
    (dz,) = torch.autograd.grad((g.double() * lp).sum() + (ge.double() * ent).sum(), z)
    return lp.detach(), ent.detach(), dz


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_lanes_that_see_many_logits_and_tiles_far_apart(temperature):
    """16-wide blocks over 200-wide tiles: each lane folds 13 logits, rising by steps under 1 (the max moves by
    less than the old terms' scale), falling, and equal; the second tile sits 100 above the first, so the merge
    must rescale toward the larger max (toward the smaller, e^100 overflows fp32). log p, the entropy and the
    gradient of both tiles (13 blocks each) against fp64, at T = 1 and 2."""
    from grpo_bench.numerics.kernels import head

    gen = torch.Generator().manual_seed(11)
    n, c = 3, 200
    ramp = torch.arange(c, dtype=torch.float32)
    z = torch.stack([0.3 * ramp, -0.45 * ramp, torch.zeros(c)])
    z = z + 0.05 * torch.randn(n, c, generator=gen)
    z = torch.cat([z, z.flip(-1) + 100.0], 1)  # (3, 400): two tiles of 200
    labels = torch.tensor([399, 7, 250])
    g, ge = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    cfg = dict(fwd=(16, 1), bwd=(16, 1))
    state, logp, ent = torch.empty(4, n), torch.empty(n), torch.empty(n)
    tiles = [z[:, :c].clone(), z[:, c:].clone()]
    for k, tile in enumerate(tiles):
        head.fold(tile, labels, state, logp, ent, k * c, temperature, first=k == 0, last=k == 1, cfg=cfg)
    lp, h, dz = _fp64_head(z, labels, temperature, g, ge)
    torch.testing.assert_close(logp.double(), lp, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(ent.double(), h, rtol=1e-6, atol=1e-5)
    for k, tile in enumerate(tiles):
        head.grad(tile, labels, state[:2], ent, g, ge, k * c, temperature, cfg)
        torch.testing.assert_close(tile.double(), dz[:, k * c:(k + 1) * c], rtol=1e-5, atol=1e-6)


def test_a_label_outside_the_vocabulary_reads_no_logit():
    """Labels of -1 and V (padding conventions) give log p = -inf on the tiled schedule, with a vocabulary whose
    last tile is narrower than the buffer, so column V is the buffer's padding and readable."""
    hidden, weight, _, labels = inputs(1, 4, 8, 100, torch.float32, False, seed=12)
    labels[0, 1], labels[0, 3] = -1, 100
    lp, _ = fused_linear_logprobs(hidden, weight, labels, use_triton=True, cols=64)
    assert torch.isneginf(lp[0, [1, 3]]).all() and torch.isfinite(lp[0, [0, 2]]).all()


def test_the_load_bound_by_hand():
    """The kernels read a tile's width rounded up to 16, never past its buffer's row stride."""
    from grpo_bench.numerics.kernels.head import _load_bound

    buf = torch.empty(2, 3072)
    for width, stride, want in ((100, 128, 112), (3000, 3072, 3008), (5, 128, 16), (120, 120, 120), (112, 112, 112)):
        assert _load_bound(torch.empty(2, stride)[:, :width]) == want, (width, stride)
    assert _load_bound(buf[:1, :3]) == 16


def test_chunk_rule_where_each_term_binds():
    """Cases where one term alone sets the chunk: a hidden size of 1 in Liger's rule (h = 1, not 2: 512 rows of
    8 logits, not 1,024); N / 16 rounded down on the GPU (8,200 rows: 512, an int, not 512.5); on the CPU N / 16
    under 64 while the row ops' own rule is held at 16 MiB (27 rows of 151,936), so N / 16 = 62 rows decides."""
    assert default_rows(4096, 8, 1, "cuda") == 512
    rows = default_rows(8200, 151_936, 896, "cuda")
    assert rows == 512 and type(rows) is int
    assert default_rows(1000, 151_936, 128, "cpu") == 62


def _tile_cases():
    for n in (1, 2, 7, 1000, 131_072):
        for v in (10, 100, 128, 129, 258, 1000, 50_257, 151_936):
            for esize in (2, 4):
                for budget in (1, 256, 12_800, 256_000, 1 << 20, 256 << 20):
                    for min_cols in (1, 128, 256, 4096):
                        yield n, v, esize, budget, min_cols


def test_tile_rule_properties():
    """Over 1,920 shapes and budgets, the documented rule: as many rows as a tile min_cols wide (at most the padded
    vocabulary) fits, within [1, N]; then the fewest tiles of equal width, each a multiple of 128 and within the
    budget whenever a 128-wide tile of those rows is; the narrowest tile is 128 wide. Plain ints throughout."""
    for n, v, esize, budget, min_cols in _tile_cases():
        case = (n, v, esize, budget, min_cols)
        rows, cols = tile_shape(n, v, esize, budget, min_cols)
        assert type(rows) is int and type(cols) is int, case
        elems, vpad, narrow = budget // esize, -(-v // 128) * 128, min(-(-v // 128) * 128, min_cols)
        assert 1 <= rows <= n, case
        assert rows == 1 or rows * narrow <= elems, case  # within the budget...
        assert rows == n or (rows + 1) * narrow > elems, case  # ...and no row more would fit
        assert cols % 128 == 0 and 128 <= cols <= vpad, case
        tiles = -(-v // cols)
        assert cols - 128 < -(-v // tiles) <= cols, case  # equal tiles, none a sliver
        if elems // rows >= 128:
            assert rows * cols <= elems, case
        else:
            assert cols == 128, case
        if tiles > 1:  # one tile fewer would not fit
            assert rows * (-(-(-(-v // (tiles - 1))) // 128) * 128) > max(elems, rows * 128), case


def test_tile_rule_by_hand():
    """Three shapes worked by hand. 12,800 bytes of bf16 over V = 100 (padded to 128): 6,400 elements, 50 rows of
    128. 256,000 bytes over V = 258 with 1,000 rows: 128 columns per row fit, so 3 tiles of 86 -> 128 (two tiles of
    129 -> 256 would be twice the budget). A budget under one fp32 element: one row, one 128-wide tile."""
    assert tile_shape(10_000, 100, 2, 12_800, 4096) == (50, 128)
    assert tile_shape(1000, 258, 2, 256_000, 128) == (1000, 128)
    assert tile_shape(4, 10, 4, 1, 1) == (1, 128)
    assert tile_shape(1, 10, 2, 256 << 20, 4096) == (1, 128)
    rows, cols = tile_shape(131_072, 151_936, 2, 256 << 20, 4096)
    assert (rows, cols) == (32_768, 4_096) and type(rows) is int and type(cols) is int


class _Recorder:
    """Stands in for the torch module inside linear.py: records each allocation (name, shape, dtype) and each
    call named in `calls`, forwards everything else to torch."""

    ALLOC = ("empty", "zeros", "empty_like", "zeros_like")

    def __init__(self, calls=()):
        self.allocs, self.calls, self._names = [], [], calls

    def __getattr__(self, name):
        f = getattr(torch, name)
        if name in self.ALLOC:
            def alloc(*a, **k):
                t = f(*a, **k)
                self.allocs.append((name, tuple(t.shape), t.dtype))
                return t
            return alloc
        if name in self._names:
            def call(*a, **k):
                self.calls.append((name, a, k))
                return f(*a, **k)
            return call
        return f


# (rows, cols) at N = 10, V = 100: TILES, and a tile exactly N rows and V columns (a single tile either way)
LAYOUTS = {**TILES, "exact": (10, 100)}


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
@pytest.mark.parametrize("leaves", ["hw", "h", "w", "hwb"])
def test_what_each_layout_allocates_and_where_its_tiles_lie(monkeypatch, layout, leaves):
    """The tiled schedule's memory and tiles, by hand. Forward: log p, entropy, the (4, N) fold state and one tile
    buffer (rows x cols); backward: dh, an fp32 (rows, H) accumulator only when the vocabulary is split, dW in the
    weight's dtype when every row is in one tile, else an fp32 (V, H) accumulator, db, the tile buffer. Each tile's
    logits are a (rows in it, columns in it) view of that buffer, row stride cols; fold and grad get that tile's
    rows of labels, state (4 rows, then max and log-sum-exp only) and outputs; the entropy's gradient is asked for
    only when the entropy is used."""
    from grpo_bench.numerics.kernels import head, linear

    rows, cols = LAYOUTS[layout]
    hidden, weight, bias, labels = inputs(2, 5, 8, 100, torch.float32, "b" in leaves, seed=13)
    x = hidden.clone().requires_grad_("h" in leaves)
    w = weight.clone().requires_grad_("w" in leaves)
    b = bias.clone().requires_grad_() if bias is not None else None
    n, v, hd = 10, 100, 8
    r, c = tile_shape(n, v, 4, head.CONFIGS["default"]["tile_mib"] << 20, head.CONFIGS["default"]["min_cols"], rows)
    c = cols or c
    seen, real_fold, real_grad = [], head.fold, head.grad

    def fold(tile, lab, state, logp, ent, col0, *a, **k):
        seen.append(("fold", tuple(tile.shape), tile.stride(0), col0, lab.shape[0], tuple(state.shape),
                     logp.shape[0], ent.shape[0]))
        return real_fold(tile, lab, state, logp, ent, col0, *a, **k)

    def grad(tile, lab, state, ent, g, ge, col0, *a):
        seen.append(("grad", tuple(tile.shape), tile.stride(0), col0, lab.shape[0], tuple(state.shape),
                     g.shape[0], ge))
        return real_grad(tile, lab, state, ent, g, ge, col0, *a)

    monkeypatch.setattr(head, "fold", fold)
    monkeypatch.setattr(head, "grad", grad)
    rec = _Recorder()
    monkeypatch.setattr(linear, "torch", rec)
    lp, ent = fused_linear_logprobs(x, w, labels, with_entropy=True, bias=b, use_triton=True, rows=rows, cols=cols)
    lp.sum().backward()  # the entropy unused: its incoming gradient is None

    f32, one_row, one_col = torch.float32, r >= n, c >= v
    want = [("empty", (n,), f32), ("empty", (n,), f32), ("empty", (4, n), f32), ("empty", (r, c), f32)]
    want += [("empty_like", (n, hd), f32)] if "h" in leaves else []
    want += [("empty", (r, hd), f32)] if "h" in leaves and not one_col else []
    if "w" in leaves:
        want += [("empty_like", (v, hd), f32)] if one_row else [("zeros", (v, hd), f32)]
    want += [("zeros", (v,), f32)] if "b" in leaves else []
    want += [("empty", (r, c), f32)]
    assert rec.allocs == want
    tiles = [(r0, c0, min(r, n - r0), min(c, v - c0)) for r0 in range(0, n, r) for c0 in range(0, v, c)]
    assert seen == [("fold", (nr, nc), c, c0, nr, (4, nr), nr, nr) for _, c0, nr, nc in tiles] + \
        [("grad", (nr, nc), c, c0, nr, (2, nr), nr, None) for _, c0, nr, nc in tiles]


def test_the_chunked_schedule_skips_an_unused_entropy(monkeypatch):
    """With the entropy computed but unused, the chunked backward gets None for its gradient (not zeros to multiply
    through); with only the entropy used, zeros stand in for the log-prob's."""
    from grpo_bench.numerics.kernels import linear

    seen, real = [], linear.rows_backward
    monkeypatch.setattr(linear, "rows_backward", lambda z, lab, g, ge, *a, **k: seen.append((g, ge)) or
                        real(z, lab, g, ge, *a, **k))
    hidden, weight, _, labels = inputs(2, 5, 8, 33, torch.float32, False, seed=14)
    x = hidden.clone().requires_grad_()
    lp, ent = fused_linear_logprobs(x, weight, labels, with_entropy=True, rows=4)
    lp.sum().backward(retain_graph=True)
    assert len(seen) == 4 and all(ge is None and g is not None for g, ge in seen)  # 4 + 1 rows per sequence
    seen.clear()
    ent.sum().backward()
    assert len(seen) == 4 and all(ge is not None and not g.any() for g, ge in seen)


def test_each_entry_point_sizes_its_chunks_from_its_own_shape(monkeypatch):
    """The chunk and tile rules are given N = B * L rows, the vocabulary, the hidden size and the device; the
    default schedule is the chunked one; linear_sum_pi_squared's temperature is 1 unless given."""
    from grpo_bench.numerics.kernels import linear

    hidden, weight, _, labels = inputs(2, 5, 16, 33, torch.float32, False, seed=15)
    rules = []
    real_rows, real_tile = linear.default_rows, linear.tile_shape
    monkeypatch.setattr(linear, "default_rows", lambda *a: rules.append(("rows", *a)) or real_rows(*a))
    monkeypatch.setattr(linear, "tile_shape", lambda *a: rules.append(("tile", *a[:3])) or real_tile(*a))
    monkeypatch.setattr(linear.TiledLinearLogProb, "apply", None)  # the default must not reach it
    lp, _ = fused_linear_logprobs(hidden, weight, labels)
    assert rules.pop() == ("rows", 10, 33, 16, hidden.device)
    out = linear.linear_sum_pi_squared(hidden, weight)
    assert rules.pop() == ("rows", 10, 33, 16, hidden.device)
    p = torch.softmax(F.linear(hidden.double(), weight.double()), -1)
    torch.testing.assert_close(out.double(), (p * p).sum(-1), rtol=1e-5, atol=1e-6)
    monkeypatch.undo()
    monkeypatch.setattr(linear, "tile_shape", lambda *a: rules.append(("tile", *a[:3])) or real_tile(*a))
    fused_linear_logprobs(hidden.bfloat16(), weight.bfloat16(), labels, use_triton=True)
    assert rules.pop() == ("tile", 10, 33, 2)


def test_fp32_accumulation_takes_the_mixed_precision_gemm_on_cuda(monkeypatch):
    """acc += a @ b: fp32 inputs add in place; bf16 / fp16 on a GPU go to addmm with an fp32 output, never cast
    (no rounded bf16 product, no fp32 copies of a and b); elsewhere, and for other dtypes, cast to fp32 first.
    A stand-in accumulator that reports a GPU holds the dispatch on this CPU; test_full_size_gpu its numbers."""
    from grpo_bench.numerics.kernels import linear

    class Acc:
        def __init__(self, is_cuda):
            self.is_cuda, self.calls = is_cuda, []

        def addmm_(self, a, b):
            self.calls.append(("addmm_", a.dtype, b.dtype))

    rec = _Recorder(calls=("addmm",))
    monkeypatch.setattr(linear, "torch", rec)
    rec.addmm = lambda *a, **k: rec.calls.append(("addmm", a[1].dtype, k))  # the CPU has no such kernel
    for dtype, is_cuda, want in ((torch.float32, True, ("addmm_", torch.float32, torch.float32)),
                                 (torch.bfloat16, False, ("addmm_", torch.float32, torch.float32)),
                                 (torch.float64, True, ("addmm_", torch.float32, torch.float32))):
        acc = Acc(is_cuda)
        linear._addmm_fp32(acc, torch.ones(2, 3, dtype=dtype), torch.ones(3, 4, dtype=dtype))
        assert acc.calls == [want] and rec.calls == [], dtype
    for dtype in (torch.bfloat16, torch.float16):
        acc = Acc(True)
        linear._addmm_fp32(acc, torch.ones(2, 3, dtype=dtype), torch.ones(3, 4, dtype=dtype))
        assert acc.calls == [] and rec.calls.pop() == ("addmm", dtype, dict(out_dtype=torch.float32, out=acc))
