"""Where GSPO's sequence clip would bind, measured on DAPO's own updates before a setting is chosen.

    python scripts/clip_probe.py PRESET [--rollouts 2] [--prompts 8] [--group 8] [--inner-steps 8] [--lr 5e-4]
                                 [--lows 3e-4 3e-3 1e-2 3e-2 0.1 0.2 0.3] [--shared-prefill]
                                 [--out results/smollm2_start/clip_probe.csv]

GSPO clips the sequence ratio s = exp(mean of a response's token log-ratios) at 1 - low / 1 + high (3e-4 / 4e-4 as
published, for responses of thousands of tokens); a short response's mean moves far more, so the published range
clips most of it, and a setting where GSPO is GSPO sets the range on its own scale (policy_losses' lm_acts: the
range, in the paper's 3:4 shape, whose clipped share matches DAPO's). Each candidate range would need a run of its
own; instead one seed trains DAPO's loss (clip-higher 0.2 / 0.28, token mean, z-score advantages) for ROLLOUTS
rollouts of INNER_STEPS updates, and every update logs, beside DAPO's own clipped share, the share of tokens GSPO's
clip would drop at each candidate (a token of a response with A > 0 and s > 1 + high, or A < 0 and s < 1 - low). The
updates are DAPO's, not GSPO's: the range found is where the two clip alike on the same policy path. The probe
stops before the run's final evaluation (it would score the held-out set, which the probe does not need).

Rows: DAPO's own share, each candidate's, and the candidate range log-log interpolated to DAPO's share.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

import torch

SHAPE = 4 / 3   # GSPO's high / low (3e-4 / 4e-4)


def _key(low: float) -> str:
    return "gspo_" + f"{low:g}".replace(".", "p").replace("-", "m")


def _register(lows: list[float]) -> str:
    from grpo_bench import registry
    from grpo_bench.algos.common import bcast
    from grpo_bench.algos.losses import _ppo, seq_log_ratio

    name = "clip_probe_" + "_".join(_key(x) for x in lows)

    def probe_loss(logp, old_logp, deltas, mask):
        """DAPO's clip-higher loss, with a region per candidate GSPO range where that clip would bind.

        Source: scripts/clip_probe.py (a probe, not a part to train with)."""
        adv = bcast(deltas, logp)
        loss, regions = _ppo(torch.exp(logp - old_logp), adv, 0.2, 0.28)
        with torch.no_grad():
            s = torch.exp(seq_log_ratio(logp, old_logp, mask)).expand_as(logp)
            for low in lows:
                regions[_key(low)] = ((adv < 0) & (s < 1 - low)) | ((adv > 0) & (s > 1 + SHAPE * low))
        return loss, regions

    if name not in registry.names("loss"):
        registry.register("loss", name)(probe_loss)
    return name


class _Stop(Exception):
    pass


def probe(preset: str, rollouts: int, prompts: int, group: int, inner_steps: int, lr: float,
          lows: list[float], shared_prefill: bool = False) -> list[dict]:
    from grpo_bench.config.run import resolve_run
    from grpo_bench.engine.trainer import train_population
    from grpo_bench.store.rundir import cpu_name
    from grpo_bench.tasks.arithmetic import Arithmetic

    t0 = time.perf_counter()
    cfg = resolve_run({"task": {"name": preset, "prompts_per_step": prompts, "pass_k": 0,
                                "model": {"gradient_checkpointing": True},
                                "sampling": {"shared_prefill": shared_prefill}},
                       "group_size": group, "epochs": rollouts, "inner_steps": inner_steps, "lr": lr, "log_every": 1,
                       "eval_every": 0, "backend": "chunked", "delta": "zscore", "loss": _register(lows),
                       "aggregate": "token_mean"})

    def stop(self, mid_run=False):
        raise _Stop

    rows: list[list] = [[]]
    keep, Arithmetic.evaluate = Arithmetic.evaluate, stop
    try:
        train_population([cfg], rows)
        raise SystemExit(f"clip_probe: {preset} finished without evaluating: not an LM task")
    except _Stop:
        pass
    finally:
        Arithmetic.evaluate = keep
    logged: dict[str, list[float]] = {}
    for _, metric, value in rows[0]:
        logged.setdefault(metric, []).append(value)
    mean = lambda k: sum(logged[k]) / len(logged[k])  # noqa: E731
    updates = len(logged["clip/low_frac"])
    common = {"preset": preset, "rollouts": rollouts, "updates": updates}
    dapo = mean("clip/low_frac") + mean("clip/high_frac")   # disjoint: one side per advantage sign
    out = [common | {"loss": "dapo", "clip_low": 0.2, "clip_high": 0.28, "clipped": round(dapo, 5)}]
    shares = [(low, mean(f"clip/{_key(low)}_frac")) for low in lows]
    out += [common | {"loss": "gspo", "clip_low": low, "clip_high": round(SHAPE * low, 6), "clipped": round(v, 5)}
            for low, v in shares]
    # the share falls as the range widens: interpolate log(share) against log(low) between the two that bracket DAPO's
    # (the share itself where the wider one clips nothing: its log is -inf)
    for (a, fa), (b, fb) in zip(shares, shares[1:]):
        if fa >= dapo >= fb and fa > fb and dapo > 0:
            g = math.log if fb > 0 else (lambda x: x)
            t = (g(dapo) - g(fa)) / (g(fb) - g(fa))
            low = math.exp(math.log(a) + t * (math.log(b) - math.log(a)))
            out.append(common | {"loss": "gspo matched to dapo", "clip_low": round(low, 3),
                                 "clip_high": round(SHAPE * round(low, 3), 3), "clipped": round(dapo, 5)})
            break
    machine = f"{cpu_name()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    return [r | {"seconds": round(time.perf_counter() - t0), "machine": machine} for r in out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--rollouts", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--inner-steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--lows", type=float, nargs="+", default=[3e-4, 3e-3, 1e-2, 3e-2, 0.1, 0.2, 0.3])
    ap.add_argument("--shared-prefill", action="store_true", help="sample as the SmolLM2 settings do (the other bits)")
    ap.add_argument("--out", type=Path, default=Path("results/smollm2_start/clip_probe.csv"))
    args = ap.parse_args(argv)
    from grpo_bench.numerics import cpu

    cpu.pin()
    rows = probe(args.preset, args.rollouts, args.prompts, args.group, args.inner_steps, args.lr, sorted(args.lows),
                 args.shared_prefill)
    for r in rows:
        print(r)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
