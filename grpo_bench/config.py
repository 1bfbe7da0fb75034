"""Run and ablation configuration: dataclasses, strict YAML loading, cross-field checks.

Every key has a docstring-like comment; an unknown key, a wrong type or a bad
value raises ConfigError, which the CLI prints as one line naming the file, the
key and the valid choices.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from . import presets, registry, strict_yaml
from .lm import shipped

BACKENDS = ("auto", "torch", "chunked", "triton")
KL_PLACEMENTS = ("loss", "reward")
OPTIMIZERS = ("adam", "adamw", "sgd")
# seeds are int64 in every table (pandas, Parquet); torch takes [0, 2**64) and folds negative ones onto them
SEED_LIMIT = 2**63
MAX_SEEDS = 100_000  # a bound on `seeds: N`: 10**9 would allocate the plan before a single run


class ConfigError(ValueError):
    def __init__(self, source: str, key: str, message: str):
        self.source, self.key, self.message = source, key, message
        super().__init__(f"{source}: {key}: {message}")


Part = Union[str, dict]  # a registered name, or {name: <name>, <param>: <value>, ...}

# the axes a run config selects one part of, each under the key of the same name
PART_KEYS = ("delta", "loss", "aggregate", "kl", "kl_ctrl", "ref_update", "entropy_ctrl")


SAMPLER_PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class SamplerSection:
    """The policy that generates the rollouts, where it differs from the one that trains (an inference engine)."""

    precision: str = "fp32"
    """The sampler's copy of the weights and its compute: fp32 (the trainer's own), bf16 or fp16; its logits
    are sampled from in fp32, as vLLM does. The mismatch of "Defeating the Training-Inference Mismatch via FP16"."""
    staleness: int = 0
    """The sampler's weights are the policy's of this many optimizer updates ago (PipelineRL-k, asynchronous RL)."""

    @property
    def active(self) -> bool:
        return self.precision != "fp32" or self.staleness > 0


@dataclass
class RunConfig:
    """One training run: a task, one choice per GRPO axis, and the optimisation budget.

    A part is its registered name or a mapping with its parameters, e.g.
    `loss: {name: clipped, clip_high: 0.28}`; `python -m grpo_bench list` shows every
    part's parameters and defaults. Resolved, every part is a mapping holding all of its
    parameters, which is what is saved beside each run.
    """

    task: Any = field(default_factory=lambda: {"name": "sort"})
    """Task section: `{name: <task>, ...}`; the rest is checked against that task's config."""
    delta: Part = "zscore"
    """Advantage mode (registry axis `delta`)."""
    loss: Part = "clipped"
    """Policy loss (axis `loss`); its clip range and other parameters are its own."""
    aggregate: Part = "seq_mean_token_mean"
    """How per-token losses become one scalar (axis `aggregate`)."""
    kl: Part = "k3"
    """KL estimator (axis `kl`); only used when kl_coef > 0."""
    kl_coef: float = 0.0
    """beta: weight of the KL term; 0 turns KL and the reference policy off."""
    kl_track: bool = False
    """Compute the reference's log-probs even with kl_coef 0, to log how far the policy drifted from it (kl/seq); one more no-grad forward per rollout."""
    kl_placement: str = "loss"
    """`loss`: beta*KL added per token before aggregation; `reward`: beta * summed KL subtracted from each response's reward before deltas."""
    kl_ctrl: Part = "fixed"
    """How beta changes over training (axis `kl_ctrl`): fixed, or adaptive to a target KL."""
    ref_update: Part = "frozen"
    """When and how the reference policy follows the policy (axis `ref_update`): frozen, hard copies, soft (TR-DPO) mixes."""
    filters: list = field(default_factory=list)
    """Sample filters (axis `filter`), applied in this order, e.g. [dynamic_sampling, {name: overlong_punish, cache: 2}]."""
    corrections: list = field(default_factory=list)
    """Off-policy corrections (axis `correction`) from the sampler's log-probs, composed, e.g. [token_tis, {name: opsm, threshold: 0.5}]."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (- coef * token-mean entropy, TRL's); 0 and entropy_ctrl fixed: no bonus. The adaptive controller's starting value."""
    entropy_ctrl: Part = "fixed"
    """How the entropy bonus's coefficient changes (axis `entropy_ctrl`): fixed, or adaptive to a target entropy (Skywork-OR1, TRL)."""
    nll_coef: float = 0.0
    """Weight of the positive-example NLL term (VAPO, NeMo-RL): token-mean -log pi over responses with a positive reward; 0 = off."""
    adv_clip: Any = None
    """Clamp every delta after the delta part: a number c gives [-c, c], a pair [low, high] (null: open); null = off (NeMo-RL, ROLL)."""
    group_size: int = 10
    """G: responses sampled per prompt."""
    epochs: int = 100
    """Rollouts: each samples fresh responses and takes inner_steps gradient steps on them."""
    inner_steps: int = 10
    """K: gradient steps per rollout; K > 1 is where ratio and clipping matter (K = 1 is exactly on-policy)."""
    optimizer: str = "adam"
    """adam, adamw or sgd."""
    lr: float = 1e-3
    """Learning rate."""
    weight_decay: float = 0.0
    """Weight decay (adamw: decoupled)."""
    max_grad_norm: float = 0.0
    """Clip the global gradient norm to this; 0 = no clipping (grad/norm is logged either way)."""
    seed: int = 0
    """Seeds initialisation, prompts and sampling; same seed and config give the same numbers on CPU."""
    log_every: int = 1
    """Record metrics every N gradient steps (and always on the last)."""
    eval_every: int = 0
    """Run the task's held-out evaluation every N epochs (and at the start and the end); 0 = only at the end."""
    backend: str = "auto"
    """Log-prob / loss implementation: torch, chunked, triton, or auto (triton on CUDA, chunked on CPU)."""
    device: str = "cpu"
    """cpu, cuda, or auto (cuda when available)."""
    include: list = field(default_factory=list)
    """The user's Python files or directories (absolute paths) whose `@register`ed parts and tasks this run uses; an ablation's `include:` and `--include` fill it."""
    sampler: SamplerSection = field(default_factory=SamplerSection)
    """Who samples (section): a copy of the policy in another precision and/or some updates old. Its own
    log-probs travel with the rollout (as an inference engine's do), for the corrections and mismatch/* metrics."""


def _type_ok(value: Any, tp: Any) -> tuple[bool, Any]:
    """Accept value for annotation tp, coercing int -> float; returns (ok, value)."""
    if tp is Any:
        return True, value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, v = _type_ok(value, arg)
            if ok:
                return True, v
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if origin is list:
        return isinstance(value, list), value
    if origin is dict or tp is dict:
        return isinstance(value, dict), value
    if isinstance(tp, type):
        return isinstance(value, tp), value
    return True, value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def build_dataclass(cls: type, data: dict, source: str, prefix: str = "") -> Any:
    """cls(**data), strictly: unknown keys and wrong types are ConfigErrors; a field whose
    type is itself a dataclass (a config section) is built from its mapping the same way."""
    if not isinstance(data, dict):
        raise ConfigError(source, prefix.rstrip(".") or "<root>", f"expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(source, prefix + str(key), f"unknown key; valid: {', '.join(names)}")
        if dataclasses.is_dataclass(hints[key]):
            kwargs[key] = build_dataclass(hints[key], value, source, f"{prefix}{key}.")
            continue
        ok, value = _type_ok(value, hints[key])
        if not ok:
            want = _type_name(hints[key])
            if hints[key] == Part and key in PART_KEYS:
                want = f"a {key} name or a mapping with `name` (valid: {', '.join(registry.names(key))})"
            raise ConfigError(source, prefix + key, f"expected {want}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):  # inf and nan only fail once training runs
            raise ConfigError(source, prefix + key, f"must be a finite number, got {value}")
        kwargs[key] = value
    return cls(**kwargs)


def _require(cond: bool, source: str, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(source, key, message)


def _check_name(axis: str, name: str, source: str, key: str) -> None:
    try:
        registry.entry(axis, name)  # `module:function` is imported here
    except registry.UnknownPart:
        raise ConfigError(source, key, f"unknown {axis} {name!r}; valid: {', '.join(registry.names(axis))} "
                          "or module:function") from None
    except registry.IncludeError as e:
        raise ConfigError(source, key, str(e)) from None


def load_includes(paths: Any, source: str) -> None:
    """The user's modules a config names, loaded before any of its parts is looked up."""
    if not paths:
        return
    _require(isinstance(paths, list) and all(isinstance(p, str) for p in paths), source, "include",
             f"expected a list of paths to .py files or directories, got {paths!r}")
    for p in paths:
        try:
            registry.include(p)
        except registry.IncludeError as e:
            raise ConfigError(source, "include", str(e)) from None


def resolve_run(data: dict, source: str = "<config>") -> RunConfig:
    """Build a RunConfig from a plain dict; the task section becomes its task's dataclass,
    every part a mapping with all of its parameters."""
    data = copy.deepcopy(data)
    load_includes(data.get("include"), source)
    cfg = build_dataclass(RunConfig, data, source)
    task = cfg.task
    if isinstance(task, str):
        task = {"name": task}
    if dataclasses.is_dataclass(task):
        task = dataclasses.asdict(task) | {"name": task_name(cfg)}
    tasks, known_presets = registry.names("task"), presets.names()
    valid = f"{', '.join(tasks)} (tasks); {', '.join(known_presets)} (presets in {presets.tasks_dir()})"
    _require(isinstance(task, dict) and "name" in task, source, "task.name", "missing; valid: " + valid)
    if task["name"] not in tasks and task["name"] in known_presets:
        task = presets.merge(presets.section(task["name"]), {k: v for k, v in task.items() if k != "name"})
    _require(task["name"] in tasks, source, "task.name", f"unknown task {task['name']!r}; valid: {valid}")
    entry = registry.entry("task", task["name"])
    cfg.task = build_dataclass(entry.config, {k: v for k, v in task.items() if k != "name"}, source, "task.")
    resolve_parts(cfg, source, run_context(cfg))
    validate(cfg, source)
    return cfg


def resolve_parts(cfg: RunConfig, source: str, context: dict) -> None:
    """Every part of cfg, in place, to {name, every parameter}; the run config and the TRL bridge share it."""
    for axis in PART_KEYS:
        setattr(cfg, axis, resolve_part(axis, getattr(cfg, axis), source, axis, context))
    cfg.filters = [resolve_part("filter", f, source, f"filters.{i}", context) for i, f in enumerate(cfg.filters)]
    cfg.corrections = [resolve_part("correction", c, source, f"corrections.{i}", context)
                       for i, c in enumerate(cfg.corrections)]


def run_context(cfg: RunConfig) -> dict:
    """What parts' null parameters are filled from: the generation budget, the task's reward weights."""
    context = {"max_len": cfg.task.generation_budget}
    rewards = getattr(cfg.task, "rewards", None)
    if isinstance(rewards, dict):  # gdpo weighs its normalised components as the task weighs its rewards
        context["reward_weights"] = [float(w) for w in rewards.values()]
    return context



def resolve_part(axis: str, value: Any, source: str, key: str, context: dict | None = None) -> dict:
    """`name` or {name: ..., params} -> {name: ..., every param}, or ConfigError naming the key."""
    if isinstance(value, dict):
        _require(isinstance(value.get("name"), str), source, f"{key}.name",
                 f"missing; valid: {', '.join(registry.names(axis))}")
        name, given = value["name"], {k: v for k, v in value.items() if k != "name"}
    elif isinstance(value, str):
        name, given = value, {}
    else:
        raise ConfigError(source, key, f"expected a {axis} name or a mapping with `name`, got {value!r}")
    _check_name(axis, name, source, key if isinstance(value, str) else f"{key}.name")
    params = registry.entry(axis, name).params
    for k, v in given.items():
        if k in params:
            ok, given[k] = _type_ok(v, params[k].type)
            _require(ok, source, f"{key}.{k}", f"expected {_type_name(params[k].type)}, got {v!r}")
    try:
        resolved = registry.resolve_params(axis, name, given, context)
    except ValueError as e:
        param, _, msg = str(e).partition(": ")
        raise ConfigError(source, f"{key}.{param}", msg) from None
    return {"name": name, **resolved}


def task_name(cfg: RunConfig) -> str:
    for name in registry.names("task"):
        if isinstance(cfg.task, registry.entry("task", name).config):
            return name
    raise TypeError(f"no task registered for {type(cfg.task).__name__}")


def validate(cfg: RunConfig, source: str) -> None:
    _require(cfg.kl_placement in KL_PLACEMENTS, source, "kl_placement",
             f"unknown {cfg.kl_placement!r}; valid: {', '.join(KL_PLACEMENTS)}")
    _require(cfg.backend in BACKENDS, source, "backend", f"unknown {cfg.backend!r}; valid: {', '.join(BACKENDS)}")
    _require(cfg.optimizer in OPTIMIZERS, source, "optimizer", f"unknown {cfg.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    _require(cfg.device in ("cpu", "cuda", "auto"), source, "device", f"unknown {cfg.device!r}; valid: cpu, cuda, auto")
    _require(cfg.kl_coef >= 0, source, "kl_coef", f"must be >= 0, got {cfg.kl_coef}")
    _require(cfg.sampler.precision in SAMPLER_PRECISIONS, source, "sampler.precision",
             f"unknown {cfg.sampler.precision!r}; valid: {', '.join(SAMPLER_PRECISIONS)}")
    _require(cfg.sampler.staleness >= 0, source, "sampler.staleness", f"must be >= 0, got {cfg.sampler.staleness}")
    _require(cfg.entropy_coef >= 0, source, "entropy_coef", f"must be >= 0, got {cfg.entropy_coef}")
    _require(cfg.nll_coef >= 0, source, "nll_coef", f"must be >= 0, got {cfg.nll_coef}")
    _check_adv_clip(cfg.adv_clip, source)
    for key, axis, part in [(a, a, getattr(cfg, a)) for a in PART_KEYS] + \
            [(f"filters.{i}", "filter", f) for i, f in enumerate(cfg.filters)]:
        if registry.entry(axis, part["name"]).traits.get("needs_group"):
            _require(cfg.group_size >= 2, source, "group_size",
                     f"must be >= 2 with {key} {part['name']!r} (it compares responses within a group), got {cfg.group_size}")
    _require(cfg.group_size >= 1, source, "group_size", f"must be >= 1, got {cfg.group_size}")
    _require(cfg.epochs >= 1, source, "epochs", f"must be >= 1, got {cfg.epochs}")
    _require(cfg.inner_steps >= 1, source, "inner_steps", f"must be >= 1, got {cfg.inner_steps}")
    _require(cfg.lr > 0, source, "lr", f"must be > 0, got {cfg.lr}")
    _require(cfg.weight_decay >= 0, source, "weight_decay", f"must be >= 0, got {cfg.weight_decay}")
    _require(cfg.max_grad_norm >= 0, source, "max_grad_norm", f"must be >= 0 (0 = off), got {cfg.max_grad_norm}")
    _require(cfg.log_every >= 1, source, "log_every", f"must be >= 1, got {cfg.log_every}")
    _require(cfg.eval_every >= 0, source, "eval_every", f"must be >= 0, got {cfg.eval_every}")
    _require(0 <= cfg.seed < SEED_LIMIT, source, "seed", f"must be 0 <= seed < 2**63, got {cfg.seed}")
    check = getattr(cfg.task, "check", None)
    if check is not None:  # task-specific cross-field checks; raise ValueError("key: message")
        try:
            check(cfg)
        except ValueError as e:
            key, _, msg = str(e).partition(": ")
            raise ConfigError(source, "task." + key, msg) from None


def _check_adv_clip(value: Any, source: str) -> None:
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == v  # noqa: E731
    if value is None or (number(value) and value > 0):
        return
    ok = (isinstance(value, list) and len(value) == 2 and all(v is None or number(v) for v in value)
          and (None in value or value[0] < value[1]))
    _require(ok, source, "adv_clip", f"expected null, a number > 0 or a pair [low, high] with low < high "
                                     f"(null: open), got {value!r}")


def run_dict(cfg: RunConfig) -> dict:
    """Plain, YAML-able form of a resolved config (what is saved beside each run)."""
    d = dataclasses.asdict(cfg)
    d["task"] = {"name": task_name(cfg), **dataclasses.asdict(cfg.task)}
    if not d["include"]:  # absent, not [], so the ids of runs without user code stay what they were
        del d["include"]
    return d


def config_hash(cfg: RunConfig) -> str:
    d = run_dict(cfg)
    weights = shipped.weights_id(cfg.task)  # the weights a run loads are part of what it is
    if weights:
        d["weights"] = weights
    if cfg.include:  # and so is the user's code: its bytes, not only its path
        d["include_digest"] = registry.digest(cfg.include)
    blob = json.dumps(d, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


# --------------------------------------------------------------------- overrides


def set_dotted(d: dict, key: str, value: Any, source: str) -> None:
    parts = key.split(".")
    node = d
    for p in parts[:-1]:
        nxt = node.get(p)
        if isinstance(nxt, str):  # `task: sort`, `loss: clipped`: reaching into one names its parameters
            nxt = node[p] = {"name": nxt}
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(source, key, f"{p!r} is not a mapping")
        node = nxt
    node[parts[-1]] = value


def parse_set(items: list[str]) -> list[tuple[str, Any]]:
    out = []
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise ConfigError("--set", item, "expected key=value, e.g. --set loss=clipped")
        key = key.strip()
        try:
            out.append((key, strict_yaml.load(raw)))
        except strict_yaml.DuplicateKey as e:
            raise ConfigError("--set", f"{key}.{e.key}", f"duplicate key in {raw!r}") from None
        except yaml.YAMLError as e:
            raise ConfigError("--set", key, f"invalid YAML value {raw!r}: {getattr(e, 'problem', None) or e}") from None
    return out


# ---------------------------------------------------------------------- ablation


@dataclass
class Ablation:
    """A grid of variants x seeds over a base config, read from one YAML file."""

    name: str
    source: str
    description: str
    axes: list[str]                        # keys varied across variants (variant columns)
    variants: list[tuple[str, dict, dict]]  # (label, axis values, full raw run dict)
    seeds: list[int]
    resources: dict = field(default_factory=lambda: dict(RESOURCES))
    """What one run asks of a Ray node ({cpus, gpus}); not part of the run config or its hash."""
    claim: dict | None = None
    """A published claim the ablation tests (text, source, setting, expect: ["a > b", ...], and optionally
    metric, untestable, margin: the equivalence margin in the metric's units, one number or one per setting,
    and judge: final (the value at the end of the budget, the default) or area (the mean of the curve over
    the budget against samples drawn))."""
    setting: str | None = None
    """Which of the file's `settings` this is (the same variants on another task), or None."""


ABLATION_KEYS = ("name", "description", "include", "claim", "settings", "base", "grid", "variants", "seeds",
                 "resources")
CLAIM_KEYS = ("text", "source", "setting", "expect", "metric", "untestable", "margin", "judge")
JUDGE = ("final", "area")  # what a claim is about: the end of the budget, or the whole curve (its speed)
RESOURCES = {"cpus": 1, "gpus": 0}


def _resources(value: Any, overrides: list[tuple[str, Any]], src: str) -> dict:
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise ConfigError(src, "resources", "expected a mapping, e.g. {cpus: 1, gpus: 0.25}")
    res = dict(RESOURCES)
    items = [(src, k, v) for k, v in value.items()] + [("--set", k, v) for k, v in overrides]
    for source, key, v in items:
        if key not in RESOURCES:
            raise ConfigError(source, f"resources.{key}", "unknown key; valid: " + ", ".join(RESOURCES))
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and v < float("inf")
        # Ray's rule: a share of one device, or whole devices
        if not number or not (v >= 0 if key == "gpus" else v > 0) or (v > 1 and v != int(v)):
            raise ConfigError(source, f"resources.{key}", f"expected {'0, ' if key == 'gpus' else ''}"
                              f"a fraction below 1 (e.g. 0.25) or a whole number, got {v!r}")
        res[key] = int(v) if v == int(v) else float(v)
    return res


def read_yaml(path: Path) -> Any:
    """A user's YAML file, or ConfigError naming it: unreadable, not UTF-8, invalid, or a key given twice."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(str(path), "<file>", e.strerror or str(e)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(str(path), f"line {line}", f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset "
                          f"{e.start}; save the file as UTF-8") from None
    try:
        return strict_yaml.load(text)
    except strict_yaml.DuplicateKey as e:
        raise ConfigError(str(path), e.key, f"duplicate key (lines {e.first} and {e.second}); "
                          "YAML would keep only the last") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "<file>"
        raise ConfigError(str(path), where, f"invalid YAML: {getattr(e, 'problem', e)}") from None


def ablation_settings(path: str | Path) -> list[str]:
    """The names of a file's `settings` (the same variants on other tasks), [] if it has none."""
    doc = read_yaml(Path(path))
    settings = doc.get("settings") if isinstance(doc, dict) else None
    if settings is None:
        return []
    if not isinstance(settings, dict) or not settings or not all(isinstance(v, dict) for v in settings.values()):
        raise ConfigError(str(path), "settings", "expected a mapping name -> {run config keys, seeds}")
    return list(settings)


def _claim(value: Any, src: str) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(k in value for k in ("text", "source", "expect")):
        raise ConfigError(src, "claim", "expected a mapping with text, source and expect (a list of 'a > b')")
    for key in value:
        if key not in CLAIM_KEYS:
            raise ConfigError(src, f"claim.{key}", "unknown key; valid: " + ", ".join(CLAIM_KEYS))
    expect = value["expect"]
    if not isinstance(expect, list) or not expect or not all(isinstance(e, str) for e in expect):
        raise ConfigError(src, "claim.expect", f"expected a list of 'variant > variant' or 'variant = variant', "
                          f"got {expect!r}")
    for e in expect:
        try:
            parse_ordering(e)
        except ValueError as err:
            raise ConfigError(src, "claim.expect", str(err)) from None
    if value.get("judge", "final") not in JUDGE:
        raise ConfigError(src, "claim.judge", f"expected one of {', '.join(JUDGE)}, got {value['judge']!r}")
    margin = value.get("margin")
    for key, m in (margin.items() if isinstance(margin, dict) else [(None, margin)] if "margin" in value else []):
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 < m < float("inf"):
            raise ConfigError(src, "claim.margin" + (f".{key}" if key is not None else ""),
                              f"expected a positive number in the metric's units (e.g. 0.02), or a mapping "
                              f"setting -> number, got {m!r}")
    return value


def load_ablation(path: str | Path, seeds: int | None = None, sets: list[str] | None = None,
                  setting: str | None = None, include: list[str] | None = None) -> Ablation:
    """`include`: --include paths (from the working directory), added to the file's own `include:`
    (paths from the file's directory)."""
    path = Path(path)
    src = str(path)
    doc = read_yaml(path)
    if not isinstance(doc, dict):
        raise ConfigError(src, "<root>", "expected a mapping with keys " + ", ".join(ABLATION_KEYS))
    for key in doc:
        if key not in ABLATION_KEYS:
            raise ConfigError(src, str(key), "unknown key; valid: " + ", ".join(ABLATION_KEYS))
    base = doc.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError(src, "base", "expected a mapping of run config keys")
    own = doc.get("include") or []
    if isinstance(own, str):
        own = [own]
    _require(isinstance(own, list) and all(isinstance(p, str) for p in own), src, "include",
             f"expected a path or a list of paths to .py files or directories, got {own!r}")
    paths = [str((path.parent / p).expanduser().resolve()) for p in own]
    paths += [str(Path(p).expanduser().resolve()) for p in include or []]
    if paths:
        base = {**base, "include": list(dict.fromkeys([*base.get("include", []), *paths]))}
        load_includes(base["include"], "--include" if include and not own else src)
    claim = _claim(doc.get("claim"), src)
    names = ablation_settings(path)
    file_seeds = doc.get("seeds", 3)
    if names or setting is not None:
        if setting not in names:
            raise ConfigError(src if setting is None else "--setting", "settings",
                              f"unknown setting {setting!r}; valid: {', '.join(names) or 'none'}")
        chosen = copy.deepcopy(doc["settings"][setting])
        file_seeds = chosen.pop("seeds", file_seeds)
        for key, value in chosen.items():  # a setting is base keys on top of base
            set_dotted(base, key, value, f"{src}: settings.{setting}")
    overrides = parse_set(sets or [])
    resources = _resources(doc.get("resources"), [(k[len("resources."):], v) for k, v in overrides
                                                         if k.startswith("resources.")], src)
    overrides = [(k, v) for k, v in overrides if not k.startswith("resources.")]
    for key, value in overrides:
        set_dotted(base, key, value, "--set")

    grid = doc.get("grid") or {}
    named = doc.get("variants") or {}
    if not isinstance(grid, dict):
        raise ConfigError(src, "grid", "expected a mapping key -> list of values")
    if not isinstance(named, dict):
        raise ConfigError(src, "variants", "expected a mapping name -> {key: value}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(src, f"grid.{key}", "expected a non-empty list of values")
        seen = set()
        for v in values:  # a repeated value is the same runs counted as a second variant
            canon = json.dumps(_numbers_as_floats(v), sort_keys=True, default=str)
            if canon in seen:
                raise ConfigError(src, f"grid.{key}", f"value {_fmt(v)!r} is listed twice; each value is one variant")
            seen.add(canon)
        if key == "seed" and len(values) > 1:
            raise ConfigError(src, "grid.seed", "seeds come from `seeds` (or --seeds); a grid over seed would run "
                              "the same runs under each label")
    for vname, ov in named.items():
        if not isinstance(ov, dict):
            raise ConfigError(src, f"variants.{vname}", "expected a mapping of run config keys")
    if not grid and not named:
        raise ConfigError(src, "grid", "empty: give `grid` (key -> values) and/or `variants` (name -> overrides)")

    axes = list(grid)
    cells = [dict(zip(axes, combo)) for combo in itertools.product(*grid.values())] or [{}]
    named_items = list(named.items()) or [(None, {})]
    resolved: list[RunConfig] = []  # each variant's run config, in the order of `variants`
    if named:
        axes = ["variant_name"] + axes
    variants = []
    for vname, ov in named_items:
        for cell in cells:
            run = copy.deepcopy(base)
            for key, value in ov.items():
                set_dotted(run, key, value, src)
            for key, value in cell.items():
                set_dotted(run, key, value, src)
            for key, value in overrides:  # --set wins over the grid too
                set_dotted(run, key, value, "--set")
            label_parts = ([vname] if vname is not None else []) + [f"{k}={_fmt(v)}" for k, v in cell.items()]
            values = ({"variant_name": vname} if vname is not None else {}) | cell
            # fail now, naming the file (or --set, where the bad value came from), rather than inside a worker
            try:
                resolved.append(resolve_run(run, src))
            except ConfigError as e:
                if any(_overlaps(e.key, k) for k, _ in overrides):
                    raise ConfigError("--set", e.key, e.message) from None
                raise
            variants.append((",".join(label_parts), values, run))

    seed_list = _seeds(file_seeds if seeds is None else seeds, src if seeds is None else "--seeds")
    name = doc.get("name") or path.stem
    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(src, "name", f"expected a plain name (letters, digits, _ -), got {name!r}")
    if claim is not None:
        for key in claim.get("margin") if isinstance(claim.get("margin"), dict) else []:
            if key not in names:
                raise ConfigError(src, f"claim.margin.{key}", f"unknown setting; valid: {', '.join(names) or 'none'}")
        labels = [label for label, _, _ in variants]
        for e in claim["expect"]:
            for side in parse_ordering(e)[:2]:
                if side not in labels:
                    raise ConfigError(src, "claim.expect", f"{side!r} is no variant; valid: {', '.join(labels)}")
        if claim.get("metric"):  # named in the file, found now: not after the first batch of --seeds auto
            from . import metrics
            cls = registry.get("task", task_name(resolved[0]))
            asked = claim["metric"]
            column = asked if asked.startswith("final/") else metrics.final_column(asked)
            if not metrics.final_known(cls, column):
                raise ConfigError(src, "claim.metric", f"{asked!r}: no run of task {task_name(resolved[0])} writes "
                                  f"{column}; valid: {', '.join(metrics.final_columns(cls))}")
        check_orderings(claim, dict(zip(labels, resolved)), setting, f"{src}: claim of {name}")
    return Ablation(name if setting is None else f"{name}_{setting}", src, str(doc.get("description", "")).strip(),
                    axes, variants, seed_list, resources, claim, setting)


def parse_ordering(e: str) -> tuple[str, str, str]:
    """'a > b' -> (a, b, '>'); 'a = b' -> (a, b, '='); grid labels with spaces around the sign
    ('lr=0.001 > lr=0.002'). ValueError for anything else."""
    from .stats import split_ordering
    a, b, kind = split_ordering(e)
    if kind == "vs":
        raise ValueError(f"{e!r}: expected 'a > b' or 'a = b' in a claim ('vs' is a plain pair's)")
    return a, b, kind


def check_orderings(claim: dict, configs: dict[str, "RunConfig"] | None, setting: str | None, where: str,
                    task=None) -> None:
    """What a claim may not ask, as a one-line ConfigError naming `where` (the file and claim) and the ordering:
    the same pair of variants twice (in either direction, or as both "=" and ">": Holm's m and the counts
    would count it twice); two variants that resolve to the same run config (configs: label -> RunConfig;
    the same runs under two names cannot differ); "a = b" on a metric with no margin (no equivalence
    test, so it could never hold). task: the metrics.TaskInfo the claim runs on (from configs where None)."""
    from . import metrics, stats

    seen: dict[frozenset, str] = {}
    for e in claim["expect"]:
        a, b, kind = parse_ordering(e)
        if a == b:
            raise ConfigError(where, "claim.expect", f"{e!r} compares {a} with itself")
        pair = frozenset((a, b))
        if pair in seen:
            raise ConfigError(where, "claim.expect", f"{e!r} tests the pair {a}, {b} again ({seen[pair]!r} does "
                              "already); each pair once, or Holm and the counts count it twice")
        seen[pair] = e
        if configs and a in configs and b in configs and config_hash(configs[a]) == config_hash(configs[b]):
            raise ConfigError(where, "claim.expect", f"{e!r}: {a} and {b} resolve to the same run config, so "
                              "their runs are the same runs; nothing to test")
        if kind == "=":
            if task is None and configs:
                task = metrics.declared_task(task_name(next(iter(configs.values()))))
            metric = claim.get("metric") or (task.verdict_metric if task else None)
            if metric is None:
                continue
            column = metric if metric.startswith("final/") else metrics.final_column(metric)
            if stats.claim_margin(claim, setting, column, task)[0] is None:
                raise ConfigError(where, "claim.expect", f"{e!r}: an '=' needs an equivalence margin and {column} "
                                  "has none; give claim.margin (in the metric's units, with the reason)")


def _fmt(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def _seeds(value: Any, source: str) -> list[int]:
    """`seeds: N` (0..N-1) or a list of distinct seeds in [0, 2**63); ConfigError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        if value > MAX_SEEDS:
            raise ConfigError(source, "seeds", f"expected at most {MAX_SEEDS} seeds, got {value}")
        return list(range(value))
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise ConfigError(source, "seeds", f"expected a positive int or a list of ints, got {value!r}")
    if len(value) > MAX_SEEDS:
        raise ConfigError(source, "seeds", f"expected at most {MAX_SEEDS} seeds, got {len(value)}")
    seen = set()
    for s in value:
        if not 0 <= s < SEED_LIMIT:
            raise ConfigError(source, "seeds", f"each seed must be 0 <= seed < 2**63, got {s}")
        if s in seen:
            raise ConfigError(source, "seeds", f"seed {s} is listed twice; a repeated seed is the same run, "
                              "not a second sample")
        seen.add(s)
    return list(value)


def _numbers_as_floats(v: Any) -> Any:
    """1 and 1.0 are one grid value: both resolve to the same float parameter."""
    if isinstance(v, dict):
        return {k: _numbers_as_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_numbers_as_floats(x) for x in v]
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


def _overlaps(a: str, b: str) -> bool:
    """Whether dotted keys a and b name the same setting or one holds the other."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")
