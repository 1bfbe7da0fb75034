"""Sweep the log-prob kernel's launch parameters on a GPU: tile width, warps, pipeline stages.

    python3 scripts/tune_logprob.py results/kernels/gpu/tune.csv

For each vocabulary (GPT-2's 50,257 and Qwen's 151,936, bf16, N = 16,384 rows) and each pass
(forward; backward, which reads the logits and writes their gradient), every configuration
is timed with triton.testing.do_bench beside the memory bound of the same traffic (x.sum()
for one read; x * 0.5 into a preallocated tensor for a read and a write). The CSV holds every timing, so
the rule in kernels/logprob.py (_launch_cfg) can be checked against what was measured.
"""
from __future__ import annotations

import csv
import itertools
import sys

import torch
import triton.testing

from grpo_bench.numerics.kernels import logprob as K

N = 16_384
VOCABS = (50_257, 151_936)
BLOCKS = (1024, 2048, 4096, 8192)
WARPS = (4, 8, 16)
STAGES = (1, 2, 3)


def main(path: str) -> None:
    default = K._launch_cfg
    rows = []
    for v in VOCABS:
        gen = torch.Generator("cuda").manual_seed(0)
        x = torch.randn(1, N, v, device="cuda", generator=gen).mul_(2).to(torch.bfloat16)
        y = torch.randint(0, v, (1, N), device="cuda", generator=gen)
        g = torch.ones(1, N, device="cuda")
        out = torch.empty_like(x)
        nbytes = x.numel() * x.element_size()
        bounds = {"fwd": triton.testing.do_bench(lambda: x.sum()),
                  "bwd": triton.testing.do_bench(lambda: torch.mul(x, 0.5, out=out))}
        _, lse, _ = K.logprob_fwd(x, y, False)
        passes = {"fwd": lambda: K.logprob_fwd(x, y, False), "bwd": lambda: K.logprob_bwd(x, y, lse, None, g, None, out)}
        for block, warps, stages in itertools.product(BLOCKS, WARPS, STAGES):
            K._launch_cfg = lambda n, v, backward=False, b=block, w=warps, s=stages: dict(
                grid=(n,), BLOCK_V=b, num_warps=w, num_stages=s)
            for name, fn in passes.items():
                try:
                    ms = triton.testing.do_bench(fn)
                except Exception as e:  # noqa: BLE001 - a config that does not fit (registers, shared memory)
                    print(f"V={v} {name} block={block} warps={warps} stages={stages}: {type(e).__name__}", flush=True)
                    continue
                traffic = nbytes * (1 if name == "fwd" else 2)
                rows.append(dict(v=v, n=N, dtype="bfloat16", pass_=name, block=block, warps=warps, stages=stages,
                                 ms=ms, gb_per_s=traffic / ms / 1e6, bound_ms=bounds[name],
                                 of_bound=bounds[name] / ms))
        K._launch_cfg = default
        for name, fn in passes.items():
            cfg = default(N, v, backward=name == "bwd")
            ms = triton.testing.do_bench(fn)
            rows.append(dict(v=v, n=N, dtype="bfloat16", pass_=name, block=cfg["BLOCK_V"], warps=cfg["num_warps"],
                             stages="rule", ms=ms, gb_per_s=nbytes * (1 if name == "fwd" else 2) / ms / 1e6,
                             bound_ms=bounds[name], of_bound=bounds[name] / ms))
        del x, out
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for (v, name), group in itertools.groupby(sorted(rows, key=lambda r: (r["v"], r["pass_"], r["ms"])),
                                              key=lambda r: (r["v"], r["pass_"])):
        group = list(group)
        rule = next(r for r in group if r["stages"] == "rule")
        print(f"V={v} {name}: rule {rule['ms']:.3f} ms ({rule['of_bound']:.0%} of bound); best:")
        for r in group[:4]:
            print(f"   block={r['block']} warps={r['warps']} stages={r['stages']}: {r['ms']:.3f} ms "
                  f"({r['of_bound']:.0%} of bound)")


if __name__ == "__main__":
    main(sys.argv[1])
