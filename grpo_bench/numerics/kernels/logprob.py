"""Triton log-prob of the chosen token: one online-logsumexp pass over each row.

Forward: each program walks whole rows of V in BLOCK_V tiles, keeping per-lane running
max m, sum s = sum exp(x - m) and, for the entropy, t = sum exp(x - m) * (x - m), all in
fp32; the lanes are merged once at the end of the row, so a tile needs no reduction and
one exp per element (bf16 at H100 bandwidth leaves little exp throughput to spare).
Keeping t relative to the max (rather than sum p * x) avoids cancelling two ~1e4 numbers
when logits are extreme. It stores log p(label), the row's max and log-sum-exp relative
to it, and optionally the entropy.

Backward: one more pass over the row computes p = exp(x - max - log s) tile by tile, writes
g * (onehot - p) - g_H * p * (log p + H) directly in the logits' dtype, so no softmax
tensor exists; the output may alias the logits (linear.py reuses its logits chunk).

Grid: 1-D, at most MAX_PROGRAMS programs striding over rows, so N has no limit of its own
(a (B, L) grid breaks at L >= 65,536). A row is addressed as (row // L, row % L) with
two strides in int64, so `logits[:, :-1]` is read in place.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .chunked import as_bl

# Any positive values are correct; tests shrink them to exercise the row loop and the tiles.
MAX_PROGRAMS = 1 << 20
# Tiles measured on an H100 (scripts/tune_logprob.py -> results/kernels/gpu/tune.csv, bf16,
# N = 16,384): the forward, which only reads, is fastest with narrow tiles and 4 warps (more
# rows in flight per SM: 14% faster than 4096-wide tiles at V = 50,257, equal at 151,936);
# the backward, which also writes V values a row, with 8192-wide tiles and 16 warps.
BLOCK_V_MAX = 8192
FWD_BLOCK_V_MAX = 1024
# The forward's launch configurations (BLOCK_V, num_warps, num_stages, tile-reduce) the GPU benchmark times side
# by side (tests/benchmarks/test_bench_logprobs.py, kernel "logprob_config"), the first being the rule above. On an
# H200 (results/gpu, 2026-11-30) no lane configuration came within 1.25x of Liger's forward at V 50,257, its own
# launch (one warp, 2048-wide tiles, 4 stages) included: the gap is the work an element costs, not the launch.
# Our lanes keep their running max and sum (no per-tile reduction: 3 selects and a rescale an element); Liger
# reduces each tile (a max, then a sum of exp against the new max). tile-reduce 1 runs that scheme in our kernel
# (_row_tiles). Lanes hold 2-3 fp32 values per element of a thread's share of a tile, so shares of 16-32
# (MAX_FWD_PER_THREAD) keep them in registers; a reduced tile holds one or two, so up to 64.
FWD_CONFIGS = [(1024, 4, 3, 0), (1024, 2, 4, 0), (512, 1, 4, 0),
               (2048, 1, 4, 1), (1024, 1, 4, 1), (1024, 2, 4, 1), (2048, 2, 4, 1), (1024, 4, 3, 1), (4096, 4, 4, 1)]
MAX_FWD_PER_THREAD = 32
MAX_TILE_PER_THREAD = 64

# Logits are clamped here so that -inf (a banned token) never meets -inf in a subtraction:
# exp(FLOOR - real max) is exactly 0, and every product stays finite. Logits below -1e30
# therefore count as -inf, which no model produces otherwise.
FLOOR: tl.constexpr = tl.constexpr(-1e30)


@triton.jit
def _load_row(ptrs, mask, temp, TEMPERED: tl.constexpr):
    x = tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32)
    if TEMPERED:  # fp32(x) / T correctly rounded, as the sampler's division (`/` may be approximate)
        x = tl.math.div_rn(x, temp)
    return x


@triton.jit
def _logprob_fwd(x_ptr, lab_ptr, logp_ptr, lse_ptr, ent_ptr,
                 n_rows, L, sxb, sxl, slb, sll, V, temp,
                 BLOCK_V: tl.constexpr, WITH_ENTROPY: tl.constexpr, TEMPERED: tl.constexpr,
                 TILE_REDUCE: tl.constexpr = False):
    cols = tl.arange(0, BLOCK_V)
    for r in tl.range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        base = x_ptr + (r // L) * sxb + (r % L) * sxl
        if TILE_REDUCE:
            mx, log_s, ent = _row_tiles(base, V, temp, cols, BLOCK_V, WITH_ENTROPY, TEMPERED)
        else:
            mx, log_s, ent = _row_lanes(base, V, temp, cols, BLOCK_V, WITH_ENTROPY, TEMPERED)
        label = tl.load(lab_ptr + (r // L) * slb + (r % L) * sll).to(tl.int64)
        # an out-of-range label reads nothing and gives -inf, not another row's memory
        x_lab = _load_row(base + label, (label >= 0) & (label < V), temp, TEMPERED)
        # (x - max) - log s, never x - (max + log s): with logits ~1e4 the latter rounds to 1e-3
        tl.store(logp_ptr + r, (x_lab - mx) - log_s)
        tl.store(lse_ptr + r, mx)
        tl.store(lse_ptr + n_rows + r, log_s)
        if WITH_ENTROPY:
            tl.store(ent_ptr + r, ent)


@triton.jit
def _row_lanes(base, V, temp, cols, BLOCK_V: tl.constexpr, WITH_ENTROPY: tl.constexpr, TEMPERED: tl.constexpr):
    """(row max, log sum exp(x - max), entropy or 0) with a running max and sum per lane, merged once."""
    m = tl.full([BLOCK_V], FLOOR, tl.float32)
    s = tl.zeros([BLOCK_V], tl.float32)
    t = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, V, BLOCK_V):
        idx = start + cols
        x = tl.maximum(_load_row(base + idx, idx < V, temp, TEMPERED), FLOOR)
        # One exp per element: either the max moves up to x (old terms scale by
        # exp(m - x), the new one is 1) or it stays (the new term is exp(x - m)).
        delta = x - m
        d = tl.exp(-tl.abs(delta))
        up = delta > 0
        if WITH_ENTROPY:
            t = tl.where(up, d * (t - delta * s), t + d * delta)
        s = tl.where(up, s * d + 1.0, s + d)
        m = tl.maximum(m, x)
    mx = tl.max(m, axis=0)
    scale = tl.exp(m - mx)
    ssum = tl.sum(s * scale, axis=0)
    log_s = tl.log(ssum)
    ent = 0.0
    if WITH_ENTROPY:
        ent = log_s - tl.sum(scale * (t + (m - mx) * s), axis=0) / ssum
    return mx, log_s, ent


@triton.jit
def _row_tiles(base, V, temp, cols, BLOCK_V: tl.constexpr, WITH_ENTROPY: tl.constexpr, TEMPERED: tl.constexpr):
    """The same three numbers with the tile reduced first (its max, then its sum against the new max), as
    Liger's forward does: two reductions a tile but fewer operations an element (no selects, no per-lane
    rescale), which is what a bandwidth-bound read has left to spend. t stays relative to the running max."""
    m = -1e30   # FLOOR, as a float literal: a loop-carried scalar must start as a value, not a constexpr
    s = 0.0
    t = 0.0
    for start in range(0, V, BLOCK_V):
        idx = start + cols
        x = tl.maximum(_load_row(base + idx, idx < V, temp, TEMPERED), FLOOR)
        new = tl.maximum(m, tl.max(x, axis=0))
        alpha = tl.exp(m - new)
        e = tl.exp(x - new)
        if WITH_ENTROPY:  # sum e (x - new), and the old terms moved from m to new: alpha (t + (m - new) s)
            t = alpha * (t + (m - new) * s) + tl.sum(e * (x - new), axis=0)
        s = s * alpha + tl.sum(e, axis=0)
        m = new
    log_s = tl.log(s)
    ent = 0.0
    if WITH_ENTROPY:
        ent = log_s - t / s
    return m, log_s, ent


@triton.jit
def _logprob_bwd(x_ptr, lab_ptr, lse_ptr, ent_ptr, g_ptr, ge_ptr, dx_ptr,
                 n_rows, L, sxb, sxl, slb, sll, sdb, sdl, sg, sge, V, temp,
                 BLOCK_V: tl.constexpr, WITH_ENTROPY: tl.constexpr, TEMPERED: tl.constexpr):
    cols = tl.arange(0, BLOCK_V)
    for r in tl.range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        b = r // L
        i = r % L
        base = x_ptr + b * sxb + i * sxl
        dbase = dx_ptr + b * sdb + i * sdl
        label = tl.load(lab_ptr + b * slb + i * sll).to(tl.int64)
        mx = tl.load(lse_ptr + r)
        log_s = tl.load(lse_ptr + n_rows + r)
        g = tl.load(g_ptr + r * sg).to(tl.float32)
        if WITH_ENTROPY:
            h = tl.load(ent_ptr + r)
            ge = tl.load(ge_ptr + r * sge).to(tl.float32)
        for start in range(0, V, BLOCK_V):
            idx = start + cols
            inb = idx < V
            x = tl.maximum(_load_row(base + idx, inb, temp, TEMPERED), FLOOR)
            logp = (x - mx) - log_s
            p = tl.exp(logp)
            coef = g
            if WITH_ENTROPY:
                coef = g + ge * (logp + h)  # dH/dx = -p (log p + H)
            dx = tl.where(idx == label, g, 0.0) - p * coef
            if TEMPERED:  # d(x / T)/dx, in fp32 before the store's cast
                dx = tl.math.div_rn(dx, temp)
            tl.store(dbase + idx, dx.to(dx_ptr.dtype.element_ty), mask=inb)


def fwd_config_valid(cfg) -> bool:
    """(BLOCK_V, warps, stages[, tile-reduce 0/1])."""
    if len(cfg) not in (3, 4):
        return False
    block, warps, stages, tile = (*cfg, 0)[:4]
    share = MAX_TILE_PER_THREAD if tile else MAX_FWD_PER_THREAD
    return (block >= 16 and block & (block - 1) == 0 and warps in (1, 2, 4, 8, 16, 32) and 1 <= stages <= 8
            and tile in (0, 1) and block // (32 * warps) <= share)


def fwd_env_config() -> tuple | None:
    """$GRPO_BENCH_LOGPROB_FWD_CFG = "BLOCK_V,warps,stages[,tile-reduce]" (the benchmark's sweep), checked, as a
    4-tuple; None when unset."""
    env = os.environ.get("GRPO_BENCH_LOGPROB_FWD_CFG")
    if not env:
        return None
    try:
        cfg = tuple(int(x) for x in env.split(","))
    except ValueError:
        cfg = ()
    if not fwd_config_valid(cfg):
        raise ValueError(f"GRPO_BENCH_LOGPROB_FWD_CFG={env!r} is not a valid configuration (BLOCK_V a power of two, "
                         f"warps in 1..32, stages in 1..8, tile-reduce 0 or 1, at most {MAX_FWD_PER_THREAD} values "
                         f"a thread, {MAX_TILE_PER_THREAD} with tile-reduce)")
    return (*cfg, 0)[:4]


def _launch_cfg(n_rows: int, v: int, backward: bool = False) -> dict:
    block = min(BLOCK_V_MAX, triton.next_power_of_2(max(v, 16)))
    grid = (min(n_rows, MAX_PROGRAMS),)   # n_rows >= 1: both callers launch only when there are rows
    if backward:
        warps = 16 if block >= 4096 else 8 if block >= 1024 else 4
    elif (forced := fwd_env_config()) is not None:
        cfg = dict(grid=grid, BLOCK_V=min(block, forced[0]), num_warps=forced[1], num_stages=forced[2])
        return cfg | ({"TILE_REDUCE": True} if forced[3] else {})
    else:
        block, warps = min(block, FWD_BLOCK_V_MAX), 4
    return dict(grid=grid, BLOCK_V=block, num_warps=warps)


def logprob_fwd(x: Tensor, labels: Tensor, with_entropy: bool,
                temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor | None]:
    """x (B, L, V) with unit stride on V, labels (B, L) -> logp (B, L), lse (2, B, L), entropy (B, L)|None
    of the tempered logits fp32(x) / T.

    lse holds each row's max and log-sum-exp relative to it; all fp32.
    """
    b, l, v = x.shape
    n = b * l
    logp = torch.empty(b, l, dtype=torch.float32, device=x.device)
    lse = torch.empty(2, b, l, dtype=torch.float32, device=x.device)  # row max, log sum exp(x - max)
    ent = torch.empty_like(logp) if with_entropy else logp  # dummy pointer when unused
    if n:
        cfg = _launch_cfg(n, v)
        _logprob_fwd[cfg.pop("grid")](x, labels, logp, lse, ent, n, l, x.stride(0), x.stride(1),
                                      labels.stride(0), labels.stride(1), v, float(temperature),
                                      WITH_ENTROPY=with_entropy, TEMPERED=temperature != 1.0, **cfg)
    return logp, lse, ent if with_entropy else None


def logprob_bwd(x: Tensor, labels: Tensor, lse: Tensor, ent: Tensor | None, g: Tensor,
                ge: Tensor | None, out: Tensor, temperature: float = 1.0) -> Tensor:
    """Write d(sum g*logp + ge*H)/dx into out (B, L, V), logp and H those of x / T; out may be x itself."""
    b, l, v = x.shape
    n = b * l
    # g and ge keep their stride (autograd often hands in an expanded, zero-stride grad);
    # lse and ent are indexed densely, so slices of them (linear.py's chunks) are copied
    g = g.reshape(n)
    lse = lse.reshape(2, n).contiguous()
    with_entropy = ge is not None
    ge = ge.reshape(n) if with_entropy else g
    ent = ent.reshape(n).contiguous() if with_entropy else g
    if n:
        cfg = _launch_cfg(n, v, backward=True)
        _logprob_bwd[cfg.pop("grid")](x, labels, lse, ent, g, ge, out,
                                      n, l, x.stride(0), x.stride(1), labels.stride(0), labels.stride(1),
                                      out.stride(0), out.stride(1), g.stride(0), ge.stride(0), v,
                                      float(temperature), WITH_ENTROPY=with_entropy,
                                      TEMPERED=temperature != 1.0, **cfg)
    return out


class TritonLogProb(torch.autograd.Function):
    """logits (B, L, V), labels (B, L) -> logp (B, L) fp32 [, entropy (B, L) fp32]."""

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, with_entropy: bool):
        logp, lse, ent = logprob_fwd(logits, labels, with_entropy)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, labels, lse, ent)
        return (logp, ent) if with_entropy else logp

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor | None, ge: Tensor | None = None):
        logits, labels, lse, ent = ctx.saved_tensors
        if g is None:
            g = torch.zeros(labels.shape, dtype=torch.float32, device=labels.device)
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        return logprob_bwd(logits, labels, lse, ent, g, ge, out), None, None


def triton_logprobs(logits: Tensor, labels: Tensor, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """logits (..., V), labels (...) -> fp32 log p(label) (...), entropy (...) or None."""
    shape = labels.shape
    x = as_bl(logits)
    if x.stride(-1) != 1:
        x = x.contiguous()
    lab = labels.reshape(x.shape[:2])
    out = TritonLogProb.apply(x, lab, with_entropy)
    if with_entropy:
        return out[0].reshape(shape), out[1].reshape(shape)
    return out.reshape(shape), None
