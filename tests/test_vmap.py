"""Every tensor part runs under torch.func.vmap over a population axis, or says why not.

A population stacks P runs on a leading axis in one process; the members may differ in
their numbers (clip bounds, thresholds), so every float parameter is passed as a 0-d tensor
per member. For every registered part of every axis in registry.TENSOR_AXES (derived from
the registry, not listed here), on random shapes, ragged masks, flat groups and mixed-sign
deltas: vmap over the members equals a Python loop over them, and the loop with 0-d tensor
parameters equals the loop with plain floats (the path every single run takes). A part
registered per_member must really fail under vmap, or is skipped with its stated reason.
"""
import math
import typing

import pytest
import torch
from torch.func import vmap

from grpo_bench import registry
from grpo_bench.algos import Batch
from grpo_bench.algos.deltas import Extra
from grpo_bench.numerics.kernels.spec import fused_names

P = 3
SHAPES = [(2, 4, 5), (3, 2, 7)]  # (B, G, T)


pytestmark = pytest.mark.usefixtures("fp64")


def _floaty(p: registry.Param) -> bool:
    tp = p.type
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, type(int | None)) else (tp,)
    return float in args and not isinstance(p.default, bool)


def member_params(e: registry.Entry, fill_none: bool) -> dict[str, list]:
    """Per-member values of every float parameter: the default spread by a few percent
    (0.5 spread likewise for a null default when fill_none), kept only when in range."""
    out = {}
    for p in e.params.values():
        if not _floaty(p) or (p.default is None and not fill_none):
            continue
        base = 0.5 if p.default is None else p.default
        values = [base * (1 + 0.05 * i) for i in range(P)]
        if all(p.check(v) is None for v in values):
            out[p.name] = values
    return out


def data(shape, seed):
    b, g, t = shape
    gen = torch.Generator().manual_seed(seed)
    logp = -3 * torch.rand(P, b, g, t, generator=gen)
    old = logp + 0.3 * torch.randn(P, b, g, t, generator=gen)
    sampler = old + 0.2 * torch.randn(P, b, g, t, generator=gen)
    ref = logp + 0.3 * torch.randn(P, b, g, t, generator=gen)
    lengths = torch.randint(1, t + 1, (P, b, g), generator=gen)
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).double()
    mask[:, -1, -1] = 0.0                                         # an empty response
    components = torch.randint(0, 2, (P, b, g, 2), generator=gen).double()
    components[:, 0] = 1.0                                       # a flat group
    rewards = components[..., 0] + 0.5 * components[..., 1]
    deltas = torch.randn(P, b, g, generator=gen)
    deltas[:, 0, 0] = 0.0
    # what a delta part's needs ask for (algos.deltas.Extra): few token ids, so that responses share some
    ids = torch.randint(0, 2, (P, b, g, t), generator=gen)
    sum_pi_sq = torch.exp(old) ** 2 + 0.3 * torch.rand(P, b, g, t, generator=gen)
    return dict(logp=logp, old=old, sampler=sampler, ref=ref, mask=mask, rewards=rewards, components=components,
                deltas=deltas, lengths=mask.sum(-1), greedy=torch.randn(P, b, generator=gen),
                finished=torch.rand(P, b, g, generator=gen) > 0.3, entropy=2 * torch.rand(P, b, g, t, generator=gen),
                ids=ids, sum_pi_sq=sum_pi_sq, ref_rewards=torch.randint(0, 2, (P, b, 3), generator=gen).double())


def _batch_fn(fn, max_len):
    def run(rewards, mask, lengths, finished, entropy, **params):
        out = fn(Batch(rewards, mask, lengths, finished, max_len, entropy=entropy), **params)
        return {k: getattr(out, k) for k in ("rewards", "mask", "gate", "keep", "retire") if getattr(out, k) is not None}
    return run


def _delta_fn(fn):
    def run(rewards, lengths, greedy, components, mask, ids, logp, entropy, sum_pi_sq, ref_rewards, **params):
        return fn(rewards, lengths, greedy, components, Extra(mask, ids, logp, entropy, sum_pi_sq, ref_rewards),
                  **params)
    return run


# each tensor axis: (the part made a function of tensors only, the member-stacked tensors it takes)
CALLS = {
    "delta": lambda fn, d, t: (_delta_fn(fn), [d["rewards"], d["lengths"], d["greedy"], d["components"], d["mask"],
                                               d["ids"], d["old"], d["entropy"], d["sum_pi_sq"], d["ref_rewards"]]),
    "loss": lambda fn, d, t: (fn, [d["logp"], d["old"], d["deltas"], d["mask"]]),
    "aggregate": lambda fn, d, t: (fn, [d["logp"] * d["deltas"].unsqueeze(-1), d["mask"]]),
    "kl": lambda fn, d, t: (fn, [d["logp"], d["ref"], d["old"]]),
    "correction": lambda fn, d, t: (fn, [d["logp"], d["old"], d["sampler"], d["deltas"], d["mask"]]),
    "filter": lambda fn, d, t: (_batch_fn(fn, t), [d["rewards"], d["mask"], d["lengths"], d["finished"],
                                                   d["entropy"]]),
}


def cases():
    for axis in registry.TENSOR_AXES:
        for name in registry.names(axis):
            yield pytest.param(axis, name, id=f"{axis}-{name}")


def test_every_tensor_axis_has_a_call():
    assert set(registry.TENSOR_AXES) == set(CALLS), "a new tensor axis needs its inputs here"
    assert set(registry.TENSOR_AXES) <= set(registry.AXES)


def _vmapped(fn, args, params):
    # parameters go in positionally: vmap does not map keyword arguments
    return vmap(lambda a, prm: fn(*a, **prm))(args, params)


def _loop(fn, args, params, as_tensor: bool):
    outs = []
    torch.manual_seed(0)  # parts that draw (clip_cov) draw the same in both loops
    for i in range(P):
        kw = {k: (v[i] if as_tensor else v[i].item()) for k, v in params.items()}
        outs.append(fn(*[a[i] for a in args], **kw))
    return torch.utils._pytree.tree_map(lambda *xs: torch.stack(xs), *outs)


def _same(a, b, exact=False):
    fa, sa = torch.utils._pytree.tree_flatten(a)
    fb, sb = torch.utils._pytree.tree_flatten(b)
    assert sa == sb
    for x, y in zip(fa, fb):
        if exact or x.dtype == torch.bool:
            assert torch.equal(x, y)
        else:
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=["b2g4t5", "b3g2t7"])
@pytest.mark.parametrize("axis,name", list(cases()))
def test_vmap_equals_a_loop_over_members(axis, name, shape):
    e = registry.entry(axis, name)
    d = data(shape, seed=hash((axis, name)) % 1000)
    fn, args = CALLS[axis](e.obj, d, shape[-1])
    why = e.traits.get("per_member")
    for fill_none in (False, True):
        params = {k: torch.tensor(v) for k, v in member_params(e, fill_none).items()}
        looped = _loop(fn, args, params, as_tensor=True)
        # the 0-d tensor parameter path gives the float path's numbers
        _same(looped, _loop(fn, args, params, as_tensor=False))
        if why:
            try:
                mapped = _vmapped(fn, args, params)
            except Exception:
                continue  # it really cannot run under vmap: per_member is true
            pytest.skip(f"per_member: {why}")
        _same(_vmapped(fn, args, params), looped)


def test_members_really_differ_in_their_parameters():
    """Not vacuous: a member's own clip bound changes its loss, and vmap keeps the members apart."""
    fn = registry.get("loss", "clipped")
    d = data((2, 4, 5), seed=3)
    d["old"] = d["logp"] + 0.5 * torch.randn(d["logp"].shape, generator=torch.Generator().manual_seed(0))
    high = torch.tensor([0.05, 0.2, 1.0])
    out, _ = vmap(lambda lp, o, dl, m, h: fn(lp, o, dl, m, clip_high=h))(d["logp"], d["old"], d["deltas"], d["mask"],
                                                                         high)
    for i in range(P):
        want, _ = fn(d["logp"][i], d["old"][i], d["deltas"][i], d["mask"][i], clip_high=float(high[i]))
        torch.testing.assert_close(out[i], want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out[0], out[2])


def test_per_member_parts_give_their_reason_and_list_shows_it():
    text = registry.describe(fused_names)
    flagged = [(a, n) for a in registry.TENSOR_AXES for n in registry.names(a)
               if registry.entry(a, n).traits.get("per_member")]
    assert {("loss", "clip_cov"), ("loss", "kl_cov"), ("filter", "dynamic_sampling"),
            ("filter", "top_entropy")} <= set(flagged)
    for axis, name in flagged:
        why = registry.entry(axis, name).traits["per_member"]
        assert isinstance(why, str) and len(why) > 20, (axis, name)
        line = next(ln for ln in text.splitlines() if ln.startswith(f"  {name} ") and "per_member" in ln)
        assert line
    assert math.isfinite(P)
