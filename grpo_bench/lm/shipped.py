"""The embedded default model: a warm-started 2-layer GPT-2 shipped in tasks/arithmetic_tiny/.

A warm-start stopped mid-way through the model's jump in accuracy amplifies the last-bit
differences of each CPU's kernels: the same recipe gave 21.5% held-out accuracy on one
machine and 12% on another. So the checkpoint is built once (tasks/arithmetic_tiny/build.py,
the code that built it) and shipped; `model.source: tiny` loads it, identical everywhere.
manifest.json records each file's SHA-256, the task settings it was warm-started for (its
held-out problems were kept out of its training) and its held-out greedy accuracy; a test
holds the shipped files to both. The hashes are checked whenever a config names the model
and again where it is loaded (1.6 MB: milliseconds), so a flipped byte is an error, not a
silently different model; and the manifest's hashes enter the run id (`weights_id`), so
results from other weights never resume into the same run directories.
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


def verify() -> Path:
    """The checkpoint directory, once every file's SHA-256 is the manifest's; ValueError naming the first that differs."""
    want, have = manifest()["files"], file_hashes(directory())
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            found = f"found {have[name][:12]}…" if name in have else "the file is missing"
            expected = f"{want[name][:12]}…" if name in want else "no such file"
            raise ValueError(f"{directory() / name}: SHA-256 {expected} expected by {root() / 'manifest.json'}, "
                             f"{found}: the shipped checkpoint was modified; restore it (git checkout "
                             "tasks/arithmetic_tiny) or rebuild it with build.py, which rewrites the manifest")
    return directory()


_verified: dict[str, tuple] = {}


def verify_cached() -> None:
    """verify(), redone only when a file's size, mtime or inode changed: a config is resolved once per planned run."""
    files = sorted(p for p in directory().rglob("*") if p.is_file()) + [root() / "manifest.json"]
    stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino) for p in files)
    if _verified.get(str(root())) != stamp:
        verify()
        _verified[str(root())] = stamp


def weights_id(task_cfg) -> str | None:
    """What the run id must hold of the model a task config loads: a hash of the shipped checkpoint's
    manifest (verify() holds the files to it); None for other models."""
    if getattr(getattr(task_cfg, "model", None), "source", None) != TINY:
        return None
    blob = json.dumps(manifest()["files"], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def check_compatible(cfg) -> None:
    """ValueError("key: ...") when the shipped files are not the manifest's, or a task config would evaluate
    the shipped model on problems it trained on."""
    try:
        verify_cached()
    except (ValueError, OSError) as e:
        raise ValueError(f"model.source: {e}") from None
    split = manifest()["task"]
    for key in SPLIT_KEYS:
        if getattr(cfg, key) != split[key]:
            raise ValueError(f"{key}: model.source tiny was warm-started on ops {split['ops']} with held-out "
                             f"set (eval_size {split['eval_size']}, eval_seed {split['eval_seed']}) kept out; "
                             f"with {key} {getattr(cfg, key)!r} it would be scored on problems it trained on; "
                             "use model.source tiny-scratch with warmstart.steps > 0")
