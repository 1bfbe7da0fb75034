"""One registry per axis of the GRPO design space.

A part is a function registered under the string that selects it in YAML. Every
part of an axis takes the same positional data arguments, so the trainer calls
them all the same way; its keyword-only arguments (each with a default and a type)
are the part's parameters, set from YAML as `loss: {name: clipped, clip_high: 0.28}`.

    delta       fn(rewards (B, G), lengths (B, G) | None, greedy (B,) | None, components (B, G, C) | None,
                   extra: algos.deltas.Extra | None) -> deltas (B, G), or (B, G, T) for a token_level part
    loss        fn(logp, old_logp (B, G, T), deltas (B, G) | (B, G, T), mask (B, G, T))
                  -> (per-token loss to minimise (B, G, T), {clip region: bool (B, G, T)})
    aggregate   fn(per_token (B, G, T), mask (B, G, T)) -> scalar
    kl          fn(logp, ref_logp, old_logp | None (B, G, T)) -> per-token estimate of KL(pi || pi_ref)
    correction  fn(logp, old_logp, sampler_logp (B, G, T), deltas (B, G), mask (B, G, T))
                  -> (weight (B, G, T), keep: bool (B, G, T), {region: bool (B, G, T)})
    kl_ctrl     fn(coef, observed_kl, n_samples) -> the KL coefficient for the next rollout
    entropy_ctrl fn(coef, entropy | None) -> (its next state, the coefficient the next step applies)
    ref_update  fn(epoch) -> weight w of the policy in ref <- w * policy + (1 - w) * ref, or 0 for no update
    filter      fn(batch: algos.Batch) -> Batch   (runs at its `stage`: "rollout" or "step")
    reward      fn(prompts, completions, **kwargs) -> list[float]   (TRL's signature; `task` trait)
    task        cls(task_config, run_config) -> a Task (see grpo_bench/tasks/__init__.py); one module of
                  grpo_bench/tasks/ each, found there on first lookup

A user's own parts and tasks join without editing the package: `include: [my_parts.py]` in an
ablation file (or `--include`) loads the user's modules, whose `@register` calls add to these
registries; `module:function` names a function on any axis; an installed package names its
module in the `grpo_bench.parts` entry-point group.

What a part knows about itself travels with its registration (`register(axis, name,
**traits)`): `needs_group` (a baseline over G >= 2 responses), `needs` (extra inputs the
trainer must compute: a delta's "greedy", or the fields of its Extra -- "ids", "logp",
"entropy", "sum_pi_sq", "ref_rewards"; a loss's "ref_logp", handed to it in the place of
old_logp), `token_level` (a delta part that returns per-token deltas), `whole_batch` (a correction whose
weights depend on the whole batch), `stage` (filters), `per_member` (a reason: the part
cannot run under torch.func.vmap over a population axis, so a population loops over its
members for it). A parameter left at None is
filled from the run's context when the context has a value of that name (the task's
generation budget `max_len`, for instance). Constraints on parameters are written in
their annotations (`Annotated[float, Range(0, 1)]`), so checking a config and printing
`python -m grpo_bench list` derive from the signature, never from a second list.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import math
import pkgutil
import sys
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Callable

# axis -> names of the positional data arguments every part of it takes (None: classes)
AXES: dict[str, tuple[str, ...] | None] = {
    "delta": ("rewards", "lengths", "greedy", "components", "extra"),
    "loss": ("logp", "old_logp", "deltas", "mask"),
    "aggregate": ("per_token", "mask"),
    "kl": ("logp", "ref_logp", "old_logp"),
    "correction": ("logp", "old_logp", "sampler_logp", "deltas", "mask"),
    "kl_ctrl": ("coef", "observed_kl", "n_samples"),
    "entropy_ctrl": ("coef", "entropy"),
    "ref_update": ("epoch",),
    "filter": ("batch",),
    "reward": ("prompts", "completions", "**kwargs"),  # TRL's signature: data arrives as keywords
    "task": None,
}

# What a part of each axis takes and returns, in the words of the one-line error that refuses a user's part
# that does not (algos/contracts.py calls it on tiny tensors of these shapes when it registers)
CONTRACTS: dict[str, str] = {
    "delta": "fn(rewards (B, G), lengths (B, G), greedy (B,), components (B, G, C), extra: Extra, *, params) -> "
             "deltas: a finite tensor (B, G), or (B, G, T) for a token_level part",
    "loss": "fn(logp, old_logp (B, G, T), deltas (B, G) or (B, G, T), mask (B, G, T), *, params) -> "
            "(per-token loss: a finite tensor (B, G, T), {region name: tensor (B, G, T)})",
    "aggregate": "fn(per_token (B, G, T), mask (B, G, T), *, params) -> a finite 0-d tensor",
    "kl": "fn(logp, ref_logp, old_logp (B, G, T), *, params) -> per-token estimate: a finite tensor (B, G, T)",
    "correction": "fn(logp, old_logp, sampler_logp (B, G, T), deltas (B, G), mask (B, G, T), *, params) -> "
                  "(weight: a finite tensor (B, G, T), keep: a bool tensor (B, G, T), {region name: tensor (B, G, T)})",
    "kl_ctrl": "fn(coef, observed_kl, n_samples, *, params) -> the next coefficient: a finite number",
    "entropy_ctrl": "fn(coef or state, entropy or None, *, params) -> (state, the next coefficient: a finite number)",
    "ref_update": "fn(epoch, *, params) -> the policy's weight in the reference mix: a finite number",
    "filter": "fn(batch: Batch, *, params) -> a Batch (rewards (B, G), mask (B, G, T))",
    "reward": "fn(prompts, completions, **kwargs) -> list of finite floats, one per completion (TRL's signature)",
    "task": "cls(task_config, run_configs) -> a Task (grpo_bench/tasks/__init__.py)",
}

# Axes whose parts are pure tensor functions. Each such part gives the same result under
# torch.func.vmap over a leading population axis of its tensor arguments and of its float
# parameters (as 0-d tensors) as a loop over the members does, or is registered with
# per_member="why not" (tests/test_vmap.py holds every part to this).
TENSOR_AXES = ("delta", "loss", "aggregate", "kl", "correction", "filter")

# Packages whose modules' import fills the registries; imported on first lookup so that
# `from grpo_bench import registry` stays cheap and import cycles cannot bite. Every module of
# grpo_bench/tasks/ is a task's: a new task is a new module there, and nothing here changes.
# the packages whose modules register each axis's parts, found by name (so no import goes upward): a task's
# own reward (gym's `score`) is registered beside its task
_PROVIDERS = {axis: ("grpo_bench.algos",) for axis in AXES}
_PROVIDERS["task"] = ("grpo_bench.tasks",)
_PROVIDERS["reward"] = ("grpo_bench.algos", "grpo_bench.tasks")
_LOADED: set[str] = set()
# An installed package adds its parts and tasks by naming a module in this entry-point group
# (lm-evaluation-harness does the same for tasks): importing the module runs its @register calls.
ENTRY_POINTS = "grpo_bench.parts"
_INCLUDED: dict[str, str] = {}   # absolute path of a user's file -> the module name it was loaded as


# ------------------------------------------------------------------ constraints


@dataclass(frozen=True)
class Range:
    """A numeric parameter's allowed interval; open ends exclude the bound."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def violation(self, v: float) -> str | None:
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return f"must be {'>' if self.lo_open else '>='} {self.lo}, got {v}"
        if self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)):
            return f"must be {'<' if self.hi_open else '<='} {self.hi}, got {v}"
        return None


@dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]

    def violation(self, v: str) -> str | None:
        return None if v in self.options else f"unknown {v!r}; valid: {', '.join(self.options)}"


Positive = Annotated[float, Range(0, None, lo_open=True)]
NonNegative = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1, lo_open=True, hi_open=True)]  # (0, 1)
Probability = Annotated[float, Range(0, 1)]                           # [0, 1]
PositiveInt = Annotated[int, Range(1)]


# --------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Param:
    name: str
    default: Any
    type: Any                      # the annotation without its constraint
    constraint: Range | Choice | None

    def check(self, value: Any) -> str | None:
        """None when value is acceptable, else a message (the type was checked already)."""
        if value is None or self.constraint is None:
            return None
        if isinstance(value, float) and math.isnan(value):
            return "must be a number, got nan"
        return self.constraint.violation(value)


@dataclass(frozen=True)
class Entry:
    axis: str
    name: str
    obj: Any
    doc: str                        # first line of the docstring
    source: str = ""                # the docstring's "Source:" line
    config: type | None = None      # tasks: the dataclass their YAML section is checked against
    traits: dict = field(default_factory=dict)
    params: dict[str, Param] = field(default_factory=dict)


# A part as the hot path takes it: its entry (looked up once, when a run's recipe is bound) and every parameter
Part = tuple[Entry, dict]

_REGISTRY: dict[str, dict[str, Entry]] = {axis: {} for axis in AXES}


class UnknownPart(KeyError):
    def __init__(self, axis: str, name: str):
        self.axis, self.name = axis, name
        self.choices = names(axis)
        super().__init__(f"unknown {axis} {name!r}; valid: {', '.join(self.choices)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


def _split_annotation(tp: Any) -> tuple[Any, Range | Choice | None]:
    if typing.get_origin(tp) is Annotated:
        base, *meta = typing.get_args(tp)
        return base, next((m for m in meta if isinstance(m, (Range, Choice))), None)
    return tp, None


def _params(axis: str, name: str, fn: Callable) -> dict[str, Param]:
    sig = inspect.signature(fn)
    positional = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    want = AXES[axis]
    if want[-1] == "**kwargs":  # a leading signature plus keyword data; no tunable parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        if tuple(positional[:len(want) - 1]) != want[:-1] or not takes_kwargs:
            raise TypeError(f"{axis} {name!r}: signature must be ({', '.join(want)}), got {sig}")
        return {}
    hints = typing.get_type_hints(fn, include_extras=True)
    if tuple(positional) != want:
        raise TypeError(f"{axis} {name!r}: positional arguments must be {want}, got {tuple(positional)}")
    out = {}
    for p in sig.parameters.values():
        if p.kind is not p.KEYWORD_ONLY:
            continue
        if p.default is p.empty or p.name not in hints:
            raise TypeError(f"{axis} {name!r}: parameter {p.name!r} needs a type annotation and a default")
        tp, constraint = _split_annotation(hints[p.name])
        out[p.name] = Param(p.name, p.default, tp, constraint)
    return out


def _refuse(e: "Entry", problem: str) -> PartContractError:
    return PartContractError(f"{e.axis} {e.name!r} in {origin(e)}: {problem}; a {e.axis} part is "
                             f"{CONTRACTS[e.axis]}")


# algos/contracts.py's check (set when the package's parts load, as this module may not import torch) and the
# axes it covers; the users' parts it has passed
_CONTRACT: dict = {"check": None, "axes": ()}
_CHECKED: set[tuple[str, str]] = set()


def set_contract_check(check: Callable, axes: tuple[str, ...]) -> None:
    _CONTRACT.update(check=check, axes=axes)


def _check_contract(e: "Entry") -> None:
    """A user's part called on tiny inputs of its axis's shapes, once; PartContractError if it fails."""
    if (e.axis, e.name) in _CHECKED or not origin(e) or _CONTRACT["check"] is None \
            or e.axis not in _CONTRACT["axes"]:
        return
    problem = _CONTRACT["check"](e)
    if problem:
        raise _refuse(e, problem)
    _CHECKED.add((e.axis, e.name))


def register(axis: str, name: str, *, config: type | None = None, **traits) -> Callable:
    if axis not in _REGISTRY:
        raise ValueError(f"unknown axis {axis!r}; valid: {', '.join(AXES)}")

    def deco(obj):
        if name in _REGISTRY[axis]:
            raise ValueError(f"{axis} {name!r} registered twice")
        lines = (inspect.getdoc(obj) or "").strip().splitlines()
        source = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Source:")), "")
        e = Entry(axis, name, obj, lines[0] if lines else "", source, config, traits)
        try:
            params = _params(axis, name, obj) if AXES[axis] is not None else {}
        except TypeError as err:
            if origin(e):  # a user's: one line naming its file and what the axis takes
                raise _refuse(e, str(err).removeprefix(f"{axis} {name!r}: ")) from None
            raise
        e = dataclasses.replace(e, params=params)
        _check_contract(e)  # before it is registered: a refused part is not left behind
        _REGISTRY[axis][name] = e
        return obj

    return deco


def _load(axis: str) -> dict[str, Entry]:
    if axis not in _REGISTRY:
        raise ValueError(f"unknown axis {axis!r}; valid: {', '.join(AXES)}")
    if axis not in _LOADED:
        for provider in _PROVIDERS[axis]:
            pkg = importlib.import_module(provider)
            for mod in pkgutil.iter_modules(pkg.__path__):
                importlib.import_module(f"{pkg.__name__}.{mod.name}")
        if not _LOADED:  # once: installed packages' parts, after ours (a clash names theirs)
            for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
                try:
                    ep.load()
                except Exception as e:  # noqa: BLE001 - a broken plug-in must say which one it is
                    raise IncludeError(f"entry point {ep.name} = {ep.value} ({ENTRY_POINTS}): "
                                       f"{type(e).__name__}: {e}") from None
        _LOADED.add(axis)
    return _REGISTRY[axis]


class IncludeError(ValueError):
    """A user's module could not be loaded: the message names the file and the first line of the error."""


class PartContractError(IncludeError):
    """A user's part that does not take or return what its axis does: one line naming it, its file and the
    axis's contract (CONTRACTS)."""


def include(path: str | Path) -> list[Path]:
    """Load a user's Python file, or every `*.py` in a directory (not `_*`), so its `@register`
    calls fill the registries. Each file is loaded once per process, under a module name of
    its own; returns the files. Workers call this too: a run's config carries its `include`."""
    p = Path(path).expanduser().resolve()
    if not p.exists():
        raise IncludeError(f"{path}: no such file or directory")
    files = sorted(f for f in p.glob("*.py") if not f.name.startswith("_")) if p.is_dir() else [p]
    if p.is_file() and p.suffix != ".py":
        raise IncludeError(f"{path}: not a Python file (.py) or a directory of them")
    for f in files:
        key = str(f)
        if key in _INCLUDED:
            continue
        for axis in AXES:
            _load(axis)  # ours first, so a user's name that clashes with a shipped part is the one refused
        name = f"grpo_bench_user.{f.stem}_{hashlib.sha256(key.encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(name, f)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        _INCLUDED[key] = name
        try:
            spec.loader.exec_module(mod)
        except PartContractError:  # names the file already
            del sys.modules[name], _INCLUDED[key]
            raise
        except Exception as e:  # noqa: BLE001 - the user's code: one line naming the file
            del sys.modules[name], _INCLUDED[key]
            line = next((str(a) for a in [e] if str(a)), type(e).__name__).splitlines()[0]
            raise IncludeError(f"{f}: {type(e).__name__}: {line}") from None
    return files


def digest(paths: list[str]) -> str:
    """sha256 of the included files' bytes, in order: a run's id changes when the user's code does."""
    h = hashlib.sha256()
    for path in paths:
        p = Path(path)
        for f in (sorted(x for x in p.glob("*.py") if not x.name.startswith("_")) if p.is_dir() else [p]):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


PACKAGE = "grpo_bench_tasks"


@lru_cache(maxsize=1)
def tasks_dir() -> Path:
    """The top-level tasks/: presets (config/presets.py), shipped starts and the user's modules that
    `module:function` finds beside them; the checkout's, else the installed grpo_bench_tasks package."""
    checkout = Path(__file__).resolve().parents[1] / "tasks"
    if (checkout / "__init__.py").is_file():
        return checkout
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"no task presets: neither {checkout} nor an installed {PACKAGE} package")
    return Path(list(spec.submodule_search_locations)[0])


def _from_module(axis: str, spec: str) -> Entry | None:
    """`module:function` (or `module:Class` for a task) on any axis: imported (a module beside the
    task presets first, then by import path) and registered under that string."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        return None
    path = tasks_dir() / f"{module}.py"
    try:
        if path.is_file():
            include(path)
            mod = sys.modules[_INCLUDED[str(path.resolve())]]
        else:
            mod = importlib.import_module(module)
        obj = getattr(mod, attr)
    except (ImportError, AttributeError) as e:
        raise IncludeError(f"cannot load {axis} {spec!r}: {e}") from None
    if spec not in _REGISTRY[axis]:
        known = next((e for e in _REGISTRY[axis].values() if e.obj is obj), None)
        if known is not None:   # registered by its own decorator: the same part under a second name
            _REGISTRY[axis][spec] = dataclasses.replace(known, name=spec)
        else:
            register(axis, spec, **({"config": getattr(obj, "config", None)} if axis == "task" else {}))(obj)
    return _REGISTRY[axis][spec]


def origin(e: Entry) -> str:
    """Where a part was defined, for `list`: empty for the package's own, else its file."""
    mod = getattr(e.obj, "__module__", "") or ""
    if mod == "grpo_bench" or mod.startswith("grpo_bench."):
        return ""
    try:
        return inspect.getsourcefile(e.obj) or mod
    except TypeError:
        return mod


def names(axis: str) -> list[str]:
    return sorted(_load(axis))


def entry(axis: str, name: str) -> Entry:
    parts = _load(axis)
    if name not in parts:
        _from_module(axis, name)  # None unless module:function
    if name not in parts:
        raise UnknownPart(axis, name)
    try:
        _check_contract(parts[name])  # a part registered before the package's parts (and its check) loaded
    except PartContractError:
        del parts[name]
        raise
    return parts[name]


def get(axis: str, name: str):
    """The raw part: call it with the axis's data arguments and, optionally, its parameters."""
    return entry(axis, name).obj


def resolve_params(axis: str, name: str, given: dict | None = None, context: dict | None = None) -> dict:
    """Every parameter of a part: given values over defaults, None filled from the context.

    Raises ValueError("param: message") for an unknown parameter or a value out of range;
    types are the caller's business (config.py checks them against Param.type).
    """
    e = entry(axis, name)
    given = dict(given or {})
    unknown = [k for k in given if k not in e.params]
    if unknown:
        valid = ", ".join(e.params) or "none"
        raise ValueError(f"{unknown[0]}: {axis} {name!r} has no parameter {unknown[0]!r}; valid: {valid}")
    out = {}
    for p in e.params.values():
        v = given.get(p.name, p.default)
        if v is None and context and context.get(p.name) is not None:
            v = context[p.name]
        problem = p.check(v)
        if problem:
            raise ValueError(f"{p.name}: {problem}")
        out[p.name] = v
    return out


def bind(axis: str, spec: str | dict, context: dict | None = None) -> Callable:
    """The part selected by `spec` (a name, or {name: ..., param: value}) with its parameters fixed."""
    name, given = split_spec(spec)
    return functools.partial(get(axis, name), **resolve_params(axis, name, given, context))


def split_spec(spec: str | dict) -> tuple[str, dict]:
    if isinstance(spec, str):
        return spec, {}
    rest = {k: v for k, v in spec.items() if k != "name"}
    return spec["name"], rest


def parameters(e: Entry) -> dict[str, Any]:
    """The tunable parameters of a part and their defaults."""
    if is_dataclass(e.config):
        return {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(e.config)}
    return {p.name: p.default for p in e.params.values()}


def describe(fused_names=lambda axis: ()) -> str:
    """What `python -m grpo_bench list` prints: every part, its parameters, source, and fused or not
    (fused_names(axis): the parts the fused loss covers, numerics/kernels/spec.py's table; the CLI passes it)."""
    lines = []
    for axis in AXES:
        lines.append(f"{axis}:")
        fused = fused_names(axis)
        for name in names(axis):
            e = entry(axis, name)
            params = ", ".join(f"{k}={v!r}" for k, v in parameters(e).items())
            flags = [f"{k}={e.traits[k]}" for k in ("stage", "task") if k in e.traits]
            flags += ["per_member"] if e.traits.get("per_member") else []
            flags += ["fused"] if name in fused else []
            head = f"  {name:<24} {e.doc}"
            lines.append(head + (f"  [{'; '.join(flags)}]" if flags else ""))
            if params:
                lines.append(f"  {'':<24}   params: {params}")
            if e.source:
                lines.append(f"  {'':<24}   source: {e.source}")
            if origin(e):
                lines.append(f"  {'':<24}   file: {origin(e)}")
            if isinstance(e.traits.get("per_member"), str):  # why a population runs it member by member
                lines.append(f"  {'':<24}   per member: {e.traits['per_member']}")
    return "\n".join(lines)
