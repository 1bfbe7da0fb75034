"""A run's configuration: dataclasses, strict YAML loading, cross-field checks, the hash.

Every key has a docstring-like comment; an unknown key, a wrong type or a bad
value raises ConfigError, which the CLI prints as one line naming the file, the
key and the valid choices.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Union

import yaml

from .. import registry
from ..errors import ConfigError
from . import presets, strict_yaml

BACKENDS = ("auto", "torch", "chunked", "triton")
KL_PLACEMENTS = ("loss", "reward")
OPTIMIZERS = ("adam", "adamw", "sgd")
# seeds are int64 in every table (pandas, Parquet); torch takes [0, 2**64) and folds negative ones onto them
SEED_LIMIT = 2**63
MAX_SEEDS = 100_000  # a bound on `seeds: N`: 10**9 would allocate the plan before a single run


# the metadata of a field (a task's or the run's) added after results were published: absent from run_dict
# at its default
NEW_OPTION = {"absent_at_default": True}

Part = Union[str, dict]  # a registered name, or {name: <name>, <param>: <value>, ...}

# the axes a run config selects one part of, each under the key of the same name
PART_KEYS = ("delta", "loss", "aggregate", "kl", "kl_ctrl", "ref_update", "entropy_ctrl")


SAMPLER_PRECISIONS = ("fp32", "bf16", "fp16")
SAMPLER_HEADS = ("same", "fp32")


@dataclass
class SamplerSection:
    """The policy that generates the rollouts, where it differs from the one that trains (an inference engine)."""

    precision: str = "fp32"
    """The sampler's copy of the weights and its compute: fp32 (the trainer's own), bf16 or fp16; its logits
    are sampled from in fp32, as vLLM does. The mismatch of "Defeating the Training-Inference Mismatch via FP16"."""
    staleness: int = 0
    """The sampler's weights are the policy's of this many optimizer updates ago (PipelineRL-k, asynchronous RL)."""
    head: str = field(default="same", metadata=NEW_OPTION)
    """same: the LM head's GEMM in the sampler's precision; fp32: from its hidden states and weights upcast
    (vLLM's head_dtype override), ScaleRL's fp32 head on the generator's side (the trainer's is
    task.model.cast_lm_head_to_fp32)."""

    @property
    def active(self) -> bool:
        return self.precision != "fp32" or self.staleness > 0 or self.head != "same"


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
    task_name: str = field(default="", init=False, compare=False)
    """Set by resolve_run, never by a user: the registered name of the task the section belongs to."""
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
    device: str = "auto"
    """cpu, cuda, or auto: cuda where a GPU is and does this task's runs faster than this machine's CPU workers
    (the task's measured `gpu_replaces_cores` exceeds the cores here), else cpu; a run's config records which."""
    cuda_graphs: bool = field(default=False, metadata=NEW_OPTION)
    """On CUDA, capture one inner training step of the toy as a CUDA graph and replay it (engine/graphs.py): one
    launch a step instead of hundreds. Only where the step is static (inner_steps > 1, no step filter, no per-member
    or Triton loss, no sampler, no entropy controller); elsewhere, and if capture fails, steps run as usual."""
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
    names = [f.name for f in dataclasses.fields(cls) if f.init]
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


# each part's and the task's name when a config leaves it out (set_dotted reaches into it)
_DEFAULT_PARTS = {f.name: f.default if f.default is not MISSING else f.default_factory()["name"]
                  for f in fields(RunConfig) if f.name in (*PART_KEYS, "task")}


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
    cfg.task_name = task["name"]
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
    if cfg.task_name:
        return cfg.task_name
    for name in registry.names("task"):  # a config built without resolve_run (the TRL bridge's)
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
    _require(cfg.sampler.head in SAMPLER_HEADS, source, "sampler.head",
             f"unknown {cfg.sampler.head!r}; valid: {', '.join(SAMPLER_HEADS)}")
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


def with_seed(cfg: RunConfig, seed: int) -> RunConfig:
    """A resolved config for another seed, without resolving again: nothing resolve_run does depends on the seed
    (it is range-checked where seeds are read). A copy, so runs never share a part's mapping."""
    out = copy.deepcopy(cfg)
    out.seed = seed
    return out


def run_dict(cfg: RunConfig) -> dict:
    """Plain, YAML-able form of a resolved config (what is saved beside each run)."""
    d = dataclasses.asdict(cfg)
    del d["task_name"]  # it is d["task"]["name"]
    d["task"] = {"name": task_name(cfg), **dataclasses.asdict(cfg.task)}
    _drop_new_defaults(cfg, d)  # the run's own options and every section's, the task's included
    if not d["include"]:  # absent, not [], so the ids of runs without user code stay what they were
        del d["include"]
    return d


def _drop_new_defaults(section: Any, d: dict) -> None:
    """An option added after results were published, left at its default, is absent, so the ids of runs that
    never set it stay what they were (a field marked field(..., metadata=NEW_OPTION), in a section or below)."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.metadata.get("absent_at_default") and d[f.name] == f.default:
            del d[f.name]
        elif dataclasses.is_dataclass(value) and isinstance(d.get(f.name), dict):
            _drop_new_defaults(value, d[f.name])


def config_hash(cfg: RunConfig) -> str:
    d = run_dict(cfg)
    # the weights a run loads are part of what it is; the task's section says which (a shipped checkpoint's)
    weights = getattr(cfg.task, "weights_id", lambda: None)()
    if weights:
        d["weights"] = weights
    if cfg.include:  # and so is the user's code: its bytes, not only its path
        d["include_digest"] = registry.digest(cfg.include)
    blob = json.dumps(d, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


# --------------------------------------------------------------------- overrides


def set_dotted(d: dict, key: str, value: Any, source: str) -> None:
    """d[a][b] = value for key "a.b" in a run config's dict. Reaching into a part or task the config leaves at its
    default reaches into that default (`--set loss.clip_high=0.28` on a file that names no loss)."""
    parts = key.split(".")
    node = d
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None and node is d and p in _DEFAULT_PARTS:
            nxt = _DEFAULT_PARTS[p]
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
