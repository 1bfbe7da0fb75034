"""What bounding a reward call costs, per call: the evidence for rewards.bounded's choice (docs/reliability.md).

`pytest tests/benchmarks/test_bench_reward_call.py --benchmark-only` times one call of a reward scoring 128
completions (arithmetic's `correct` on 16 prompts x 8), each way a limit could be kept: none (the bare
function), rewards.call in the main thread (SIGALRM), rewards.call while a timer of the caller's runs (a
thread waited on), a persistent reward process (a pipe round trip of the batch and the scores, what a
process that can be killed costs at least), and a forked process per call. A plain `pytest` run calls each
once and checks it scores what the bare function does.
"""
from __future__ import annotations

import multiprocessing as mp
import signal

import pytest

from benchmarks.conftest import full_run
from grpo_bench.algos import rewards

PROMPTS = [f"{a}+{a}=" for a in range(16) for _ in range(8)]
COMPLETIONS = [str(2 * a + (j % 2)) for a in range(16) for j in range(8)]
ANSWERS = [2 * a for a in range(16) for _ in range(8)]


def _serve(conn):
    while (batch := conn.recv()) is not None:
        conn.send(rewards.correct(*batch[:2], answer=batch[2]))


def _child(conn):
    conn.send(rewards.correct(PROMPTS, COMPLETIONS, answer=ANSWERS))


@pytest.fixture
def ways():
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(there,), daemon=True)
    server.start()

    def persistent():
        here.send((PROMPTS, COMPLETIONS, ANSWERS))
        return here.recv()

    def fork_each():
        a, b = ctx.Pipe()
        p = ctx.Process(target=_child, args=(b,))
        p.start()
        out = a.recv()
        p.join()
        return out

    def thread():
        previous = signal.signal(signal.SIGALRM, lambda *a: None)
        signal.setitimer(signal.ITIMER_REAL, 100)  # a caller's timer: bounded waits on a thread instead
        try:
            return rewards.call("correct", rewards.correct, PROMPTS, COMPLETIONS, limit=10, answer=ANSWERS)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    yield {
        "bare": lambda: rewards.correct(PROMPTS, COMPLETIONS, answer=ANSWERS),
        "sigalrm": lambda: rewards.call("correct", rewards.correct, PROMPTS, COMPLETIONS, limit=10, answer=ANSWERS),
        "thread": thread,
        "persistent_process": persistent,
        "process_per_call": fork_each,
    }
    here.send(None)
    server.join(5)


@pytest.mark.parametrize("way", ["bare", "sigalrm", "thread", "persistent_process", "process_per_call"])
def test_reward_call_overhead(benchmark, ways, way, request):
    expected = rewards.correct(PROMPTS, COMPLETIONS, answer=ANSWERS)
    assert sum(expected) == 64
    benchmark.disabled = not full_run(request.config)   # disabled: one call, its result checked, nothing timed
    assert benchmark(ways[way]) == expected
