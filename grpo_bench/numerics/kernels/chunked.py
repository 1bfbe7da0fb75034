"""Row-chunked log-prob of the chosen token in pure torch: the CPU path and the reference
the Triton kernel is timed against.

log_softmax(logits).gather(label) writes an (N, V) fp32 tensor only to read N numbers
back; on CPU most of its time goes to faulting in that fresh tensor's pages. Here a
few rows at a time go through ATen's fused log_softmax into one reused buffer small
enough to stay in cache, so extra memory is O(rows * V) whatever N is. The backward
recomputes the softmax of each chunk from the saved logits (nothing (N, V) is saved)
and writes the gradient straight into the output tensor.

Leading dims are kept as a (B, L) pair rather than flattened, because the usual input
`logits[:, :-1]` cannot be flattened without a copy of the whole tensor.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

# Any value below log(smallest fp32 subnormal) ~ -104 has exp() == 0 exactly; clamping
# log-probs there keeps p * log p at 0 instead of 0 * -inf = nan for -inf logits.
_LOG_FLOOR = -1e3


def as_bl(x: Tensor, trailing: int = 1) -> Tensor:
    """View x (..., *trailing dims) as (B, L, *trailing), copying only if it must."""
    lead = x.shape[: x.dim() - trailing]
    rest = x.shape[x.dim() - trailing:]
    if len(lead) == 0:
        return x.reshape(1, 1, *rest)
    if len(lead) == 1:
        return x.unsqueeze(0)
    if len(lead) == 2:
        return x
    try:
        return x.view(-1, lead[-1], *rest)
    except RuntimeError:
        return x.reshape(-1, lead[-1], *rest)


def row_blocks(b: int, l: int, rows: int) -> Iterator[tuple[slice, slice]]:
    """(B, L) index blocks of about `rows` rows each, in memory order."""
    if l >= rows:
        for i in range(b):
            for j in range(0, l, rows):
                yield slice(i, i + 1), slice(j, min(j + rows, l))
    else:
        k = max(1, rows // max(l, 1))
        for i in range(0, b, k):
            yield slice(i, min(i + k, b)), slice(0, l)


def default_rows(n: int, v: int, device: torch.device) -> int:
    """Rows per chunk for n rows of v logits."""
    if device.type == "cuda":  # chunks only bound memory here; large ones hide launch latency
        return max(1, (256 << 20) // (4 * max(v, 1)))
    # CPU: at least 16 chunks, so the extra memory stays under 1/16 of the naive path's
    # (N, V) fp32 tensor; at most 16 MiB each. Cache-sized chunks (2-4 MiB) are ~15% faster
    # on idle cores, but every chunk costs a few OpenMP fork-joins, and when other processes
    # share the cores each join can wait a whole time slice: 4 MiB chunks then ran 10x slower.
    budget = min(16 << 20, max(1 << 20, 4 * n * v // 16))
    return max(1, budget // (4 * max(v, 1)))


def _work(buf: Tensor, like: Tensor) -> Tensor:
    return buf.view(-1)[: like.numel()].view(like.shape)


def _tempered(x: Tensor, temperature: float, buf2: Tensor | None) -> Tensor:
    """x in fp32 divided by the temperature, as the sampler computes it: fp32(x) / T, never x / T
    in x's own dtype (bf16 logits / T round to other log-probs)."""
    if x.dtype == torch.float32 and temperature == 1.0:
        return x
    xf = _work(buf2, x).copy_(x)
    return xf if temperature == 1.0 else xf.div_(temperature)


def rows_forward(x: Tensor, labels: Tensor, with_entropy: bool, buf: Tensor, buf2: Tensor | None,
                 temperature: float = 1.0) -> tuple[Tensor, Tensor | None]:
    """x (..., V) any float dtype -> fp32 log p(label) (...) and entropy (...) or None, of x / T."""
    xf = _tempered(x, temperature, buf2)
    lsm = torch.log_softmax(xf, -1, out=_work(buf, x))
    logp = lsm.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ent = None
    if with_entropy:
        lsm.clamp_(min=_LOG_FLOOR)
        p = torch.exp(lsm, out=_work(buf2, x))
        ent = -(p.mul_(lsm).sum(-1))
    return logp, ent


def rows_backward(x: Tensor, labels: Tensor, g: Tensor, ge: Tensor | None, ent: Tensor | None,
                  out: Tensor, buf: Tensor, buf2: Tensor | None, temperature: float = 1.0) -> None:
    """Write d(sum g*logp + ge*H)/dx into out (x's shape), logp and H being those of x / T; out may alias x."""
    xf = _tempered(x, temperature, buf2)
    g = g.unsqueeze(-1)
    if ge is None:
        # an fp32 output that is not the input itself takes the softmax directly: no copy
        direct = out.dtype == torch.float32 and out.is_contiguous() and out.data_ptr() != x.data_ptr()
        p = torch.softmax(xf, -1, out=out if direct else _work(buf, x))
        p.mul_(-g)  # -g * p
    else:
        # dH/dx = -p * (log p + H): grad = g*onehot - p * (g + ge * (log p + H))
        lsm = torch.log_softmax(xf, -1, out=_work(buf, x)).clamp_(min=_LOG_FLOOR)
        p = torch.exp(lsm, out=_work(buf2, x))
        coef = lsm.add_(ent.unsqueeze(-1)).mul_(ge.unsqueeze(-1)).add_(g)
        p.mul_(coef).neg_()
    p.scatter_add_(-1, labels.unsqueeze(-1), g)
    if temperature != 1.0:
        p.div_(temperature)  # d(x / T)/dx, in fp32 before any cast, as autograd through the division
    if p is not out:
        out.copy_(p)


def work_buffers(rows: int, v: int, dtype: torch.dtype, device, with_entropy: bool,
                 temperature: float = 1.0) -> tuple[Tensor, Tensor | None]:
    buf = torch.empty(rows * v, dtype=torch.float32, device=device)
    need2 = with_entropy or dtype != torch.float32 or temperature != 1.0
    return buf, (torch.empty(rows * v, dtype=torch.float32, device=device) if need2 else None)


class ChunkedLogProb(torch.autograd.Function):
    """logits (B, L, V), labels (B, L) -> logp (B, L) fp32 [, entropy (B, L) fp32]."""

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, with_entropy: bool, rows: int):
        b, l, v = logits.shape
        rows = max(1, min(rows, b * l))
        logp = torch.empty(b, l, dtype=torch.float32, device=logits.device)
        ent = torch.empty_like(logp) if with_entropy else None
        buf, buf2 = work_buffers(rows, v, logits.dtype, logits.device, with_entropy)
        for bi, li in row_blocks(b, l, rows):
            lp, h = rows_forward(logits[bi, li], labels[bi, li], with_entropy, buf, buf2)
            logp[bi, li] = lp
            if with_entropy:
                ent[bi, li] = h
        ctx.rows = rows
        ctx.set_materialize_grads(False)  # an unused entropy output should cost nothing
        ctx.save_for_backward(logits, labels, ent)
        if with_entropy:
            return logp, ent
        return logp

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor, ge: Tensor | None = None):
        logits, labels, ent = ctx.saved_tensors
        b, l, v = logits.shape
        if g is None:
            g = torch.zeros(b, l, dtype=torch.float32, device=logits.device)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        buf, buf2 = work_buffers(ctx.rows, v, logits.dtype, logits.device, ge is not None)
        for bi, li in row_blocks(b, l, ctx.rows):
            rows_backward(logits[bi, li], labels[bi, li], g[bi, li], None if ge is None else ge[bi, li],
                          None if ent is None else ent[bi, li], grad[bi, li], buf, buf2)
        return grad, None, None, None


def chunked_logprobs(logits: Tensor, labels: Tensor, with_entropy: bool = False,
                     rows: int | None = None) -> tuple[Tensor, Tensor | None]:
    """logits (..., V), labels (...) -> fp32 log p(label) (...), entropy (...) or None."""
    shape = labels.shape
    x = as_bl(logits)
    lab = labels.reshape(x.shape[:2]).long()
    rows = rows or default_rows(x.shape[0] * x.shape[1], x.shape[-1], x.device)
    out = ChunkedLogProb.apply(x, lab, with_entropy, rows)
    if with_entropy:
        return out[0].reshape(shape), out[1].reshape(shape)
    return out.reshape(shape), None


def rows_sum_pi_squared(x: Tensor, temperature: float = 1.0) -> Tensor:
    """x (..., V) any float dtype -> sum_v softmax(fp32(x) / T)_v^2 (...) in fp32, no grad.

    exp(logsumexp(2 z) - 2 logsumexp(z)): exact in log space, as verl's
    calculate_sum_pi_squared_from_logits; -inf logits contribute 0.
    """
    z = x.float()
    if temperature != 1.0:
        z = z / temperature
    return torch.exp(torch.logsumexp(2.0 * z, -1) - 2.0 * torch.logsumexp(z, -1))


@torch.no_grad()
def chunked_sum_pi_squared(logits: Tensor, temperature: float = 1.0, rows: int | None = None) -> Tensor:
    """logits (..., V) -> sum_v pi_v^2 (...) fp32, a few rows at a time: the statistic of the whole
    distribution that the Optimal Token Baseline needs, with O(rows * V) extra memory."""
    shape = logits.shape[:-1]
    x = as_bl(logits)
    b, l, v = x.shape
    rows = rows or default_rows(b * l, v, x.device)
    out = torch.empty(b, l, dtype=torch.float32, device=x.device)
    for bi, li in row_blocks(b, l, max(1, min(rows, b * l))):
        out[bi, li] = rows_sum_pi_squared(x[bi, li], temperature)
    return out.reshape(shape)

