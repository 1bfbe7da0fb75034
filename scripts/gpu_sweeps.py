"""Run many claim sweeps at once on one GPU, in priority order, until a deadline.

    python scripts/gpu_sweeps.py OUTDIR [--seeds 10] [--slots 15] [--deadline-s 380] [--set K=V ...] ABLATION:SETTING ...

A tiny LM's population keeps an H100 a few percent busy from one host thread, so one sweep at a time
would leave the device idle: this starts `python -m grpo_bench run` for each ABLATION:SETTING (in the
order given: most wanted first) with up to 3 spawned worker processes each (one population of every
variant's seeds per worker), as many sweeps at once as `--slots` worker processes allow, into
OUTDIR/<ablation>_<setting>. At the deadline every sweep still running is sent SIGTERM, which keeps its
finished runs: the same command resumes them. Writes OUTDIR/sweeps.csv (one row per sweep: status, wall
seconds, workers) as each sweep ends, so a call stopped from outside still returns what finished.
"""
from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def n_variants(ablation: str, setting: str) -> int:
    from grpo_bench.config.ablation import load_ablation

    return len(load_ablation(ROOT / ablation, setting=setting).variants)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("sweeps", nargs="+", metavar="ABLATION:SETTING")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--slots", type=int, default=15, help="worker processes at once, over all sweeps")
    ap.add_argument("--per-sweep", type=int, default=3, help="worker processes per sweep at most")
    ap.add_argument("--deadline-s", type=float, default=380.0)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(argv)

    todo = []
    for item in args.sweeps:
        ablation, _, setting = item.partition(":")
        if not setting:
            ap.error(f"{item}: expected ABLATION:SETTING, e.g. ablations/adv_norm.yaml:countdown")
        name = f"{Path(ablation).stem}_{setting}"
        try:
            n_variants(ablation, setting)
        except Exception as e:  # a sweep that cannot load must not stop the others
            print(f"{name}: not run: {e}", flush=True)
            continue
        todo.append((name, ablation, setting, min(args.per_sweep, n_variants(ablation, setting), args.slots)))

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    table = args.out / "sweeps.csv"
    with table.open("w", newline="") as f:
        csv.writer(f).writerow(["sweep", "workers", "status", "wall_s"])

    t0 = time.monotonic()
    running: dict[str, tuple[subprocess.Popen, int, float]] = {}

    def record(name, workers, status, started):
        with table.open("a", newline="") as f:
            csv.writer(f).writerow([name, workers, status, round(time.monotonic() - started, 1)])
        print(f"[{time.monotonic() - t0:6.1f} s] {name}: {status}", flush=True)

    while todo or running:
        for name, (proc, workers, started) in list(running.items()):
            if proc.poll() is not None:
                record(name, workers, "ok" if proc.returncode == 0 else f"exit {proc.returncode}", started)
                del running[name]
        busy = sum(w for _, w, _ in running.values())
        while todo and busy + todo[0][3] <= args.slots and time.monotonic() - t0 < args.deadline_s:
            name, ablation, setting, workers = todo.pop(0)
            cmd = [args.python, "-m", "grpo_bench", "run", ablation, "--setting", setting,
                   "--seeds", str(args.seeds), "--workers", str(workers), "--population", "64",
                   "--no-progress", "--out", str(args.out / name)]
            for s in args.sets:
                cmd += ["--set", s]
            log = open(args.out / "logs" / f"{name}.log", "w")
            running[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                              start_new_session=True), workers, time.monotonic())
            busy += workers
            print(f"[{time.monotonic() - t0:6.1f} s] {name}: started, {workers} workers", flush=True)
        if time.monotonic() - t0 >= args.deadline_s:
            for name, (proc, workers, started) in running.items():
                os.killpg(proc.pid, signal.SIGTERM)
            for name, (proc, workers, started) in running.items():
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                record(name, workers, "stopped at the deadline", started)
            for name, _, _, workers in todo:
                record(name, workers, "not started", time.monotonic())
            return 1
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
