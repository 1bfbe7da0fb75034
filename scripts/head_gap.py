"""The sampler-trainer gap a precision claim needs before it can act, measured before any run.

    python scripts/head_gap.py [PRESET ...] [--prompts 8] [--group 8] [--out results/smollm2_start/head_gap.csv]

fp32_head and sampler_mismatch's `fp16 > bf16` are about one gap: the KL between the policy a sampler draws
from and the trainer's on the tokens it drew (mismatch/k3, the trainer's own metric). Their mechanism acts
only where it reaches 1e-3 nats per token (ablations/fp32_head.yaml, `why`). For each preset this draws one
rollout of PROMPTS x GROUP completions from the start (seed 0) with a sampler copy and scores it with the
trainer, in four arms: a bf16 trainer beside a bf16 sampler with the LM head's GEMM in bf16 on both sides
or in fp32 on both (ScaleRL's recipe), and an fp32 trainer beside a bf16 or an fp16 sampler. No update is
taken: the gap of the start, which a run's first rollout logs too.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import torch

ARMS = {  # name: (trainer dtype, sampler precision, fp32 head on both sides)
    "bf16_head": ("bf16", "bf16", False),
    "fp32_head": ("bf16", "bf16", True),
    "bf16_sampler": ("fp32", "bf16", False),
    "fp16_sampler": ("fp32", "fp16", False),
}


def gap(preset: str, arm: str, prompts: int, group: int) -> dict:
    from grpo_bench.algos.corrections import mismatch
    from grpo_bench.config.run import resolve_run
    from grpo_bench.engine.sampling import Sampler
    from grpo_bench.engine.trainer import build_task
    from grpo_bench.store.rundir import cpu_name

    dtype, precision, fp32 = ARMS[arm]
    cfg = resolve_run({"task": {"name": preset, "prompts_per_step": prompts,
                                "model": {"dtype": dtype, "cast_lm_head_to_fp32": fp32}},
                       "group_size": group, "backend": "chunked",
                       "sampler": {"precision": precision, "head": "fp32" if fp32 else "same"}})
    t0 = time.perf_counter()
    task = build_task([cfg])
    params = [p for p in task.policy.parameters() if p.requires_grad]
    ro = task.rollout(0, 0, group, Sampler(task.policy, params, cfg.sampler).load(params))
    with torch.no_grad():
        logp, _ = task.logprobs(ro)
    m = {k: float(v) for k, v in mismatch(logp, ro.sampler_logp, ro.mask).items()}
    return {"preset": preset, "arm": arm, "trainer": dtype, "sampler": precision, "fp32_head": fp32,
            "tokens": int(ro.mask.sum()), **m, "seconds": round(time.perf_counter() - t0, 1),
            "machine": f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d')}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="*", default=["smollm2_arithmetic", "arithmetic_scratchpad"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--out", type=Path, default=Path("results/smollm2_start/head_gap.csv"))
    # each row names its machine: a gap measured on another processor is kept beside this one's, not replaced
    ap.add_argument("--append", action="store_true", help="add the rows to --out's instead of replacing them")
    args = ap.parse_args(argv)
    rows = []
    for preset in args.presets:
        for arm in args.arms:
            rows.append(gap(preset, arm, args.prompts, args.group))
            r = rows[-1]
            print(f"{preset:24s} {arm:13s} k3 {r['mismatch/k3']:.3g}  kl {r['mismatch/kl']:.3g}  "
                  f"ratio [{r['mismatch/ratio_min']:.3f}, {r['mismatch/ratio_max']:.3f}]  {r['tokens']} tokens  "
                  f"{r['seconds']} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    old = list(csv.DictReader(args.out.open())) if args.append and args.out.is_file() else []
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(old + rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
