"""Property-based tests: every part and every backend on random shapes, masks and rewards,
against formulas written out here (numpy loops for advantages and aggregations, plain
elementwise fp64 torch for losses and KL so that autograd gives the reference gradient).

Hypothesis draws B, G >= 2, T >= 1 (T = 1 and G = 2 included), masks with fully masked
responses and fully masked batches, rewards with all-equal groups, and log-prob spreads
from 0 (ratio 1) to far beyond every clip. Examples are few and derandomized: CI sees the
same cases every run.
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from grpo_bench import registry
from grpo_bench.numerics.logprobs import grpo_loss, token_logprobs
from helpers import needs

F64 = torch.float64
# no explain phase: it traces lines with sys.settrace, which scripts/mutate.py uses too
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=20, print_blob=False,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def t(x):
    return torch.as_tensor(np.asarray(x, dtype=float), dtype=F64)


@st.composite
def reward_batches(draw, min_g=2):
    """rewards (B, G): binary, continuous or tied, with whole groups equal; lengths (B, G) >= 0."""
    b, g = draw(st.integers(1, 4)), draw(st.integers(min_g, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["binary", "continuous", "ties"]))
    r = {"binary": lambda: rng.integers(0, 2, (b, g)).astype(float),
         "continuous": lambda: rng.normal(0, 2, (b, g)),
         "ties": lambda: rng.integers(0, 3, (b, g)) / 3.0}[kind]()
    for row in range(b):
        if draw(st.booleans()):
            r[row] = draw(st.sampled_from([0.0, 1.0, 1 / 3, -2.5]))  # a group without signal
    lengths = rng.integers(0, 6, (b, g)).astype(float)
    return r, lengths


@st.composite
def token_batches(draw):
    """logp, old, ref (B, G, T), deltas (B, G), mask (B, G, T) as float64 tensors."""
    b, g, T = draw(st.integers(1, 3)), draw(st.integers(2, 4)), draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    spread = draw(st.sampled_from([0.0, 0.05, 0.4, 1.5]))
    logp = -rng.uniform(0.02, 3.0, (b, g, T))
    old = logp + spread * rng.standard_normal((b, g, T))
    ref = logp + spread * rng.standard_normal((b, g, T))
    deltas = rng.normal(0, 1, (b, g))
    deltas[rng.random((b, g)) < 0.2] = 0.0
    lengths = rng.integers(0, T + 1, (b, g))
    mask = (np.arange(T) < lengths[..., None]).astype(float)
    if draw(st.booleans()):
        mask *= rng.random((b, g, T)) > 0.3  # holes inside responses too
    if draw(st.integers(0, 9)) == 0:
        mask[:] = 0.0  # a fully masked batch
    return [t(x) for x in (logp, np.minimum(old, -1e-3), ref, deltas, mask)]


# --------------------------------------------------------------------------- deltas


def _mean(x):
    return sum(x) / len(x)


def _std(x):  # unbiased, as torch.std
    m = _mean(x)
    return math.sqrt(sum((v - m) ** 2 for v in x) / (len(x) - 1))


def _delta_formula(name, r, lengths, greedy):
    """One advantage per response, group by group, in plain Python."""
    flat = [len(set(row)) == 1 for row in r]
    out = []
    all_r = [v for row in r for v in row]
    for i, row in enumerate(r):
        m, g = _mean(row), len(row)
        if name == "raw":
            out.append(list(row))
        elif name == "centered":
            out.append([0.0 if flat[i] else v - m for v in row])
        elif name == "zscore":
            out.append([0.0 if flat[i] else (v - m) / (_std(row) + 1e-6) for v in row])
        elif name == "batch_std":
            out.append([0.0 if flat[i] else (v - m) / (_std(all_r) + 1e-6) for v in row])
        elif name == "rloo":
            out.append([0.0 if flat[i] else v - (sum(row) - v) / (g - 1) for v in row])
        elif name == "max":
            out.append([v if v == max(row) else 0.0 for v in row])
        elif name == "passk":
            top = sorted(row, reverse=True)
            gap = (top[0] - top[1]) / (_std(row) + 1e-6)
            first = row.index(max(row))
            out.append([gap if j == first else 0.0 for j in range(g)])
        elif name == "opo":
            w = lengths[i]
            base = sum(a * b for a, b in zip(w, row)) / sum(w) if sum(w) > 0 else m
            out.append([0.0 if flat[i] else v - base for v in row])
        elif name == "remax":
            out.append([v - greedy[i] for v in row])
        elif name == "gpg":
            out.append([0.0 if flat[i] else v - m for v in row])
        elif name == "maxrl":
            out.append([0.0 if flat[i] or m <= 0 else (v - m) / (m + 1e-6) for v in row])
    if name in ("reinforce_pp", "reinforce_pp_baseline", "gdpo"):
        # gdpo without components: the total reward is its only component, z-scored, then whitened
        x = [[v - _mean(row) if not flat[i] else 0.0 for v in row] if name.endswith("baseline") else
             [0.0 if flat[i] else (v - _mean(row)) / (_std(row) + 1e-6) for v in row] if name == "gdpo" else
             list(row) for i, row in enumerate(r)]
        w = [a for row in lengths for a in row]
        xs = [v for row in x for v in row]
        n = sum(w)
        mean = sum(a * b for a, b in zip(w, xs)) / n
        var = sum(a * (b - mean) ** 2 for a, b in zip(w, xs)) / (n - 1)
        return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in x]
    if name == "gpg":
        nonzero = sum(v != 0 for row in out for v in row)
        alpha = len(all_r) / max(nonzero, 1)
        return [[alpha * v for v in row] for row in out]
    return out


# parts that need more than rewards (per-token statistics, reference samples: algos.deltas.Extra) are held
# to their formulas in tests/test_parts_v4.py
DELTAS = [n for n in registry.names("delta") if set(registry.entry("delta", n).traits.get("needs", ())) <= {"greedy"}]


@pytest.mark.parametrize("name", DELTAS)
@FAST
@given(data=reward_batches())
def test_every_delta_against_its_formula(name, data):
    r, lengths = data
    greedy = np.round(np.random.default_rng(0).random(r.shape[0]), 1)
    if (name.startswith("reinforce_pp") or name == "gdpo") and lengths.sum() < 2:
        lengths = lengths + 1  # whitening needs two tokens
    got = registry.get("delta", name)(t(r), t(lengths), t(greedy))
    want = _delta_formula(name, r.tolist(), lengths.tolist(), greedy.tolist())
    assert got.shape == r.shape and got.dtype == F64
    torch.testing.assert_close(got, t(want), rtol=1e-9, atol=1e-9)
    # (max keeps equal rewards; REINFORCE++-baseline whitens over the batch, which shifts a flat group)
    if registry.entry("delta", name).traits.get("needs_group") and name not in ("max", "reinforce_pp_baseline", "gdpo"):
        flat = (r == r[:, :1]).all(-1)
        assert (got[torch.as_tensor(flat)] == 0).all()  # exactly 0, not 1e-17: no signal, no update


# --------------------------------------------------------------------------- losses

def _ppo(ratio, a, lo, hi):
    return -torch.minimum(ratio * a, torch.clamp(ratio, 1 - lo, 1 + hi) * a)


def _seq_mean(x, mask):
    n = mask.sum(-1, keepdim=True)
    return torch.where(n > 0, (x * mask).sum(-1, keepdim=True) / n.clamp(min=1), torch.zeros_like(n))


def _loss_formula(name, lp, old, d, mask, p):
    a = d[..., None].expand_as(lp)
    r = torch.exp(lp - old)
    if name == "naive":
        return -a * lp
    if name == "unclipped":
        return -a * r
    if name in ("clipped", "clip_cov"):
        return _ppo(r, a, p["clip_low"], p["clip_high"])
    if name == "dual_clip":
        base = _ppo(r, a, p["clip_low"], p["clip_high"])
        return torch.where(a < 0, torch.minimum(base, -a * p["clip_c"]), base)
    if name == "gspo":
        s = torch.exp(_seq_mean(lp - old, mask)).expand_as(lp)
        # sequence value on every token, the gradient of the sequence mean of log pi
        s = s.detach() * torch.exp(lp - lp.detach())
        return _ppo(s, a, p["clip_low"], p["clip_high"])
    if name == "gmpo":
        lr = lp - old
        c = lr.clamp(-p["clip_low"], p["clip_high"])
        lr = torch.where(a > 0, torch.minimum(lr, c), torch.where(a < 0, torch.maximum(lr, c), torch.zeros_like(lr)))
        return (-a * torch.exp(_seq_mean(lr, mask))).expand_as(lp)
    if name == "cispo":
        lo = 0.0 if p["clip_low"] is None else 1 - p["clip_low"]
        return -torch.clamp(r, lo, 1 + p["clip_high"]).detach() * a * lp
    if name == "sapo":
        tau = torch.where(a > 0, t(p["tau_pos"]), t(p["tau_neg"]))
        return -torch.sigmoid(tau * (r - 1)) * 4 / tau * a
    if name == "vespo":
        log_w = ((lp - old).clamp(-20, 20) * mask).sum(-1, keepdim=True).clamp(math.log(1e-8), 20).detach()
        pos = d[..., None] >= 0
        k = torch.where(pos, t(p["k_pos"]), t(p["k_neg"]))
        lam = torch.where(pos, t(p["lambda_pos"]), t(p["lambda_neg"]))
        return -torch.exp(lam + k * log_w - lam * torch.exp(log_w)) * a * lp
    if name in ("dppo_tv", "dppo_kl"):
        pi, q = torch.exp(lp), torch.exp(old)
        if name == "dppo_tv":
            valid = torch.where(a > 0, pi - q <= p["clip_high"], pi - q >= -p["clip_low"])
        else:
            bkl = q * (old - lp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - pi + 1e-8))
            valid = torch.where(a > 0, (bkl <= p["clip_high"]) | (pi <= q), (bkl <= p["clip_low"]) | (pi >= q))
        return -a * torch.clamp(r, max=p["clip_c"]).detach() * lp * valid
    if name == "kl_cov":
        return -a * r
    if name == "dro":
        return -a * lp + p.get("tau", 0.1) / 2 * (lp - old) ** 2
    if name == "topr":
        return torch.where(a > 0, -a * lp, -torch.clamp(r, 0, 1).detach() * a * lp)
    if name == "a2po":  # `old` is the reference's log-probs here; the response's value on each token
        return ((p.get("beta2", 1e-3) * ((lp - old) * mask).sum(-1, keepdim=True) - d[..., None]) ** 2).expand_as(lp)
    raise KeyError(name)


def _params(name, rng):
    """Parameters that put ratios on both sides of every bound for the spreads drawn."""
    p = {"clipped": {"clip_low": 0.1, "clip_high": 0.15}, "clip_cov": {"clip_low": 0.1, "clip_high": 0.15,
                                                                       "clip_cov_lb": 1e9, "clip_cov_ub": 2e9},
         "dual_clip": {"clip_low": 0.1, "clip_high": 0.15, "clip_c": 1.5},
         "gspo": {"clip_low": 0.02, "clip_high": 0.03}, "gmpo": {"clip_low": 0.1, "clip_high": 0.2},
         "cispo": {"clip_low": rng.choice([None, 0.1]), "clip_high": 0.2}, "sapo": {"tau_pos": 1.3, "tau_neg": 2.1},
         "vespo": {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0},
         "dppo_tv": {"clip_low": 0.05, "clip_high": 0.08, "clip_c": 1.5},
         "dppo_kl": {"clip_low": 0.01, "clip_high": 0.02, "clip_c": 1.5}, "kl_cov": {"ppo_kl_coef": 0.0},
         "a2po": {"beta2": 0.3}}
    return p.get(name, {})


@pytest.mark.parametrize("name", registry.names("loss"))
@FAST
@given(data=token_batches(), seed=st.integers(0, 3))
def test_every_loss_against_its_formula(name, data, seed):
    logp, old, _, d, mask = data
    p = _params(name, np.random.default_rng(seed))
    x = logp.clone().requires_grad_()
    got, regions = registry.get("loss", name)(x, old, d, mask, **p)
    y = logp.clone().requires_grad_()
    want = _loss_formula(name, y, old, d, mask, p)
    on = mask > 0
    torch.testing.assert_close(got[on], want[on], rtol=1e-9, atol=1e-12)
    # gradients of the masked sum (what every aggregation is built on)
    (got * mask).sum().backward()
    (want * mask).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-9, atol=1e-12)
    for key, region in regions.items():
        assert region.dtype == torch.bool and region.shape == logp.shape, key
    want_regions = _regions_formula(name, logp, old, d, mask, p)
    for key, region in want_regions.items():
        assert torch.equal(regions[key][on], region[on]), key


def _regions_formula(name, lp, old, d, mask, p):
    """Where each loss says its clip cut in, from the definitions in algos/losses.py's docstring."""
    a = d[..., None].expand_as(lp)
    r = torch.exp(lp - old)
    if name in ("clipped", "dual_clip", "clip_cov", "gspo"):
        if name == "gspo":
            r = torch.exp(_seq_mean(lp - old, mask)).expand_as(lp)
        out = {"low": (a < 0) & (r < 1 - p["clip_low"]), "high": (a > 0) & (r > 1 + p["clip_high"])}
        if name == "dual_clip":
            out["dual"] = (a < 0) & (torch.maximum(r, r.clamp(1 - p["clip_low"], 1 + p["clip_high"])) > p["clip_c"])
        return out
    if name == "gmpo":
        return {"low": (a < 0) & (lp - old < -p["clip_low"]), "high": (a > 0) & (lp - old > p["clip_high"])}
    if name == "cispo":
        lo = 0.0 if p["clip_low"] is None else 1 - p["clip_low"]
        return {"low": r < lo, "high": r > 1 + p["clip_high"]}
    if name in ("dppo_tv", "dppo_kl"):
        pi, q = torch.exp(lp), torch.exp(old)
        if name == "dppo_tv":
            valid = torch.where(a > 0, pi - q <= p["clip_high"], pi - q >= -p["clip_low"])
        else:
            bkl = q * (old - lp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - pi + 1e-8))
            valid = torch.where(a > 0, (bkl <= p["clip_high"]) | (pi <= q), (bkl <= p["clip_low"]) | (pi >= q))
        return {"low": (a <= 0) & ~valid, "high": (a > 0) & ~valid, "cap": valid & (r > p["clip_c"])}
    return {}


# ----------------------------------------------------------------------------- KL


def _kl_formula(name, lp, ref, old):
    d = ref - lp  # log r, r = pi_ref / pi
    k3 = torch.exp(d) - d - 1
    return {"k1": -d, "k2": d ** 2 / 2, "k3": k3, "abs": d.abs(), "k1+": -d, "k3+": k3,
            "k3_is": torch.exp(lp - old) * k3,
            "low_var_kl": (torch.exp(d.clamp(-20, 20)) - d.clamp(-20, 20) - 1).clamp(-10, 10)}[name]


@pytest.mark.parametrize("name", registry.names("kl"))
@FAST
@given(data=token_batches())
def test_every_kl_against_its_formula(name, data):
    logp, old, ref, _, _ = data
    x = logp.clone().requires_grad_()
    got = registry.get("kl", name)(x, ref, old)
    torch.testing.assert_close(got, _kl_formula(name, logp, ref, old), rtol=1e-9, atol=1e-12)
    got.sum().backward()
    y = logp.clone().requires_grad_()
    want = _kl_formula(name, y, ref, old)
    if name.endswith("+"):
        want = (ref - y) ** 2 / 2  # straight-through: k2's gradient
    want.sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-9, atol=1e-12)
    if name in ("k2", "k3", "abs", "k3+", "k3_is", "low_var_kl"):
        assert (got >= 0).all()


# ---------------------------------------------------------------------- aggregation


def _aggregate_formula(name, x, mask, max_len):
    """Loops over responses; a response with no token is not part of the batch."""
    seqs = []
    for idx in np.ndindex(*mask.shape[:-1]):
        toks = [x[idx][k] for k in range(mask.shape[-1]) if mask[idx][k] > 0]
        if toks:
            seqs.append(toks)
    if not seqs:
        return 0.0
    n_tok = sum(len(s) for s in seqs)
    prompts = {}
    for idx in np.ndindex(*mask.shape[:-1]):  # a prompt: every axis but the responses' and the tokens'
        prompts.setdefault(idx[:-1], []).extend(x[idx][k] for k in range(mask.shape[-1]) if mask[idx][k] > 0)
    groups = [p for p in prompts.values() if p]
    return {"prompt_mean": sum(sum(p) / len(p) for p in groups) / len(groups),
            "token_mean": sum(map(sum, seqs)) / n_tok, "token_sum": sum(map(sum, seqs)),
            "seq_mean_token_mean": sum(sum(s) / len(s) for s in seqs) / len(seqs),
            "seq_mean_token_sum": sum(map(sum, seqs)) / len(seqs),
            "seq_mean_token_sum_norm": sum(sum(s) / max_len for s in seqs) / len(seqs)}[name]


@pytest.mark.parametrize("name", registry.names("aggregate"))
@FAST
@given(data=token_batches(), max_len=st.sampled_from([None, 1, 7]))
def test_every_aggregation_against_its_formula(name, data, max_len):
    x, _, _, _, mask = data
    x = x.clone()
    x[mask == 0] = float("nan")  # what sits under the mask never reaches the result
    kw = {"max_len": max_len} if name == "seq_mean_token_sum_norm" else {}
    got = registry.get("aggregate", name)(x, mask, **kw)
    want = _aggregate_formula(name, x.numpy(), mask.numpy(), max_len or x.shape[-1])
    assert got.shape == () and math.isclose(got.item(), want, rel_tol=1e-9, abs_tol=1e-12)


# ------------------------------------------------------------------------- backends

FUSED_LOSSES = ["naive", "unclipped", "clipped", "gspo", "dual_clip", "cispo", "sapo"]
FUSED_KLS = [None, "k1", "k2", "k3", "abs", "k1+", "k3+", "k3_is"]


def _composition(lp, old, ref, d, mask, loss, p, kl, beta, agg, max_len):
    """aggregate(loss + beta * kl) from this file's formulas, differentiable in lp."""
    # a loss registered needs=("ref_logp",) is handed the reference's log-probs in the place of old's
    against = ref if "ref_logp" in registry.entry("loss", loss).traits.get("needs", ()) else old
    per_tok = _loss_formula(loss, lp, against, d, mask, p)
    if kl is not None:
        k = _kl_formula(kl, lp, ref, old)
        if kl.endswith("+"):
            k2 = (ref - lp) ** 2 / 2
            k = k2 - k2.detach() + k.detach()
        per_tok = per_tok + beta * k
    on = mask > 0
    per_tok = torch.where(on, per_tok, torch.zeros_like(per_tok))
    n_tok = on.sum(-1)
    seqs = n_tok > 0
    n_seq = seqs.sum().clamp(min=1)
    sums = per_tok.sum(-1)
    if agg == "token_mean":
        return sums.sum() / n_tok.sum().clamp(min=1)
    if agg == "token_sum":
        return sums.sum()
    if agg == "seq_mean_token_mean":
        return (sums / n_tok.clamp(min=1)).sum() / n_seq
    if agg == "seq_mean_token_sum":
        return sums.sum() / n_seq
    if agg == "prompt_mean":
        per_prompt, n_prompt = sums.sum(-1), n_tok.sum(-1)
        return (per_prompt / n_prompt.clamp(min=1)).sum() / (n_prompt > 0).sum().clamp(min=1)
    return sums.sum() / (n_seq * max_len)


def _check_backend(backend, data, loss, kl, agg, seed, atol):
    logp, old, ref, d, mask = data
    p = _params(loss, np.random.default_rng(seed))
    beta = 0.0 if kl is None else 0.3
    max_len = 5
    agg_spec = {"name": agg, "max_len": max_len} if agg == "seq_mean_token_sum_norm" else agg
    dtype = F64 if backend != "triton" else torch.float32
    x = logp.to(dtype).requires_grad_()
    value, stats = grpo_loss(x, old.to(dtype), ref.to(dtype), d.to(dtype), mask.to(dtype), loss={"name": loss, **p},
                             aggregate=agg_spec, kl=kl, kl_coef=beta, backend=backend)
    (g,) = torch.autograd.grad(value, x)
    y = logp.clone().requires_grad_()
    want = _composition(y, old, ref, d, mask, loss, p, kl, beta, agg, max_len)
    (want_g,) = torch.autograd.grad(want, y)
    torch.testing.assert_close(value.double(), want.detach(), rtol=1e-5, atol=atol)
    torch.testing.assert_close(g.double(), want_g, rtol=1e-5, atol=atol)
    on = mask > 0
    assert (g[~on] == 0).all()  # no gradient reaches a masked token
    if on.any() and loss in ("clipped", "dual_clip"):
        r, a = torch.exp(logp - old), d[..., None].expand_as(logp)
        high = ((a > 0) & (r > 1 + p["clip_high"]))[on].double().mean()
        assert stats["clip/high_frac"].item() == pytest.approx(high.item(), abs=1e-6)


@pytest.mark.parametrize("backend", ["torch", "chunked", "auto"])
@FAST
@given(data=token_batches(), loss=st.sampled_from(registry.names("loss")), kl=st.sampled_from(FUSED_KLS),
       agg=st.sampled_from(registry.names("aggregate")), seed=st.integers(0, 3))
def test_grpo_loss_backends_against_the_composition(backend, data, loss, kl, agg, seed):
    _check_backend(backend, data, loss, kl, agg, seed, atol=1e-9)


@settings(FAST, max_examples=8)
@given(data=token_batches(), loss=st.sampled_from(FUSED_LOSSES), kl=st.sampled_from(FUSED_KLS),
       agg=st.sampled_from(registry.names("aggregate")), seed=st.integers(0, 3))
def test_fused_kernel_against_the_composition(data, loss, kl, agg, seed):
    needs("triton")
    if not torch.cuda.is_available():
        import os
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton on CPU needs its interpreter")
    data = [x.to("cuda") if torch.cuda.is_available() else x for x in data]
    _check_backend("triton", data, loss, kl, agg, seed, atol=2e-5)


@pytest.mark.parametrize("backend", ["torch", "chunked", "auto"])
@settings(FAST, max_examples=15)
@given(n=st.integers(1, 4), v=st.integers(1, 40), scale=st.sampled_from([0.1, 3.0, 80.0]), seed=st.integers(0, 99))
def test_token_logprobs_against_log_softmax(backend, n, v, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(n, 1, v, generator=gen)   # T = 1
    labels = torch.randint(0, v, (n, 1), generator=gen)
    lp, ent = token_logprobs(logits, labels, backend=backend, with_entropy=True)
    x = logits.double()
    logz = torch.logsumexp(x, -1)
    want = x.gather(-1, labels[..., None])[..., 0] - logz
    p = torch.exp(x - logz[..., None])
    torch.testing.assert_close(lp.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), -(p * torch.where(p > 0, torch.log(p), 0.0)).sum(-1), rtol=1e-4, atol=1e-4)
    assert (lp <= 0).all() and (ent >= -1e-6).all()
