"""Triton GRPO loss: ratio, clip, KL, mask and aggregation in one pass, forward and backward.

Every registry aggregation is linear in the per-sequence masked sums of the per-token
loss, with a weight per sequence that depends only on the mask:

    token_mean               w_s = 1 / max(sum of all lengths, 1)
    seq_mean_token_mean      w_s = [len_s > 0] / (max(len_s, 1) * max(#non-empty, 1))
    seq_mean_token_sum_norm  w_s = 1 / (S * max_len)

So the forward kernel (one program per sequence, looping over T) only emits, per
sequence, sum policy loss, sum KL, clipped-token count and length; torch turns those
into the scalar. The backward kernel recomputes each token's derivative and scales it
by g * w_s, reading logp/old/ref/mask once and writing d loss / d logp once. GSPO's
sequence ratio needs a masked mean over T before any token, so its forward loops over
T twice and stores the ratio for the backward.

The gradient matches autograd's on ties too (ratio exactly 1, the first inner step):
torch.minimum splits a tie's gradient evenly and clamp passes it on the closed interval,
so inside the trust region it is that of ratio * A. old_logp, ref_logp and the deltas
are data here (no gradient), as they are in GRPO.
Hyper-parameters are compile-time constants: one compile per configuration of a run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

LOSSES = {"naive": 0, "unclipped": 1, "clipped": 2, "gspo": 3}
KLS = {"k1": 1, "k2": 2, "k3": 3}  # 0: no KL term
AGGREGATES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
MAX_PROGRAMS = 1 << 20  # any positive values are correct; tests shrink them
BLOCK_T_MAX = 1024


@dataclass(frozen=True)
class LossSpec:
    loss: str
    kl: str | None
    kl_coef: float
    aggregate: str
    clip_low: float
    clip_high: float
    max_len: int | None = None

    def _parts(self):
        return (("loss", self.loss, LOSSES), ("aggregate", self.aggregate, AGGREGATES), ("kl", self.kl or "k1", KLS))

    def fusable(self) -> bool:
        return all(name in known for _, name, known in self._parts())

    def check(self) -> None:
        for what, name, known in self._parts():
            if name not in known:
                raise ValueError(f"the fused loss kernel has no {what} {name!r} (it has {', '.join(known)}); "
                                 "use backend='torch'")


@triton.jit
def _token(logp, old, ref, adv, seq_ratio, LOSS: tl.constexpr, KL: tl.constexpr,
           COEF: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr):
    """Per-token (policy loss, KL, clipped?, d(policy + COEF * KL)/d logp)."""
    if LOSS == 0:
        pol = -logp * adv
        dpol = -adv + tl.zeros_like(logp)
        clipped = tl.zeros_like(logp)
    elif LOSS == 1:
        r = tl.exp(logp - old)
        pol = -r * adv
        dpol = pol
        clipped = tl.zeros_like(logp)
    else:
        if LOSS == 3:
            r = seq_ratio + tl.zeros_like(logp)  # d ratio / d logp_t = ratio: GSPO-token form
        else:
            r = tl.exp(logp - old)
        u = r * adv
        v = tl.minimum(tl.maximum(r, LO), HI) * adv
        pol = -tl.minimum(u, v)
        # The clipped term strictly wins only with r outside [LO, HI], where clamp passes no
        # gradient: zero. Otherwise the gradient is that of -r * A, ties included: inside the
        # range torch.minimum splits it evenly between two equal gradients, and a tie
        # outside the range needs A == 0.
        clip = u > v
        dpol = tl.where(clip, 0.0, -adv * r)
        clipped = clip.to(tl.float32)
    if KL == 0:
        kl = tl.zeros_like(logp)
        dkl = tl.zeros_like(logp)
    else:
        d = logp - ref
        if KL == 1:
            kl = d
            dkl = 1.0 + tl.zeros_like(logp)
        elif KL == 2:
            kl = 0.5 * d * d
            dkl = d
        else:
            e = tl.exp(-d)
            kl = e - 1.0 + d
            dkl = 1.0 - e
    return pol, kl, clipped, dpol + COEF * dkl


@triton.jit
def _operands(old_ptr, ref_ptr, offs, inb, lp, LOSS: tl.constexpr, KL: tl.constexpr):
    """old and ref log-probs, loaded only when the loss mode / KL estimator reads them."""
    old = lp
    ref = lp
    if LOSS != 0:
        old = tl.load(old_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    if KL != 0:
        ref = tl.load(ref_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    return old, ref


@triton.jit
def _gspo_ratio(logp_ptr, old_ptr, mask_ptr, row, T, BLOCK_T: tl.constexpr):
    lr = tl.zeros([BLOCK_T], tl.float32)
    cnt = tl.zeros([BLOCK_T], tl.float32)
    for t0 in range(0, T, BLOCK_T):
        idx = t0 + tl.arange(0, BLOCK_T)
        inb = idx < T
        m = tl.load(mask_ptr + row + idx, mask=inb, other=0.0)
        lp = tl.load(logp_ptr + row + idx, mask=inb, other=0.0).to(tl.float32)
        old = tl.load(old_ptr + row + idx, mask=inb, other=0.0).to(tl.float32)
        lr += tl.where(m > 0, lp - old, 0.0)
        cnt += m
    return tl.exp(tl.sum(lr, axis=0) / tl.maximum(tl.sum(cnt, axis=0), 1.0))


@triton.jit
def _loss_fwd(logp_ptr, old_ptr, ref_ptr, adv_ptr, mask_ptr, stats_ptr, ratio_ptr, S, T,
              LOSS: tl.constexpr, KL: tl.constexpr, COEF: tl.constexpr, LO: tl.constexpr,
              HI: tl.constexpr, BLOCK_T: tl.constexpr):
    for s in tl.range(tl.program_id(0).to(tl.int64), S, tl.num_programs(0)):
        row = s * T
        adv = tl.load(adv_ptr + s).to(tl.float32)
        seq_ratio = 1.0
        if LOSS == 3:
            seq_ratio = _gspo_ratio(logp_ptr, old_ptr, mask_ptr, row, T, BLOCK_T)
            tl.store(ratio_ptr + s, seq_ratio)
        pol_acc = tl.zeros([BLOCK_T], tl.float32)
        kl_acc = tl.zeros([BLOCK_T], tl.float32)
        clip_acc = tl.zeros([BLOCK_T], tl.float32)
        len_acc = tl.zeros([BLOCK_T], tl.float32)
        for t0 in range(0, T, BLOCK_T):
            idx = t0 + tl.arange(0, BLOCK_T)
            inb = idx < T
            m = tl.load(mask_ptr + row + idx, mask=inb, other=0.0)
            lp = tl.load(logp_ptr + row + idx, mask=inb, other=0.0).to(tl.float32)
            old, ref = _operands(old_ptr, ref_ptr, row + idx, inb, lp, LOSS, KL)
            pol, kl, clipped, _ = _token(lp, old, ref, adv, seq_ratio, LOSS, KL, COEF, LO, HI)
            on = m > 0  # where, not a product: a padded token's inf must not reach the sum
            pol_acc += tl.where(on, pol, 0.0)
            kl_acc += tl.where(on, kl, 0.0)
            clip_acc += tl.where(on, clipped, 0.0)
            len_acc += m
        out = stats_ptr + s * 4
        tl.store(out, tl.sum(pol_acc, axis=0))
        tl.store(out + 1, tl.sum(kl_acc, axis=0))
        tl.store(out + 2, tl.sum(clip_acc, axis=0))
        tl.store(out + 3, tl.sum(len_acc, axis=0))


@triton.jit
def _loss_bwd(logp_ptr, old_ptr, ref_ptr, adv_ptr, mask_ptr, w_ptr, ratio_ptr, dlogp_ptr, S, T,
              LOSS: tl.constexpr, KL: tl.constexpr, COEF: tl.constexpr, LO: tl.constexpr,
              HI: tl.constexpr, BLOCK_T: tl.constexpr):
    for s in tl.range(tl.program_id(0).to(tl.int64), S, tl.num_programs(0)):
        row = s * T
        adv = tl.load(adv_ptr + s).to(tl.float32)
        w = tl.load(w_ptr + s)
        seq_ratio = 1.0
        if LOSS == 3:
            seq_ratio = tl.load(ratio_ptr + s)
        for t0 in range(0, T, BLOCK_T):
            idx = t0 + tl.arange(0, BLOCK_T)
            inb = idx < T
            m = tl.load(mask_ptr + row + idx, mask=inb, other=0.0)
            lp = tl.load(logp_ptr + row + idx, mask=inb, other=0.0).to(tl.float32)
            old, ref = _operands(old_ptr, ref_ptr, row + idx, inb, lp, LOSS, KL)
            _, _, _, d = _token(lp, old, ref, adv, seq_ratio, LOSS, KL, COEF, LO, HI)
            grad = tl.where(m > 0, w * d, 0.0)
            tl.store(dlogp_ptr + row + idx, grad.to(dlogp_ptr.dtype.element_ty), mask=inb)


def seq_weights(aggregate: str, lengths: Tensor, t: int, max_len: int | None) -> Tensor:
    """(S,) weights with aggregate(per_token, mask) == sum_s w_s * (masked sum of sequence s)."""
    s = lengths.numel()
    if aggregate == "token_mean":
        return (1.0 / lengths.sum().clamp(min=1)).expand(s)
    if aggregate == "seq_mean_token_mean":
        has = (lengths > 0).to(lengths.dtype)
        return has / (lengths.clamp(min=1) * has.sum().clamp(min=1))
    norm = t if max_len is None else max_len
    return torch.full((s,), 1.0 / (max(s, 1) * norm), dtype=lengths.dtype, device=lengths.device)


def _consts(spec: LossSpec, with_kl: bool, t: int) -> dict:
    return dict(LOSS=LOSSES[spec.loss], KL=KLS[spec.kl] if with_kl else 0,
                COEF=float(spec.kl_coef) if with_kl else 0.0,
                LO=1.0 - spec.clip_low, HI=1.0 + spec.clip_high,
                BLOCK_T=min(BLOCK_T_MAX, triton.next_power_of_2(max(t, 16))), num_warps=4)


class FusedGRPOLoss(torch.autograd.Function):
    """logp, old, ref (S, T), deltas (S,), mask (S, T) fp32 -> loss (), per-sequence stats (S, 4)."""

    @staticmethod
    def forward(ctx, logp: Tensor, old: Tensor, ref: Tensor | None, deltas: Tensor, mask: Tensor,
                spec: LossSpec):
        s, t = logp.shape
        with_kl = ref is not None
        consts = _consts(spec, with_kl, t)
        ref_ = ref if with_kl else old  # any valid pointer; KL=0 never reads it
        stats = torch.zeros(s, 4, dtype=torch.float32, device=logp.device)
        ratio = torch.ones(s, dtype=torch.float32, device=logp.device)
        grid = (max(1, min(s, MAX_PROGRAMS)),)
        if s:
            _loss_fwd[grid](logp, old, ref_, deltas, mask, stats, ratio, s, t, **consts)
        w = seq_weights(spec.aggregate, stats[:, 3], t, spec.max_len)
        total = stats[:, 0] + consts["COEF"] * stats[:, 1]
        ctx.save_for_backward(logp, old, ref_, deltas, mask, w, ratio)
        ctx.consts, ctx.grid = consts, grid
        ctx.mark_non_differentiable(stats)
        return (w * total).sum(), stats

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor, _g_stats: Tensor | None):
        logp, old, ref, deltas, mask, w, ratio = ctx.saved_tensors
        s, t = logp.shape
        dlogp = torch.empty_like(logp)
        if s:
            _loss_bwd[ctx.grid](logp, old, ref, deltas, mask, (w * g).contiguous(), ratio, dlogp, s, t,
                                **ctx.consts)
        return dlogp, None, None, None, None, None


def fused_grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, deltas: Tensor,
                    mask: Tensor, spec: LossSpec) -> tuple[Tensor, dict[str, Tensor]]:
    """logp (..., T), deltas (...) -> scalar loss, {loss/policy, clip/frac[, kl/value]} (see grpo_loss)."""
    spec.check()
    t = logp.shape[-1]

    def rows(x: Tensor) -> Tensor:
        return x.detach().reshape(-1, t).contiguous()

    with_kl = spec.kl is not None and spec.kl_coef != 0 and ref_logp is not None
    m = mask.to(torch.float32).reshape(-1, t).contiguous()
    value, per_seq = FusedGRPOLoss.apply(logp.reshape(-1, t).contiguous(), rows(old_logp),
                                         rows(ref_logp) if with_kl else None,
                                         deltas.detach().reshape(-1).contiguous(), m, spec)
    pol, kl, clipped, lengths = per_seq.unbind(1)
    n = lengths.sum().clamp(min=1)
    stats = {"loss/policy": (seq_weights(spec.aggregate, lengths, t, spec.max_len) * pol).sum(),
             "clip/frac": clipped.sum() / n}
    if with_kl:
        stats["kl/value"] = kl.sum() / n
    return value, stats
