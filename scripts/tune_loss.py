"""Where the fused GRPO loss spends its time on a GPU, and its launch parameters swept.

    python3 scripts/tune_loss.py results/kernels/gpu/tune_loss.csv

The benchmark's configuration (clipped 0.2 / 0.28, k3 at beta 0.04, seq_mean_token_mean), fp32
(B, G, T) = (64, 16, 4096) and (64, 16, 16384): a torch.profiler table of one forward+backward
(kernels against the torch ops around them), then every (BLOCK_T, num_warps) timed with
triton.testing.do_bench, forward+backward through autograd as the trainer calls it. The table
the kernel uses lives beside it (kernels/loss.py: BLOCK_T_MAX, NUM_WARPS).
"""
from __future__ import annotations

import csv
import itertools
import sys

import torch
import triton.testing

from grpo_bench.numerics.kernels import loss as L
from grpo_bench.numerics.logprobs import grpo_loss

CONFIG = dict(loss={"name": "clipped", "clip_low": 0.2, "clip_high": 0.28}, kl="k3", kl_coef=0.04,
              aggregate="seq_mean_token_mean", backend="triton")


def inputs(b, g, t):
    gen = torch.Generator("cuda").manual_seed(0)
    logp = -3 * torch.rand(b, g, t, generator=gen, device="cuda")
    old = logp + 0.2 * torch.randn(b, g, t, generator=gen, device="cuda")
    ref = logp + 0.2 * torch.randn(b, g, t, generator=gen, device="cuda")
    deltas = torch.randn(b, g, generator=gen, device="cuda")
    lengths = torch.randint(1, t + 1, (b, g), generator=gen, device="cuda")
    mask = (torch.arange(t, device="cuda") < lengths.unsqueeze(-1)).float()
    return logp.requires_grad_(), old, ref, deltas, mask


def main(path: str) -> None:
    default = L.BLOCK_T_MAX, L.NUM_WARPS
    rows = []
    for shape in [(64, 16, 4096), (64, 16, 16384)]:
        args = inputs(*shape)
        step = lambda: torch.autograd.grad(grpo_loss(*args, **CONFIG)[0], args[0])  # noqa: E731
        step()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(f"== {shape}: 5 forward+backward")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
        for block, warps in itertools.product((256, 512, 1024, 2048, 4096), (2, 4, 8, 16)):
            L.BLOCK_T_MAX, L.NUM_WARPS = block, warps
            ms = triton.testing.do_bench(step)
            rows.append(dict(b=shape[0], g=shape[1], t=shape[2], block_t=block, warps=warps, ms=ms))
        L.BLOCK_T_MAX, L.NUM_WARPS = default
        rows.append(dict(b=shape[0], g=shape[1], t=shape[2], block_t=min(L.BLOCK_T_MAX, shape[2]),
                         warps=f"rule {L.NUM_WARPS}",
                         ms=triton.testing.do_bench(step)))
        compiled = torch.compile(lambda *a: grpo_loss(*a, **{**CONFIG, "backend": "torch"})[0])
        torch.autograd.grad(compiled(*args), args[0])
        rows.append(dict(b=shape[0], g=shape[1], t=shape[2], block_t="torch.compile", warps="",
                         ms=triton.testing.do_bench(lambda: torch.autograd.grad(compiled(*args), args[0]))))
        for r in sorted((r for r in rows if r["t"] == shape[2]), key=lambda r: r["ms"])[:6]:
            print(r)
        print("rule / compile:", [r for r in rows if r["t"] == shape[2] and str(r["warps"]).startswith("rule")],
              [r for r in rows if r["t"] == shape[2] and r["block_t"] == "torch.compile"])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1])
