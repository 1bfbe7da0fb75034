"""Triton row ops of the tiled LM head (linear.py's TiledLinearLogProb): fold a logits tile into
per-row online-logsumexp state, and turn a recomputed tile into its gradient in place.

A tile is rows [r0, r0 + r) x vocabulary [c0, c0 + c) of hidden @ W^T, written by cuBLAS into a
buffer whose row stride is a multiple of 128 (any V, 50,257 included, gives 16-byte aligned rows).
The forward keeps four fp32 numbers a row across tiles: the max m, s = sum exp(x - m),
t = sum exp(x - m) (x - m) for the entropy, and the label's logit; the last tile turns them into
log p(label), the log-sum-exp (as m and log s, for the backward) and the entropy. Within a tile,
each lane keeps its own running state and the lanes merge once at the end, as in logprob.py
(one exp per element, no reduction per block). The gradient kernel is elementwise over a 2-D grid.

Everything is in fp32 of the tempered logits fp32(z) / T (correctly rounded division).
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

# The tuning table. tile_mib: bytes of the (rows, cols) logits tile (the buffer the GEMMs write;
# the backward's only large temporary besides an fp32 (rows, H) accumulator); min_cols: the
# narrowest vocabulary tile before rows are split instead (a row split adds an fp32 (V, H)
# accumulator for dW); fwd/bwd: (BLOCK, num_warps) of the two kernels. "default" is what
# linear_logprobs runs; the benchmark (tests/benchmarks/test_bench_grpo_step.py) times every entry
# on CUDA beside it, with its peak memory. Every entry compiles for sm_90 (test_kernels_compile).
CONFIGS = {
    # TRL 1.16 holds a 256 MiB bf16 tile too (4,096 x 32,768); with all N rows in one tile, dW is
    # written once per vocabulary tile in the weight's dtype, and TRL's fp32 (V, H) dW never exists
    "default": dict(tile_mib=256, min_cols=4096, fwd=(1024, 4), bwd=(1024, 4)),
    # half the tile: half its memory, twice the GEMM launches (still >= 4,096 wide at N = 16,384)
    "tile128": dict(tile_mib=128, min_cols=4096, fwd=(1024, 4), bwd=(1024, 4)),
    # wider blocks for both kernels (logprob.py's backward was fastest with 8,192 x 16 warps)
    "wide": dict(tile_mib=256, min_cols=4096, fwd=(2048, 8), bwd=(4096, 8)),
}

# -inf stand-in: never meets -inf in a subtraction; exp(FLOOR - a real max) is exactly 0
FLOOR: tl.constexpr = tl.constexpr(-1e30)


@triton.jit
def _tempered(ptrs, mask, keep, temp, TEMPERED: tl.constexpr):
    # loads where `mask`, keeps where `keep` (-inf elsewhere): see `cl` in _fold_fwd
    x = tl.where(keep, tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32), float("-inf"))
    if TEMPERED:  # fp32(z) / T as the sampler divides (`/` may be approximate)
        x = tl.math.div_rn(x, temp)
    return x


@triton.jit
def _fold_fwd(z_ptr, sz, lab_ptr, st_ptr, sst, logp_ptr, ent_ptr, c, cl, col0, temp,
              BLOCK: tl.constexpr, WITH_ENTROPY: tl.constexpr, TEMPERED: tl.constexpr,
              FIRST: tl.constexpr, LAST: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    base = z_ptr + r * sz
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], FLOOR, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    t = tl.zeros([BLOCK], tl.float32)
    # columns [c, cl) are the buffer's padding, read and dropped: with cl a multiple of 16 every
    # tile's loads are 16-byte vectors, the last (odd-width) tile's included
    for start in range(0, cl, BLOCK):
        idx = start + cols
        x = tl.maximum(_tempered(base + idx, idx < cl, idx < c, temp, TEMPERED), FLOOR)
        # either the max moves up to x (old terms scale by exp(m - x)) or the new term is exp(x - m)
        delta = x - m
        d = tl.exp(-tl.abs(delta))
        up = delta > 0
        if WITH_ENTROPY:
            t = tl.where(up, d * (t - delta * s), t + d * delta)
        s = tl.where(up, s * d + 1.0, s + d)
        m = tl.maximum(m, x)
    mx = tl.max(m, axis=0)
    scale = tl.exp(m - mx)
    ss = tl.sum(s * scale, axis=0)
    ts = tl.sum(scale * (t + (m - mx) * s), axis=0)
    label = tl.load(lab_ptr + r).to(tl.int64) - col0
    here = (label >= 0) & (label < c)
    x_lab = _tempered(base + label, here, here, temp, TEMPERED)
    if FIRST:
        mm = mx
        s1 = ss
        t1 = ts
        xl = x_lab
    else:
        # merge (m0, s0, t0) and (mx, ss, ts); t is relative to the max, so it shifts by (m - M) s
        m0 = tl.load(st_ptr + r)
        s0 = tl.load(st_ptr + sst + r)
        t0 = tl.load(st_ptr + 2 * sst + r)
        xl = tl.where(here, x_lab, tl.load(st_ptr + 3 * sst + r))
        mm = tl.maximum(m0, mx)
        a = tl.exp(m0 - mm)
        b = tl.exp(mx - mm)
        s1 = a * s0 + b * ss
        t1 = a * (t0 + (m0 - mm) * s0) + b * (ts + (mx - mm) * ss)
    if LAST:
        log_s = tl.log(s1)
        # (x - max) - log s, never x - (max + log s): logits ~1e4 would round the latter
        tl.store(logp_ptr + r, (xl - mm) - log_s)
        tl.store(st_ptr + r, mm)
        tl.store(st_ptr + sst + r, log_s)
        if WITH_ENTROPY:
            tl.store(ent_ptr + r, log_s - t1 / s1)
    else:
        tl.store(st_ptr + r, mm)
        tl.store(st_ptr + sst + r, s1)
        tl.store(st_ptr + 2 * sst + r, t1)
        tl.store(st_ptr + 3 * sst + r, xl)


@triton.jit
def _grad_tile(z_ptr, sz, lab_ptr, st_ptr, sst, ent_ptr, g_ptr, ge_ptr, c, cl, col0, temp,
               BLOCK: tl.constexpr, WITH_ENTROPY: tl.constexpr, TEMPERED: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inb = idx < cl  # the padding [c, cl) gets p = 0 and a 0 gradient, which no GEMM reads
    ptrs = z_ptr + r * sz + idx
    x = tl.maximum(_tempered(ptrs, inb, idx < c, temp, TEMPERED), FLOOR)
    logp = (x - tl.load(st_ptr + r)) - tl.load(st_ptr + sst + r)
    p = tl.exp(logp)
    g = tl.load(g_ptr + r)
    coef = g
    if WITH_ENTROPY:
        coef = g + tl.load(ge_ptr + r) * (logp + tl.load(ent_ptr + r))  # dH/dx = -p (log p + H)
    label = tl.load(lab_ptr + r).to(tl.int64) - col0
    dx = tl.where(idx == label, g, 0.0) - p * coef
    if TEMPERED:  # d(z / T)/dz, in fp32 before the store's cast
        dx = tl.math.div_rn(dx, temp)
    tl.store(ptrs, dx.to(z_ptr.dtype.element_ty), mask=inb)


def _load_bound(tile: Tensor) -> int:
    """Columns the kernels read: the tile's width rounded up to 16 within the buffer's row stride, so
    that Triton sees a bound divisible by 16 (its loads are then vectors, where the exact width of
    an odd last tile would make every load of that tile scalar)."""
    return min(-(-tile.shape[1] // 16) * 16, max(tile.stride(0), tile.shape[1]))


def fold(tile: Tensor, labels: Tensor, state: Tensor, logp: Tensor, ent: Tensor | None, col0: int,
         temperature: float, first: bool, last: bool, cfg: dict) -> None:
    """Fold tile (r, c), unit stride on c, into state (4, N)[:, rows] (labels, logp, ent: those rows)."""
    block, warps = cfg["fwd"]
    r, c = tile.shape
    cl = _load_bound(tile)
    if r:
        _fold_fwd[(r,)](tile, tile.stride(0), labels, state, state.stride(0), logp,
                        logp if ent is None else ent, c, cl, col0, float(temperature),
                        BLOCK=min(block, triton.next_power_of_2(max(cl, 16))), WITH_ENTROPY=ent is not None,
                        TEMPERED=temperature != 1.0, FIRST=first, LAST=last, num_warps=warps)


def grad(tile: Tensor, labels: Tensor, state: Tensor, ent: Tensor | None, g: Tensor, ge: Tensor | None,
         col0: int, temperature: float, cfg: dict) -> None:
    """Overwrite tile (r, c) with d(sum g logp + ge H)/dz; state (2, N)[:, rows]: max and log-sum-exp."""
    block, warps = cfg["bwd"]
    r, c = tile.shape
    cl = _load_bound(tile)
    block = min(block, triton.next_power_of_2(max(cl, 16)))
    if r:
        _grad_tile[(r, triton.cdiv(cl, block))](tile, tile.stride(0), labels, state, state.stride(0),
                                                g if ent is None else ent, g, g if ge is None else ge, c, cl, col0,
                                                float(temperature), BLOCK=block, WITH_ENTROPY=ge is not None,
                                                TEMPERED=temperature != 1.0, num_warps=warps)
