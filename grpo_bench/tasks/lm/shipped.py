"""Checkpoints shipped with the presets: `model.source: tiny` (tasks/arithmetic_tiny/) or `shipped:<dir>`.

A warm-start stopped mid-way through the model's jump in accuracy amplifies the last-bit
differences of each CPU's kernels: the same recipe gave 21.5% held-out accuracy on one
machine and 12% on another. So a start point is built once (`build-start tasks/<dir>.yaml`, recorded in
its manifest) and shipped as tasks/<dir>/checkpoint/; `model.source: shipped:<dir>` loads
it, identical everywhere, and `tiny` is the first of them, tasks/arithmetic_tiny/.
Each directory's manifest.json records each file's SHA-256, the task settings it was
warm-started for (its held-out problems were kept out of its training) and its held-out
greedy accuracy; a test holds every shipped directory's files to both. The hashes are
checked whenever a config names the model and again where it is loaded (a few MB:
milliseconds), so a flipped byte is an error, not a silently different model; and the
manifest's hashes enter the run id (`weights_id`), so results from other weights never
resume into the same run directories.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from ...config import presets

TINY, SCRATCH = "tiny", "tiny-scratch"
PREFIX = "shipped:"
DEFAULT = "arithmetic_tiny"  # what `tiny` names
# settings that define the held-out split the checkpoint never saw, and their values in a
# manifest written before the setting existed
SPLIT_KEYS = ("ops", "eval_size", "eval_seed", "operands")
SPLIT_DEFAULTS = {"operands": "uniform"}


def name(source: str) -> str | None:
    """The shipped directory a model.source names (`tiny` or `shipped:<dir>`), else None."""
    if source == TINY:
        return DEFAULT
    if source.startswith(PREFIX):
        return source[len(PREFIX):]
    return None


def available() -> list[str]:
    return sorted(p.parent.name for p in presets.tasks_dir().glob("*/manifest.json"))


def root(which: str = DEFAULT) -> Path:
    return presets.tasks_dir() / which


def directory(which: str = DEFAULT) -> Path:
    return root(which) / "checkpoint"


@lru_cache(maxsize=None)
def manifest(which: str = DEFAULT) -> dict:
    return json.loads((root(which) / "manifest.json").read_text())


def loadable(which: str) -> bool:
    """A shipped directory with a checkpoint: a model (config.json) or a LoRA warm-up of a pretrained base."""
    return which in available() and any((directory(which) / f).is_file()
                                        for f in ("config.json", "adapter_config.json"))


def base(source: str) -> str | None:
    """The pretrained model.source a shipped warm-up adapter sits on (its manifest's recipe), else None;
    reads JSON only, so a config can record the base's quantisation without loading anything."""
    which = name(source) if isinstance(source, str) else None
    if which is None or not (root(which) / "manifest.json").is_file():
        return None
    found = manifest(which).get("recipe", {}).get("base")
    return found if isinstance(found, str) else None


def file_hashes(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def verify(which: str = DEFAULT) -> Path:
    """The checkpoint directory, once every file's SHA-256 is the manifest's; ValueError naming the first that differs."""
    want, have = manifest(which)["files"], file_hashes(directory(which))
    for file in sorted(set(want) | set(have)):
        if want.get(file) != have.get(file):
            found = f"found {have[file][:12]}…" if file in have else "the file is missing"
            expected = f"{want[file][:12]}…" if file in want else "no such file"
            raise ValueError(f"{directory(which) / file}: SHA-256 {expected} expected by "
                             f"{root(which) / 'manifest.json'}, {found}: the shipped checkpoint was modified; "
                             f"restore it (git checkout tasks/{which}) or rebuild it with build-start, which "
                             "rewrites the manifest")
    return directory(which)


_verified: dict[str, tuple] = {}


def verify_cached(which: str = DEFAULT) -> None:
    """verify(), redone only when a file's size, mtime or inode changed: a config is resolved once per planned run."""
    files = sorted(p for p in directory(which).rglob("*") if p.is_file()) + [root(which) / "manifest.json"]
    stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino) for p in files)
    if _verified.get(str(root(which))) != stamp:
        manifest.cache_clear()   # a rewritten manifest.json (build-start, a checkout) is read again, not remembered
        verify(which)
        _verified[str(root(which))] = stamp


def weights_id(task_cfg) -> str | None:
    """What the run id must hold of the model a task config loads: a hash of its shipped checkpoint's
    manifest (verify() holds the files to it); None for other models."""
    source = getattr(getattr(task_cfg, "model", None), "source", None)
    which = name(source) if isinstance(source, str) else None
    if which is None:
        return None
    blob = json.dumps(manifest(which)["files"], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def split(which: str = DEFAULT) -> dict:
    """The held-out split a shipped checkpoint was warm-started for, every SPLIT_KEY present."""
    return {key: manifest(which)["task"].get(key, SPLIT_DEFAULTS.get(key)) for key in SPLIT_KEYS}


def check_compatible(cfg) -> None:
    """ValueError("key: ...") when model.source names no shipped checkpoint, its files are not its manifest's,
    or a task config would evaluate a shipped model on problems it trained on."""
    source = cfg.model.source
    which = name(source)
    if not loadable(which):
        raise ValueError(f"model.source: no shipped checkpoint {source!r} (tasks/{which}/ with manifest.json "
                         f"and checkpoint/); valid: {TINY}, " + ", ".join(PREFIX + n for n in available()))
    try:
        verify_cached(which)
    except (ValueError, OSError) as e:
        raise ValueError(f"model.source: {e}") from None
    want = split(which)
    for key in SPLIT_KEYS:
        if getattr(cfg, key) != want[key]:
            raise ValueError(f"{key}: model.source {source} was warm-started on ops {want['ops']} "
                             f"({want['operands']} operands) with held-out set (eval_size {want['eval_size']}, "
                             f"eval_seed {want['eval_seed']}) kept out; with {key} {getattr(cfg, key)!r} it would "
                             "be scored on problems it trained on; use model.source tiny-scratch with "
                             "warmstart.steps > 0")
