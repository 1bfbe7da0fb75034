"""Triton GRPO loss: ratio, clip, KL, gate, mask and aggregation in one pass, with the gradient.

Every registry aggregation is linear in the per-sequence masked sums of the per-token
loss, with a weight per sequence that depends only on the mask (n = responses with at
least one token; an empty response is not part of the batch, see algos/aggregate.py, and
its weight multiplies a sum over no token, so any value serves):

    token_mean               w_s = 1 / max(sum of all lengths, 1)
    token_sum                w_s = 1
    seq_mean_token_mean      w_s = 1 / (max(len_s, 1) * n)
    seq_mean_token_sum       w_s = 1 / n
    seq_mean_token_sum_norm  w_s = 1 / (n * max_len)
    prompt_mean              w_s = 1 / (max(len_p, 1) * n_p), len_p the tokens of s's group,
                             n_p the groups with any token (the group is the second-to-last axis)

The weights are known before any log-prob is, so d loss / d logp_t = w_s * (gate * dpol_t +
beta * dkl_t) is too once logp_t is read: the forward writes the gradient (for grad_output
1) beside the loss, and no backward pass reads the inputs again. Three launches a call,
whatever the configuration: _lengths (tokens per sequence, from the mask), _loss_fwd (one
program per sequence: w_s from all the lengths, every token's loss, statistics and
gradient) and _reduce (one program: the scalar loss and the statistics, final, so no torch
op follows). The backward is _scale_rows, which returns at once when grad_output is 1 (it
reads it on the device: no host sync) and otherwise scales the stored gradient in place; so
the backward may run once per forward. GSPO's sequence ratio needs a masked mean over T
before any token, so its program loops over T twice. The per-token loss launch was bound by
launches and torch glue at (64, 16, 4096) (results/gpu/bench.jsonl): hence the few launches.

The gradient matches autograd's on ties too (ratio exactly 1, the first inner step):
torch.minimum splits a tie's gradient evenly and clamp passes it on the closed interval,
so inside the trust region it is that of ratio * A. old_logp, ref_logp, the gate and the
deltas are data here (no gradient), as they are in GRPO. The parts it covers and the
constants it takes from their parameters are in kernels/spec.py; every constant is a
compile-time one, so a run compiles once per configuration. logits_loss.py applies the same
per-token algebra to the log-probs it computes from logits.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from .spec import AGGREGATES, EXTRA_REGION, LossSpec

MAX_PROGRAMS = 1 << 20  # any positive values are correct; tests shrink them
# Tuning (H100, fp32 (64, 16, 4096), scripts/tune_loss.py before this rework): tiles of
# 512-1024 tokens and 8 warps were fastest, 256 tokens or 2-4 warps up to 15% slower.
BLOCK_T_MAX = 1024
NUM_WARPS = 8
BLOCK_S = 1024  # at most this many lengths read per step when a program builds w_s from all of them
# the statistics _reduce writes, in order
STATS = ("loss/policy", "clip/frac", "clip/low_frac", "clip/high_frac", "clip/extra_frac", "kl/value")
AGG_CODES = {name: i for i, name in enumerate(AGGREGATES)}


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
def _lengths(mask_ptr, len_ptr, S, T, BLOCK_T: tl.constexpr):
    """Unmasked tokens of each sequence (fp32, exact up to 2^24)."""
    for s in tl.range(tl.program_id(0).to(tl.int64), S, tl.num_programs(0)):
        acc = tl.zeros([BLOCK_T], tl.float32)
        for t0 in range(0, T, BLOCK_T):
            idx = t0 + tl.arange(0, BLOCK_T)
            m = tl.load(mask_ptr + s * T + idx, mask=idx < T, other=0.0)
            acc += (m > 0).to(tl.float32)
        tl.store(len_ptr + s, tl.sum(acc, axis=0))


@triton.jit
def _seq_weight(len_ptr, s, S, G, norm, AGG: tl.constexpr, BLOCK_S: tl.constexpr, GP: tl.constexpr):
    """w_s of the table above, from all S lengths: every program reads them (a few KB, from L2),
    so no launch sits between the lengths and the loss."""
    if AGG == 1:  # token_sum
        w = 1.0
    elif AGG == 5:  # prompt_mean: groups of G adjacent responses
        cols = tl.arange(0, GP)
        len_p = tl.sum(tl.load(len_ptr + (s // G) * G + cols, mask=cols < G, other=0.0), axis=0)
        BLOCK_P: tl.constexpr = BLOCK_S // GP
        rows = tl.arange(0, BLOCK_P)
        n_acc = tl.zeros([BLOCK_P], tl.float32)
        P = S // G
        for p0 in range(0, P, BLOCK_P):
            p = p0 + rows
            x = tl.load(len_ptr + p[:, None] * G + cols[None, :], mask=(p[:, None] < P) & (cols[None, :] < G),
                        other=0.0)
            n_acc += (tl.sum(x, axis=1) > 0).to(tl.float32)
        n_p = tl.maximum(tl.sum(n_acc, axis=0), 1.0)
        w = 1.0 / (tl.maximum(len_p, 1.0) * n_p)
    else:
        len_s = tl.load(len_ptr + s)
        tot = tl.zeros([BLOCK_S], tl.float32)
        cnt = tl.zeros([BLOCK_S], tl.float32)
        for i0 in range(0, S, BLOCK_S):
            idx = i0 + tl.arange(0, BLOCK_S)
            ln = tl.load(len_ptr + idx, mask=idx < S, other=0.0)
            tot += ln
            cnt += (ln > 0).to(tl.float32)
        n = tl.maximum(tl.sum(cnt, axis=0), 1.0)
        if AGG == 0:  # token_mean
            w = 1.0 / tl.maximum(tl.sum(tot, axis=0), 1.0)
        elif AGG == 2:  # seq_mean_token_mean
            w = 1.0 / (tl.maximum(len_s, 1.0) * n)
        elif AGG == 3:  # seq_mean_token_sum
            w = 1.0 / n
        else:  # seq_mean_token_sum_norm
            w = 1.0 / (n * norm)
    return w


@triton.jit
def _store_part(part_ptr, w, pol, kl, low, high, extra, tokens, coef):
    """One part's row of _reduce's input (a part is a sequence, or a token in logits_loss.py), 8 wide:
    w*(policy + beta*KL), w*policy, KL, region counts low, high, extra, tokens, and a pad column."""
    tl.store(part_ptr, w * (pol + coef * kl))
    tl.store(part_ptr + 1, w * pol)
    tl.store(part_ptr + 2, kl)
    tl.store(part_ptr + 3, low)
    tl.store(part_ptr + 4, high)
    tl.store(part_ptr + 5, extra)
    tl.store(part_ptr + 6, tokens)


@triton.jit
def _loss_fwd(logp_ptr, old_ptr, ref_ptr, gate_ptr, adv_ptr, mask_ptr, len_ptr, part_ptr, grad_ptr,
              S, T, G, norm, coef,
              LOSS: tl.constexpr, KL: tl.constexpr, GATED: tl.constexpr,
              LO: tl.constexpr, HI: tl.constexpr, C: tl.constexpr, TP: tl.constexpr, TN: tl.constexpr,
              AGG: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
              GP: tl.constexpr):
    for s in tl.range(tl.program_id(0).to(tl.int64), S, tl.num_programs(0)):
        row = s * T
        adv = tl.load(adv_ptr + s).to(tl.float32)
        w = _seq_weight(len_ptr, s, S, G, norm, AGG, BLOCK_S, GP)
        seq_ratio = 1.0
        if LOSS == 3:
            seq_ratio = _gspo_ratio(logp_ptr, old_ptr, mask_ptr, row, T, BLOCK_T)
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
            pol, kl, low, high, extra, dpol, dkl = _token(lp, old, ref, adv, seq_ratio, LOSS, KL, LO, HI, C, TP, TN)
            on = m > 0  # where, not a product: a padded token's inf must not reach the sum
            pol_acc += tl.where(on, gate * pol, 0.0)
            kl_acc += tl.where(on, kl, 0.0)
            low_acc += tl.where(on, low, 0.0)
            high_acc += tl.where(on, high, 0.0)
            extra_acc += tl.where(on, extra, 0.0)
            len_acc += on.to(tl.float32)
            if WRITE_GRAD:
                grad = tl.where(on, w * (gate * dpol + coef * dkl), 0.0)
                tl.store(grad_ptr + row + idx, grad.to(grad_ptr.dtype.element_ty), mask=inb)
        _store_part(part_ptr + s * 8, w, tl.sum(pol_acc, axis=0), tl.sum(kl_acc, axis=0), tl.sum(low_acc, axis=0),
                    tl.sum(high_acc, axis=0), tl.sum(extra_acc, axis=0), tl.sum(len_acc, axis=0), coef)


@triton.jit
def _pick(v, cols, k: tl.constexpr):
    return tl.sum(tl.where(cols == k, v, 0.0), axis=0)


@triton.jit
def _reduce(part_ptr, n, value_ptr, stats_ptr, BLOCK: tl.constexpr):
    """One program: the parts' (n, 8) rows summed in a fixed order (deterministic), then the loss
    and the statistics of STATS, final."""
    cols = tl.arange(0, 8)
    acc = tl.zeros([BLOCK, 8], tl.float32)
    for i0 in range(0, n, BLOCK):
        rows = i0 + tl.arange(0, BLOCK)
        # the pad column (7) is read too, never written: no _pick takes it, so whatever it holds stays there
        acc += tl.load(part_ptr + rows[:, None] * 8 + cols[None, :], mask=rows[:, None] < n, other=0.0)
    tot = tl.sum(acc, axis=0)
    low, high, extra, tokens = _pick(tot, cols, 3), _pick(tot, cols, 4), _pick(tot, cols, 5), _pick(tot, cols, 6)
    inv = 1.0 / tl.maximum(tokens, 1.0)
    tl.store(value_ptr, _pick(tot, cols, 0))
    out = tl.where(cols == 0, _pick(tot, cols, 1), 0.0)
    out = tl.where(cols == 1, (low + high + extra) * inv, out)
    out = tl.where(cols == 2, low * inv, out)
    out = tl.where(cols == 3, high * inv, out)
    out = tl.where(cols == 4, extra * inv, out)
    out = tl.where(cols == 5, _pick(tot, cols, 2) * inv, out)
    tl.store(stats_ptr + cols, out)


@triton.jit
def _scale_rows(x_ptr, g_ptr, n_rows, L, sb, sl, V, BLOCK: tl.constexpr):
    """x[r] *= g in place, rows addressed as in logprob.py; nothing at all when g == 1."""
    g = tl.load(g_ptr).to(tl.float32)
    if g != 1.0:
        cols = tl.arange(0, BLOCK)
        for r in tl.range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
            base = x_ptr + (r // L) * sb + (r % L) * sl
            for c0 in range(0, V, BLOCK):
                idx = c0 + cols
                x = tl.load(base + idx, mask=idx < V, other=0.0).to(tl.float32)
                tl.store(base + idx, (x * g).to(x_ptr.dtype.element_ty), mask=idx < V)


@functools.lru_cache(maxsize=256)
def launch_consts(spec: LossSpec, group: int, n_seq: int) -> dict:
    """The compile-time constants of spec (its COEF excepted: a runtime argument, an adaptive beta
    changes it every rollout) and the aggregation's; cached, so a call builds nothing. BLOCK_S
    covers the n_seq lengths in one step when it can (a batch size: it changes rarely)."""
    consts = spec.constants()
    del consts["COEF"]
    gp = triton.next_power_of_2(max(group, 1))
    block_s = max(gp, min(BLOCK_S, triton.next_power_of_2(max(n_seq, 16))))
    return consts | dict(AGG=AGG_CODES[spec.aggregate], GP=gp, BLOCK_S=block_s)


def scale_rows(x: Tensor, g: Tensor) -> None:
    """x (B, L, V) with unit stride on V, or (S, T) contiguous: x *= g in place (no-op launch when g == 1)."""
    if x.dim() == 2:
        n, big_l, sb, sl, v = x.shape[0], 1, x.stride(0), 0, x.shape[1]
    else:
        n, big_l, sb, sl, v = x.shape[0] * x.shape[1], x.shape[1], x.stride(0), x.stride(1), x.shape[2]
    if n:
        block = min(4096, triton.next_power_of_2(max(v, 16)))
        _scale_rows[(min(n, 1024),)](x, g.reshape(()).to(torch.float32), n, big_l, sb, sl, v, BLOCK=block,
                                     num_warps=8 if block >= 2048 else 4)


def reduce_parts(parts: Tensor, n: int) -> tuple[Tensor, Tensor]:
    value = torch.empty((), dtype=torch.float32, device=parts.device)
    stats = torch.empty(8, dtype=torch.float32, device=parts.device)
    _reduce[(1,)](parts, n, value, stats, BLOCK=1024, num_warps=8)
    return value, stats


class FusedGRPOLoss(torch.autograd.Function):
    """logp, old, ref, gate, mask (S, T), deltas (S,) -> loss (), statistics (8,) in STATS order.

    The gradient is written by the forward (for grad_output 1) when write_grad; the backward
    scales it in place, so it runs once.
    """

    @staticmethod
    def forward(ctx, logp: Tensor, old: Tensor, ref: Tensor | None, gate: Tensor | None, deltas: Tensor,
                mask: Tensor, spec: LossSpec, group: int, write_grad: bool):
        s, t = logp.shape
        consts = launch_consts(spec, group, s)
        dev = logp.device
        lengths = torch.empty(s, dtype=torch.float32, device=dev)
        parts = torch.empty(max(s, 1), 8, dtype=torch.float32, device=dev)
        grad = torch.empty_like(logp) if write_grad else parts  # parts: any valid pointer, never written
        if s:
            block = min(BLOCK_T_MAX, triton.next_power_of_2(max(t, 16)))
            grid = (min(s, MAX_PROGRAMS),)
            _lengths[grid](mask, lengths, s, t, BLOCK_T=block, num_warps=4)
            _loss_fwd[grid](logp, old, ref if ref is not None else old, gate if gate is not None else mask, deltas,
                            mask, lengths, parts, grad, s, t, group, float(t if spec.max_len is None else spec.max_len),
                            float(spec.kl_coef), WRITE_GRAD=write_grad, BLOCK_T=block,
                            num_warps=NUM_WARPS, **consts)
        value, stats = reduce_parts(parts, s)
        ctx.grad = grad if write_grad else None
        ctx.mark_non_differentiable(stats)
        return value, stats

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor, _g_stats: Tensor | None):
        grad, ctx.grad = ctx.grad, None
        if grad is None:
            raise RuntimeError("the fused GRPO loss wrote its gradient in the forward and has handed it out: its "
                               "backward runs once per forward (no second backward through the same graph)")
        scale_rows(grad, g)
        return grad, None, None, None, None, None, None, None, None


def stats_dict(stats: Tensor, spec: LossSpec) -> dict[str, Tensor]:
    """_reduce's vector as compose_loss's statistics (views without gradient, no launch)."""
    policy, frac, low, high, extra, kl, _, _ = stats.unbind()
    out = {"loss/policy": policy, "clip/frac": frac, "clip/low_frac": low, "clip/high_frac": high}
    if spec.loss in EXTRA_REGION:
        out[f"clip/{EXTRA_REGION[spec.loss]}_frac"] = extra
    if spec.kl:
        out["kl/value"] = kl
    return out


def rows(x: Tensor, t: int) -> Tensor:
    """x (..., T) as contiguous fp32 (S, T) rows, a view when it already is one (the usual case: no copy,
    few calls, since the loss is launch-bound). A gradient never flows to these inputs."""
    y = x.reshape(-1, t)
    return y if y.dtype == torch.float32 and y.is_contiguous() else y.detach().to(torch.float32).contiguous()


def fused_grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, deltas: Tensor, mask: Tensor,
                    spec: LossSpec, gate: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """logp (..., T), deltas (...) -> scalar loss, statistics (see grpo_bench.numerics.logprobs.grpo_loss)."""
    spec.check()
    t = logp.shape[-1]
    # the kernel's rows are responses; prompt_mean needs their groups (the second-to-last axis)
    group = logp.shape[-2] if spec.aggregate == "prompt_mean" else 1

    write_grad = torch.is_grad_enabled() and logp.requires_grad
    value, stats = FusedGRPOLoss.apply(logp.reshape(-1, t).contiguous(), rows(old_logp, t),
                                       rows(ref_logp, t) if spec.kl else None, rows(gate, t) if spec.gated else None,
                                       rows(deltas, 1).view(-1), rows(mask, t), spec, group, write_grad)
    return value, stats_dict(stats, spec)
