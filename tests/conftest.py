import os

from helpers import HIDE_ENV, hide_extra

# the suite as it runs where these extras (comma-separated) are not installed (test_faults.py's collection under each missing extra),
# hidden before torch, which may look for triton
for _extra in filter(None, os.environ.get(HIDE_ENV, "").split(",")):
    hide_extra(_extra)

import torch  # noqa: E402


# an xdist worker takes its share of the cores: torch's default, a thread per core in every worker, would
# put two threads on each core, each waiting on the other at every parallel region
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# A test process pins its CPU paths before anything computes, as every run's process does (numerics/cpu.py): MKL's
# and ATen's paths are fixed by a process's first computation, so a test that computed first left its whole xdist
# worker on this CPU's native paths (MKL OFF, ATen AVX512 here), where a population's stacked products round
# otherwise than its members' alone: test_lm_population_equals_runs_alone failed in one worker of the full suite
# and passed alone. GRPO_BENCH_CPU_NUMERICS=native still keeps the native paths.
from grpo_bench.numerics import cpu as _cpu  # noqa: E402

_cpu.pin()

# Triton kernels run in the interpreter where there is no GPU; the variable must be
# set before any kernel module is imported, and conftest is imported first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml's addopts): a worker per core this process may use, except where one process
    must run alone: a benchmark times one test on an otherwise idle machine, a GPU's tests share one device,
    and a pytest that a test starts (test_faults.py) must not fan out inside a worker."""
    if (config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False)
            or torch.cuda.is_available() or os.environ.get("PYTEST_XDIST_WORKER")):
        return 0
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.fixture
def fp64():
    """fp64 default dtype for exact comparisons, restored so that other modules keep fp32.
    A module opts in with `pytestmark = pytest.mark.usefixtures("fp64")`."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture
def one_thread():
    """One torch thread, the runner's default: with more, a reduction splits across threads by
    its size, which a population changes, so bit-level contracts hold only at one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
