"""Populations against one run per process: runs per core-minute and memory per member.

`pytest tests/benchmarks/test_bench_population.py --benchmark-only` runs the full cases:
- loss_modes at 32 seeds (96 runs of the sorting toy, 150 epochs x 10 inner steps): every
  run inside populations of 32, against a sample of the same runs trained one per process
  (`--population 1`), per run;
- arithmetic_lora's `grpo` at 10 seeds on the embedded LM, its budget cut to 20 rollouts
  (the cost of a rollout does not change along a run; evaluation at the start and the end):
  one population of 10 against 2 of the runs alone.
Each provider trains in a fresh process (spawned) with one torch thread, as the runner's
workers do, and reports the CPU seconds it used, its wall time and its peak resident set;
memory per member is the growth of the peak from a population of 1 to one of P, over P - 1.
A plain `pytest` run keeps the file as a smoke test: two tiny runs each way, nothing timed,
and their metrics compared (a population must give each run the numbers it has alone).
`python -m grpo_bench.analysis.bench_population` turns the --benchmark-json file into results/population/.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import resource
import time
from dataclasses import dataclass
from queue import Empty


from benchmarks.conftest import device_name, full_run


@dataclass(frozen=True)
class Case:
    ablation: str
    variants: tuple[str, ...] | None   # None: every variant
    seeds: int
    population: int                    # members per population (1: one run per process)
    sample: int | None = None          # runs trained (the first ones of the plan), None: all
    sets: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.ablation}-s{self.seeds}-p{self.population}"


def cases(full: bool, device: str) -> dict[str, list[Case]]:
    if not full:
        tiny = ("epochs=2", "inner_steps=2", "eval_every=0")
        return {"pop_case": [Case("loss_modes", ("loss=clipped",), 2, 2, sets=tiny),
                             Case("loss_modes", ("loss=clipped",), 2, 1, sets=tiny)]}
    lm = ("epochs=20", "eval_every=0")
    return {"pop_case": [Case("loss_modes", None, 32, 32), Case("loss_modes", None, 32, 1, sample=8),
                         Case("arithmetic_lora", ("grpo",), 10, 10, sets=lm),
                         Case("arithmetic_lora", ("grpo",), 10, 1, sample=2, sets=lm)]}


def _train(case: Case, queue) -> None:
    """In a fresh process: train the case's runs in populations of case.population; report the cost."""
    import torch

    from grpo_bench.config.ablation import load_ablation
    from grpo_bench.config.run import resolve_run
    from grpo_bench.sweep.runner import plan
    from grpo_bench.sweep.worker import populations
    from grpo_bench.engine.trainer import train_population

    torch.set_num_threads(1)
    abl = load_ablation(f"ablations/{case.ablation}.yaml", seeds=case.seeds, sets=list(case.sets))
    specs = [s for s in plan(abl) if case.variants is None or s.variant in case.variants][:case.sample]
    groups = populations(specs, case.population)
    cpu, wall = time.process_time(), time.perf_counter()
    rows = []
    for group in groups:
        cfgs = [resolve_run(s.config, s.run_id) for s in group]
        out = [[] for _ in cfgs]
        results = train_population(cfgs, out)
        rows += [(s.run_id, r, [x for x in o if not x[1].startswith("time/")]) for s, r, o in zip(group, results, out)]
    queue.put({"runs": len(specs), "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
               "device": device_name(), "load_avg": os.getloadavg()[0],
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rows": rows})


def run_case(case: Case) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_train, args=(case, queue))
    proc.start()
    while True:   # a process that dies before its result (an import that fails in it) must not hang the suite
        try:
            out = queue.get(timeout=5)
            break
        except Empty:
            if not proc.is_alive():
                raise RuntimeError(f"{case}: the training process exited with {proc.exitcode} before its result")
    proc.join()
    return out


_RESULTS: dict[Case, dict] = {}


def test_population(benchmark, request, pop_case):
    full = full_run(request.config)
    box = {}

    def once():
        box["out"] = run_case(pop_case)

    if not full:
        benchmark.disabled = True
    benchmark.pedantic(once, rounds=1, iterations=1)
    out = box["out"]
    _RESULTS[pop_case] = out
    assert out["runs"] >= 1 and all(isinstance(r, dict) and "final/reward" in r for _, r, _ in out["rows"])
    per_run = out["cpu_s"] / out["runs"]
    benchmark.extra_info.update(
        ablation=pop_case.ablation, seeds=pop_case.seeds, population=pop_case.population, runs=out["runs"],
        cpu_s=out["cpu_s"], wall_s=out["wall_s"], cpu_s_per_run=per_run, runs_per_core_minute=60 / per_run,
        peak_rss_mb=out["peak_rss_mb"], device=out["device"], load_avg=out["load_avg"],
        sets=" ".join(pop_case.sets))
    alone = next((c for c in _RESULTS if c.ablation == pop_case.ablation and c.population == 1
                  and c is not pop_case), None)
    together = next((c for c in _RESULTS if c.ablation == pop_case.ablation and c.population > 1), None)
    if alone and together:
        # the runs both sides trained have the same metric rows: the speed is not bought with other numbers
        mine = {rid: rows for rid, _, rows in _RESULTS[alone]["rows"]}
        theirs = {rid: rows for rid, _, rows in _RESULTS[together]["rows"]}
        shared = mine.keys() & theirs.keys()
        assert shared and all(mine[r] == theirs[r] for r in shared)
