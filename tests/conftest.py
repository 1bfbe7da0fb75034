import os
import sys

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
def registry_restored():
    """Parts a test registers (an include, a config that names one) leave with it: a later test in the same worker,
    test_cli's `list` against this process's registry for one, must see the shipped parts alone."""
    from grpo_bench import registry

    for axis in registry.AXES:
        registry.names(axis)
    saved = {axis: dict(parts) for axis, parts in registry._REGISTRY.items()}
    included = dict(registry._INCLUDED)
    yield
    for axis, parts in saved.items():
        registry._REGISTRY[axis].clear()
        registry._REGISTRY[axis].update(parts)
    registry._INCLUDED.clear()
    registry._INCLUDED.update(included)


@pytest.fixture(autouse=True)
def _figures_closed():
    """A test's figures go with it: build_figures hands its figures back open for tests to read, and an xdist
    worker holding 21 from earlier tests warned (test_mechanism.py) and kept their memory."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture
def one_thread():
    """One torch thread, the runner's default: with more, a reduction splits across threads by
    its size, which a population changes, so bit-level contracts hold only at one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The modules that take longest on 2 cores, longest first (measured 2026-12-02 with --durations=0). Under xdist's
# load scheduling the last tests handed out decide how long one core idles at the end: in file order
# test_runner.py's shipped-ablation runs came last, and one core waited 3 minutes for the other. A stale
# order costs only that idle time again.
SLOW_FIRST = ("test_report.py", "test_findings.py", "test_runner.py", "test_pretrained.py", "test_include.py",
              "test_cpu_numerics.py", "test_faults.py", "test_reliability.py", "test_ray.py", "test_architecture.py",
              "test_gpu_script.py", "test_seeds_auto.py", "test_trl_multiprocess.py")


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):   # one process (scripts/mutate.py: fastest first) keeps its order
        return
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    # a stable sort: each module's tests keep their order (and its module fixtures their one set-up)
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))
