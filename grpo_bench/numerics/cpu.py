"""The same bits on every x86-64 CPU with AVX2: one code path for matrix products and vector kernels.

A CPU run's float32 matrix products go to MKL, which picks its kernels by instruction set and
vendor (AVX-512 on an Intel Xeon, another path on an AMD EPYC), and ATen's own vectorised
kernels (softmax, exp, reductions, Adam) are compiled per instruction set and picked the same
way (ATEN_CPU_CAPABILITY). The paths sum in different orders or round exp differently, and RL
dynamics amplify a last-bit difference into a different run (0.16 in one seed's held-out
accuracy on the sorting toy). So every run pins, before anything computes:
- MKL to its conditional-numerical-reproducibility mode COMPATIBLE, one path on every Intel and
  compatible processor (MKL_CBWR=AVX2 is refused on AMD, so COMPATIBLE is the only shared one);
- ATen to its AVX2 kernels, which every x86-64 server of the last decade runs; AVX-512 machines
  would otherwise take other kernels (oneDNN likewise, ONEDNN_MAX_CPU_ISA).
Environment variables a user set for these are overridden. The cost is measured in
docs/reliability.md; GRPO_BENCH_CPU_NUMERICS=native keeps the fastest paths (numbers then depend
on the processor). tests/test_cpu_numerics.py runs the toy under every setting the libraries offer.
"""
from __future__ import annotations

import ctypes
import math
import os
import warnings
from functools import lru_cache

CBWR_BRANCH, CBWR_COMPATIBLE = 1, 3  # mkl_service.h
# every branch torch's MKL can be on (it refuses 11 and 13, the Xeon Phi ones, and knows nothing past 14)
BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 5: "SSE3", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2",
            9: "AVX", 10: "AVX2", 12: "AVX512", 14: "AVX512_E1"}
PINNED = "MKL COMPATIBLE, ATen AVX2"


@lru_cache(maxsize=1)
def _mkl():
    """torch's statically linked MKL service functions (get, set), or None where torch has no MKL."""
    import torch

    if not torch.backends.mkl.is_available():
        return None
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get, set_ = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
    except (OSError, AttributeError):
        return None
    get.restype = set_.restype = ctypes.c_int
    get.argtypes = set_.argtypes = [ctypes.c_int]
    return get, set_


def state() -> str:
    """The paths in force in this process, e.g. 'MKL COMPATIBLE, ATen AVX2'."""
    import torch

    mkl = _mkl()
    branch = "none" if mkl is None else BRANCHES.get(mkl[0](CBWR_BRANCH), "?")
    return f"MKL {branch}, ATen {torch.backends.cpu.get_cpu_capability()}"


def pin() -> str:
    """Pin the paths (module docstring) unless GRPO_BENCH_CPU_NUMERICS=native; returns state().

    Where this process computed before the call, a path may already be fixed: that is warned about
    once, and the returned state says which paths are in force.
    """
    if os.environ.get("GRPO_BENCH_CPU_NUMERICS", "").lower() == "native":
        return state()
    # read by ATen and oneDNN at their first computation, not at import
    os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
    os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    mkl = _mkl()
    if mkl is not None and mkl[0](CBWR_BRANCH) != CBWR_COMPATIBLE:
        mkl[1](CBWR_COMPATIBLE)  # fails (-8) once MKL has computed: state() then says so
    now = state()
    if mkl is not None and now != PINNED:
        _warn(now)
    return now


@lru_cache(maxsize=None)
def _warn(now: str) -> None:
    warnings.warn(f"grpo_bench: this process computed before its CPU paths could be pinned ({now}, not {PINNED}), "
                  "so its numbers may differ on another processor; train through `python -m grpo_bench run`, "
                  "or call grpo_bench.numerics.cpu.pin() before anything computes", RuntimeWarning, stacklevel=3)


def sqrt(x):
    """x.sqrt(), correctly rounded on every CPU, for the few values of a per-member metric.

    ATen hands a CPU tensor's sqrt to MKL's vector math (vsSqrt/vdSqrt), which is accurate to one unit
    in the last place, not correctly rounded, and rounds differently by processor even under the pin:
    the spread metrics of one pinned sweep differed in their last bit between an Intel Xeon and an AMD
    EPYC while every other number was the same (docs/reliability.md). Python's sqrt is IEEE's
    (correctly rounded in float64, and rounding that to float32 gives the correctly rounded float32
    sqrt). CUDA's sqrt is IEEE's already.
    """
    import torch

    if x.device.type != "cpu":
        return x.sqrt()
    roots = [math.sqrt(v) if v >= 0 else math.nan for v in x.detach().flatten().tolist()]
    return torch.tensor(roots, dtype=x.dtype).view(x.shape)
