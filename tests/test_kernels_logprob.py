"""The selected-token log-prob (chunked torch and Triton) against an fp64 torch reference.

Forward values and gradients (through log p and through the entropy) across dtypes and
awkward shapes. On CPU the Triton kernels run in the interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), so shapes stay small; the full-size cases at the end need a GPU.
"""
import math

import pytest
import torch
from helpers import needs

from grpo_bench.numerics.kernels import chunked as C

needs("triton")
from grpo_bench.numerics.kernels import logprob as K  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = torch.float32  # explicit everywhere: another test module sets the default dtype to fp64
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
       torch.float16: dict(rtol=2e-3, atol=2e-3)}


def reference(logits, labels):
    """fp64 log p(label) and entropy; differentiable, and finite for -inf logits."""
    lp = torch.log_softmax(logits.double(), -1)
    out = lp.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    p = lp.exp()
    ent = -(p * torch.where(p > 0, lp, torch.zeros_like(lp))).sum(-1)
    return out, ent


def run(backend, logits, labels, with_entropy, rows=3):
    if backend == "triton":
        return K.triton_logprobs(logits, labels, with_entropy)
    return C.chunked_logprobs(logits, labels, with_entropy, rows=rows)


def check(backend, logits, labels, with_entropy=True, tol=None, vtol=None, seed=0, **kw):
    """Compare values and d/dlogits of sum(a * logp + b * H) with random a, b."""
    tol = tol or TOL[logits.dtype]
    vtol = vtol or TOL[torch.float32]
    x = logits.detach().clone().requires_grad_()
    lp, ent = run(backend, x, labels, with_entropy, **kw)
    xr = logits.detach().double().requires_grad_()
    rlp, rent = reference(xr, labels)
    assert lp.dtype == torch.float32 and lp.shape == labels.shape
    torch.testing.assert_close(lp.double(), rlp, **vtol)
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(labels.shape, generator=gen, dtype=torch.float64).to(logits.device)
    obj, robj = (lp.double() * a).sum(), (rlp * a).sum()
    if with_entropy:
        torch.testing.assert_close(ent.double(), rent, **vtol)
        b = torch.randn(labels.shape, generator=gen, dtype=torch.float64).to(logits.device)
        obj, robj = obj + (ent.double() * b).sum(), robj + (rent * b).sum()
    else:
        assert ent is None
    (g,) = torch.autograd.grad(obj, x)
    (rg,) = torch.autograd.grad(robj, xr)
    assert g.dtype == logits.dtype and g.shape == logits.shape
    torch.testing.assert_close(g.double(), rg, **tol)


def randn(*shape, dtype=torch.float32, scale=3.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen, dtype=torch.float32)).to(dtype).to(DEVICE)


def labels_for(shape, v, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, v, shape, generator=gen).to(DEVICE)


@pytest.fixture
def small_tiles(monkeypatch):
    # several V tiles with a ragged last one, and fewer programs than rows
    monkeypatch.setattr(K, "BLOCK_V_MAX", 64)
    monkeypatch.setattr(K, "MAX_PROGRAMS", 3)


SHAPES = [(1, 1), (1, 37), (3, 5, 77), (2, 2, 3, 200)]  # N = 1, V = 1, V odd, 4-D leading


@pytest.mark.parametrize("backend", ["chunked", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_fp64_reference(backend, dtype, shape, small_tiles):
    logits = randn(*shape, dtype=dtype)
    labels = labels_for(shape[:-1], shape[-1])
    check(backend, logits, labels, with_entropy=dtype != torch.float16)
    if dtype == torch.float32:
        check(backend, logits, labels, with_entropy=False)


@pytest.mark.parametrize("backend", ["chunked", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_logits(backend, dtype, small_tiles):
    # +-1e4: a naive exp overflows, and x - (max + log s) in fp32 would lose 1e-3
    logits = randn(4, 150, dtype=torch.float32, scale=1.0, seed=3)
    logits = torch.where(logits > 0, torch.full_like(logits, 1e4), torch.full_like(logits, -1e4)) + logits
    logits = logits.to(dtype)
    labels = labels_for((4,), 150, seed=4)
    labels[0] = logits[0].float().argmax()  # log p near 0 as well as near -2e4
    check(backend, logits, labels)


@pytest.mark.parametrize("backend", ["chunked", "triton"])
def test_ties(backend, small_tiles):
    v = 130
    logits = torch.zeros(3, v, dtype=F32, device=DEVICE)
    logits[1, :5] = 2.0  # a tie at the top, the label among the tied
    logits[2] = torch.arange(v, dtype=F32, device=DEVICE) % 4  # many ties, label on a low one
    labels = torch.tensor([7, 3, 4], device=DEVICE)
    x = logits.clone().requires_grad_()
    lp, ent = run(backend, x, labels, True)
    torch.testing.assert_close(lp[0], torch.tensor(-math.log(v), dtype=F32, device=DEVICE))
    torch.testing.assert_close(ent[0], torch.tensor(math.log(v), dtype=F32, device=DEVICE))
    (g,) = torch.autograd.grad(lp[0], x)
    expect = torch.full((v,), -1.0 / v, dtype=F32, device=DEVICE)
    expect[7] += 1.0
    torch.testing.assert_close(g[0], expect)
    assert (g[1:] == 0).all()
    check(backend, logits, labels)


@pytest.mark.parametrize("backend", ["chunked", "triton"])
def test_minus_inf_logits(backend, small_tiles):
    # banned tokens: everything stays finite and p = 0 there, including the entropy terms
    logits = randn(3, 100, seed=5)
    logits[:, ::3] = float("-inf")
    labels = torch.tensor([1, 2, 4], device=DEVICE)
    check(backend, logits, labels)


@pytest.mark.parametrize("backend", ["chunked", "triton"])
def test_largest_vocab(backend):
    v = 262_144
    logits = randn(2, v, seed=6)
    # ATen's fp32 log_softmax sums 262,144 exps in a few running lanes: ~1e-5 relative error
    # (the naive torch path shares it); the kernel keeps 4,096 lanes and stays within 1e-7
    if backend == "triton":
        vtol, tol = dict(rtol=1e-5, atol=1e-5), dict(rtol=1e-5, atol=1e-7)
    else:
        vtol, tol = dict(rtol=3e-5, atol=1e-5), dict(rtol=1e-4, atol=2e-5)
    check(backend, logits, labels_for((2,), v), tol=tol, vtol=vtol)


def test_rows_are_read_in_place(small_tiles):
    base = randn(2, 6, 50, seed=7)
    view = base[:, :-1]  # the usual logits[:, :-1]: not flattenable without a copy
    assert C.as_bl(view).data_ptr() == view.data_ptr()
    labels = labels_for((2, 5), 50)
    for backend in ("chunked", "triton"):
        check(backend, view, labels)


def test_chunking_covers_every_row():
    # row blocks in (B, L): across whole sequences when L < rows, within one otherwise
    for b, l, rows in [(3, 5, 2), (3, 5, 7), (4, 1, 3), (1, 9, 9)]:
        seen = torch.zeros(b, l, dtype=torch.int64)
        for bi, li in C.row_blocks(b, l, rows):
            assert seen[bi, li].numel() <= rows
            seen[bi, li] += 1
        assert (seen == 1).all()


def test_cpu_chunk_rule():
    cpu = torch.device("cpu")
    for n, v in [(4096, 50_257), (1024, 151_936), (64, 262_144), (4096, 5000)]:
        chunk = 4 * v * C.default_rows(n, v, cpu)
        assert chunk <= 16 << 20 and (chunk <= 4 * n * v / 16 or C.default_rows(n, v, cpu) == 1)
    assert C.default_rows(480, 5, cpu) >= 480  # a toy task's logits: one chunk


def test_cpu_chunk_rule_by_hand():
    """The largest chunk the rule allows (a smaller one is slower: more OpenMP fork-joins), hand-computed: 16 MiB
    at most, else a 16th of the naive path's (N, V) fp32 tensor, 1 MiB at least, one row at least. On a GPU a chunk
    only bounds memory: 256 MiB."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    # (4096, 50257): 16 MiB // 201028 B a row; (64, 262144): N V / 4 = 4 MiB of 1 MiB rows; (64, 5000) and a toy's
    # (480, 5): 1 MiB; a row wider than 16 MiB: one row
    got = [C.default_rows(n, v, cpu) for n, v in [(4096, 50_257), (1024, 151_936), (64, 262_144), (64, 5000),
                                                  (480, 5), (8, 1 << 23), (8, 1)]]
    assert got == [83, 27, 4, 52, 52_428, 1, 262_144]
    on_gpu = [C.default_rows(n, v, cuda) for n, v in [(4096, 50_257), (16, 151_936), (8, 1 << 27), (8, 1)]]
    assert on_gpu == [1335, 441, 1, 1 << 26]
    assert all(type(r) is int for r in got + on_gpu)   # a count of rows, for range()


def test_row_blocks_by_hand():
    """Within one sequence when it is at least a chunk long, else whole sequences, as many as fit."""
    blocks = lambda *a: [(bi.start, bi.stop, li.start, li.stop) for bi, li in C.row_blocks(*a)]  # noqa: E731
    assert blocks(2, 5, 2) == [(0, 1, 0, 2), (0, 1, 2, 4), (0, 1, 4, 5), (1, 2, 0, 2), (1, 2, 2, 4), (1, 2, 4, 5)]
    assert blocks(5, 3, 7) == [(0, 2, 0, 3), (2, 4, 0, 3), (4, 5, 0, 3)]   # 7 // 3 = 2 sequences a chunk
    assert blocks(3, 1, 2) == [(0, 2, 0, 1), (2, 3, 0, 1)]


def test_as_bl_views_where_it_can():
    """(..., V) as (B, L, V): no leading dim is (1, 1), one is (1, L), two are kept, more fold into B; a view of
    the same memory where the strides allow, a copy only where they do not."""
    x = randn(2, 3, 4, 5)
    assert C.as_bl(torch.ones(5)).shape == (1, 1, 5)
    one = C.as_bl(x[0, 0])
    assert one.shape == (1, 4, 5) and one.data_ptr() == x[0, 0].data_ptr()
    two = x[0]
    assert C.as_bl(two) is two
    folded = C.as_bl(x)
    assert folded.shape == (6, 4, 5) and folded.data_ptr() == x.data_ptr()
    t = x.transpose(0, 1)   # (3, 2, 4, 5): B and the next dim cannot fold without a copy
    copied = C.as_bl(t)
    assert copied.shape == (6, 4, 5) and torch.equal(copied, t.reshape(6, 4, 5))
    assert C.as_bl(randn(5), trailing=0).shape == (1, 5) and C.as_bl(randn(2, 3, 4), trailing=0).shape == (6, 4)


def test_chunks_never_ask_for_more_rows_than_there_are(monkeypatch):
    """The work buffers hold min(rows, B L) rows, and the default rows are asked for B L rows of V logits."""
    asked, sized, blocks = [], [], []
    default, buffers, row_blocks = C.default_rows, C.work_buffers, C.row_blocks
    monkeypatch.setattr(C, "default_rows", lambda n, v, d: asked.append((n, v)) or default(n, v, d))
    monkeypatch.setattr(C, "work_buffers", lambda rows, *a: sized.append(rows) or buffers(rows, *a))
    monkeypatch.setattr(C, "row_blocks", lambda b, l, rows: blocks.append(rows) or row_blocks(b, l, rows))
    x, labels = randn(2, 3, 7), labels_for((2, 3), 7)
    C.chunked_logprobs(x, labels)
    C.chunked_logprobs(x[:1, :1], labels[:1, :1], rows=5)
    assert asked == [(6, 7)] and sized == [6, 1]
    blocks.clear()
    C.chunked_sum_pi_squared(randn(4, 5, 7))
    C.chunked_sum_pi_squared(randn(4, 2, 7), rows=5)
    C.chunked_sum_pi_squared(randn(1, 1, 7), rows=5)
    assert asked[1:] == [(20, 7)] and blocks == [20, 5, 1]


def test_the_second_buffer_only_where_a_pass_needs_it():
    """fp32 logits at T = 1 without entropy need one chunk buffer; entropy, a cast or a temperature, two."""
    def second(**kw):
        return C.work_buffers(4, 10, kw.pop("dtype", torch.float32), "cpu", kw.pop("entropy", False), **kw)[1]
    assert second() is None and C.work_buffers(4, 10, torch.float32, "cpu", False)[0].numel() == 40
    assert all(second(**kw) is not None for kw in ({"entropy": True}, {"dtype": torch.bfloat16},
                                                    {"temperature": 0.7}))


@pytest.mark.parametrize("t", [0.7, 2.0])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_at_a_temperature_against_fp64(dtype, with_entropy, t):
    """rows_forward and rows_backward of x / T (the fused head's CPU path), with the gradient written into x's own
    memory as the head does: log-probs, entropy and d/dx of sum(a logp + b H) against fp64 autograd."""
    x, labels = randn(6, 33, dtype=dtype), labels_for((6,), 33)
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    buf, buf2 = C.work_buffers(6, 33, dtype, "cpu", with_entropy, t)
    lp, h = C.rows_forward(x, labels, with_entropy, buf, buf2, temperature=t)
    xr = x.double().requires_grad_()
    rlp, rent = reference(xr / t, labels)
    torch.testing.assert_close(lp.double(), rlp, **TOL[torch.float32])
    robj = (rlp * a.double()).sum() + ((rent * b.double()).sum() if with_entropy else 0)
    (rg,) = torch.autograd.grad(robj, xr)
    out = x.clone()
    C.rows_backward(out, labels, a, b if with_entropy else None, h, out, buf, buf2, temperature=t)
    torch.testing.assert_close(out.double(), rg, **TOL[dtype])


def test_sum_pi_squared_against_fp64():
    """sum_v pi_v^2 of x / T by rows and in chunks, at T = 1 by default, at 0.7 and at 2."""
    x = randn(3, 4, 29)
    want = lambda t: (torch.softmax(x.double() / t, -1) ** 2).sum(-1)  # noqa: E731
    close = lambda got, t: torch.testing.assert_close(got.double(), want(t), rtol=1e-5, atol=1e-7)  # noqa: E731
    close(C.rows_sum_pi_squared(x), 1.0)
    close(C.chunked_sum_pi_squared(x, rows=5), 1.0)
    close(C.rows_sum_pi_squared(x, 0.7), 0.7)
    close(C.rows_sum_pi_squared(x, 2.0), 2.0)


def test_an_unused_entropy_costs_its_gradient_nothing():
    """Without a gradient for the entropy the backward is the log-prob's alone, to the bit (no zeros pushed
    through the entropy's terms); and without entropy asked for, none is returned."""
    x, labels = randn(2, 5, 40), labels_for((2, 5), 40)
    grads = []
    for with_entropy in (False, True):
        xg = x.clone().requires_grad_()
        lp, ent = C.chunked_logprobs(xg, labels, with_entropy, rows=3)
        assert (ent is None) != with_entropy
        (g,) = torch.autograd.grad((lp * torch.arange(10.0).view(2, 5)).sum(), xg)
        grads.append(g)
    assert torch.equal(grads[0], grads[1])
    assert C.chunked_logprobs(x, labels)[1] is None


def test_int32_labels_and_unused_entropy():
    logits = randn(2, 3, 40, seed=8)
    labels = labels_for((2, 3), 40).to(torch.int32)
    for backend in ("chunked", "triton"):
        x = logits.clone().requires_grad_()
        lp, _ = run(backend, x, labels, True)  # entropy computed but not in the objective
        (g,) = torch.autograd.grad(lp.sum(), x)
        xr = logits.double().requires_grad_()
        (rg,) = torch.autograd.grad(reference(xr, labels)[0].sum(), xr)
        torch.testing.assert_close(g.double(), rg, rtol=1e-5, atol=1e-6)


def test_forced_forward_configuration_is_checked_and_used(monkeypatch):
    """GRPO_BENCH_LOGPROB_FWD_CFG (the benchmark's sweep of FWD_CONFIGS): a malformed or invalid value is a
    one-line error naming the variable; a valid one sets the forward's tile, warps and stages (clamped to the
    row's width), leaves the backward's rule alone, and gives the fp64 log-probs and entropy with tiles
    narrower than the row, a ragged last one included."""
    monkeypatch.delenv("GRPO_BENCH_LOGPROB_FWD_CFG", raising=False)
    assert K._launch_cfg(10, 50_257) == dict(grid=(10,), BLOCK_V=1024, num_warps=4)
    assert K.FWD_CONFIGS[0] == (K.FWD_BLOCK_V_MAX, 4, 3, 0) and all(K.fwd_config_valid(c) for c in K.FWD_CONFIGS)
    for bad in ("1000,4,3", "2048,1", "4096,1,4", "1024,3,4", "1024,4,0", "big,4,3", "4096,1,4,1", "1024,4,3,2",
                "1024,4,3,1,0"):
        monkeypatch.setenv("GRPO_BENCH_LOGPROB_FWD_CFG", bad)
        with pytest.raises(ValueError, match="GRPO_BENCH_LOGPROB_FWD_CFG") as e:
            K._launch_cfg(10, 50_257)
        assert "\n" not in str(e.value)
    monkeypatch.setenv("GRPO_BENCH_LOGPROB_FWD_CFG", "2048,2,4")
    assert K._launch_cfg(10, 50_257) == dict(grid=(10,), BLOCK_V=2048, num_warps=2, num_stages=4)
    monkeypatch.setenv("GRPO_BENCH_LOGPROB_FWD_CFG", "2048,1,4,1")   # 64 a thread: too many for lanes, not for tiles
    assert K._launch_cfg(10, 50_257) == dict(grid=(10,), BLOCK_V=2048, num_warps=1, num_stages=4, TILE_REDUCE=True)
    monkeypatch.setenv("GRPO_BENCH_LOGPROB_FWD_CFG", "2048,2,4,0")
    assert K._launch_cfg(10, 50_257) == dict(grid=(10,), BLOCK_V=2048, num_warps=2, num_stages=4)
    assert K._launch_cfg(10, 200) == dict(grid=(10,), BLOCK_V=256, num_warps=2, num_stages=4)
    assert K._launch_cfg(10, 50_257, backward=True)["BLOCK_V"] == K.BLOCK_V_MAX
    monkeypatch.setenv("GRPO_BENCH_LOGPROB_FWD_CFG", "32,1,2")  # 200 = 6 tiles of 32 and a ragged 8
    logits = randn(3, 7, 200, seed=11)
    labels = labels_for((3, 7), 200)
    lp, ent = K.triton_logprobs(logits, labels, True)
    rlp, rent = reference(logits, labels)
    torch.testing.assert_close(lp.double(), rlp, **TOL[torch.float32])
    torch.testing.assert_close(ent.double(), rent, **TOL[torch.float32])


@pytest.mark.parametrize("with_entropy", [False, True])
def test_the_tile_reducing_forward_gives_the_fp64_log_probs_entropy_and_gradient(monkeypatch, with_entropy):
    """tile-reduce 1 (Liger's scheme in our kernel, a GPU benchmark's candidate) against fp64, values and the
    gradient its lse feeds: tiles narrower than the row with a ragged last one, a row whose max sits in the last
    tile (every earlier sum rescaled), logits of +-3e4 (where a sum kept against a stale max overflows), the first
    tiles of a row all -inf (banned tokens: the running max starts at the floor), a lone -inf."""
    monkeypatch.setenv("GRPO_BENCH_LOGPROB_FWD_CFG", "32,1,2,1")
    logits = randn(3, 7, 200, seed=12)
    logits[0, 0, 199] = 40.0
    logits[0, 1] *= 1e4
    logits[1, 2, :150] = float("-inf")
    logits[2, 3, 7] = float("-inf")
    labels = labels_for((3, 7), 200)
    labels[1, 2] = 170
    check("triton", logits, labels, with_entropy)


# ------------------------------------------------- held where mutation testing found them unheld (2026-12-03)

@pytest.mark.parametrize("t", [0.7, 2.0])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernels_at_a_temperature_against_fp64(small_tiles, dtype, with_entropy, t):
    """logprob_fwd and logprob_bwd of x / T (the fused head's GPU path; only the CPU rows had been checked at
    T != 1): log-probs, entropy and d/dx of sum(a logp + b H), several tiles and fewer programs than rows."""
    x, labels = randn(2, 3, 150, dtype=dtype, seed=3), labels_for((2, 3), 150)
    gen = torch.Generator().manual_seed(6)
    a, b = torch.randn(2, 3, generator=gen), torch.randn(2, 3, generator=gen)
    lp, lse, ent = K.logprob_fwd(x, labels, with_entropy, temperature=t)
    xr = x.double().requires_grad_()
    rlp, rent = reference(xr / t, labels)
    torch.testing.assert_close(lp.double(), rlp, **TOL[torch.float32])
    if with_entropy:
        torch.testing.assert_close(ent.double(), rent, **TOL[torch.float32])
    robj = (rlp * a.double()).sum() + ((rent * b.double()).sum() if with_entropy else 0)
    (rg,) = torch.autograd.grad(robj, xr)
    out = torch.empty_like(x)
    K.logprob_bwd(x, labels, lse, ent, a, b if with_entropy else None, out, temperature=t)
    torch.testing.assert_close(out.double(), rg, **TOL[dtype])


def test_an_out_of_range_label_reads_nothing_and_gives_minus_inf():
    """Labels -1 and V in rows between others: -inf, not the element before or after the row (the neighbour
    row's memory), and the other rows keep their log-probs."""
    x, labels = randn(1, 5, 40, seed=4), labels_for((1, 5), 40)
    labels[0, 1], labels[0, 3] = -1, 40
    lp, _ = K.triton_logprobs(x, labels)
    assert lp[0, 1] == lp[0, 3] == float("-inf")
    keep = [0, 2, 4]
    torch.testing.assert_close(lp[0, keep].double(), reference(x[0, keep], labels[0, keep])[0], **TOL[F32])


def test_the_default_forward_is_the_lane_scheme(monkeypatch):
    """Without a forced configuration the forward runs per-lane running sums (FWD_CONFIGS[0]), not the
    tile-reducing scheme: the same numbers to the bit as the forced lanes, other bits than the forced tiles, and
    the tile scheme's helper runs only where tile-reduce is asked for."""
    x, labels = randn(4, 3000, seed=9), labels_for((4,), 3000)
    tiles, real = [], K._row_tiles
    monkeypatch.setattr(K, "_row_tiles", lambda *a: tiles.append(1) or real(*a))
    got = {}
    for name, cfg in (("default", None), ("lanes", "1024,4,3,0"), ("tiles", "1024,4,3,1")):
        if cfg is None:
            monkeypatch.delenv("GRPO_BENCH_LOGPROB_FWD_CFG", raising=False)
        else:
            monkeypatch.setenv("GRPO_BENCH_LOGPROB_FWD_CFG", cfg)
        got[name] = torch.cat(K.triton_logprobs(x, labels, True))
        got[name + " tiles"] = len(tiles)
    assert torch.equal(got["default"], got["lanes"]) and not torch.equal(got["default"], got["tiles"])
    assert (got["default tiles"], got["lanes tiles"]) == (0, 0) and got["tiles tiles"] == 4   # a row each


def test_forward_configurations_are_valid_up_to_their_edges(monkeypatch):
    """fwd_config_valid at each bound: the smallest tile, every warp count, stages 1 and 8, a thread's share of
    32 values (64 reducing tiles) and one past each; $GRPO_BENCH_LOGPROB_FWD_CFG comes back as 4 numbers."""
    valid = [(16, 1, 1), (1024, 32, 8), (1024, 16, 1, 0), (1024, 8, 1), (1024, 1, 1), (2048, 1, 1, 1), (4096, 2, 8, 1)]
    invalid = [(8, 1, 1), (1024, 3, 1), (1024, 64, 1), (1024, 4, 0), (1024, 4, 9), (2048, 1, 1), (4096, 1, 1, 1),
               (1024, 4, 1, 2), (1024, 4), (1024, 4, 1, 0, 0)]
    assert all(K.fwd_config_valid(c) for c in valid), [c for c in valid if not K.fwd_config_valid(c)]
    assert not any(K.fwd_config_valid(c) for c in invalid), [c for c in invalid if K.fwd_config_valid(c)]
    for env, want in (("1024,2,4", (1024, 2, 4, 0)), ("2048,1,4,1", (2048, 1, 4, 1))):
        monkeypatch.setenv("GRPO_BENCH_LOGPROB_FWD_CFG", env)
        assert K.fwd_env_config() == want


def test_the_launch_rule_by_hand(monkeypatch):
    """Tiles of at least 16 lanes, the forward's at most FWD_BLOCK_V_MAX with 4 warps, the backward's at most
    BLOCK_V_MAX with 4, 8 or 16 warps by the tile (the H100 tuning), one program a row up to MAX_PROGRAMS; and
    the backward launches with its own rule."""
    monkeypatch.delenv("GRPO_BENCH_LOGPROB_FWD_CFG", raising=False)
    for v, fwd, bwd in ((3, (16, 4), (16, 4)), (512, (512, 4), (512, 4)), (600, (1024, 4), (1024, 8)),
                        (1024, (1024, 4), (1024, 8)), (1025, (1024, 4), (2048, 8)), (2049, (1024, 4), (4096, 16)),
                        (4096, (1024, 4), (4096, 16)), (50_257, (1024, 4), (8192, 16))):
        assert K._launch_cfg(7, v) == dict(grid=(7,), BLOCK_V=fwd[0], num_warps=fwd[1]), v
        assert K._launch_cfg(7, v, backward=True) == dict(grid=(7,), BLOCK_V=bwd[0], num_warps=bwd[1]), v
    assert K._launch_cfg(1, 10)["grid"] == (1,) and K._launch_cfg(5 << 20, 10)["grid"] == (K.MAX_PROGRAMS,)
    launched = []
    real = K._logprob_bwd

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                launched.append((grid, kw["BLOCK_V"], kw["num_warps"]))
                return real[grid](*args, **kw)
            return launch

    monkeypatch.setattr(K, "_logprob_bwd", Spy())
    x, labels = randn(1, 2, 3000, seed=2).requires_grad_(), labels_for((1, 2), 3000)
    K.triton_logprobs(x, labels)[0].sum().backward()
    assert launched == [((2,), 4096, 16)]


def test_an_unused_entropy_gradient_runs_the_kernel_without_it(monkeypatch):
    """Entropy returned but not in the objective: the backward gets no entropy gradient (not zeros pushed through
    its terms) and gives the log-prob's gradient to the bit; entropy not asked for is not returned."""
    x, labels = randn(2, 3, 50, seed=7), labels_for((2, 3), 50)
    seen, real = [], K.logprob_bwd
    monkeypatch.setattr(K, "logprob_bwd", lambda *a, **kw: seen.append(a[5]) or real(*a, **kw))
    grads = []
    for with_entropy in (False, True):
        xg = x.clone().requires_grad_()
        lp, ent = K.triton_logprobs(xg, labels, with_entropy)
        assert (ent is None) != with_entropy
        (g,) = torch.autograd.grad((lp * torch.arange(6.0).view(2, 3)).sum(), xg)
        grads.append(g)
    assert seen == [None, None] and torch.equal(grads[0], grads[1])
    assert K.triton_logprobs(x, labels)[1] is None


@pytest.mark.parametrize("layout", ["every_other_column", "transposed"])
def test_logits_strided_along_the_vocabulary_are_read_as_they_are(layout):
    """A view whose vocabulary stride is not 1 (every other column of a wider tensor; a (B, V, L) tensor seen as
    (B, L, V), whose rows have unit stride instead) is made contiguous before the kernel, which walks a row at
    unit stride: the fp64 log-probs, entropy and gradient of the view's own numbers."""
    if layout == "every_other_column":
        base = randn(2, 3, 2 * 37, seed=13).requires_grad_()
        view = lambda t: t[..., ::2]  # noqa: E731
    else:
        base = randn(2, 37, 3, seed=13).requires_grad_()
        view = lambda t: t.transpose(1, 2)  # noqa: E731
    x, labels = view(base), labels_for((2, 3), 37)
    assert x.shape == (2, 3, 37) and x.stride(-1) != 1
    lp, ent = K.triton_logprobs(x, labels, True)
    xr = view(base.detach()).double().requires_grad_()
    rlp, rent = reference(xr, labels)
    torch.testing.assert_close(lp.double(), rlp, **TOL[F32])
    torch.testing.assert_close(ent.double(), rent, **TOL[F32])
    (g,) = torch.autograd.grad((lp + ent).sum(), base)
    (rg,) = torch.autograd.grad((rlp + rent).sum(), xr)
    torch.testing.assert_close(view(g).double(), rg, **TOL[F32])
    assert g.abs().sum() == view(g).abs().sum()   # nothing outside the view


# ----------------------------------------------------------------- full size, GPU only

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="full-size kernel checks need a GPU")


def _full_check(logits, labels, with_entropy=True):
    x = logits.clone().requires_grad_()
    lp, ent = K.triton_logprobs(x, labels, with_entropy)
    xr = logits.float().requires_grad_()  # fp32 torch reference: fp64 at this size is slow
    lsm = torch.log_softmax(xr, -1)
    rlp = lsm.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    rent = -(lsm.exp() * lsm).sum(-1)
    torch.testing.assert_close(lp, rlp, rtol=1e-4, atol=1e-4)
    a = torch.randn_like(rlp)
    obj, robj = (lp * a).sum(), (rlp * a).sum()
    if with_entropy:
        torch.testing.assert_close(ent, rent, rtol=1e-4, atol=1e-4)
        obj, robj = obj + ent.sum(), robj + rent.sum()
    (g,) = torch.autograd.grad(obj, x)
    (rg,) = torch.autograd.grad(robj, xr)
    torch.testing.assert_close(g.float(), rg, **(TOL[logits.dtype] if logits.dtype != torch.float32
                                                   else dict(rtol=1e-4, atol=1e-6)))


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v", [50_257, 151_936, 262_144])
def test_full_size_gpu(dtype, v):
    torch.manual_seed(0)
    logits = (3 * torch.randn(2048, v, dtype=F32, device="cuda")).to(dtype)
    _full_check(logits, torch.randint(0, v, (2048,), device="cuda"))


@gpu
def test_more_rows_than_a_grid_dimension_gpu():
    torch.manual_seed(0)
    logits = torch.randn(2, 70_000, 256, dtype=F32, device="cuda")  # L >= 65,536 breaks a (B, L) grid
    _full_check(logits[:, :-1], torch.randint(0, 256, (2, 69_999), device="cuda"))
