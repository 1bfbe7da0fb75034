"""One registry per axis of the GRPO design space.

A part is registered under the string that selects it in YAML. Every part of an
axis has the same signature, so the trainer calls them all the same way:

    delta      fn(rewards (B, G), *, eps) -> deltas (B, G)
    loss       fn(logp, old_logp (B, G, T), deltas (B, G), mask=None, *, clip_low, clip_high) -> (B, G, T)
    kl         fn(logp, ref_logp (B, G, T)) -> per-token estimate of KL(pi || pi_ref), (B, G, T)
    aggregate  fn(per_token (B, G, T), mask (B, G, T), *, max_len=None) -> scalar
    task       cls(task_config, run_config) -> a Task (see grpo_bench/tasks/__init__.py)

Keyword-only arguments with defaults are the part's parameters; `python -m
grpo_bench list` prints them.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, Callable

AXES = ("delta", "loss", "aggregate", "kl", "task")

# Modules whose import fills the registries; imported on first lookup so that
# `from grpo_bench import registry` stays cheap and import cycles cannot bite.
_PROVIDERS = {
    "delta": ["grpo_bench.algos"],
    "loss": ["grpo_bench.algos"],
    "aggregate": ["grpo_bench.algos"],
    "kl": ["grpo_bench.algos"],
    "task": ["grpo_bench.tasks.sort", "grpo_bench.tasks.arithmetic"],
}


@dataclass(frozen=True)
class Entry:
    name: str
    obj: Any
    doc: str
    config: type | None = None  # tasks: the dataclass their YAML section is checked against


_REGISTRY: dict[str, dict[str, Entry]] = {axis: {} for axis in AXES}


class UnknownPart(KeyError):
    def __init__(self, axis: str, name: str):
        self.axis, self.name = axis, name
        self.choices = names(axis)
        super().__init__(f"unknown {axis} {name!r}; valid: {', '.join(self.choices)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


def register(axis: str, name: str, config: type | None = None) -> Callable:
    if axis not in _REGISTRY:
        raise ValueError(f"unknown axis {axis!r}; valid: {', '.join(AXES)}")

    def deco(obj):
        if name in _REGISTRY[axis]:
            raise ValueError(f"{axis} {name!r} registered twice")
        doc = (inspect.getdoc(obj) or "").strip().split("\n")[0]
        _REGISTRY[axis][name] = Entry(name, obj, doc, config)
        return obj

    return deco


def _load(axis: str) -> dict[str, Entry]:
    if axis not in _REGISTRY:
        raise ValueError(f"unknown axis {axis!r}; valid: {', '.join(AXES)}")
    for mod in _PROVIDERS[axis]:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # a real missing dependency, not an absent optional task
                raise
    return _REGISTRY[axis]


def names(axis: str) -> list[str]:
    return sorted(_load(axis))


def entry(axis: str, name: str) -> Entry:
    parts = _load(axis)
    if name not in parts:
        raise UnknownPart(axis, name)
    return parts[name]


def get(axis: str, name: str):
    return entry(axis, name).obj


def parameters(e: Entry) -> dict[str, Any]:
    """The tunable parameters of a part and their defaults."""
    if e.config is not None and is_dataclass(e.config):
        return {f.name: f.default_factory() if f.default is MISSING else f.default
                for f in fields(e.config) if f.name != "name"}
    sig = inspect.signature(e.obj)
    return {p.name: p.default for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}


def describe() -> str:
    lines = []
    for axis in AXES:
        lines.append(f"{axis}:")
        for name in names(axis):
            e = entry(axis, name)
            params = ", ".join(f"{k}={v!r}" for k, v in parameters(e).items())
            lines.append(f"  {name:<26} {e.doc}" + (f"  [{params}]" if params else ""))
    return "\n".join(lines)
