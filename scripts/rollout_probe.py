"""What DAPO's parts would act on at a start, measured on one rollout before any run is set.

    python scripts/rollout_probe.py PRESET [--max-new-tokens 10 6] [--prompts 16] [--group 8] [--cache 2]
                                    [--out results/smollm2_start/rollout_probe.csv] [--append]

A setting where a claim's mechanism acts is chosen from numbers like these (ablations/dapo_ladder.yaml's
`smollm2`): one rollout of PROMPTS x GROUP completions from the start (seed 0, the preset's temperature), at
each response budget, and per budget the share of responses cut off at it and of the tokens they carry (what
overlong filtering drops), the share ending in the budget's last `cache` tokens (what the soft punishment
lowers), and two of the trainer's own diagnostics at its first rollout: the groups whose rewards are all alike
(reward/zero_std_frac, what dynamic sampling replaces) and the spread of the lengths of the responses in the
other groups (response/length_cv, what the token-level mean weighs). The clip's share needs updates, which a
rollout does not take: the runs' own diagnostics say it.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import torch


def probe(preset: str, budget: int, prompts: int, group: int, cache: int) -> dict:
    from grpo_bench.config.run import resolve_run
    from grpo_bench.engine.sampling import _rollout_metrics
    from grpo_bench.engine.trainer import build_task
    from grpo_bench.store.rundir import cpu_name

    t0 = time.perf_counter()
    cfg = resolve_run({"task": {"name": preset, "prompts_per_step": prompts, "sampling": {"max_new_tokens": budget}},
                       "group_size": group, "backend": "chunked"})
    ro = build_task([cfg]).rollout(0, 0, group)
    length = ro.mask.sum(-1).float()                      # (members, prompts, group)
    cut = 1.0 - ro.finished.float()
    rewards = ro.rewards.float()
    logged = {k: float(v[0]) for k, v in _rollout_metrics(ro).items()}   # the trainer's own step-0 diagnostics
    return {"preset": preset, "max_new_tokens": budget, "responses": length.numel(),
            "reward": round(float(rewards.mean()), 4),
            "cut_off": round(float(cut.mean()), 4),
            "cut_off_tokens": round(float((length * cut).sum() / length.sum()), 4),
            f"last_{cache}_tokens": round(float(((length > budget - cache) & (length <= budget)).float().mean()), 4),
            "equal_reward_groups": round(logged["reward/zero_std_frac"], 4),
            "length_cv": round(logged["response/length_cv"], 4),
            "lengths": " ".join(map(str, torch.bincount(length.long().flatten(), minlength=budget + 1).tolist())),
            "seconds": round(time.perf_counter() - t0, 1),
            "machine": f"{cpu_name()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--max-new-tokens", type=int, nargs="+", default=[10])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--cache", type=int, default=2, help="the soft punishment's zone (dapo_ladder's overlong_punish)")
    ap.add_argument("--out", type=Path, default=Path("results/smollm2_start/rollout_probe.csv"))
    ap.add_argument("--append", action="store_true", help="add the rows to --out's instead of replacing them")
    args = ap.parse_args(argv)
    old = list(csv.DictReader(args.out.open())) if args.append and args.out.is_file() else []
    rows = []
    for budget in args.max_new_tokens:
        rows.append(probe(args.preset, budget, args.prompts, args.group, args.cache))
        print(rows[-1], flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:   # kept as each budget finishes
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(old + rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
