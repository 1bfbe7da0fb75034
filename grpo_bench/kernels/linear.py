"""Fused LM head + log-prob: hidden (N, H) and weight (V, H) -> log p(label), in row chunks.

The (N, V) logits are the largest tensor of a GRPO step (4096 tokens x 151,936 vocab is
2.5 GB in fp32); here only one chunk of them exists at a time. Forward: per chunk,
logits = h @ W^T (+ b) in the hidden dtype, then the log-prob row op (chunked torch or
the Triton kernel). Backward: per chunk, recompute the logits, turn them in place into
d/d logits with the row op's backward, then dh = dz @ W and dW += dz^T @ h. The GEMMs
stay in torch (cuBLAS / MKL); only the softmax part is ours. dW and db accumulate in
fp32 whatever the weight dtype, so bf16 weights don't lose the small chunks' updates.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .chunked import work_buffers, as_bl, row_blocks, rows_backward, rows_forward


def default_rows(n: int, v: int, h: int) -> int:
    # Chunk logits about as large as the hidden states themselves (Liger-Kernel's rule),
    # so the fused path never needs more than ~2x the memory of its inputs.
    return max(1, min(n, 1 << math.ceil(math.log2(max(1, math.ceil(n / math.ceil(v / max(h, 1))))))))


class LinearLogProb(torch.autograd.Function):
    """hidden (B, L, H), weight (V, H), bias (V)|None, labels (B, L) -> logp [, entropy] (B, L) fp32."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, with_entropy: bool, use_triton: bool, rows: int):
        b, l, _ = hidden.shape
        v = weight.shape[0]
        logp = torch.empty(b, l, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(2, b, l, dtype=torch.float32, device=hidden.device) if use_triton else None
        ent = torch.empty_like(logp) if with_entropy else None
        bufs = None if use_triton else work_buffers(rows, v, hidden.dtype, hidden.device, with_entropy)
        for bi, li in row_blocks(b, l, rows):
            z = F.linear(hidden[bi, li], weight, bias)  # (b', l', V), contiguous
            if use_triton:
                from .logprob import logprob_fwd
                lp, ls, h = logprob_fwd(z, labels[bi, li], with_entropy)
                lse[:, bi, li] = ls
            else:
                lp, h = rows_forward(z, labels[bi, li], with_entropy, *bufs)
            logp[bi, li] = lp
            if with_entropy:
                ent[bi, li] = h
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, ent)
        ctx.use_triton, ctx.rows = use_triton, rows
        return (logp, ent) if with_entropy else logp

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor | None, ge: Tensor | None = None):
        hidden, weight, bias, labels, lse, ent = ctx.saved_tensors
        b, l, hdim = hidden.shape
        v = weight.shape[0]
        if g is None:
            g = torch.zeros(b, l, dtype=torch.float32, device=hidden.device)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dh = torch.empty_like(hidden) if need_h else None
        dw = torch.zeros(v, hdim, dtype=torch.float32, device=weight.device) if need_w else None
        db = torch.zeros(v, dtype=torch.float32, device=weight.device) if need_b else None
        bufs = None if ctx.use_triton else work_buffers(ctx.rows, v, hidden.dtype, hidden.device, ge is not None)
        for bi, li in row_blocks(b, l, ctx.rows):
            h = hidden[bi, li]
            z = F.linear(h, weight, bias)
            gi, gei = g[bi, li], None if ge is None else ge[bi, li]
            if ctx.use_triton:
                from .logprob import logprob_bwd
                logprob_bwd(z, labels[bi, li], lse[:, bi, li], None if ent is None else ent[bi, li], gi, gei, out=z)
            else:
                rows_backward(z, labels[bi, li], gi, gei, None if ent is None else ent[bi, li], z, *bufs)
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
        return dh, dw, db, None, None, None, None


def fused_linear_logprobs(hidden: Tensor, weight: Tensor, labels: Tensor, with_entropy: bool = False,
                          bias: Tensor | None = None, use_triton: bool = False,
                          rows: int | None = None) -> tuple[Tensor, Tensor | None]:
    """hidden (..., H), weight (V, H), labels (...) -> fp32 log p(label) (...), entropy (...) or None."""
    shape = labels.shape
    x = as_bl(hidden)
    lab = labels.reshape(x.shape[:2])
    if not use_triton:
        lab = lab.long()
    rows = rows or default_rows(x.shape[0] * x.shape[1], weight.shape[0], x.shape[-1])
    out = LinearLogProb.apply(x, weight, bias, lab, with_entropy, use_triton, rows)
    if with_entropy:
        return out[0].reshape(shape), out[1].reshape(shape)
    return out.reshape(shape), None
