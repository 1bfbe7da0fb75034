"""Whether each claim's mechanism would act on a task, measured on one seed of the default recipe before a setting
is run there.

    python scripts/mechanism_probe.py PRESET [--rollouts 4] [--prompts 8] [--group 8] [--inner-steps 8] [--lr 5e-4]
                                      [--out results/smollm2_start/mechanism_probe.csv]

A claim's verdict counts only where the diagnostic its ablation file declares (analysis/mechanism.py) reaches its
threshold. On a task where no run of the claim exists yet, one seed of the default recipe (z-score advantages, PPO
clip 0.2, the default aggregation, no KL in the loss) trains ROLLOUTS rollouts of INNER_STEPS updates with the KL to
its start tracked (kl_track: the frozen reference's kl/seq, as ref_policy's `frozen` and kl_gradients' `none` log
it), each prompt run once for its group (model.shared_prefix) and sampled from one prefill, and stops before the
run's final evaluation. Rows: each logged diagnostic's mean over each rollout's updates, then over all of them
(rollout `all`), and for metrics judged by their spread over steps (reward/std: batch std's) that spread (cv).
The variants of the claims would move differently; the probe says where the default recipe stands, not what a
claim's own variant would log.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

DIAGNOSTICS = ["entropy", "kl/seq", "clip/frac", "clip/high_frac", "response/length", "response/length_cv",
               "response/length_group_cv", "response/length_prompt_cv", "reward/mean", "reward/std",
               "reward/group_std_cv", "reward/zero_std_frac", "delta/abs_mean", "response/finished"]


class _Stop(Exception):
    pass


def probe(preset: str, rollouts: int, prompts: int, group: int, inner_steps: int, lr: float) -> list[dict]:
    from grpo_bench.config.run import resolve_run
    from grpo_bench.engine.trainer import train_population
    from grpo_bench.store.rundir import cpu_name
    from grpo_bench.tasks.arithmetic import Arithmetic

    t0 = time.perf_counter()
    cfg = resolve_run({"task": {"name": preset, "prompts_per_step": prompts, "pass_k": 0,
                                "model": {"shared_prefix": True}, "sampling": {"shared_prefill": True}},
                       "group_size": group, "epochs": rollouts, "inner_steps": inner_steps, "lr": lr, "log_every": 1,
                       "eval_every": 0, "backend": "chunked", "kl_track": True})

    def stop(self, mid_run=False):
        raise _Stop

    rows: list[list] = [[]]
    keep, Arithmetic.evaluate = Arithmetic.evaluate, stop
    try:
        train_population([cfg], rows)
        raise SystemExit(f"mechanism_probe: {preset} finished without evaluating: not an LM task")
    except _Stop:
        pass
    finally:
        Arithmetic.evaluate = keep
    per_step = inner_steps  # log_every 1: a row a metric an update; rollout r is updates r*K .. r*K+K-1
    logged: dict[str, list[float]] = {}
    for _, metric, value in rows[0]:
        logged.setdefault(metric, []).append(value)
    machine = f"{cpu_name()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    common = {"preset": preset, "inner_steps": inner_steps, "lr": lr, "prompts": prompts, "group": group}
    out = []
    for metric in DIAGNOSTICS:
        values = logged.get(metric)
        if not values:
            continue
        chunks = [values[i:i + per_step] for i in range(0, len(values), per_step)]
        for r, chunk in enumerate(chunks):
            out.append(common | {"metric": metric, "rollout": r, "value": statistics.fmean(chunk)})
        out.append(common | {"metric": metric, "rollout": "all", "value": statistics.fmean(values)})
        if metric == "reward/std" and len(values) > 1 and statistics.fmean(values):
            out.append(common | {"metric": "cv over steps of reward/std", "rollout": "all",
                                 "value": statistics.pstdev(values) / statistics.fmean(values)})
    seconds = round(time.perf_counter() - t0)
    return [r | {"value": round(r["value"], 6), "seconds": seconds, "machine": machine} for r in out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--inner-steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--out", type=Path, default=Path("results/smollm2_start/mechanism_probe.csv"))
    args = ap.parse_args(argv)
    from grpo_bench.numerics import cpu

    cpu.pin()
    rows = probe(args.preset, args.rollouts, args.prompts, args.group, args.inner_steps, args.lr)
    if not rows:
        raise SystemExit(f"mechanism_probe: {args.preset} logged none of the diagnostics")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        if r["rollout"] == "all":
            print(f"{r['metric']:>32}  {r['value']:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
