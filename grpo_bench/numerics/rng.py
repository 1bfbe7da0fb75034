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


# The paths that batch work across a population's members where, on the CPU, numbers committed today
# would change by rounding or by stream: counter-based random streams on the device, one fused optimizer
# call per run of members. On for every device but the CPU; True or False forces them (scripts/population_ops.py
# counts a CUDA run's host work on the CPU with it).
DEVICE_PATHS: bool | None = None


def device_paths(device: torch.device | str) -> bool:
    """Whether work on `device` takes the batched device paths (DEVICE_PATHS)."""
    return torch.device(device).type != "cpu" if DEVICE_PATHS is None else DEVICE_PATHS


def stream_seed(seed: int, *key) -> int:
    """A 63-bit seed for the stream named by (seed, *key); stable across machines and versions."""
    blob = repr((int(seed), *key)).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def stream(seed: int, *key) -> torch.Generator:
    """A fresh CPU generator for the stream named by (seed, *key)."""
    return torch.Generator().manual_seed(stream_seed(seed, *key))


# ----------------------------------------------------------------- counter-based streams on the device
# A population on a GPU cannot afford a CPU generator per member per draw (P generators, P host calls and
# a host-to-device copy every epoch). These streams are a pure function of (seed, *key, element index),
# computed for every member in one batch of integer ops on the device: the same common random numbers
# (a seed's numbers do not depend on its population or on other draws), other numbers than the CPU
# generators', so CPU runs keep theirs (device_paths). The hash is lowbias32 (C. Wellons' hash
# prospector), three rounds keyed by 64 bits of (seed, key); int64 arithmetic on values below 2**32
# with the multiply split in 16-bit halves, so nothing overflows on any backend.
_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    return ((((x * (c >> 16)) & 0xFFFF) << 16) + x * (c & 0xFFFF)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def bits32(seeds: torch.Tensor, key: tuple, shape: tuple[int, ...]) -> torch.Tensor:
    """(P, *shape) int64 values in [0, 2**32): element i of the stream named by (seeds[p], *key), on seeds' device."""
    h = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")
    h0, h1 = h & _M32, h >> 32
    s = seeds.to(torch.int64).view(-1, *[1] * len(shape))
    lo, hi = s & _M32, (s >> 32) & _M32
    k0 = _mix32(_mix32(lo ^ h0) ^ hi)
    k1 = _mix32(_mix32(hi ^ h1) ^ lo ^ 0x85EBCA6B)
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.int64, device=seeds.device).view(1, *shape)
    return _mix32((_mix32(_mix32(i ^ k0) + k1) & _M32) ^ k0)


def uniform(seeds: torch.Tensor, key: tuple, shape: tuple[int, ...]) -> torch.Tensor:
    """(P, *shape) float32 uniforms in [0, 1), multiples of 2**-24, from each member's stream (bits32)."""
    return (bits32(seeds, key, shape) >> 8).float() * 2.0 ** -24


def randint(seeds: torch.Tensor, key: tuple, shape: tuple[int, ...], high: int) -> torch.Tensor:
    """(P, *shape) int64 in [0, high) from each member's stream (bits32; Lemire's multiply-shift, bias < high / 2**32)."""
    if not 0 < high < 2 ** 31:
        raise ValueError(f"high: expected 0 < high < 2**31, got {high}")
    return (bits32(seeds, key, shape) * high) >> 32


class DeviceStreams:
    """Each member's stream on the device, drawn in order as a list of CPU generators is: draw d of member p
    is uniform((seeds[p], *key, d)). What an LM's generation loop takes for its sampling noise on a GPU (one
    draw a token, every member at once, nothing copied from the host)."""

    def __init__(self, seeds: torch.Tensor, *key):
        self.seeds, self.key, self.draws = seeds, key, 0

    def __len__(self) -> int:
        return len(self.seeds)

    def rand(self, *shape: int) -> torch.Tensor:
        """(P, *shape) uniforms in [0, 1): every member's next draw."""
        self.draws += 1
        return uniform(self.seeds, (*self.key, self.draws - 1), shape)
