"""Task presets: named task sections kept as data in the top-level `tasks/` directory.

A preset is `tasks/<name>.yaml` holding a description and a task section:

    description: what the setting is and where it comes from
    task: {name: sort, prompts: null, n: 6, vocab: 16, num_prompts: 16, dim: 64}

An ablation then says `task: sort_hard`, or `task: {name: sort_hard, num_prompts: 32}` to
override keys (nested sections merge key by key). Python modules beside the presets
(`tasks/arithmetic_rewards.py`) hold user rewards, named `module:function` in a task's
`rewards`. The directory is the repository's `tasks/` in a checkout and the installed
package `grpo_bench_tasks` otherwise (pyproject.toml maps one onto the other).
"""
from __future__ import annotations

import copy
from functools import lru_cache

from ..registry import tasks_dir
from .strict_yaml import read_yaml

def names() -> list[str]:
    return sorted(p.stem for p in tasks_dir().glob("*.yaml"))


@lru_cache(maxsize=None)
def _read(name: str) -> dict:
    path = tasks_dir() / f"{name}.yaml"
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("task"), dict) or "name" not in doc["task"]:
        raise ValueError(f"{path}: a preset needs `description` and `task: {{name: <task>, ...}}`")
    return doc


def section(name: str) -> dict:
    """The preset's task section (a fresh copy)."""
    return copy.deepcopy(_read(name)["task"])


def description(name: str) -> str:
    return " ".join(str(_read(name).get("description", "")).split())


def merge(base: dict, override: dict) -> dict:
    """base with override's keys on top; mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out
