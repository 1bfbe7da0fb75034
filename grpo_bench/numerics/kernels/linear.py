"""Fused LM head + log-prob: hidden (N, H) and weight (V, H) -> log p(label), in row chunks.

The (N, V) logits are the largest tensor of a GRPO step (4096 tokens x 151,936 vocab is
2.5 GB in fp32); here only one chunk of them exists at a time. Forward: per chunk,
logits = h @ W^T (+ b) in the hidden dtype, then the log-prob row op (chunked torch or
the Triton kernel) on fp32(logits) / T, T the sampling temperature. Backward: per chunk,
recompute the logits, turn them in place into d/d logits with the row op's backward, then
dh = dz @ W and dW += dz^T @ h. The GEMMs stay in torch (cuBLAS / MKL); only the softmax
part is ours. dW and db accumulate in fp32 whatever the weight dtype, so bf16 weights
don't lose the small chunks' updates.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .chunked import as_bl, row_blocks, rows_backward, rows_forward, work_buffers
from .chunked import default_rows as chunked_rows


def default_rows(n: int, v: int, h: int, device: torch.device | str) -> int:
    """Rows per chunk for n rows of hidden size h and vocabulary v."""
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
    """hidden (B, L, H), weight (V, H), bias (V)|None, labels (B, L) -> logp [, entropy] (B, L) fp32."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, with_entropy: bool, use_triton: bool, rows: int,
                temperature: float):
        b, l, _ = hidden.shape
        v = weight.shape[0]
        logp = torch.empty(b, l, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(2, b, l, dtype=torch.float32, device=hidden.device) if use_triton else None
        ent = torch.empty_like(logp) if with_entropy else None
        zbuf = torch.empty(rows * v, dtype=hidden.dtype, device=hidden.device)
        bufs = None if use_triton else work_buffers(rows, v, hidden.dtype, hidden.device, with_entropy, temperature)
        for bi, li in row_blocks(b, l, rows):
            z = _logits(hidden[bi, li], weight, bias, zbuf)  # (b', l', V)
            if use_triton:
                from .logprob import logprob_fwd
                lp, ls, h = logprob_fwd(z, labels[bi, li], with_entropy, temperature)
                lse[:, bi, li] = ls
            else:
                lp, h = rows_forward(z, labels[bi, li], with_entropy, *bufs, temperature=temperature)
            logp[bi, li] = lp
            if with_entropy:
                ent[bi, li] = h
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, ent)
        ctx.use_triton, ctx.rows, ctx.temperature = use_triton, rows, temperature
        return (logp, ent) if with_entropy else logp

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor | None, ge: Tensor | None = None):
        hidden, weight, bias, labels, lse, ent = ctx.saved_tensors
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
        bufs = None if ctx.use_triton else work_buffers(ctx.rows, v, hidden.dtype, hidden.device, ge is not None, tau)
        for bi, li in row_blocks(b, l, ctx.rows):
            h = hidden[bi, li]
            z = _logits(h, weight, bias, zbuf)
            gi, gei = g[bi, li], None if ge is None else ge[bi, li]
            enti = None if ent is None else ent[bi, li]
            if ctx.use_triton:
                from .logprob import logprob_bwd
                logprob_bwd(z, labels[bi, li], lse[:, bi, li], enti, gi, gei, out=z, temperature=tau)
            else:
                rows_backward(z, labels[bi, li], gi, gei, enti, z, *bufs, temperature=tau)
            if need_h:
                dh[bi, li] = torch.matmul(z, weight)
            z2 = z.reshape(-1, v)
            if need_w:
                h2 = h.reshape(-1, hdim)
                if z2.dtype == torch.float32:
                    dw.addmm_(z2.t(), h2)
                else:
                    dw += torch.mm(z2.t(), h2)
            if need_b:
                db += z2.sum(0, dtype=torch.float32)
        dw = dw.to(weight.dtype) if need_w else None
        db = db.to(bias.dtype) if need_b else None
        return dh, dw, db, None, None, None, None, None


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
                          temperature: float = 1.0) -> tuple[Tensor, Tensor | None]:
    """hidden (..., H), weight (V, H), labels (...) -> fp32 log p(label) (...), entropy (...) or None,
    under softmax(fp32(hidden @ W^T + bias) / temperature)."""
    shape = labels.shape
    x = as_bl(hidden)
    lab = labels.reshape(x.shape[:2])
    if not use_triton:
        lab = lab.long()
    rows = rows or default_rows(x.shape[0] * x.shape[1], weight.shape[0], x.shape[-1], x.device)
    out = LinearLogProb.apply(x, weight, bias, lab, with_entropy, use_triton, rows, float(temperature))
    if with_entropy:
        return out[0].reshape(shape), out[1].reshape(shape)
    return out.reshape(shape), None
