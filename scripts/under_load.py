"""The test suite several times in a row on a machine kept busy: no test may depend on timing or load.

    .venv/bin/python scripts/under_load.py                  # 3 runs of the whole suite beside 1 busy loop per core
    .venv/bin/python scripts/under_load.py --runs 1 --busy 4 -- tests/test_ray.py tests/test_faults.py

Beside the suite, `--busy` processes (default: one per core) spin in a pure-Python loop for as long as
it runs: `stress --cpu N` without installing stress, and without taskset, so the suite's own processes
compete for every core. Each run's exit code and wall time are printed; the exit code is 0 only when
every run passed. The busy loops end with this script: Ctrl-C, SIGTERM, or (Linux) SIGKILL, by the kernel.
"""
from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _spin(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent ends us
    if sys.platform.startswith("linux"):  # SIGKILLed by the kernel when the parent dies, even by SIGKILL
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before prctl took hold
            return
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="times the suite runs in a row (default 3)")
    p.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy-loop processes (default: one per core)")
    p.add_argument("pytest_args", nargs="*", help="after --: what pytest runs (default: the whole suite)")
    args = p.parse_args()
    # SIGTERM's default ends this process without its `finally`, leaving the busy loops spinning
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    spinners = [mp.get_context("spawn").Process(target=_spin, args=(os.getpid(),), daemon=True)
                for _ in range(args.busy)]
    for s in spinners:
        s.start()
    results = []
    try:
        for i in range(args.runs):
            t0 = time.perf_counter()
            rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                                 cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            results.append((rc, time.perf_counter() - t0))
            print(f"under load ({args.busy} busy loops): run {i + 1} of {args.runs}: exit {rc} in "
                  f"{results[-1][1] / 60:.1f} min", file=sys.stderr, flush=True)
    finally:
        for s in spinners:
            s.terminate()
        for s in spinners:
            s.join()
    passed = sum(rc == 0 for rc, _ in results)
    print(f"{passed} of {len(results)} runs passed under load", file=sys.stderr)
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
