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
    from grpo_bench.numerics.kernels import head as Hd, logprob as K, logits_loss as LL, loss as L, spec as S

    TYPES = {"x_ptr": "*bf16", "dx_ptr": "*bf16", "z_ptr": "*bf16", "lab_ptr": "*i64"}
    FLOATS = ("coef", "temp", "norm")

    def signature(fn):
        sig = {}
        for p in fn.params:
            if p.is_constexpr:
                sig[p.name] = "constexpr"
            elif p.name.endswith("_ptr"):
                sig[p.name] = TYPES.get(p.name, "*fp32")
            else:  # strides are int64 so that row * stride never wraps
                sig[p.name] = "fp32" if p.name in FLOATS else "i64" if p.name[0] == "s" else "i32"
        return sig

    target = GPUTarget("cuda", 90, 32)
    jobs = []
    for ent, tempered in ((False, False), (True, False), (True, True)):
        for fn in (K._logprob_fwd, K._logprob_bwd):
            jobs.append((fn, dict(BLOCK_V=4096, WITH_ENTROPY=ent, TEMPERED=tempered), 16))
    agg = dict(AGG=2, WRITE_GRAD=True, BLOCK_S=1024, GP=16)
    for code, _ in S.LOSSES.values():
        for kl, gated in ((0, False), (3, True), (7, False)):
            c = dict(LOSS=code, KL=kl, GATED=gated, LO=0.8, HI=1.28, C=3.0, TP=1.0, TN=1.05)
            jobs += [(L._loss_fwd, c | agg | dict(BLOCK_T=1024), 8),
                     (LL._logits_loss_fwd, c | agg | dict(BLOCK_V=2048, REVERSE=True), 8)]
    for kl in S.KLS.values():
        c = dict(LOSS=2, KL=kl, GATED=False, LO=0.8, HI=1.28, C=S.INF, TP=1.0, TN=1.0)
        jobs += [(L._loss_fwd, c | agg | dict(BLOCK_T=1024), 8)]
    clipped = dict(LOSS=2, KL=3, GATED=False, LO=0.8, HI=1.28, C=S.INF, TP=1.0, TN=1.0, BLOCK_S=1024, GP=16)
    for a in range(len(S.AGGREGATES)):
        for write in (True, False):
            jobs += [(L._loss_fwd, clipped | dict(AGG=a, WRITE_GRAD=write, BLOCK_T=1024), 8),
                     (LL._logits_loss_fwd, clipped | dict(AGG=a, WRITE_GRAD=write, BLOCK_V=2048, REVERSE=True), 8)]
    small = clipped | dict(AGG=5, WRITE_GRAD=True, BLOCK_S=32, GP=8)  # prompt_mean at a batch's BLOCK_S
    jobs += [(L._loss_fwd, small | dict(BLOCK_T=1024), 8), (LL._logits_loss_fwd, small | dict(BLOCK_V=2048, REVERSE=True), 8)]
    for block, warps, _, reverse in LL.CONFIGS + [c for _, c in LL.TILES]:
        jobs.append((LL._logits_loss_fwd, clipped | dict(AGG=2, WRITE_GRAD=True, BLOCK_V=block, REVERSE=reverse), warps))
    jobs += [(L._lengths, dict(BLOCK_T=1024), 4), (L._reduce, dict(BLOCK=1024), 8), (L._scale_rows, dict(BLOCK=4096), 8)]
    # the fused head's kernels at every tuning-table entry: the GPU run times them all
    for cfg in Hd.CONFIGS.values():
        (fb, fw), (bb, bw) = cfg["fwd"], cfg["bwd"]
        for ent, tempered, first, last in ((False, False, True, True), (True, True, False, False),
                                           (True, False, True, False), (False, True, False, True)):
            jobs.append((Hd._fold_fwd, dict(BLOCK=fb, WITH_ENTROPY=ent, TEMPERED=tempered, FIRST=first, LAST=last), fw))
        for ent, tempered in ((False, False), (True, True)):
            jobs.append((Hd._grad_tile, dict(BLOCK=bb, WITH_ENTROPY=ent, TEMPERED=tempered), bw))
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
