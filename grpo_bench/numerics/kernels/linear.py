"""Fused LM head + log-prob: hidden (N, H) and weight (V, H) -> log p(label), never the (N, V) logits.

Two schedules, the same numbers (softmax(fp32(hidden @ W^T + b) / T), T the sampling temperature):

- chunked (CPU, `use_triton=False`): row chunks of whole vocabulary rows through the torch row ops
  of chunked.py. Forward: logits of a chunk, log-prob. Backward: recompute the chunk's logits, turn
  them in place into d/d logits, dh = dz @ W, dW += dz^T @ h in fp32.
- tiled (Triton, `use_triton=True`, TiledLinearLogProb): tiles of rows x vocabulary, all N rows
  in one tile when the memory budget allows, in a buffer whose row stride is a multiple of 128.
  Forward: per tile one GEMM, then head.py's kernel folds it into per-row online-logsumexp state.
  Backward: per tile the GEMM again, the gradient kernel in place, dh += dz @ W_c (fp32
  accumulator) and dW_c = dz^T @ h written straight into the weight's dtype (cuBLAS sums the
  N rows in fp32 and rounds once; with rows split, an fp32 (V, H) accumulator instead).

Why tiles of the vocabulary rather than whole rows: at V = 50,257 a whole-row chunk has an odd
row stride, so every bf16 GEMM that reads or writes it runs cuBLAS's unaligned kernels (the H100
run: 58 ms, slower than materialising the logits); and a row chunk adds a (V, H) partial dW into
an fp32 accumulator per chunk, where a vocabulary tile with every row writes its slice of dW once.
GEMMs: 4 vocabulary-sized ones (forward, recompute, dh, dW), as TRL's. Computing the gradient in
the forward would save the recompute only where whole rows fit in one chunk (the softmax needs
the row's log-sum-exp first), and dL/dlogp of a GRPO loss depends on log p itself, so no caller
has it in the forward; the recompute stays. dW and db accumulate in fp32 whatever the weight
dtype, so bf16 weights don't lose the small chunks' updates.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .chunked import as_bl, row_blocks, rows_backward, rows_forward, work_buffers
from .chunked import default_rows as chunked_rows


def default_rows(n: int, v: int, h: int, device: torch.device | str) -> int:
    """Rows per chunk of the chunked schedule (and of linear_sum_pi_squared), n rows of hidden size h."""
    if torch.device(device).type == "cuda":
        # Liger-Kernel's rule (chunk logits about as large as the hidden states) gives 64-row
        # chunks at N = 8,192, V = 151,936, H = 896: 128 GEMMs that each read the whole head
        # again, and a step 1.4x slower than the materialised one on an H100. Chunks of up to
        # n / 16 rows (a sixteenth of the logits, as on CPU) and at most 1 GiB of fp32 logits
        # keep the memory bounded while the GEMMs stay large enough to be fast.
        liger = 1 << math.ceil(math.log2(max(1, math.ceil(n / math.ceil(v / max(h, 1))))))
        return max(1, min(n, max(liger, min(n // 16, (1 << 30) // (4 * v)))))
    # CPU: every chunk reads all of W again, so a chunk needs enough rows for its GEMM to
    # outweigh that read (64 rows: 32 flop per fp32 weight byte), but at most n / 16 of them,
    # so the chunk stays under 1/16 of the (N, V) logits. A small vocabulary takes the row
    # ops' own rule (one chunk when the logits are small).
    return max(1, min(n, max(min(64, n // 16), chunked_rows(n, v, torch.device("cpu")))))


def _logits(h: Tensor, weight: Tensor, bias: Tensor | None, buf: Tensor) -> Tensor:
    """h (b, l, H) -> h @ W^T + bias (b, l, V), written into buf: a fresh tensor per chunk
    would fault in its pages every time on CPU."""
    h2 = h.reshape(-1, h.shape[-1])
    z = buf[: h2.shape[0] * weight.shape[0]].view(h2.shape[0], weight.shape[0])
    if bias is None:
        torch.mm(h2, weight.t(), out=z)
    else:
        torch.addmm(bias, h2, weight.t(), out=z)
    return z.view(*h.shape[:-1], weight.shape[0])


class LinearLogProb(torch.autograd.Function):
    """The chunked schedule: hidden (B, L, H), weight (V, H), bias (V)|None, labels (B, L) -> logp [, entropy]."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, with_entropy: bool, rows: int, temperature: float):
        b, l, _ = hidden.shape
        v = weight.shape[0]
        logp = torch.empty(b, l, dtype=torch.float32, device=hidden.device)
        ent = torch.empty_like(logp) if with_entropy else None
        zbuf = torch.empty(rows * v, dtype=hidden.dtype, device=hidden.device)
        bufs = work_buffers(rows, v, hidden.dtype, hidden.device, with_entropy, temperature)
        for bi, li in row_blocks(b, l, rows):
            z = _logits(hidden[bi, li], weight, bias, zbuf)  # (b', l', V)
            lp, h = rows_forward(z, labels[bi, li], with_entropy, *bufs, temperature=temperature)
            logp[bi, li] = lp
            if with_entropy:
                ent[bi, li] = h
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, bias, labels, ent)
        ctx.rows, ctx.temperature = rows, temperature
        return (logp, ent) if with_entropy else logp

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor | None, ge: Tensor | None = None):
        hidden, weight, bias, labels, ent = ctx.saved_tensors
        b, l, hdim = hidden.shape
        v = weight.shape[0]
        tau = ctx.temperature
        if g is None:
            g = torch.zeros(b, l, dtype=torch.float32, device=hidden.device)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dh = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_h else None
        dw = torch.zeros(v, hdim, dtype=torch.float32, device=weight.device) if need_w else None
        db = torch.zeros(v, dtype=torch.float32, device=weight.device) if need_b else None
        zbuf = torch.empty(ctx.rows * v, dtype=hidden.dtype, device=hidden.device)
        bufs = work_buffers(ctx.rows, v, hidden.dtype, hidden.device, ge is not None, tau)
        for bi, li in row_blocks(b, l, ctx.rows):
            h = hidden[bi, li]
            z = _logits(h, weight, bias, zbuf)
            gei, enti = (None, None) if ge is None else (ge[bi, li], ent[bi, li])
            rows_backward(z, labels[bi, li], g[bi, li], gei, enti, z, *bufs, temperature=tau)
            if need_h:
                dh[bi, li] = torch.matmul(z, weight)
            z2 = z.reshape(-1, v)
            if need_w:
                _addmm_fp32(dw, z2.t(), h.reshape(-1, hdim))
            if need_b:
                db += z2.sum(0, dtype=torch.float32)
        dw = dw.to(weight.dtype) if need_w else None
        db = db.to(bias.dtype) if need_b else None
        return dh, dw, db, None, None, None, None


def _addmm_fp32(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b into an fp32 acc, the product never rounded to a's dtype (TRL's helper: rounding
    each chunk's bf16 product before the sum biases training). cuBLAS takes bf16/fp16 inputs with an
    fp32 output (torch >= 2.8); elsewhere the inputs are cast."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif acc.is_cuda and a.dtype in (torch.float16, torch.bfloat16):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.float(), b.float())


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def tile_shape(n: int, v: int, esize: int, tile_bytes: int, min_cols: int, rows: int | None = None) -> tuple[int, int]:
    """(rows, cols) of the tiled schedule's logits tile for n rows, vocabulary v, esize-byte logits.

    Every row in one tile while a tile min_cols wide fits in tile_bytes (dW is then written
    once, no fp32 (V, H) accumulator); the widest tile that fits, then the vocabulary split
    into equal tiles, each a multiple of 128 wide (aligned rows for any V)."""
    vpad = _ceil(v, 128)
    elems = max(1, tile_bytes // esize)
    if rows is None:
        rows = elems // min(vpad, min_cols)
    rows = max(1, min(rows, n))
    widest = min(vpad, max(128, elems // rows // 128 * 128))
    return rows, _ceil(-(-v // -(-v // widest)), 128)


def _tiles(x: Tensor, weight: Tensor, bias: Tensor | None, buf: Tensor, rows: int, cols: int):
    """(r0, c0, h, w, z) per tile, rows outer: z = h @ w^T + bias[c0:] written into buf (row stride cols)."""
    for r0 in range(0, x.shape[0], rows):
        h = x[r0:r0 + rows]
        for c0 in range(0, weight.shape[0], cols):
            w = weight[c0:c0 + cols]
            z = buf[: h.shape[0], : w.shape[0]]
            if bias is None:
                torch.mm(h, w.t(), out=z)
            else:
                torch.addmm(bias[c0:c0 + cols], h, w.t(), out=z)
            yield r0, c0, h, w, z


class TiledLinearLogProb(torch.autograd.Function):
    """The tiled schedule: hidden (N, H), weight (V, H), bias (V)|None, labels (N,) -> logp [, entropy] (N,)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, with_entropy: bool, rows: int, cols: int, temperature: float,
                cfg: dict):
        from . import head

        n, v = hidden.shape[0], weight.shape[0]
        f32 = dict(dtype=torch.float32, device=hidden.device)
        logp = torch.empty(n, **f32)
        ent = torch.empty(n, **f32) if with_entropy else None
        state = torch.empty(4, n, **f32)  # max, sum exp, entropy sum, label logit; then max, log-sum-exp
        buf = torch.empty(rows, cols, dtype=hidden.dtype, device=hidden.device)  # rows <= N: tile_shape's
        for r0, c0, _, w, z in _tiles(hidden, weight, bias, buf, rows, cols):
            r1 = r0 + z.shape[0]
            head.fold(z, labels[r0:r1], state[:, r0:r1], logp[r0:r1], None if ent is None else ent[r0:r1], c0,
                      temperature, first=c0 == 0, last=c0 + w.shape[0] >= v, cfg=cfg)
        del buf
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, bias, labels, state[:2], ent)
        ctx.rows, ctx.cols, ctx.temperature, ctx.cfg = rows, cols, temperature, cfg
        return (logp, ent) if with_entropy else logp

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor | None, ge: Tensor | None = None):
        from . import head

        hidden, weight, bias, labels, lse, ent = ctx.saved_tensors
        (n, hdim), v = hidden.shape, weight.shape[0]
        rows, cols = ctx.rows, ctx.cols
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        f32 = dict(dtype=torch.float32, device=hidden.device)
        g = torch.zeros(n, **f32) if g is None else g.float().contiguous()
        ge = None if ge is None else ge.float().contiguous()
        one_row, one_col = rows >= n, cols >= v  # a single tile across: its GEMM writes the gradient directly
        dh = torch.empty_like(hidden) if need_h else None
        dh32 = torch.empty(rows, hdim, **f32) if need_h and not one_col else None
        dw = (torch.empty_like if n else torch.zeros_like)(weight) if need_w and one_row else None  # no rows: 0
        dw32 = torch.zeros(v, hdim, **f32) if need_w and not one_row else None
        db = torch.zeros(v, **f32) if need_b else None
        buf = torch.empty(rows, cols, dtype=hidden.dtype, device=hidden.device)
        for r0, c0, h, w, z in _tiles(hidden, weight, bias, buf, rows, cols):
            r1, c1 = r0 + z.shape[0], c0 + w.shape[0]
            head.grad(z, labels[r0:r1], lse[:, r0:r1], None if ge is None else ent[r0:r1], g[r0:r1],
                      None if ge is None else ge[r0:r1], c0, ctx.temperature, ctx.cfg)
            if need_h:
                if one_col:
                    torch.mm(z, w, out=dh[r0:r1])
                else:
                    acc = dh32[: z.shape[0]]
                    if c0 == 0:
                        acc.zero_()
                    _addmm_fp32(acc, z, w)
                    if c1 >= v:
                        dh[r0:r1].copy_(acc)
            if need_w:
                if one_row:
                    torch.mm(z.t(), h, out=dw[c0:c1])
                else:
                    _addmm_fp32(dw32[c0:c1], z.t(), h)
            if need_b:
                db[c0:c1] += z.sum(0, dtype=torch.float32)
        del buf
        if dw32 is not None:
            dw = dw32.to(weight.dtype)
        db = db.to(bias.dtype) if need_b else None
        return dh, dw, db, None, None, None, None, None, None


@torch.no_grad()
def linear_sum_pi_squared(hidden: Tensor, weight: Tensor, bias: Tensor | None = None, temperature: float = 1.0,
                          rows: int | None = None) -> Tensor:
    """hidden (..., H), weight (V, H) -> sum_v pi_v^2 (...) fp32 under softmax(fp32(hidden @ W^T + bias) / T),
    one chunk of rows of the logits at a time (the same chunks as the log-probs): never the (N, V) logits.
    No gradient: the Optimal Token Baseline reads it once per rollout, as a statistic of the old policy."""
    from .chunked import rows_sum_pi_squared

    shape = hidden.shape[:-1]
    x = as_bl(hidden)
    b, l, _ = x.shape
    v = weight.shape[0]
    rows = rows or default_rows(b * l, v, x.shape[-1], x.device)
    out = torch.empty(b, l, dtype=torch.float32, device=x.device)
    zbuf = torch.empty(rows * v, dtype=hidden.dtype, device=hidden.device)
    for bi, li in row_blocks(b, l, rows):
        out[bi, li] = rows_sum_pi_squared(_logits(x[bi, li], weight, bias, zbuf), temperature)
    return out.reshape(shape)


def fused_linear_logprobs(hidden: Tensor, weight: Tensor, labels: Tensor, with_entropy: bool = False,
                          bias: Tensor | None = None, use_triton: bool = False, rows: int | None = None,
                          temperature: float = 1.0, cols: int | None = None,
                          config: str = "default") -> tuple[Tensor, Tensor | None]:
    """hidden (..., H), weight (V, H), labels (...) -> fp32 log p(label) (...), entropy (...) or None,
    under softmax(fp32(hidden @ W^T + bias) / temperature).

    use_triton: the tiled schedule, tiles from head.py's CONFIGS[config] unless rows / cols are given;
    else the chunked one, `rows` rows a chunk."""
    shape = labels.shape
    if use_triton:
        from .head import CONFIGS

        if config not in CONFIGS:
            raise ValueError(f"kernels/head.py: no config {config!r} in CONFIGS; valid: {', '.join(CONFIGS)}")
        cfg = CONFIGS[config]
        x = hidden.reshape(-1, hidden.shape[-1])
        lab = labels.reshape(-1).contiguous()
        r, c = tile_shape(x.shape[0], weight.shape[0], x.element_size(), cfg["tile_mib"] << 20, cfg["min_cols"], rows)
        out = TiledLinearLogProb.apply(x, weight, bias, lab, with_entropy, r, cols or c, float(temperature), cfg)
    else:
        x = as_bl(hidden)
        lab = labels.reshape(x.shape[:2]).long()
        rows = rows or default_rows(x.shape[0] * x.shape[1], weight.shape[0], x.shape[-1], x.device)
        out = LinearLogProb.apply(x, weight, bias, lab, with_entropy, rows, float(temperature))
    if with_entropy:
        return out[0].reshape(shape), out[1].reshape(shape)
    return out.reshape(shape), None
