"""A gradient pass's memory on a CPU under glibc's malloc settings, measured.

    python scripts/cpu_memory.py [PRESET] [--prompts 8] [--group 8] [--thresholds default 131072 4194304]
                                 [--layouts checkpointed] [--passes 2] [--out results/smollm2_start/cpu_memory.csv]

glibc's malloc serves a request below its mmap threshold from its heap and raises that threshold (up to 32 MB)
whenever a larger mapped block is freed; a transformer's per-block activations then land in the heap between
the tensors the backward keeps, and the holes they leave are reused only in part, so a process's RSS grows
well past what it holds (SmolLM2, 64 completions, in a process without the CPU pin: the forward kept 20 MB a
block, each block's input, while RSS grew 200 MB a block; under the pin the forward's RSS stays near what it
keeps and the backward's recomputed blocks grow it). Setting the threshold (MALLOC_MMAP_THRESHOLD_, read by
glibc at start) ends the dynamic rule: larger blocks are mapped and unmapped on their own, at the cost of fresh
pages each time.

Each threshold and layout runs in a process of its own: one rollout of PROMPTS x GROUP completions (seed 0),
then PASSES gradient passes (the policy's log-probs of them and their backward), timed, with the RSS the first
forward adds, the peak RSS, and the log-probs' sum as hex (the allocator must not change a bit). Layouts: each
block recomputed in the backward (`checkpointed`, model.gradient_checkpointing), or every prompt run once for
its group and its keys and values repeated (`shared_prefix`, model.shared_prefix: other rounding, so another sum).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def rss_gb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def measure(preset: str, prompts: int, group: int, passes: int, layout: str = "checkpointed") -> dict:
    """In this process (whose allocator settings are its environment's)."""
    from grpo_bench.numerics import cpu

    cpu.pin()
    import torch

    from grpo_bench.config.run import resolve_run
    from grpo_bench.engine.trainer import build_task

    cfg = resolve_run({"task": {"name": preset, "prompts_per_step": prompts,
                                "model": {"gradient_checkpointing": layout == "checkpointed",
                                          "shared_prefix": layout == "shared_prefix"}},
                       "group_size": group, "backend": "chunked"})
    task = build_task([cfg])
    ro = task.rollout(0, 0, group)
    before = rss_gb()
    seconds, grown, total = [], None, None
    for _ in range(passes):
        t0 = time.perf_counter()
        logp, _ = task.logprobs(ro)
        grown = rss_gb() - before if grown is None else grown
        total = logp.sum()
        total.backward()
        seconds.append(time.perf_counter() - t0)
    # the setting as this process's glibc read it, not as the parent meant it
    return {"layout": layout, "mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_", "default"),
            "responses": int(ro.mask[..., 0].numel()), "tokens": int(ro.extra["prompt_ids"].shape[-1]) + ro.mask.shape[-1],
            "threads": torch.get_num_threads(), "pass_s": round(min(seconds), 1), "forward_rss_gb": round(grown, 2),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
            "logp_sum": float(total).hex()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", nargs="?", default="smollm2_countdown_warm")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--thresholds", nargs="+", default=["default", "131072", "4194304"],
                    help="MALLOC_MMAP_THRESHOLD_ values in bytes; `default` leaves glibc's dynamic rule")
    ap.add_argument("--layouts", nargs="+", default=["checkpointed"], choices=["checkpointed", "shared_prefix"])
    ap.add_argument("--out", type=Path, default=Path("results/smollm2_start/cpu_memory.csv"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.preset, args.prompts, args.group, args.passes, args.layouts[0])))
        return 0
    from grpo_bench.store.rundir import cpu_name

    rows = []
    for layout, threshold in ((lay, t) for lay in args.layouts for t in args.thresholds):
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
        if threshold != "default":
            env["MALLOC_MMAP_THRESHOLD_"] = str(int(threshold))
        cmd = [sys.executable, __file__, args.preset, "--prompts", str(args.prompts), "--group", str(args.group),
               "--passes", str(args.passes), "--layouts", layout, "--child"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"cpu_memory: the measure of {layout} at threshold {threshold} failed:\n"
                             f"{done.stderr[-2000:]}")
        rows.append({"preset": args.preset, **json.loads(done.stdout.splitlines()[-1]),
                     "machine": f"{cpu_name()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"})
        print(rows[-1], flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:   # kept as each setting finishes
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
