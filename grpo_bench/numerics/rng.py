"""Random streams keyed by what they are for: common random numbers across variants.

Every random draw of a run comes from a generator named by (run seed, purpose, indices),
e.g. stream(seed, "sample", epoch, draw). Two consequences:
- runs of different variants with the same seed draw the same initial weights, the same
  prompts and the same sampling noise for the same (epoch, draw), however many draws
  each of them consumed before (one shared stream would drift apart at the first
  dynamic-sampling redraw), so seed-matched comparisons are paired;
- a run's numbers do not depend on which other runs share its process (a population)
  or in which order they were scheduled.
Different seeds give independent streams: the key is hashed, not added to.
"""
from __future__ import annotations

import hashlib

import torch


def stream_seed(seed: int, *key) -> int:
    """A 63-bit seed for the stream named by (seed, *key); stable across machines and versions."""
    blob = repr((int(seed), *key)).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def stream(seed: int, *key) -> torch.Generator:
    """A fresh CPU generator for the stream named by (seed, *key)."""
    return torch.Generator().manual_seed(stream_seed(seed, *key))
