"""Per-token log-probs of chosen labels and the GRPO loss over them, with selectable backends.

    torch    the reference: log_softmax(logits.float()).gather(label), which writes an (N, V)
             fp32 tensor; the loss is the registry's functions composed, as the trainer does
    chunked  row-chunked torch (kernels/chunked.py): same numbers, O(rows * V) extra memory;
             the loss has nothing to chunk and runs the torch composition
    triton   the Triton kernels (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)
    auto     triton when the tensors are on CUDA and Triton imports, chunked otherwise

Every backend is differentiable and returns fp32 log-probs for logits of any float dtype
and any leading shape (..., V). Labels must lie in [0, V): there is no ignore index, pad
positions are handled by the loss mask. token_sum_pi_squared / linear_sum_pi_squared give
sum_v pi_v^2 per position (the Optimal Token Baseline's statistic), without gradient, by the
same paths: chunked rows, never the (N, V) logits, on every backend but torch.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import registry
from ..registry import Part
from ..algos.common import masked_mean, seq_deltas
from ..algos.corrections import compose
from ..config.run import BACKENDS
from .kernels import check_triton
from .kernels.chunked import _LOG_FLOOR, chunked_logprobs, chunked_sum_pi_squared, rows_sum_pi_squared
from .kernels.linear import fused_linear_logprobs
from .kernels.linear import linear_sum_pi_squared as fused_linear_sum_pi_squared
from .kernels.spec import LossSpec


@lru_cache(maxsize=1)
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_backend(backend: str, *tensors: Tensor) -> str:
    """The concrete backend ('torch', 'chunked' or 'triton') that `backend` means for these tensors."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "auto":
        return "triton" if _has_triton() and all(t.is_cuda for t in tensors) else "chunked"
    if backend == "triton":
        check_triton(*tensors)
    return backend


def selective_log_softmax(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[..., label] in fp32; logits (..., V), labels (...) -> (...).

    TRL's name and argument order; row-chunked, so no (N, V) fp32 tensor is ever made.
    """
    return chunked_logprobs(logits, labels)[0]


def _torch_logprobs(logits: Tensor, labels: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    lp = torch.log_softmax(logits.float(), dim=-1)
    out = lp.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    # the floor keeps p * log p at 0, not 0 * -inf, for -inf logits; it only moves values with p == 0
    ent = -(lp.exp() * lp.clamp(min=_LOG_FLOOR)).sum(-1) if with_entropy else None
    return out, ent


def token_logprobs(logits: Tensor, labels: Tensor, backend: str = "auto",
                   with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """logits (..., V), labels (...) -> (fp32 log p(label) (...), entropy (...) or None)."""
    b = resolve_backend(backend, logits)
    if b == "torch":
        return _torch_logprobs(logits, labels, with_entropy)
    if b == "chunked":
        return chunked_logprobs(logits, labels, with_entropy)
    from .kernels.logprob import triton_logprobs
    return triton_logprobs(logits, labels, with_entropy)


def linear_logprobs(hidden: Tensor, weight: Tensor, labels: Tensor, backend: str = "auto",
                    with_entropy: bool = False, bias: Tensor | None = None,
                    temperature: float = 1.0) -> tuple[Tensor, Tensor | None]:
    """log-probs of labels under the LM head: hidden (..., H), weight (V, H), bias (V) -> (...).

    The distribution is softmax(fp32(hidden @ W^T + bias) / temperature), the sampler's: the
    division happens in fp32 after the GEMM, never on bf16 hidden states. torch materialises
    hidden @ W^T; chunked and triton never hold more than a chunk of it.
    """
    b = resolve_backend(backend, hidden, weight)
    if b == "torch":
        logits = F.linear(hidden, weight, bias)
        if temperature != 1.0:
            logits = logits.float() / temperature
        return _torch_logprobs(logits, labels, with_entropy)
    return fused_linear_logprobs(hidden, weight, labels, with_entropy, bias, use_triton=b == "triton",
                                 temperature=temperature)


def token_sum_pi_squared(logits: Tensor, backend: str = "auto", temperature: float = 1.0) -> Tensor:
    """logits (..., V) -> sum_v pi_v^2 (...) fp32, pi = softmax(fp32(logits) / temperature), no grad.

    torch materialises the whole softmax; every other backend takes rows in chunks (no Triton
    kernel: a statistic read once per rollout, without gradient, is not worth one).
    """
    with torch.no_grad():
        if resolve_backend(backend, logits) == "torch":
            return rows_sum_pi_squared(logits, temperature)   # every row at once
        return chunked_sum_pi_squared(logits, temperature)


def linear_sum_pi_squared(hidden: Tensor, weight: Tensor, backend: str = "auto", bias: Tensor | None = None,
                          temperature: float = 1.0) -> Tensor:
    """sum_v pi_v^2 under the LM head, hidden (..., H), weight (V, H) -> (...), no grad: torch materialises
    hidden @ W^T, the other backends go through it a chunk of rows at a time (kernels/linear.py)."""
    with torch.no_grad():
        if resolve_backend(backend, hidden, weight) == "torch":
            return token_sum_pi_squared(F.linear(hidden, weight, bias), "torch", temperature)
        return fused_linear_sum_pi_squared(hidden, weight, bias, temperature)


def grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, deltas: Tensor, mask: Tensor, *,
              loss: str | dict = "clipped", aggregate: str | dict = "seq_mean_token_mean",
              kl: str | dict | None = None, kl_coef: float = 0.0, gate: Tensor | None = None,
              sampler_logp: Tensor | None = None, corrections: list | tuple = (),
              entropy: Tensor | None = None, entropy_coef: float = 0.0,
              nll_coef: float = 0.0, positive: Tensor | None = None,
              backend: str = "auto", context: dict | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """aggregate(gate * w * loss(logp, old, deltas, mask') + kl_coef * kl(logp, ref, old), mask')
    - entropy_coef * H + nll_coef * NLL, and its statistics.

    logp, old_logp, ref_logp, sampler_logp, gate, entropy, mask (..., T); deltas, positive (...).
    Parts are given as a name or {name: ..., param: value}; `context` fills parameters left at
    None (e.g. max_len). kl None or kl_coef 0 means no KL term (ref_logp may then be None).

    corrections (axis `correction`, algos/corrections.py) read the sampler's log-probs
    (sampler_logp None: the old ones, as when the trainer samples itself): their weights w
    multiply the policy term, tokens they do not keep leave mask' = mask * keep, which every
    term and its normaliser then uses. H is the token mean of `entropy` over mask' * gate
    (TRL's bonus: a token mean whatever the aggregation); NLL the token mean of -logp over
    the tokens of positive responses (`positive`, default deltas > 0; VAPO, NeMo-RL's
    positive_example_nll_weight). The gradient flows to logp (and entropy) only.

    Statistics, detached scalars: loss/policy (the gated, corrected policy term alone, same
    aggregation), clip/frac and clip/<region>_frac (share of unmasked tokens in each clip
    region the loss reports, see algos/losses.py; low and high always), kl/value (token mean
    of the estimator, with a KL term); with corrections mismatch/* (corrections.mismatch)
    and correction/<name>/<region>_frac (share of the tokens of `mask`); loss/entropy with
    entropy, loss/nll with an NLL term. On the triton backend the fused kernel writes the gradient
    in the forward (kernels/loss.py): the backward may then run once per forward.
    """
    use_kl = kl is not None and kl_coef != 0
    return compose_loss(logp, old_logp, ref_logp, deltas, mask, loss=_resolve("loss", loss, context),
                        aggregate=_resolve("aggregate", aggregate, context),
                        kl=_resolve("kl", kl, context) if use_kl else None, kl_coef=kl_coef if use_kl else 0.0,
                        gate=gate, sampler_logp=sampler_logp,
                        corrections=[_resolve("correction", c, context) for c in corrections],
                        entropy=entropy, entropy_coef=entropy_coef, nll_coef=nll_coef, positive=positive,
                        backend=backend)


def compose_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, deltas: Tensor, mask: Tensor, *,
                 loss: Part, aggregate: Part, kl: Part | None = None,
                 kl_coef: float | Tensor = 0.0, gate: Tensor | None = None, sampler_logp: Tensor | None = None,
                 corrections: list[Part] = (), entropy: Tensor | None = None,
                 entropy_coef: float | Tensor = 0.0, nll_coef: float | Tensor = 0.0, positive: Tensor | None = None,
                 backend: str = "auto") -> tuple[Tensor, dict[str, Tensor]]:
    """grpo_loss with its parts already resolved to (registry entry, every parameter); kl None: no KL term.

    What a Recipe calls at every step with the entries it bound once (nothing is looked up by name), and what torch.func.vmap
    maps over a population: kl_coef, entropy_coef, nll_coef and the parameters may then be
    0-d tensors (the terms present are decided by what is passed, never by a coefficient's value).
    """
    (loss_entry, loss_params), (agg_entry, agg_params) = loss, aggregate
    loss_name, agg_name = loss_entry.name, agg_entry.name
    use_kl = kl is not None
    kl_entry, kl_params = kl if use_kl else (None, {})
    kl_name = None if kl_entry is None else kl_entry.name
    if use_kl and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp")
    against_ref = "ref_logp" in loss_entry.traits.get("needs", ())
    if against_ref and ref_logp is None:
        raise ValueError(f"loss {loss_name!r} regresses onto log pi / pi_ref: it needs ref_logp")
    fixes = list(corrections)
    use_entropy = entropy is not None and not (isinstance(entropy_coef, (int, float)) and entropy_coef == 0)
    use_nll = not (isinstance(nll_coef, (int, float)) and nll_coef == 0)
    extra = tuple(t for t, on in (("correction", bool(fixes)), ("entropy", use_entropy), ("nll", use_nll),
                                  ("token_deltas", deltas.dim() == logp.dim())) if on)
    b = resolve_backend(backend, logp)
    if b == "triton":
        spec = LossSpec(loss_name, tuple(sorted(loss_params.items())), agg_name, tuple(sorted(agg_params.items())),
                        kl_name, float(kl_coef) if use_kl else 0.0, gate is not None, extra)
        if backend == "triton" or spec.fusable():  # auto falls back for parts and terms the kernel lacks
            from .kernels.loss import fused_grpo_loss
            return fused_grpo_loss(logp, old_logp, ref_logp, deltas, mask, spec, gate)  # statistics: no gradient

    loss_fn, agg_fn = loss_entry.obj, agg_entry.obj
    on = mask > 0
    # Masked tokens may hold -inf log-probs (a padded position); zeroing them before any
    # part runs keeps inf out of every backward (0 * inf = nan), whatever the part computes.
    safe = lambda x: torch.where(on, x, torch.zeros_like(x))  # noqa: E731
    lp, old = safe(logp), safe(old_logp)
    weight, mask, stats = compose(fixes, lp, old, None if sampler_logp is None else safe(sampler_logp), deltas, mask)
    on = mask > 0
    # a loss registered needs=("ref_logp",) takes the reference's log-probs where the others take pi_old's
    pol, regions = loss_fn(lp, safe(ref_logp) if against_ref else old, deltas, mask, **loss_params)
    if weight is not None:
        pol = pol * weight
    if gate is not None:
        pol = pol * gate
    per_token = pol
    if use_kl:
        kl_tok = kl_entry.obj(lp, safe(ref_logp), old, **kl_params)
        per_token = pol + kl_coef * kl_tok
    value = agg_fn(per_token, mask, **agg_params)
    if entropy is not None:
        # TRL's entropy_mask is our gate: the bonus acts on the tokens the policy term does
        h = masked_mean(entropy, mask if gate is None else mask * gate)
        stats["loss/entropy"] = h
        if use_entropy:
            value = value - entropy_coef * h
    if use_nll:
        pos = seq_deltas(deltas, mask) > 0 if positive is None else positive.to(torch.bool)
        nll = masked_mean(-lp, torch.where(pos.unsqueeze(-1), mask, torch.zeros_like(mask)))
        stats["loss/nll"] = nll
        value = value + nll_coef * nll
    with torch.no_grad():
        regions = {"low": torch.zeros_like(on), "high": torch.zeros_like(on)} | regions
        union = torch.zeros_like(on)
        for r in regions.values():
            union = union | r
        stats |= {"loss/policy": agg_fn(pol, mask, **agg_params), "clip/frac": masked_mean(union.to(lp.dtype), mask),
                  **{f"clip/{k}_frac": masked_mean(r.to(lp.dtype), mask) for k, r in regions.items()}}
        if use_kl:
            stats["kl/value"] = masked_mean(kl_tok, mask)
    return value, {k: v.detach() for k, v in stats.items()}


def grpo_loss_from_logits(logits: Tensor, labels: Tensor, old_logp: Tensor, ref_logp: Tensor | None, deltas: Tensor,
                          mask: Tensor, *, loss: str | dict = "clipped", aggregate: str | dict = "seq_mean_token_mean",
                          kl: str | dict | None = None, kl_coef: float = 0.0, gate: Tensor | None = None,
                          backend: str = "auto", inplace: bool = False,
                          context: dict | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """grpo_loss(token_logprobs(logits, labels)[0], old_logp, ...): logits (..., T, V), labels and the
    loss's inputs as grpo_loss's; the same value, gradient (on the logits) and statistics.

    On the triton backend, for the parts kernels/spec.py lists (GSPO excepted), one kernel
    (kernels/logits_loss.py) computes the loss and writes d loss / d logits in the forward, in
    the logits' dtype, skipping masked rows; its backward runs once per forward. inplace=True
    writes that gradient into the logits themselves (they are garbage afterwards; not for a leaf).
    Otherwise it is the composition, on `backend`.
    """
    use_kl = kl is not None and kl_coef != 0
    if use_kl and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp")
    if resolve_backend(backend, logits) == "triton":
        loss_part, agg_part = _resolve("loss", loss, context), _resolve("aggregate", aggregate, context)
        spec = LossSpec(loss_part[0].name, tuple(sorted(loss_part[1].items())), agg_part[0].name,
                        tuple(sorted(agg_part[1].items())), _resolve("kl", kl, context)[0].name if use_kl else None,
                        float(kl_coef) if use_kl else 0.0, gate is not None,
                        ("token_deltas",) if deltas.dim() == labels.dim() else ())
        if spec.fusable():
            from .kernels.logits_loss import fused_logits_loss
            out = fused_logits_loss(logits, labels, old_logp, ref_logp, deltas, mask, spec, gate, inplace)
            if out is not None:  # None: GSPO
                return out
    logp = token_logprobs(logits, labels, backend=backend)[0]
    return grpo_loss(logp, old_logp, ref_logp, deltas, mask, loss=loss, aggregate=aggregate, kl=kl, kl_coef=kl_coef,
                     gate=gate, backend=backend, context=context)


def loss_needs_ref(name: str) -> bool:
    """True for a loss registered needs=("ref_logp",): it is handed pi_ref's log-probs in the place of pi_old's."""
    return "ref_logp" in registry.entry("loss", name).traits.get("needs", ())


def _resolve(axis: str, spec: str | dict, context: dict | None) -> Part:
    name, given = registry.split_spec(spec)
    return registry.entry(axis, name), registry.resolve_params(axis, name, given, context)
