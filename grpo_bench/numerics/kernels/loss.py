"""Triton GRPO loss: ratio, clip, KL, gate, mask and aggregation in one pass, forward and backward.

Every registry aggregation is linear in the per-sequence masked sums of the per-token
loss, with a weight per sequence that depends only on the mask (n = responses with at
least one token; an empty response is not part of the batch, see algos/aggregate.py):

    token_mean               w_s = 1 / max(sum of all lengths, 1)
    token_sum                w_s = 1
    seq_mean_token_mean      w_s = [len_s > 0] / (max(len_s, 1) * n)
    seq_mean_token_sum       w_s = [len_s > 0] / n
    seq_mean_token_sum_norm  w_s = [len_s > 0] / (n * max_len)
    prompt_mean              w_s = [len_p > 0] / (max(len_p, 1) * n_p), len_p the tokens of s's group,
                             n_p the groups with any token (the group is the second-to-last axis)

So the forward kernel (one program per sequence, looping over T) only emits, per
sequence, the sums of the policy loss and of the KL, the token counts of the clip
regions (low, high, the loss's own: dual_clip's cap) and the length; torch turns those
into the scalar. The backward kernel recomputes each token's derivative and scales it by
g * w_s, reading logp/old/ref/gate/mask once and writing d loss / d logp once. GSPO's
sequence ratio needs a masked mean over T before any token, so its forward loops over T
twice and stores the ratio for the backward.

The gradient matches autograd's on ties too (ratio exactly 1, the first inner step):
torch.minimum splits a tie's gradient evenly and clamp passes it on the closed interval,
so inside the trust region it is that of ratio * A. old_logp, ref_logp, the gate and the
deltas are data here (no gradient), as they are in GRPO. The parts it covers and the
constants it takes from their parameters are in kernels/spec.py; every constant is a
compile-time one, so a run compiles once per configuration.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from .spec import LossSpec

MAX_PROGRAMS = 1 << 20  # any positive values are correct; tests shrink them
BLOCK_T_MAX = 1024
N_STATS = 6  # per sequence: policy sum, KL sum, low, high, extra-region counts, length


@triton.jit
def _token(logp, old, ref, adv, seq_ratio, LOSS: tl.constexpr, KL: tl.constexpr,
           LO: tl.constexpr, HI: tl.constexpr, C: tl.constexpr, TP: tl.constexpr, TN: tl.constexpr):
    """Per-token (policy loss, KL, low?, high?, extra?, d policy / d logp, d KL / d logp)."""
    zero = tl.zeros_like(logp)
    adv = adv + zero  # a vector, so that comparisons with it combine with per-token masks
    low = zero
    high = zero
    extra = zero
    if LOSS == 0:  # naive
        pol = -logp * adv
        dpol = -adv + zero
    elif LOSS == 1:  # unclipped
        r = tl.exp(logp - old)
        pol = -r * adv
        dpol = pol
    elif LOSS == 5:  # cispo: a truncated, constant weight on log pi
        r = tl.exp(logp - old)
        w = tl.minimum(tl.maximum(r, LO), HI)
        pol = -w * adv * logp
        dpol = -w * adv
        low = (r < LO).to(tl.float32)
        high = (r > HI).to(tl.float32)
    elif LOSS == 6:  # sapo: soft gate of the ratio, log-ratio clamped to [-20, 20]
        x = logp - old
        r = tl.exp(tl.minimum(tl.maximum(x, -20.0), 20.0))
        tau = tl.where(adv > 0, TP, TN)
        s = tl.sigmoid(tau * (r - 1.0))
        pol = -s * (4.0 / tau) * adv
        inside = (x >= -20.0) & (x <= 20.0)
        dpol = tl.where(inside, -4.0 * s * (1.0 - s) * r * adv, 0.0)
    else:  # clipped (2), gspo (3), dual_clip (4)
        if LOSS == 3:
            r = seq_ratio + zero  # d ratio / d logp_t = ratio: the GSPO-token form
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
        low = (clip & (adv < 0)).to(tl.float32)
        high = (clip & (adv > 0)).to(tl.float32)
        if LOSS == 4:  # with A < 0 the loss stops at -A * C, and so does its gradient
            cap = -adv * C
            dual = (adv < 0) & (pol > cap)
            pol = tl.where(dual, cap, pol)
            dpol = tl.where(dual, 0.0, dpol)
            extra = dual.to(tl.float32)
    if KL == 0:
        kl = zero
        dkl = zero
    else:
        d = logp - ref
        if KL == 1:  # k1
            kl = d
            dkl = 1.0 + zero
        elif KL == 2:  # k2
            kl = 0.5 * d * d
            dkl = d
        elif KL == 4:  # abs
            kl = tl.abs(d)
            dkl = tl.where(d > 0, 1.0, tl.where(d < 0, -1.0, 0.0))
        elif KL == 5:  # k1+: k1's value, k2's gradient
            kl = d
            dkl = d
        else:  # k3 (3), k3+ (6), k3_is (7)
            e = tl.exp(-d)
            kl = e - 1.0 + d
            dkl = 1.0 - e
            if KL == 6:
                dkl = d
            if KL == 7:  # (pi / pi_old) * k3: product rule, d ratio / d logp = ratio
                rho = tl.exp(logp - old)
                dkl = rho * kl + rho * dkl
                kl = rho * kl
    return pol, kl, low, high, extra, dpol, dkl


@triton.jit
def _operands(old_ptr, ref_ptr, gate_ptr, offs, inb, lp, LOSS: tl.constexpr, KL: tl.constexpr,
              GATED: tl.constexpr):
    """old, ref log-probs and the gate, loaded only when the configuration reads them."""
    old = lp
    ref = lp
    gate = tl.full(lp.shape, 1.0, tl.float32)
    if LOSS != 0 or KL == 7:
        old = tl.load(old_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    if KL != 0:
        ref = tl.load(ref_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    if GATED:
        gate = tl.load(gate_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    return old, ref, gate


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
        on = m > 0
        lr += tl.where(on, lp - old, 0.0)
        cnt += on.to(tl.float32)
    return tl.exp(tl.sum(lr, axis=0) / tl.maximum(tl.sum(cnt, axis=0), 1.0))


@triton.jit
def _loss_fwd(logp_ptr, old_ptr, ref_ptr, gate_ptr, adv_ptr, mask_ptr, stats_ptr, ratio_ptr, S, T,
              LOSS: tl.constexpr, KL: tl.constexpr, GATED: tl.constexpr,
              LO: tl.constexpr, HI: tl.constexpr, C: tl.constexpr, TP: tl.constexpr, TN: tl.constexpr,
              BLOCK_T: tl.constexpr):
    for s in tl.range(tl.program_id(0).to(tl.int64), S, tl.num_programs(0)):
        row = s * T
        adv = tl.load(adv_ptr + s).to(tl.float32)
        seq_ratio = 1.0
        if LOSS == 3:
            seq_ratio = _gspo_ratio(logp_ptr, old_ptr, mask_ptr, row, T, BLOCK_T)
            tl.store(ratio_ptr + s, seq_ratio)
        pol_acc = tl.zeros([BLOCK_T], tl.float32)
        kl_acc = tl.zeros([BLOCK_T], tl.float32)
        low_acc = tl.zeros([BLOCK_T], tl.float32)
        high_acc = tl.zeros([BLOCK_T], tl.float32)
        extra_acc = tl.zeros([BLOCK_T], tl.float32)
        len_acc = tl.zeros([BLOCK_T], tl.float32)
        for t0 in range(0, T, BLOCK_T):
            idx = t0 + tl.arange(0, BLOCK_T)
            inb = idx < T
            m = tl.load(mask_ptr + row + idx, mask=inb, other=0.0)
            lp = tl.load(logp_ptr + row + idx, mask=inb, other=0.0).to(tl.float32)
            old, ref, gate = _operands(old_ptr, ref_ptr, gate_ptr, row + idx, inb, lp, LOSS, KL, GATED)
            pol, kl, low, high, extra, _, _ = _token(lp, old, ref, adv, seq_ratio, LOSS, KL, LO, HI, C, TP, TN)
            on = m > 0  # where, not a product: a padded token's inf must not reach the sum
            pol_acc += tl.where(on, gate * pol, 0.0)
            kl_acc += tl.where(on, kl, 0.0)
            low_acc += tl.where(on, low, 0.0)
            high_acc += tl.where(on, high, 0.0)
            extra_acc += tl.where(on, extra, 0.0)
            len_acc += on.to(tl.float32)
        out = stats_ptr + s * 6
        tl.store(out, tl.sum(pol_acc, axis=0))
        tl.store(out + 1, tl.sum(kl_acc, axis=0))
        tl.store(out + 2, tl.sum(low_acc, axis=0))
        tl.store(out + 3, tl.sum(high_acc, axis=0))
        tl.store(out + 4, tl.sum(extra_acc, axis=0))
        tl.store(out + 5, tl.sum(len_acc, axis=0))


@triton.jit
def _loss_bwd(logp_ptr, old_ptr, ref_ptr, gate_ptr, adv_ptr, mask_ptr, w_ptr, ratio_ptr, dlogp_ptr, S, T, coef,
              LOSS: tl.constexpr, KL: tl.constexpr, GATED: tl.constexpr,
              LO: tl.constexpr, HI: tl.constexpr, C: tl.constexpr, TP: tl.constexpr, TN: tl.constexpr,
              BLOCK_T: tl.constexpr):
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
            old, ref, gate = _operands(old_ptr, ref_ptr, gate_ptr, row + idx, inb, lp, LOSS, KL, GATED)
            _, _, _, _, _, dpol, dkl = _token(lp, old, ref, adv, seq_ratio, LOSS, KL, LO, HI, C, TP, TN)
            grad = tl.where(m > 0, w * (gate * dpol + coef * dkl), 0.0)
            tl.store(dlogp_ptr + row + idx, grad.to(dlogp_ptr.dtype.element_ty), mask=inb)


def seq_weights(aggregate: str, lengths: Tensor, t: int, max_len: int | None, group: int = 1) -> Tensor:
    """(S,) weights with aggregate(per_token, mask) == sum_s w_s * (masked sum of sequence s)."""
    if aggregate == "prompt_mean":  # S = prompts * group, a prompt's responses adjacent
        per_prompt = lengths.view(-1, group).sum(-1, keepdim=True)
        n_p = (per_prompt > 0).to(lengths.dtype).sum().clamp(min=1)
        return ((per_prompt > 0).to(lengths.dtype) / (per_prompt.clamp(min=1) * n_p)).expand(-1, group).reshape(-1)
    has = (lengths > 0).to(lengths.dtype)
    n = has.sum().clamp(min=1)
    if aggregate == "token_mean":
        return (1.0 / lengths.sum().clamp(min=1)).expand(lengths.numel())
    if aggregate == "token_sum":
        return torch.ones_like(lengths)
    if aggregate == "seq_mean_token_mean":
        return has / (lengths.clamp(min=1) * n)
    if aggregate == "seq_mean_token_sum":
        return has / n
    return has / (n * (t if max_len is None else max_len))


def _launch_consts(spec: LossSpec, t: int) -> dict:
    consts = spec.constants()
    del consts["COEF"]  # a runtime argument: an adaptive beta changes it every rollout
    return consts | dict(BLOCK_T=min(BLOCK_T_MAX, triton.next_power_of_2(max(t, 16))), num_warps=4)


class FusedGRPOLoss(torch.autograd.Function):
    """logp, old, ref, gate (S, T), deltas (S,), mask (S, T) fp32 -> loss (), per-sequence stats (S, 6)."""

    @staticmethod
    def forward(ctx, logp: Tensor, old: Tensor, ref: Tensor | None, gate: Tensor | None, deltas: Tensor,
                mask: Tensor, spec: LossSpec):
        s, t = logp.shape
        consts = _launch_consts(spec, t)
        ref_ = ref if ref is not None else old      # any valid pointer; KL=0 never reads it
        gate_ = gate if gate is not None else mask  # likewise with GATED=False
        stats = torch.zeros(s, 6, dtype=torch.float32, device=logp.device)
        ratio = torch.ones(s, dtype=torch.float32, device=logp.device)
        grid = (max(1, min(s, MAX_PROGRAMS)),)
        if s:
            _loss_fwd[grid](logp, old, ref_, gate_, deltas, mask, stats, ratio, s, t, **consts)
        w = seq_weights(spec.aggregate, stats[:, 5], t, spec.max_len, spec.group)
        coef = spec.constants()["COEF"]
        total = stats[:, 0] + coef * stats[:, 1]
        ctx.save_for_backward(logp, old, ref_, gate_, deltas, mask, w, ratio)
        ctx.consts, ctx.grid, ctx.coef = consts, grid, coef
        ctx.mark_non_differentiable(stats)
        return (w * total).sum(), stats

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor, _g_stats: Tensor | None):
        logp, old, ref, gate, deltas, mask, w, ratio = ctx.saved_tensors
        s, t = logp.shape
        dlogp = torch.empty_like(logp)
        if s:
            _loss_bwd[ctx.grid](logp, old, ref, gate, deltas, mask, (w * g).contiguous(), ratio, dlogp, s, t,
                                ctx.coef, **ctx.consts)
        return dlogp, None, None, None, None, None, None


def fused_grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, deltas: Tensor, mask: Tensor,
                    spec: LossSpec, gate: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """logp (..., T), deltas (...) -> scalar loss, per-sequence sums (see grpo_bench.numerics.logprobs.grpo_loss)."""
    spec.check()
    t = logp.shape[-1]
    if spec.aggregate == "prompt_mean":  # the kernel's rows are responses; prompt_mean needs their groups
        spec = dataclasses.replace(spec, group=logp.shape[-2] if logp.dim() >= 2 else 1)

    def rows(x: Tensor) -> Tensor:
        return x.detach().reshape(-1, t).to(torch.float32).contiguous()

    value, per_seq = FusedGRPOLoss.apply(logp.reshape(-1, t).contiguous(), rows(old_logp),
                                         rows(ref_logp) if spec.kl else None, rows(gate) if spec.gated else None,
                                         deltas.detach().reshape(-1).contiguous(), rows(mask), spec)
    pol, kl, low, high, extra, lengths = per_seq.unbind(1)
    return value, {"policy": (seq_weights(spec.aggregate, lengths, t, spec.max_len, spec.group) * pol).sum(),
                   "kl_sum": kl.sum(), "low": low.sum(), "high": high.sum(), "extra": extra.sum(),
                   "tokens": lengths.sum()}
