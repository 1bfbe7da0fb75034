"""Ray executor: one Ray task per population, results sent back to the driver, lost workers retried.

The `run` command is the Ray driver. It submits one task per population of unfinished
runs (runner.populations), asking for the ablation's `resources` ({cpus, gpus}) for the
whole population, which trains in one process (a fraction of a GPU packs several
populations onto one device). Each task calls runner.train_group, exactly what a local
worker calls, and returns each run's (resolved config, metric rows, summary, outcomes);
the driver writes the run directories itself, so nothing assumes a file
system shared with the workers. The code travels with the job: the repository
checkout (package and the top-level tasks/, without .git, .venv, results or
tests) is the job's working_dir, unpacked once per node.

Faults: a task whose worker process or node dies (any Ray error other than the
task's own exception) is submitted again, at most `max_retries` times, then its
runs are recorded as failed; a population whose code raises is recorded as failed
at once, as locally. On exit (normal, Ctrl-C or an error) the tasks not yet finished are
cancelled and the driver disconnects.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import ConfigError
from .worker import Result, RunSpec, failed_result, train_group

PACKAGE = Path(__file__).resolve().parents[1]  # grpo_bench/
# shipped with every job; the run's own --out is added when it lies inside the checkout
EXCLUDES = ["/.git", "/.venv", "/.cache", "/results", "/tests", "/.ci", "/.benchmarks", "/.pytest_cache",
            "__pycache__", "*.egg-info"]


def check_installed() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("--executor", "ray", "Ray is not installed; install it with pip install -e '.[ray]'") from None


def runtime_env(out: Path) -> dict:
    root = PACKAGE.parent
    if (root / "pyproject.toml").is_file():
        excludes = list(EXCLUDES)
        with contextlib.suppress(ValueError):
            excludes.append("/" + str(out.resolve().relative_to(root.resolve())))
        env = {"working_dir": str(root), "excludes": excludes}
    else:  # an installed package, not a checkout: the package alone
        env = {"py_modules": [str(PACKAGE)]}
    if os.environ.get("GRPO_BENCH_CACHE"):  # a cache the user placed (e.g. on a shared disk) is used there too
        env["env_vars"] = {"GRPO_BENCH_CACHE": os.environ["GRPO_BENCH_CACHE"]}
    return env


def _probe(address: str) -> None:
    """Fail in seconds on an address nobody listens on (ray.init would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except (OSError, ValueError) as e:
        raise ConfigError("--address", address, f"cannot reach a Ray cluster there: {e}") from None


@contextlib.contextmanager
def connect(address: str | None, exclude: Path) -> Iterator["Session"]:
    """Join the cluster at `address` (or RAY_ADDRESS), or start a local instance sized to this machine."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or "local"
    if address != "local" and address != "auto":
        _probe(address)
    kwargs = {"include_dashboard": False} if address == "local" else {}
    try:
        ray.init(address=address, runtime_env=runtime_env(exclude), logging_level=logging.ERROR,
                 log_to_driver=False, **kwargs)
    except Exception as e:  # ConnectionError, a missing auth token, a version mismatch: all one line
        raise ConfigError("--address", address, f"cannot connect to a Ray cluster: {(str(e) or type(e).__name__).splitlines()[0]}") from None
    try:
        yield Session()
    finally:
        ray.shutdown()


class Session:
    def __init__(self):
        self._at, self._desc, self._nodes = -1e9, "", []

    def _refresh(self) -> None:
        """Live nodes and their totals, asked at most every 5 s (nodes join and leave)."""
        import ray

        if time.monotonic() - self._at > 5:
            self._nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
            cpus, gpus = (sum(r.get(k, 0) for r in self._nodes) for k in ("CPU", "GPU"))
            n = len(self._nodes)
            self._desc = f"ray: {n} node{'s' * (n != 1)}, {cpus:g} CPUs" + (f", {gpus:g} GPUs" if gpus else "")
            self._at = time.monotonic()

    def describe(self) -> str:
        """'ray: 3 nodes, 48 CPUs, 4 GPUs'."""
        self._refresh()
        return self._desc

    def slots(self, resources: dict) -> int:
        """How many runs asking for `resources` the live nodes hold at once."""
        self._refresh()
        per_node = ([r.get("CPU", 0) / resources["cpus"]] + ([r.get("GPU", 0) / resources["gpus"]] if resources["gpus"] else [])
                    for r in self._nodes)
        return sum(int(min(fit) + 1e-9) for fit in per_node)

    def results(self, todo: list[list[RunSpec]], threads: int, resources: dict, max_retries: int,
                log: Callable[[str], None]) -> Iterator[tuple[RunSpec, Result]]:
        """One task per population; yields (spec, result) of each run as its population finishes."""
        import ray

        if not self.slots(resources):  # such a task would wait forever
            biggest = ", ".join(f"{r.get('CPU', 0):g} CPUs/{r.get('GPU', 0):g} GPUs" for r in self._nodes)
            raise ConfigError("resources", f"cpus={resources['cpus']}, gpus={resources['gpus']}",
                              f"no node of this Ray cluster has that much (nodes: {biggest})")
        remote = ray.remote(train_group)

        def name(group: list[RunSpec]) -> str:
            return group[0].run_id + (f"+{len(group) - 1}" if len(group) > 1 else "")

        def submit(group: list[RunSpec]):
            # named by its first run id: `ray list tasks` and the worker's process title say which runs it holds;
            # max_retries=0: a retry is decided here, where it can be counted, logged and bounded
            return remote.options(name=name(group), num_cpus=resources["cpus"], num_gpus=resources["gpus"],
                                  max_retries=0, retry_exceptions=False).remote(group, threads, "ray")

        queue, pending, lost = deque(todo), {}, {}
        try:
            while queue or pending:
                # a window of twice what the cluster holds, not the whole sweep: ray.wait costs
                # O(refs in flight) per call, and tasks not yet submitted cost nothing to cancel
                while queue and len(pending) < 2 * self.slots(resources) + 8:
                    group = queue.popleft()
                    pending[submit(group)] = group
                [ref], _ = ray.wait(list(pending), num_returns=1)
                group = pending.pop(ref)
                try:
                    results = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # the population's own code raised, outside training
                    cause = getattr(e, "cause", None) or e
                    results = [failed_result(s, f"{type(cause).__name__}: {cause}", str(e), len(group), "ray", threads)
                               for s in group]
                except ray.exceptions.RayError as e:  # its worker process or node is gone
                    why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                    key = name(group)
                    lost[key] = n = lost.get(key, 0) + 1
                    if n <= max_retries:
                        log(f"run {key}: worker lost ({why}); retry {n} of {max_retries}")
                        queue.appendleft(group)
                        continue
                    # the schedule it was lost in, as every other run records it
                    results = [failed_result(s, f"worker lost {n} time{'s' * (n > 1)}, last: {why}", "", len(group),
                                             "ray", threads) for s in group]
                yield from zip(group, results)
        finally:  # Ctrl-C, or the driver stopped early: nothing left running for nobody
            for ref in pending:
                ray.cancel(ref, force=True)
