"""What a part of each axis must return, checked on a user's part before any run uses it.

A part the package does not ship (an `include:` file, `module:function`, an entry point) is called
once, when it registers (or, if it registered before the package's parts loaded, when it is first
looked up), on tiny tensors of its axis's documented shapes (B = 2 prompts, G = 3 responses, T = 8
tokens; every value finite) with its parameters at their defaults. A call that raises, a return of
the wrong type or shape, or a non-finite number is refused in one line naming the part, its file
and the axis's contract (registry.CONTRACTS): before, a loss returning one tensor ran, and every
run of it failed with "too many values to unpack (expected 2)". Rewards are not called here (they
need their task's data); every reward call is checked as it happens (algos/rewards.py). Tasks are
classes whose config the strict loader checks.
"""
from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from .. import registry
from .deltas import Extra
from .filters import Batch

B, G, T = 2, 3, 8


def _inputs() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(B, G, T)
    mask[0, 1, 2:] = 0.0  # a response shorter than the budget
    logp = lambda: -0.1 - 2.0 * torch.rand(B, G, T, generator=g)  # noqa: E731
    rewards = torch.rand(B, G, generator=g)
    return {"logp": logp(), "old_logp": logp(), "ref_logp": logp(), "sampler_logp": logp(), "mask": mask,
            "deltas": torch.randn(B, G, generator=g), "rewards": rewards, "lengths": mask.sum(-1),
            "greedy": torch.rand(B, generator=g), "components": rewards[..., None],
            "ids": torch.randint(0, 5, (B, G, T), generator=g), "entropy": torch.rand(B, G, T, generator=g),
            "sum_pi_sq": 0.2 + 0.5 * torch.rand(B, G, T, generator=g), "ref_rewards": torch.rand(B, 4, generator=g)}


def _tensor(x, shape: tuple, what: str, dtype=None) -> str | None:
    if not isinstance(x, Tensor):
        return f"{what} is a {type(x).__name__}, not a tensor"
    if tuple(x.shape) != shape:
        return f"{what} has shape {tuple(x.shape)}, expected {shape}"
    if dtype is torch.bool and x.dtype is not torch.bool:
        return f"{what} has dtype {x.dtype}, expected torch.bool"
    if x.is_floating_point() and not torch.isfinite(x).all():
        return f"{what} is not finite ({x.flatten().tolist()}) on finite inputs"
    return None


def _number(x, what: str) -> str | None:
    if isinstance(x, Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, Real):
        return f"{what} is a {type(x).__name__}, not a number"
    return None if math.isfinite(x) else f"{what} is {x} on finite inputs"


def _regions(d, what: str) -> str | None:
    if not isinstance(d, dict):
        return f"{what} is a {type(d).__name__}, not a dict"
    return next(filter(None, (_tensor(v, (B, G, T), f"{what}[{k!r}]") for k, v in d.items())), None)


def _pair(out, what: str) -> str | None:
    if not isinstance(out, tuple) or len(out) != 2:
        n = f"a tuple of {len(out)}" if isinstance(out, tuple) else f"a {type(out).__name__}"
        return f"returned {n}, not a pair ({what})"
    return None


def _call(e: registry.Entry, x: dict):
    """The part on the inputs its axis takes, its parameters at their defaults (a None one that the run's
    context fills, max_len, is the budget T)."""
    params = {p.name: (T if p.default is None and p.name == "max_len" else p.default) for p in e.params.values()}
    fn = e.obj
    if e.axis == "delta":
        needs = set(e.traits.get("needs", ()))
        extra = Extra(mask=x["mask"], **{k: x[k] for k in ("ids", "logp", "entropy", "sum_pi_sq", "ref_rewards")
                                         if k in needs})
        return fn(x["rewards"], x["lengths"], x["greedy"], x["components"], extra, **params)
    if e.axis == "loss":
        return fn(x["logp"], x["ref_logp" if "ref_logp" in e.traits.get("needs", ()) else "old_logp"],
                  x["deltas"], x["mask"], **params)
    if e.axis == "aggregate":
        return fn(x["logp"].neg(), x["mask"], **params)
    if e.axis == "kl":
        return fn(x["logp"], x["ref_logp"], x["old_logp"], **params)
    if e.axis == "correction":
        return fn(x["logp"], x["old_logp"], x["sampler_logp"], x["deltas"], x["mask"], **params)
    if e.axis == "kl_ctrl":
        return fn(0.05, 0.02, B * G, **params)
    if e.axis == "entropy_ctrl":
        first = fn(0.01, None, **params)   # as the recipe starts it, then after a step
        # a first return that is no pair is what problem() names, not the unpacking's TypeError
        return first if _pair(first, "") else fn(first[0], 1.0, **params)
    if e.axis == "ref_update":
        return fn(3, **params)
    if e.axis == "filter":
        batch = Batch(rewards=x["rewards"], mask=x["mask"], lengths=x["lengths"], finished=torch.ones(B, G).bool(),
                      max_len=T, entropy=x["entropy"], components=x["components"])
        return fn(batch, **params)
    raise AssertionError(e.axis)


def problem(e: registry.Entry) -> str | None:
    """What is wrong with what the part returns on tiny inputs, or None."""
    try:
        with torch.no_grad():
            out = _call(e, _inputs())
    except Exception as err:  # noqa: BLE001 - the user's code: what it raised, in one line
        line = (str(err).splitlines() or [""])[0]
        return f"raised {type(err).__name__}: {line}" if line else f"raised {type(err).__name__}"
    if e.axis == "delta":
        return _tensor(out, (B, G, T) if e.traits.get("token_level") else (B, G), "the deltas")
    if e.axis == "loss":
        return (_pair(out, "per-token loss, regions") or _tensor(out[0], (B, G, T), "the per-token loss")
                or _regions(out[1], "the regions"))
    if e.axis == "aggregate":
        return _tensor(out, (), "the aggregate")
    if e.axis == "kl":
        return _tensor(out, (B, G, T), "the per-token estimate")
    if e.axis == "correction":
        if not isinstance(out, tuple) or len(out) != 3:
            return f"returned a {type(out).__name__}{f' of {len(out)}' if isinstance(out, tuple) else ''}, not " \
                   "a triple (weight, keep, regions)"
        return (_tensor(out[0], (B, G, T), "the weight") or _tensor(out[1], (B, G, T), "keep", torch.bool)
                or _regions(out[2], "the regions"))
    if e.axis in ("kl_ctrl", "ref_update"):
        return _number(out, "what it returned")
    if e.axis == "entropy_ctrl":
        return _pair(out, "state, coefficient") or _number(out[1], "the coefficient")
    if e.axis == "filter":
        if not isinstance(out, Batch):
            return f"returned a {type(out).__name__}, not a Batch"
        return _tensor(out.rewards, (B, G), "the batch's rewards") or _tensor(out.mask, (B, G, T), "the batch's mask")
    return None


CHECKED_AXES = ("delta", "loss", "aggregate", "kl", "correction", "kl_ctrl", "entropy_ctrl", "ref_update", "filter")
registry.set_contract_check(problem, CHECKED_AXES)
