"""The worker API in-process (sweep/worker.py): what a spawned worker does before and around training, held here
where a test can see it (the runner's tests reach the same code through worker processes)."""
import math
import pickle
import queue as queues

import pytest
import torch

from grpo_bench.numerics import cpu
from grpo_bench.sweep import worker as WK

TINY = {"task": {"name": "sort", "prompts": None, "num_prompts": 2, "eval_prompts": 4, "n": 2, "vocab": 3},
        "epochs": 2, "inner_steps": 1, "group_size": 2, "delta": "centered"}


def _spec(seed=0, run="r", **extra):
    return WK.RunSpec(f"{run}{seed}", "v", {"lr": 0.1}, seed, {**TINY, **extra, "seed": seed})


@pytest.fixture
def calls(monkeypatch):
    """What the worker pins and loads, in order, without pinning this test process."""
    seen = []
    monkeypatch.setattr(cpu, "pin", lambda: seen.append("pin"))
    monkeypatch.setattr(WK, "load_includes", lambda inc, where: seen.append(("include", inc, where)))
    return seen


def test_the_pin_is_taken_only_where_run_asked_for_it(calls, monkeypatch):
    monkeypatch.delenv("GRPO_BENCH_CPU_PIN", raising=False)
    WK._pin_if_asked()
    assert calls == []
    monkeypatch.setenv("GRPO_BENCH_CPU_PIN", "1")
    WK._pin_if_asked()
    assert calls == ["pin"]


def test_a_spec_crosses_to_a_worker_whole_and_pins_before_its_includes(calls, monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_CPU_PIN", "1")
    spec = _spec(3, include=[])
    back = pickle.loads(pickle.dumps(spec))
    assert (back.run_id, back.variant, back.values, back.seed, back.config) == \
        (spec.run_id, spec.variant, spec.values, spec.seed, spec.config)
    assert back.resolved == spec.resolved and back.resolved is not spec.resolved
    # registering a user's part computes, and MKL's path is fixed by a process's first computation
    assert calls == ["pin", ("include", [], "r3")]


def _stub_training(monkeypatch, outcome):
    """train_population replaced: `outcome(cfgs, rows, on_epoch, outcomes)` gives its return or raises."""
    import grpo_bench.engine.trainer as trainer
    monkeypatch.setattr(trainer, "train_population",
                        lambda cfgs, rows, on_epoch=None, outcomes=None: outcome(cfgs, rows, on_epoch, outcomes))


def _ok(cfgs, rows, on_epoch, outcomes):
    for r in rows:
        r.append((0, "m", 1.0))
    if on_epoch is not None:
        on_epoch(len(cfgs))
    return [{"final/reward": float(i)} for i in range(len(cfgs))]


def test_each_run_gets_its_rows_and_a_summary_of_how_it_was_scheduled(monkeypatch):
    _stub_training(monkeypatch, _ok)
    threads = []
    before = torch.get_num_threads()
    try:
        def spy(cfgs, rows, on_epoch, outcomes):
            threads.append(torch.get_num_threads())
            return _ok(cfgs, rows, on_epoch, outcomes)
        _stub_training(monkeypatch, spy)
        # a device named, since training (stubbed here) is what resolves `auto`
        out = WK.train_group([_spec(0, device="cpu"), _spec(1, device="cpu")], threads=3, executor="ray")
    finally:
        torch.set_num_threads(before)
    assert threads == [3]
    assert [s for _, _, s, _ in out] == [
        {"run": f"r{k}", "variant": "v", "lr": 0.1, "seed": k, "status": "ok", "error": "", "final/reward": float(k),
         "wall_s": out[0][2]["wall_s"], "population": 2, "executor": "ray", "device": "cpu", "threads": 3}
        for k in (0, 1)]
    assert [rows for _, rows, _, _ in out] == [[(0, "m", 1.0)], [(0, "m", 1.0)]]
    assert [c["seed"] for c, _, _, _ in out] == [0, 1]


def test_training_pins_where_run_asked_for_it_before_it_computes(calls, monkeypatch):
    # an in-process or forked worker trains specs it never unpickled: the pin must not depend on _rebuild
    monkeypatch.setenv("GRPO_BENCH_CPU_PIN", "1")
    _stub_training(monkeypatch, lambda *a: calls.append("train") or _ok(*a))
    WK.train_group([_spec(0)])
    assert calls == ["pin", "train"]


def test_the_wall_time_is_the_populations_shared_over_its_runs(monkeypatch):
    _stub_training(monkeypatch, _ok)
    clock = iter([100.0, 106.5])
    monkeypatch.setattr(WK.time, "perf_counter", lambda: next(clock))
    out = WK.train_group([_spec(0), _spec(1)])
    assert [s["wall_s"] for _, _, s, _ in out] == [3.25, 3.25]


def test_progress_goes_on_the_given_queue_or_the_pool_workers_own(monkeypatch):
    _stub_training(monkeypatch, _ok)
    given, own = queues.Queue(), queues.Queue()
    WK.train_group([_spec(0), _spec(1)], progress=(given, "k1"))
    assert given.get_nowait() == ("k1", 2) and given.empty()
    monkeypatch.setattr(WK, "_EPOCHS", own)   # set by _die_with_parent in a pool worker
    WK.train_group([_spec(0)], progress=(None, "k2"))
    assert own.get_nowait() == ("k2", 1) and own.empty()
    ticks = []
    WK.train_group([_spec(0)], progress=ticks.append)
    assert ticks == [1]
    monkeypatch.setattr(WK, "_EPOCHS", None)  # no queue anywhere (a Ray task): training gets no callback
    seen = []
    _stub_training(monkeypatch, lambda cfgs, rows, on_epoch, outcomes: seen.append(on_epoch) or _ok(cfgs, rows, None, outcomes))
    WK.train_group([_spec(0)], progress=(None, "k3"))
    assert seen == [None]


def _deep(depth):
    """Raise from `depth` frames down, so a traceback's length and end can be checked."""
    def innermost():
        raise ValueError("boom\nsecond line")

    def level(n):
        return innermost() if n == 0 else level(n - 1)
    return level(depth)


def test_an_error_outside_a_run_fails_every_run_with_the_innermost_frames(monkeypatch):
    _stub_training(monkeypatch, lambda *a: _deep(5))
    out = WK.train_group([_spec(0), _spec(1)])
    for _, rows, s, kept in out:
        assert (s["status"], s["error"], s["population"]) == ("failed", "ValueError: boom", 2)
        tb = s["traceback"]
        # the three innermost frames: where it was raised, not the worker's own
        assert tb.count('File "') == 3 and "in innermost" in tb and "in train_group" not in tb
        assert tb.rstrip().endswith("ValueError: boom\nsecond line")


def test_a_runs_own_error_ends_only_that_run_with_its_innermost_frames(monkeypatch):
    try:
        _deep(5)
    except ValueError as e:
        err = e

    def one_fails(cfgs, rows, on_epoch, outcomes):
        return [err, *_ok(cfgs, rows, on_epoch, outcomes)[1:]]
    _stub_training(monkeypatch, one_fails)
    out = WK.train_group([_spec(0), _spec(1)])
    bad, good = out[0][2], out[1][2]
    assert (bad["status"], bad["error"]) == ("failed", "ValueError: boom")
    assert bad["traceback"].count('File "') == 3 and "in innermost" in bad["traceback"]
    assert (good["status"], good["error"], good["final/reward"]) == ("ok", "", 1.0) and "traceback" not in good


def test_a_run_that_never_returned_is_recorded_as_scheduled_by_default_alone():
    _, rows, s, kept = WK.failed_result(_spec(2), "WorkerLost: gone\nmore")
    assert (s["population"], s["executor"], s["threads"], s["device"]) == (1, "local", 1, "cpu")
    assert s["traceback"] == "" and math.isnan(s["wall_s"]) and rows == [] == kept


def test_populations_default_to_one_worker():
    specs = [_spec(k) for k in range(3)]
    assert [len(p) for p in WK.populations(specs, 3)] == [3]
    assert [len(p) for p in WK.populations(specs, 3, 2)] == [2, 1]


class _Task:
    def __init__(self, member_bytes, cap=10**9):
        self.b, self.cap = member_bytes, cap

    def member_bytes(self, cfg):
        return self.b

    def population_cap(self, cfg):
        return self.cap


@pytest.mark.parametrize("member_bytes, cap, size", [
    ((2 << 30) // 5, 10**9, 5),      # the 2 GiB budget, rounded down
    ((2 << 30) // 5 + 1, 10**9, 4),
    (1 << 20, 10**9, 64),            # the cap of 64
    (3 << 30, 10**9, 1),             # a member over the budget still runs, alone
    (0, 10**9, 64),                  # a task that estimates nothing
    (1 << 20, 7, 7),                 # what the task says is worth stacking
])
def test_the_default_population_fits_the_memory_budget(monkeypatch, member_bytes, cap, size):
    from grpo_bench import registry
    monkeypatch.setattr(registry, "get", lambda axis, name: _Task(member_bytes, cap))
    assert WK.default_population([_spec(0)]) == size
    assert WK.default_population([]) == 1


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_pool_worker_dies_with_its_parent_and_keeps_the_progress_queue(monkeypatch):
    import ctypes
    import os
    import signal

    libc = ctypes.CDLL(None, use_errno=True)

    def deathsig():
        sig = ctypes.c_int(-1)
        libc.prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
        return sig.value

    before = deathsig()
    monkeypatch.setattr(WK, "_EPOCHS", None)
    exits = []

    def exit_(code):
        exits.append(code)
    monkeypatch.setattr(os, "_exit", exit_)
    q = queues.Queue()
    try:
        WK._die_with_parent(os.getppid(), q)
        assert WK._EPOCHS is q and deathsig() == signal.SIGKILL and exits == []
        WK._die_with_parent(-1)  # a parent gone before the signal took hold: the worker leaves at once
        assert exits == [1] and WK._EPOCHS is None
    finally:
        libc.prctl(WK.PR_SET_PDEATHSIG, before)  # this test process must not die with its parent
    assert deathsig() == before
