"""Every Triton kernel variant compiles to an H100 (sm_90) binary, without a GPU.

The interpreter runs the kernels as numpy and forgives what the compiler would not
(types, loop-carried values, constexpr branches); compiling ahead of time for a real
target catches that on CPU. It runs in a subprocess because under TRITON_INTERPRET=1
@triton.jit returns interpreter objects instead of compilable functions.
"""
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import needs

needs("triton")

SCRIPT = textwrap.dedent("""
    import os, sys
    import triton
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        import triton.backends.nvidia  # noqa: F401
    except ImportError as e:
        print("SKIP", e); sys.exit(0)
    from grpo_bench.numerics.kernels import logprob as K, loss as L, spec as S

    TYPES = {"x_ptr": "*bf16", "dx_ptr": "*bf16", "lab_ptr": "*i64"}

    def signature(fn):
        sig = {}
        for p in fn.params:
            if p.is_constexpr:
                sig[p.name] = "constexpr"
            elif p.name.endswith("_ptr"):
                sig[p.name] = TYPES.get(p.name, "*fp32")
            else:  # strides are int64 so that row * stride never wraps
                sig[p.name] = "fp32" if p.name in ("coef", "temp") else "i64" if p.name[0] == "s" else "i32"
        return sig

    target = GPUTarget("cuda", 90, 32)
    jobs = []
    for ent, tempered in ((False, False), (True, False), (True, True)):
        for fn in (K._logprob_fwd, K._logprob_bwd):
            jobs.append((fn, dict(BLOCK_V=4096, WITH_ENTROPY=ent, TEMPERED=tempered), 16))
    for code, _ in S.LOSSES.values():
        for kl, gated in ((0, False), (3, True), (7, False)):
            c = dict(LOSS=code, KL=kl, GATED=gated, LO=0.8, HI=1.28, C=3.0, TP=1.0, TN=1.05, BLOCK_T=1024)
            jobs += [(L._loss_fwd, c, 4), (L._loss_bwd, c, 4)]
    for kl in S.KLS.values():
        c = dict(LOSS=2, KL=kl, GATED=False, LO=0.8, HI=1.28, C=S.INF, TP=1.0, TN=1.0, BLOCK_T=1024)
        jobs += [(L._loss_fwd, c, 4), (L._loss_bwd, c, 4)]
    for fn, consts, warps in jobs:
        k = triton.compile(ASTSource(fn, signature(fn), constexprs=consts), target=target,
                           options={"num_warps": warps})
        assert k.asm["cubin"], (fn.__name__, consts)
    print("OK", len(jobs))
""")


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # silence triton 3.9's notice; fusion is its default
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout.strip())
    assert out.stdout.startswith("OK"), out.stdout + out.stderr[-2000:]
