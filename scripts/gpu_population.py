"""Populations on one device: runs per device-minute, memory per member, and whether a member's
numbers are those it has alone.

    python scripts/gpu_population.py OUTDIR [--budget-s 60,120] [--device cuda] [--tiny]

For each task (the sorting toy: loss_modes' clipped variant on sort_converge; the LM:
arithmetic_lora's grpo on arithmetic_scratchpad, population LoRA and batched generation) it
trains, in this one process, after an untimed warm-up run:
  P = 1   two runs one after the other (`--population 1`: one run per process, less the
          process start, which favours P = 1);
  P > 1   one population of P runs (seeds 0..P-1).
Budgets are cut along the run (the toy 60 of its 600 epochs, the LM 6 of its 30 rollouts,
no mid-run evaluation, greedy final evaluation on the 1000 held-out problems, pass@k off): a
run's cost per epoch does not change along it. Every case uses backend=torch, so the loss is
vmapped over members (the fused Triton loss runs member by member).

Writes, each file as soon as its row is measured (a stopped call keeps what it finished):
  population.csv           task, P, runs, wall s, s per run, runs per device-minute, speed-up
                           over P = 1, peak device memory, memory per member
  population_equality.csv  per task and metric: seeds 0 and 1 inside the P = 8 population
                           against the same runs at P = 1 (bitwise equal rows, largest
                           absolute and relative difference)
  profile_<task>_p<P>.txt  torch.profiler's top kernels for P = 1 and the largest P, with the
                           share of the wall time the device was busy
  population_profile.csv   the same profiles as a table: device-busy share, kernel launches,
                           memcpy calls and stream syncs of 3 epochs, and the wall seconds of each
                           phase (rollout, log-prob passes, evaluation, the rest: Phases)
--profile 1,64 profiles only (each task's warm-up, then those sizes): where a population's time goes,
in a call too short for the rates.
cpu_cores_replaced is runs per device-minute over one CPU core's runs per minute, measured first in
the same process (the toy as a population of 32 on one thread, the LM one run at a time), to 3
significant digits (--tiny's are about 0.01, which 2 decimals rounded to 0 on a loaded machine). A case
still training at its task's budget is abandoned (rows already written stay); none starts after it.
--tiny shrinks everything (CPU test of this script: tests/test_gpu_script.py).
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_bench.config.ablation import load_ablation  # noqa: E402
from grpo_bench.config.run import resolve_run
from grpo_bench.sweep.runner import plan  # noqa: E402
from grpo_bench.engine.trainer import train_population  # noqa: E402

TASKS = {
    "toy": dict(ablation="loss_modes", variant="loss=clipped", sizes=(1, 8, 64, 256, 1024, 4096), cpu_p=32,
                sets=("epochs=60", "backend=torch")),
    "lm": dict(ablation="arithmetic_lora", variant="grpo", sizes=(1, 8, 32, 64, 128), cpu_p=1,
               sets=("epochs=6", "eval_every=0", "task.pass_k=0", "backend=torch")),
}
TINY = {"toy": ("epochs=3", "inner_steps=2", "eval_every=0"),
        "lm": ("epochs=1", "task.prompts_per_step=2", "group_size=2", "task.sampling.max_new_tokens=8")}
FIELDS = ["task", "population", "runs", "wall_s", "s_per_run", "runs_per_device_minute", "speedup",
          "peak_mem_mb", "mem_per_member_mb", "cpu_cores_replaced", "cuda_graphs", "device", "settings"]


class Deadline(Exception):
    """A case still training at its task's deadline: abandoned, the rows already written stay."""


def configs(task: str, seeds: list[int], device: str, tiny: bool, graphs: bool = False) -> list:
    spec = TASKS[task]
    sets = [*spec["sets"], f"device={device}", *(TINY[task] if tiny else ()), *(["cuda_graphs=true"] if graphs else [])]
    abl = load_ablation(ROOT / "ablations" / f"{spec['ablation']}.yaml", seeds=max(seeds) + 1, sets=sets)
    runs = [s for s in plan(abl) if s.variant == spec["variant"] and s.seed in seeds]
    return [resolve_run(s.config, s.run_id) for s in runs]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train(cfgs: list, device: str, deadline: float = math.inf) -> tuple[float, float, list[list]]:
    """Wall seconds, peak device MB and each run's metric rows for one population; Deadline if it is still
    training at `deadline` (perf_counter seconds)."""
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    rows = [[] for _ in cfgs]
    sync(device)
    t0 = time.perf_counter()
    def on_epoch(_members):
        if time.perf_counter() > deadline:
            raise Deadline

    results = train_population(cfgs, rows, on_epoch=on_epoch)
    sync(device)
    wall = time.perf_counter() - t0
    bad = [r for r in results if isinstance(r, BaseException)]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(cfgs)} members failed: {bad[0]!r}")
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else float("nan")
    return wall, peak, [[r for r in rs if not r[1].startswith("time/")] for rs in rows]


def write(path: Path, fields: list[str], rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def equality(task: str, alone: list[list], together: list[list]) -> list[dict]:
    """Per metric: how many rows match bitwise, and the largest differences, over the shared runs."""
    out: dict[str, dict] = {}
    for a_rows, p_rows in zip(alone, together):
        if len(a_rows) != len(p_rows):
            raise RuntimeError(f"{task}: a member logged {len(p_rows)} rows, alone {len(a_rows)}")
        for (sa, ma, va), (sp, mp, vp) in zip(a_rows, p_rows):
            if (sa, ma) != (sp, mp):
                raise RuntimeError(f"{task}: rows out of order: {(sa, ma)} vs {(sp, mp)}")
            d = out.setdefault(ma, {"task": task, "metric": ma, "rows": 0, "bitwise_equal": 0,
                                    "max_abs_diff": 0.0, "max_rel_diff": 0.0})
            d["rows"] += 1
            d["bitwise_equal"] += int(va == vp or (va != va and vp != vp))
            diff = abs(va - vp)
            d["max_abs_diff"] = max(d["max_abs_diff"], diff)
            d["max_rel_diff"] = max(d["max_rel_diff"], diff / max(abs(va), 1e-12))
    return list(out.values())


class Phases:
    """Wall seconds in each phase of a population's training, exclusive of the phases inside it: the
    rollouts (generation and rewards), every log-prob pass (old, reference and each inner step's), the
    held-out evaluations; the rest is the loss, backward, optimizer and bookkeeping. A sync at every
    boundary, so a phase owns the kernels it launched; each is a torch.profiler range (grpo/<phase>)."""

    NAMES = ("rollout", "logprobs", "evaluate")

    def __init__(self, device: str):
        self.device, self.seconds, self.stack = device, dict.fromkeys(self.NAMES, 0.0), []

    def wrap(self, name: str, fn):
        from torch.profiler import record_function

        def timed(*a, **k):
            sync(self.device)
            now = time.perf_counter()
            if self.stack:  # the phase outside pauses
                self.seconds[self.stack[-1][0]] += now - self.stack[-1][1]
            self.stack.append([name, now])
            try:
                with record_function(f"grpo/{name}"):
                    return fn(*a, **k)
            finally:
                sync(self.device)
                now = time.perf_counter()
                inner, start = self.stack.pop()
                self.seconds[inner] += now - start
                if self.stack:
                    self.stack[-1][1] = now
        return timed

    def install(self):
        """Wraps the trainer's rollout and evaluation and each task's log-prob pass; returns the undo."""
        from grpo_bench.engine import trainer
        saved = {n: getattr(trainer, n) for n in ("sample", "_evaluate", "build_task")}
        trainer.sample = self.wrap("rollout", saved["sample"])
        trainer._evaluate = self.wrap("evaluate", saved["_evaluate"])

        def build(*a, **k):
            task = saved["build_task"](*a, **k)
            task.logprobs = self.wrap("logprobs", task.logprobs)
            return task
        trainer.build_task = build
        return lambda: [setattr(trainer, n, f) for n, f in saved.items()]


def profile(task: str, p: int, device: str, tiny: bool, out: Path, graphs: bool = False) -> None:
    """Top kernels of a short run of P members, how busy the device was, and the wall time of each phase."""
    from torch.profiler import ProfilerActivity, profile as prof

    cfgs = configs(task, list(range(p)), device, tiny, graphs)
    for c in cfgs:
        c.epochs = min(c.epochs, 3)
        c.eval_every = 0
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    phases = Phases(device)
    undo = phases.install()
    sync(device)
    t0 = time.perf_counter()
    try:
        with prof(activities=acts) as pr:
            train_population(cfgs, None)
            sync(device)
    finally:
        undo()
    wall = time.perf_counter() - t0
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    events = pr.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6 if device == "cuda" else float("nan")
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                        "cudaGraphLaunch"))
    copies = sum(e.count for e in events if e.key in ("cudaMemcpyAsync", "cudaMemcpy"))
    syncs = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
    row = {"task": task, "population": p, "epochs": cfgs[0].epochs, "wall_s": round(wall, 4),
           "device_busy_s": round(busy, 4), "device_busy_share": round(busy / wall, 4), "kernel_launches": launches,
           "memcpy_calls": copies, "syncs": syncs, "cuda_graphs": "on" if graphs else "off", "device": device,
           **{f"{n}_s": round(v, 4) for n, v in phases.seconds.items()},
           "other_s": round(wall - sum(phases.seconds.values()), 4)}
    path = out / "population_profile.csv"
    old = list(csv.DictReader(path.open())) if path.exists() else []
    write(path, list(row), old + [row])
    where = ", ".join(f"{n} {row[f'{n}_s']:.2f} s" for n in (*Phases.NAMES, "other"))
    head = (f"{task} P={p}, {cfgs[0].epochs} epochs x {cfgs[0].inner_steps} inner steps, device {device}: "
            f"wall {wall:.2f} s under the profiler, device busy {busy:.3f} s ({busy / wall:.1%} of wall), "
            f"{launches} kernel launches; {where}\n\n")
    (out / f"profile_{task}_p{p}{'_graphs' if graphs else ''}.txt").write_text(head + events.table(sort_by=key, row_limit=15) + "\n")


def cpu_runs_per_minute(task: str, tiny: bool) -> float:
    """One CPU core's runs per minute at the same settings: a population of the task's CPU size (the toy
    stacks on a CPU too; the LM's CPU runs train one at a time), one torch thread, in this process."""
    p = 2 if tiny else TASKS[task]["cpu_p"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        wall, _, _ = train(configs(task, list(range(p)), "cpu", tiny), "cpu")
    finally:
        torch.set_num_threads(threads)
    print(f"{task}: one CPU core, P={p}: {60 * p / wall:.1f} runs per minute", flush=True)
    return 60 * p / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--budget-s", default="60,120", help="per task (toy,lm): no new case starts after this many seconds")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (the script's CPU test)")
    ap.add_argument("--tasks", default="toy,lm")
    ap.add_argument("--graphs", default="both", choices=("off", "on", "both"),
                    help="the toy's P > 1 with cuda_graphs off, on or both (CUDA only; the LM is never graphed)")
    ap.add_argument("--profile", default=None, metavar="P,...",
                    help="only profile each task at these sizes (after the warm-up): no rates, no equality")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_population.py: --device cuda but torch.cuda.is_available() is False (use --device cpu)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    rows, eq = [], []
    tasks = args.tasks.split(",")
    budgets = dict(zip(TASKS, map(float, args.budget_s.split(","))))
    if args.profile:
        for task in tasks:
            train(configs(task, [0], args.device, args.tiny)[:1], args.device)  # warm-up
            for p in map(int, args.profile.split(",")):
                profile(task, p, args.device, args.tiny, out)
        return
    for task in tasks:
        start = time.perf_counter()
        deadline = start + budgets[task]
        sizes = ((1, 2, 3) if task == "toy" else (1, 2)) if args.tiny else TASKS[task]["sizes"]
        modes = {"off": [False], "on": [True], "both": [False, True]}[args.graphs]
        if task != "toy" or args.device != "cuda":
            modes = [False]  # a captured step needs CUDA and the toy's static step
        train(configs(task, [0], args.device, args.tiny)[:1], args.device)  # warm-up: CUDA context, kernels, caches
        cpu_rate = cpu_runs_per_minute(task, args.tiny)
        base, alone_rows = None, None
        for p, graphs in [(p, g) for p in sizes for g in ([False] if p == 1 else modes)]:
            if time.perf_counter() > deadline:
                print(f"{task} P={p}: skipped, the task's {budgets[task]:.0f} s budget is spent", flush=True)
                continue
            try:
                if p == 1:
                    walls, peaks, alone_rows = [], [], []
                    for seed in (0, 1):
                        wall, peak, r = train(configs(task, [seed], args.device, args.tiny), args.device, deadline)
                        walls.append(wall), peaks.append(peak), alone_rows.extend(r)
                    wall, peak, runs = sum(walls), max(peaks), 2
                else:
                    wall, peak, together = train(configs(task, list(range(p)), args.device, args.tiny, graphs),
                                                 args.device, deadline)
                    runs = p
            except Deadline:
                print(f"{task} P={p}: stopped at the task's {budgets[task]:.0f} s deadline", flush=True)
                continue
            if p > 1 and alone_rows is not None and not any(e["task"] == task for e in eq):  # the smallest P > 1
                eq += equality(task, alone_rows, together[:2])
                write(out / "population_equality.csv", list(eq[0]), eq)
            per_run = wall / runs
            if p == 1:
                base = (per_run, peak)
            row = {"task": task, "population": p, "runs": runs, "wall_s": float(f"{wall:.6g}"),
                   "s_per_run": float(f"{per_run:.6g}"), "runs_per_device_minute": round(60 / per_run, 2),
                   "speedup": round(base[0] / per_run, 2), "peak_mem_mb": round(peak, 1),
                   "mem_per_member_mb": round((peak - base[1]) / (p - 1), 2) if p > 1 and not math.isnan(peak) else "",
                   "cpu_cores_replaced": float(f"{60 / per_run / cpu_rate:.3g}"), "cuda_graphs": "on" if graphs else "off",
                   "device": name, "settings": " ".join(TASKS[task]["sets"] + (TINY[task] if args.tiny else ()))}
            rows.append(row)
            write(out / "population.csv", FIELDS, rows)
            print(row, flush=True)
        done = [r["population"] for r in rows if r["task"] == task]
        for p, graphs in [(1, False)] + [(max(done, default=1), g) for g in modes if max(done, default=1) > 1]:
            if time.perf_counter() - start > budgets[task] * 1.25:
                break
            profile(task, p, args.device, args.tiny, out, graphs)


if __name__ == "__main__":
    main()
