"""An ablation file: a grid of variants x seeds over a base config, its settings and its claim.

The claim's orderings are checked here, when the file loads: duplicates, two names for one run config,
and an "=" with no equivalence margin are refused in one line naming the claim.
"""
from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import registry
from ..store import metrics
from ..stats import split_ordering
from ..store.metrics import margin_from_runs, ratio_margin
from ..errors import ConfigError
from .run import (MAX_SEEDS, SEED_LIMIT, RunConfig, _require, config_hash, load_includes, parse_set, resolve_run,
                  run_dict, set_dotted, task_name)
from .strict_yaml import read_yaml

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
    the budget against samples drawn), and mechanism: per ordering (or a default) what its part acts on and the
    logged diagnostic that shows it acting, with its threshold and why (analysis/mechanism.py))."""
    setting: str | None = None
    """Which of the file's `settings` this is (the same variants on another task), or None."""
    configs: list = field(default_factory=list)
    """Each variant's resolved RunConfig, in the order of `variants`: resolved once, here, and handed to the
    plan, the workers and the hash (config.run.with_seed gives each seed's)."""


ABLATION_KEYS = ("name", "description", "include", "claim", "settings", "base", "grid", "variants", "seeds",
                 "resources")
CLAIM_KEYS = ("text", "source", "setting", "expect", "metric", "untestable", "margin", "judge", "mechanism")
# claim.mechanism: what each ordering's part acts on and the logged diagnostic that shows it acts (findings judges
# an ordering only where its diagnostic reaches `min`); keyed by `default` or an ordering's text
MECHANISM_KEYS = ("acts", "metric", "variant", "reduce", "min", "why")
# per run, over its logged steps: the mean of the value or of its size, or the value's coefficient of variation
# (how unequal a per-step scale was across steps); then the mean over the seeds of the variant read
REDUCE = ("mean", "abs_mean", "cv")
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
        where = "claim.margin" + (f".{key}" if key is not None else "")
        if margin_from_runs(m):
            raise ConfigError(src, where, f"{m!r} would be computed from the runs it judges; give a number fixed "
                              "before the runs (from a separate run named in a comment) or a ratio 'P%' (judged on "
                              "the log of the metric)")
        share = ratio_margin(m)
        if share is not None and 0 < share < 1:
            continue
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 < m < float("inf"):
            raise ConfigError(src, where, f"expected a positive number in the metric's units (e.g. 0.02), a ratio "
                              f"('5%': within 5% either way, under 100%), or a mapping setting -> either, got {m!r}")
    if "mechanism" in value:
        _mechanism(value["mechanism"], expect, src)
    return value


def _mechanism(value: Any, expect: list[str], src: str) -> None:
    """claim.mechanism: {default | an ordering's text: a diagnostic, or a list of them (the part acts when any
    does)}; each diagnostic {acts, metric (a per-step metric, or none: not logged), variant (a, b or a variant's name: the runs it is
    read on), reduce, min, why}. (`variant`, not `on`: YAML reads a bare `on` as true.)"""
    if not isinstance(value, dict) or not value:
        raise ConfigError(src, "claim.mechanism", "expected a mapping default or 'a > b' (an ordering of expect) -> "
                          "{acts, metric, variant, reduce, min, why}")
    for key, entry in value.items():
        where = f"claim.mechanism.{key}"
        if key != "default" and key not in expect:
            raise ConfigError(src, where, "unknown key; valid: default, " + ", ".join(expect))
        for i, d in enumerate(entry if isinstance(entry, list) and entry else [entry]):
            at = where + (f"[{i}]" if isinstance(entry, list) else "")
            if not isinstance(d, dict):
                raise ConfigError(src, at, f"expected a mapping with keys {', '.join(MECHANISM_KEYS)}, got {d!r}")
            for k in d:
                if k not in MECHANISM_KEYS:
                    raise ConfigError(src, f"{at}.{k}", "unknown key; valid: " + ", ".join(MECHANISM_KEYS))
            for k in ("acts", "metric", "why"):
                if not isinstance(d.get(k), str) or not d[k].strip():
                    raise ConfigError(src, f"{at}.{k}", f"expected text (metric: a logged per-step metric such as "
                                      f"clip/high_frac, or none), got {d.get(k)!r}")
            if d.get("reduce", "mean") not in REDUCE:
                raise ConfigError(src, f"{at}.reduce", f"expected one of {', '.join(REDUCE)}, got {d['reduce']!r}")
            if not isinstance(d.get("variant", "a"), str):
                raise ConfigError(src, f"{at}.variant", f"expected a, b or a variant's name, got {d['variant']!r}")
            m = d.get("min")
            if d["metric"] == "none":
                if m is not None:
                    raise ConfigError(src, f"{at}.min", "metric none has no value to compare; drop min")
            elif isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 < m < float("inf"):
                raise ConfigError(src, f"{at}.min", f"expected a positive number (the part acts when the reduced "
                                  f"value is at least this), got {m!r}")


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
    own = [str((path.parent / p).expanduser().resolve()) for p in own]
    given = [str(Path(p).expanduser().resolve()) for p in include or []]
    if own or given:
        load_includes(given, "--include")  # the file's own load with each run, named beside the file
        base = {**base, "include": list(dict.fromkeys([*base.get("include", []), *own, *given]))}
    claim = _claim(doc.get("claim"), src)
    names = ablation_settings(path)
    file_seeds = doc.get("seeds", 3)
    setting_variants, setting_text, only = {}, "", None
    if names or setting is not None:
        if setting not in names:
            raise ConfigError(src if setting is None else "--setting", "settings",
                              f"unknown setting {setting!r}; valid: {', '.join(names) or 'none'}")
        chosen = copy.deepcopy(doc["settings"][setting])
        file_seeds = chosen.pop("seeds", file_seeds)
        setting_variants = chosen.pop("variants", {})
        only = chosen.pop("only", None)
        setting_text = str(chosen.pop("description", "")).strip()
        for key, value in chosen.items():  # a setting is base keys on top of base
            set_dotted(base, key, value, f"{src}: settings.{setting}")
    overrides = parse_set(sets or [])
    resources = _resources(doc.get("resources"), [(k[len("resources."):], v) for k, v in overrides
                                                         if k.startswith("resources.")], src)
    overrides = [(k, v) for k, v in overrides if not k.startswith("resources.")]

    grid = doc.get("grid") or {}
    named = copy.deepcopy(doc.get("variants") or {})
    if setting_variants:
        # a setting may retune a variant where the task needs it (a clip range for another ratio scale): the
        # variant keeps its name, so the claim's orderings still read it; a setting cannot add variants
        if not isinstance(setting_variants, dict) or not all(isinstance(v, dict) for v in setting_variants.values()):
            raise ConfigError(src, f"settings.{setting}.variants", "expected a mapping variant name -> {key: value}")
        for vname, ov in setting_variants.items():
            if vname not in named:
                raise ConfigError(src, f"settings.{setting}.variants.{vname}",
                                  f"unknown variant; valid: {', '.join(named) or 'none'}")
            named[vname] = {**named[vname], **ov}
    if only is not None:
        # a setting that replicates a few orderings elsewhere (another start) runs only their variants
        if not isinstance(only, list) or not only or any(v not in named for v in only):
            raise ConfigError(src, f"settings.{setting}.only", f"expected a list of the file's variants; valid: "
                              f"{', '.join(named) or 'none'}, got {only!r}")
        file_names, named = list(named), {k: v for k, v in named.items() if k in only}
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
        if key == "seed" and len(values) > 1:  # one value: a file of one variant (its seed is each run's)
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
            without = copy.deepcopy(run)
            for key, value in overrides:  # --set wins over the grid too
                set_dotted(run, key, value, "--set")
            label_parts = ([vname] if vname is not None else []) + [f"{k}={_fmt(v)}" for k, v in cell.items()]
            values = ({"variant_name": vname} if vname is not None else {}) | cell
            # fail now, naming the file (or --set, where the bad key is one --set gave or the file alone
            # resolves), rather than inside a worker
            try:
                resolved.append(resolve_run(run, src))
            except ConfigError as e:
                if any(_inside(e.key, k) for k, _ in overrides) or _resolves(without, src):
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
        # an ordering names the file's variants; a setting that runs only some leaves the others' rows unrun
        labels = [label for label, _, _ in variants] + [v for v in (file_names if only is not None else [])]
        for e in claim["expect"]:
            for side in parse_ordering(e)[:2]:
                if side not in labels:
                    raise ConfigError(src, "claim.expect", f"{side!r} is no variant; valid: {', '.join(labels)}")
        for key, entry in (claim.get("mechanism") or {}).items():
            for d in entry if isinstance(entry, list) else [entry]:
                if d.get("variant", "a") not in ("a", "b", *labels):
                    raise ConfigError(src, f"claim.mechanism.{key}.variant", f"unknown variant {d['variant']!r}; valid: a, b, "
                                      + ", ".join(labels))
        if claim.get("metric"):  # named in the file, found now: not after the first batch of --seeds auto
            asked = claim["metric"]
            column = asked if asked.startswith("final/") else metrics.final_column(asked)
            for tname in dict.fromkeys(task_name(cfg) for cfg in resolved):  # every task the variants train
                cls = registry.get("task", tname)
                if not metrics.final_known(cls, column):
                    raise ConfigError(src, "claim.metric", f"{asked!r}: no run of task {tname} writes {column}; "
                                      f"valid: {', '.join(metrics.final_columns(cls))}")
        check_orderings(claim, dict(zip(labels, resolved)), setting, f"{src}: claim of {name}")
    description = str(doc.get("description", "")).strip()
    if setting_text:  # what this setting changes and why, after what the file is about
        description += f"\n\nSetting `{setting}`: {setting_text}"
    return Ablation(name if setting is None else f"{name}_{setting}", src, description,
                    axes, variants, seed_list, resources, claim, setting, resolved)


def parse_ordering(e: str) -> tuple[str, str, str]:
    """'a > b' -> (a, b, '>'); 'a = b' -> (a, b, '='); grid labels with spaces around the sign
    ('lr=0.001 > lr=0.002'). ValueError for anything else."""
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
        if configs and a in configs and b in configs and _same_run(configs[a], configs[b]):
            raise ConfigError(where, "claim.expect", f"{e!r}: {a} and {b} resolve to the same run config, so "
                              "their runs are the same runs; nothing to test")
        if kind == "=":
            if task is None and configs:
                first = next(iter(configs.values()))
                section = first["task"] if isinstance(first, dict) else run_dict(first)["task"]
                task = metrics.declared_task(section["name"], section)
            metric = claim.get("metric") or (task.verdict_metric if task else None)
            if metric is None:
                continue
            column = metric if metric.startswith("final/") else metrics.final_column(metric)
            if metrics.claim_margin(claim, setting, column, task, log_scale=True)[0] is None:
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


def _inside(key: str, given: str) -> bool:
    """Whether dotted key `key` is `given` or inside it (loss.clip_low inside a --set of loss)."""
    return key == given or key.startswith(given + ".")


def _resolves(run: dict, src: str) -> bool:
    try:
        resolve_run(run, src)
    except ConfigError:
        return False
    return True


def _same_run(x, y) -> bool:
    """Whether two variants' configs (RunConfig, or the run_dict ablation.json records) are one run's."""
    return x == y if isinstance(x, dict) else config_hash(x) == config_hash(y)


def variant_dicts(abl) -> dict[str, dict]:
    """label -> each variant's resolved config as run_dict writes it, without the seed: what findings reads
    for inert parts and twin variants where the ablation file cannot be resolved (no torch, or it changed)."""
    out = {}
    for (label, _, _), cfg in zip(abl.variants, abl.configs):
        d = run_dict(cfg)
        d.pop("seed")
        out[label] = d
    return out


def ablation_record(abl) -> dict:
    """What the runner adds to ablation.json for an ablation (config.Ablation): "task", the declaration of
    the task its variants train (None when they train several), "settings", its file's settings in
    their order (None for a file without them), which FINDINGS.md orders its columns by, and "configs",
    each variant's resolved config (variant_dicts)."""
    names = {task_name(cfg) for cfg in abl.configs}
    section = run_dict(abl.configs[0])["task"] if abl.configs else None
    return {"task": metrics.declared_task(names.pop(), section).record() if len(names) == 1 else None,
            "settings": ablation_settings(abl.source) if abl.setting is not None else None,
            "configs": variant_dicts(abl)}
