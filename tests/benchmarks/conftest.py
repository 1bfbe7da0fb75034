"""Shared machinery of the kernel benchmarks: run mode, sizes, timing and what is recorded.

`pytest --benchmark-only` (or --benchmark-enable) runs the full sizes and times them;
a plain `pytest` run keeps these files as smoke tests: tiny sizes, every provider called
once, nothing timed (so the normal test run stays fast and still catches a broken
provider). Each timed benchmark records in extra_info: rows/s, effective GB/s (the
bytes an ideal kernel must move, over the median time), peak extra memory and the device;
`python -m grpo_bench.analysis.bench_report` turns the --benchmark-json file into results/kernels/.
A benchmark that names `bounds` (bytes its case must move at the least) also records each
as a time, bytes over this machine's copy bandwidth (copy_bandwidth: a device-to-device copy
timed in the same session), and the share of it the provider reaches (of_<name>).

Peak extra memory: on CUDA, torch.cuda.max_memory_allocated() above what was allocated
before the call. On CPU torch has no such counter, so the call is run once more under
torch.profiler(profile_memory=True), whose CPU allocator hook reports the running total of
bytes allocated during the call (every tensor and ATen temporary, not the Python heap);
the peak of that total is the figure. Outputs count, inputs do not.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from helpers import cpu_allocations

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROUNDS_BUDGET_S = 1.5  # timed seconds per benchmark on CPU; rounds = budget / one call, within [3, 20]


def full_run(config) -> bool:
    return bool(config.getoption("benchmark_only") or config.getoption("benchmark_enable"))


def device_name() -> str:
    if DEVICE == "cuda":
        return torch.cuda.get_device_name()
    model = platform.processor() or "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def peak_extra_bytes(fn: Callable[[], object], device: str = DEVICE) -> int:
    """Peak bytes allocated by fn() beyond what was allocated before it (see module doc)."""
    if device == "cuda":
        sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        sync()
        del out
        return torch.cuda.max_memory_allocated() - base
    events = cpu_allocations(fn)
    if not events:
        return 0
    # the allocator's running total also holds blocks from earlier profiled runs; the
    # first event tells where this call started from
    base = events[0][1] - events[0][0]
    return max(total for _, total in events) - base


@dataclass
class Bench:
    """Times one provider on one case through pytest-benchmark and records its metrics."""

    benchmark: object
    full: bool

    def run(self, fn: Callable[[], object], *, group: str, rows: int, nbytes: int,
            bounds: dict[str, int] | None = None, **info) -> None:
        def call():
            out = fn()
            sync()
            return out

        if not self.full:
            self.benchmark.disabled = True  # smoke: one call, no statistics
            self.benchmark.pedantic(call)
            return
        t0 = time.perf_counter()
        call()  # warm-up: compilation, autotuning, first-touch of buffers
        once = time.perf_counter() - t0
        rounds = 20 if DEVICE == "cuda" else int(min(20, max(3, ROUNDS_BUDGET_S / max(once, 1e-6))))
        self.benchmark.group = group
        self.benchmark.pedantic(call, rounds=rounds, warmup_rounds=1 if DEVICE == "cuda" else 0)
        median = self.benchmark.stats.stats.median
        peak = peak_extra_bytes(call)
        self.benchmark.extra_info.update(
            group=group, rows=rows, rows_per_s=rows / median, gb_per_s=nbytes / median / 1e9,
            peak_mem_mb=peak / 2**20, device=device_name(), torch=torch.__version__,
            # timings on a shared machine: what else was running, and how OpenMP threads wait
            load_avg=os.getloadavg()[0], omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", ""),
            memory_method="cuda.max_memory_allocated" if DEVICE == "cuda" else "torch.profiler CPU allocator",
            **info)
        if bounds:
            bw = copy_bandwidth()
            self.benchmark.extra_info["copy_gb_per_s"] = bw / 1e9
            for name, nb in bounds.items():
                self.benchmark.extra_info |= {f"{name}_bytes": nb, f"{name}_ms": nb / bw * 1e3,
                                              f"of_{name}": nb / bw / median}
        _MEASURED.append((group, info.get("provider", ""), median * 1e3, peak / 2**20))
        _append_jsonl(self.benchmark)


_BANDWIDTH: dict[str, float] = {}


def copy_bandwidth(device: str = DEVICE) -> float:
    """Bytes per second a device-to-device copy moves (each byte read once and written once), median of
    10 copies of 1 GiB (64 MiB on CPU), measured once a session: the machine's achievable bandwidth."""
    if device not in _BANDWIDTH:
        n = 1 << 30 if device == "cuda" else 1 << 26
        src = torch.ones(n, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        times = []
        for _ in range(12):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dst.copy_(src)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                dst.copy_(src)
                times.append(time.perf_counter() - t0)
        _BANDWIDTH[device] = 2 * n / sorted(times[2:])[len(times[2:]) // 2]
    return _BANDWIDTH[device]


def _append_jsonl(benchmark) -> None:
    """One line per finished benchmark in $GRPO_BENCH_JSONL: pytest-benchmark writes its JSON only at
    the end of the session, and a call stopped at its time limit (scripts/gpu_run.sh) must still
    return what it measured."""
    path = os.environ.get("GRPO_BENCH_JSONL")
    if not path:
        return
    import json
    s = benchmark.stats.stats
    row = {"name": benchmark.name, "group": benchmark.group, "extra_info": dict(benchmark.extra_info),
           "stats": {k: getattr(s, k) for k in ("min", "max", "mean", "stddev", "median", "iqr", "rounds")}}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


_MEASURED: list[tuple[str, str, float, float]] = []  # (group, provider, median ms, peak extra MiB)


def pytest_terminal_summary(terminalreporter):
    # pytest-benchmark's table has no column for extra_info; the memory goals need it on screen
    if not _MEASURED:
        return
    terminalreporter.section("peak extra memory (extra_info.peak_mem_mb)")
    for group, provider, ms, mb in _MEASURED:
        terminalreporter.write_line(f"{group:<58} {provider:<13} {ms:>10.1f} ms median {mb:>10.1f} MiB peak")


@pytest.fixture
def bench(benchmark, request) -> Bench:
    return Bench(benchmark, full_run(request.config))


@pytest.fixture(scope="session")
def device() -> str:
    return DEVICE


@pytest.fixture(scope="session")
def measure_peak():
    return peak_extra_bytes


def pytest_generate_tests(metafunc):
    # sizes depend on the run mode, so parametrisation happens here: a module's
    # cases(full, device) maps fixture names ("fwd_case", ...) to their cases
    make = getattr(metafunc.module, "cases", None)
    if make is None:
        return
    for name, cases in make(full_run(metafunc.config), DEVICE).items():
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, cases, ids=[c.id for c in cases])
