"""Triton logits -> GRPO loss in one kernel: each row's logits read for its log-sum-exp and,
at once, again for its gradient, written in the logits' dtype in the forward.

GRPO's d loss / d logp_t = w_s * (gate * dpol_t + beta * dkl_t) needs only token t's own
log-prob once the per-sequence weights w_s are known, and those depend on the mask alone
(kernels/loss.py). So one program per row (a token): pass 1 over its V logits is the online
log-sum-exp of logprob.py; then log p(label), the token's loss terms and dL/dlogp; pass 2
writes dL/dx = dL/dlogp * (onehot(label) - softmax x) straight away, while the row may still
sit in L1/L2 (REVERSE walks it backwards, so the tiles read last are re-read first). There is
no backward pass over the logits: backward only scales the stored gradient when grad_output
is not 1 (loss.scale_rows, a no-op launch otherwise).

Rows that need no gradient pass are skipped: a masked row (about half of a ragged batch) reads
no logits and writes zeros; a row whose dL/dlogp is exactly 0 (a clipped token without KL, a
zero advantage) writes zeros after pass 1. The gradient goes to a fresh buffer, or into the
logits themselves when the caller allows (inplace=True: the logits are garbage afterwards).

Three launches around it: loss._lengths (tokens per sequence), this kernel, loss._reduce (the
scalar and the statistics). GSPO's sequence ratio needs every log-prob of a sequence before
any token's gradient, so it goes through token_logprobs + grpo_loss instead (fused_logits_loss
returns None for it). Launch configurations: TILES below; CONFIGS is the short list the GPU
benchmark tries side by side (tests/benchmarks/test_bench_grpo_step.py), whose winner belongs in TILES.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from .chunked import as_bl
from .loss import (BLOCK_T_MAX, _lengths, _seq_weight, _store_part, _token, launch_consts, reduce_parts,
                   rows, scale_rows, stats_dict)
from .spec import LossSpec

FLOOR: tl.constexpr = tl.constexpr(-1e30)  # logprob.py's clamp: -inf logits never meet -inf in a subtraction
MAX_PROGRAMS = 1 << 20  # any positive value is correct; tests shrink it

# (BLOCK_V, num_warps, programs per SM (0: one program per row), REVERSE) by vocabulary:
# the first entry whose bound is >= V. Not yet measured for this kernel: chosen from
# logprob.py's H100 tuning (narrow tiles and many rows in flight for reading, wide tiles and
# 16 warps for writing) until the GPU run's sweep (CONFIGS) says otherwise.
TILES = [(65_536, (2048, 8, 0, True)), (1 << 62, (4096, 16, 0, True))]
# The short list the GPU benchmark times per vocabulary (one compile each, ~1-2 s). One
# program per row keeps the most bytes in flight; a few programs per SM bound the rows in
# flight (132 SMs x 2 x 100 KB rows at V = 50,257 is 26 MB, inside the H100's 50 MB L2), so the
# second pass may read from L2 rather than HBM, at the cost of fewer loads in flight.
CONFIGS = [(1024, 4, 0, True), (2048, 8, 0, True), (4096, 16, 0, True), (2048, 8, 0, False), (4096, 8, 4, True),
           (8192, 16, 2, True), (8192, 16, 1, True), (2048, 4, 4, True)]
MAX_PER_THREAD = 64  # BLOCK_V / (32 * num_warps) fp32 values a thread holds per tile: past this, spills


def valid(cfg) -> bool:
    """A configuration every GPU compiles: power-of-two tile, warps in 1..32, a tile a thread can hold (so a
    tile of at most 32 x 32 x 64 = 65,536)."""
    block, warps, per_sm, _ = cfg
    return (block >= 16 and block & (block - 1) == 0 and warps in (1, 2, 4, 8, 16, 32) and per_sm >= 0
            and block // (32 * warps) <= MAX_PER_THREAD)


def config(v: int):
    """TILES' entry for V, or $GRPO_BENCH_LOGITS_LOSS_CFG = "BLOCK_V,warps,per_sm,reverse" (the sweep)."""
    env = os.environ.get("GRPO_BENCH_LOGITS_LOSS_CFG")
    if env:
        try:
            b, w, p, r = (int(x) for x in env.split(","))
            cfg = (b, w, p, bool(r))
        except ValueError:
            cfg = None
        if cfg is None or not valid(cfg):
            raise ValueError(f"GRPO_BENCH_LOGITS_LOSS_CFG={env!r} is not a valid configuration (BLOCK_V a power of "
                             f"two <= 65536, warps in 1..32, at most {MAX_PER_THREAD} values a thread)")
        return cfg
    return next(c for bound, c in TILES if v <= bound)


@triton.jit
def _zero_row(dbase, V, BLOCK_V: tl.constexpr):
    cols = tl.arange(0, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        idx = start + cols
        tl.store(dbase + idx, tl.zeros([BLOCK_V], tl.float32).to(dbase.dtype.element_ty), mask=idx < V)


@triton.jit
def _logits_loss_fwd(x_ptr, lab_ptr, old_ptr, ref_ptr, gate_ptr, adv_ptr, mask_ptr, len_ptr, part_ptr, dx_ptr,
                     n_rows, S, T, sxb, sxl, slb, sll, sdb, sdl, V, G, norm, coef,
                     LOSS: tl.constexpr, KL: tl.constexpr, GATED: tl.constexpr,
                     LO: tl.constexpr, HI: tl.constexpr, C: tl.constexpr, TP: tl.constexpr, TN: tl.constexpr,
                     AGG: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK_S: tl.constexpr, GP: tl.constexpr,
                     BLOCK_V: tl.constexpr, REVERSE: tl.constexpr):
    cols = tl.arange(0, BLOCK_V)
    n_tiles = tl.cdiv(V, BLOCK_V)
    for r in tl.range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        s = r // T
        t = r % T
        dbase = dx_ptr + s * sdb + t * sdl
        m = tl.load(mask_ptr + r)
        if m > 0:
            base = x_ptr + s * sxb + t * sxl
            mx = tl.full([BLOCK_V], FLOOR, tl.float32)
            acc = tl.zeros([BLOCK_V], tl.float32)
            for start in range(0, V, BLOCK_V):  # pass 1: online log-sum-exp, one exp per element
                idx = start + cols
                x = tl.maximum(tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32), FLOOR)
                delta = x - mx
                d = tl.exp(-tl.abs(delta))
                acc = tl.where(delta > 0, acc * d + 1.0, acc + d)
                mx = tl.maximum(mx, x)
            row_max = tl.max(mx, axis=0)
            log_s = tl.log(tl.sum(acc * tl.exp(mx - row_max), axis=0))
            label = tl.load(lab_ptr + s * slb + t * sll).to(tl.int64)
            # an out-of-range label reads nothing and gives -inf, as in logprob.py
            x_lab = tl.load(base + label, mask=(label >= 0) & (label < V), other=float("-inf")).to(tl.float32)
            logp = (x_lab - row_max) - log_s
            old = logp
            ref = logp
            gate = 1.0
            if LOSS != 0 or KL == 7:
                old = tl.load(old_ptr + r).to(tl.float32)
            if KL != 0:
                ref = tl.load(ref_ptr + r).to(tl.float32)
            if GATED:
                gate = tl.load(gate_ptr + r).to(tl.float32)
            adv = tl.load(adv_ptr + s).to(tl.float32)
            w = _seq_weight(len_ptr, s, S, G, norm, AGG, BLOCK_S, GP)
            pol, kl, low, high, extra, dpol, dkl = _token(logp, old, ref, adv, 1.0, LOSS, KL, LO, HI, C, TP, TN)
            _store_part(part_ptr + r * 8, w, gate * pol, kl, low, high, extra, 1.0, coef)
            if WRITE_GRAD:
                dl = w * (gate * dpol + coef * dkl)
                if dl != 0:
                    shift = row_max + log_s
                    for i in range(0, n_tiles):  # pass 2: the gradient, in the logits' dtype
                        if REVERSE:
                            start = (n_tiles - 1 - i) * BLOCK_V
                        else:
                            start = i * BLOCK_V
                        idx = start + cols
                        inb = idx < V
                        x = tl.maximum(tl.load(base + idx, mask=inb, other=float("-inf")).to(tl.float32), FLOOR)
                        p = tl.exp(x - shift)
                        dx = tl.where(idx == label, dl, 0.0) - p * dl
                        tl.store(dbase + idx, dx.to(dx_ptr.dtype.element_ty), mask=inb)
                else:
                    _zero_row(dbase, V, BLOCK_V)
        else:
            _store_part(part_ptr + r * 8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, coef)
            if WRITE_GRAD:
                _zero_row(dbase, V, BLOCK_V)


@functools.lru_cache(maxsize=8)
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _programs(n_rows: int, per_sm: int, device: torch.device) -> int:
    """per_sm programs per SM striding over the rows (bounds the rows in flight, so a row's second
    pass can find it in L2), or one program per row (per_sm 0, or off CUDA)."""
    n = per_sm * _sms(device.index if device.index is not None else torch.cuda.current_device()) \
        if per_sm and device.type == "cuda" else n_rows
    return min(n_rows, n, MAX_PROGRAMS)


class FusedLogitsLoss(torch.autograd.Function):
    """logits (B, T, V), labels (B, T), old, ref, gate, mask (B, T), deltas (B,) -> loss (), statistics (8,)."""

    @staticmethod
    def forward(ctx, x: Tensor, labels: Tensor, old: Tensor, ref: Tensor | None, gate: Tensor | None, deltas: Tensor,
                mask: Tensor, spec: LossSpec, group: int, write_grad: bool, inplace: bool):
        s, t, v = x.shape
        n = s * t
        dev = x.device
        consts = launch_consts(spec, group, s)
        block, warps, per_sm, reverse = config(v)
        lengths = torch.empty(s, dtype=torch.float32, device=dev)
        parts = torch.empty(max(n, 1), 8, dtype=torch.float32, device=dev)
        dx = (x if inplace else torch.empty_like(x)) if write_grad else x  # x: a valid pointer, never written
        if n:
            _lengths[(min(s, MAX_PROGRAMS),)](mask, lengths, s, t,
                                              BLOCK_T=min(BLOCK_T_MAX, triton.next_power_of_2(max(t, 16))), num_warps=4)
            _logits_loss_fwd[(_programs(n, per_sm, dev),)](
                x, labels, old, ref if ref is not None else old, gate if gate is not None else mask, deltas, mask,
                lengths, parts, dx, n, s, t, x.stride(0), x.stride(1), labels.stride(0), labels.stride(1),
                dx.stride(0), dx.stride(1), v, group, float(t if spec.max_len is None else spec.max_len),
                float(spec.kl_coef), WRITE_GRAD=write_grad, BLOCK_V=block, REVERSE=reverse,
                num_warps=warps, **consts)
        if inplace and write_grad:  # so that an op that saved these logits for its backward (tanh) fails loudly
            torch.autograd.graph.increment_version(x)
        value, stats = reduce_parts(parts, n)
        ctx.grad = dx if write_grad else None
        ctx.mark_non_differentiable(stats)
        return value, stats

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor, _g_stats: Tensor | None):
        dx, ctx.grad = ctx.grad, None
        if dx is None:
            raise RuntimeError("grpo_loss_from_logits wrote its gradient in the forward and has handed it out: its "
                               "backward runs once per forward (no second backward through the same graph)")
        scale_rows(dx, g)
        return dx, None, None, None, None, None, None, None, None, None, None


def fused_logits_loss(logits: Tensor, labels: Tensor, old_logp: Tensor, ref_logp: Tensor | None, deltas: Tensor,
                      mask: Tensor, spec: LossSpec, gate: Tensor | None,
                      inplace: bool) -> tuple[Tensor, dict[str, Tensor]] | None:
    """logits (..., T, V), labels and the loss's (..., T) inputs -> scalar loss, statistics; None for GSPO."""
    spec.check()
    if spec.loss == "gspo":
        return None
    t = labels.shape[-1]
    group = labels.shape[-2] if spec.aggregate == "prompt_mean" else 1
    x = as_bl(logits)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.shape[1] != t:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree on T")

    write_grad = torch.is_grad_enabled() and logits.requires_grad
    if inplace and write_grad and logits.is_leaf:
        raise ValueError("inplace=True would overwrite a leaf tensor that requires grad; pass inplace=False")
    value, stats = FusedLogitsLoss.apply(x, labels.reshape(x.shape[:2]), rows(old_logp, t),
                                         rows(ref_logp, t) if spec.kl else None, rows(gate, t) if spec.gated else None,
                                         rows(deltas, 1).view(-1), rows(mask, t), spec, group, write_grad, inplace)
    return value, stats_dict(stats, spec)
