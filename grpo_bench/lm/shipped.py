"""The embedded default model: a warm-started 2-layer GPT-2 shipped in tasks/arithmetic_tiny/.

A warm-start stopped mid-way through the model's jump in accuracy amplifies the last-bit
differences of each CPU's kernels: the same recipe gave 21.5% held-out accuracy on one
machine and 12% on another. So the checkpoint is built once (tasks/arithmetic_tiny/build.py,
the code that built it) and shipped; `model.source: tiny` loads it, identical everywhere.
manifest.json records each file's SHA-256, the task settings it was warm-started for (its
held-out problems were kept out of its training) and its held-out greedy accuracy; a test
holds the shipped files to both.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from .. import presets

TINY, SCRATCH = "tiny", "tiny-scratch"
# settings that define the held-out split the checkpoint never saw
SPLIT_KEYS = ("ops", "eval_size", "eval_seed")


def root() -> Path:
    return presets.tasks_dir() / "arithmetic_tiny"


def directory() -> Path:
    return root() / "checkpoint"


@lru_cache(maxsize=1)
def manifest() -> dict:
    return json.loads((root() / "manifest.json").read_text())


def file_hashes(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def check_compatible(cfg) -> None:
    """ValueError("key: ...") when a task config would evaluate the shipped model on problems it trained on."""
    split = manifest()["task"]
    for key in SPLIT_KEYS:
        if getattr(cfg, key) != split[key]:
            raise ValueError(f"{key}: model.source tiny was warm-started on ops {split['ops']} with held-out "
                             f"set (eval_size {split['eval_size']}, eval_seed {split['eval_seed']}) kept out; "
                             f"with {key} {getattr(cfg, key)!r} it would be scored on problems it trained on; "
                             "use model.source tiny-scratch with warmstart.steps > 0")
