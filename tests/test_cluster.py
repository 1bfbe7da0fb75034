"""The Ray executor's driver side (grpo_bench/sweep/cluster.py) against a stand-in ray module: what it submits and
how many at once, a lost worker's retries and their bound, a population that raised, the cancel on an early exit,
how a cluster is joined and left. tests/test_ray.py shows the same end to end on a real 2-CPU cluster, at about
a minute of set-up; these take well under a second and reach the branches that sweep does not (several nodes,
GPUs, a retry bound of 0, a window full of tasks)."""
from __future__ import annotations

import logging
import socket
import sys
import types
from pathlib import Path

import pytest

from grpo_bench.errors import ConfigError
from grpo_bench.sweep import cluster
from grpo_bench.sweep.cluster import Session
from grpo_bench.sweep.worker import RunSpec

CFG = {"task": {"name": "sort"}, "epochs": 1, "inner_steps": 1}


class RayError(Exception):
    pass


class RayTaskError(RayError):
    cause = None


class WorkerCrashedError(RayError):
    pass


class StandIn(types.ModuleType):
    """ray as cluster.py calls it. outcome(group, attempt) -> results to return, or an exception to raise from
    ray.get; wait() hands back the oldest task in flight."""

    def __init__(self, nodes, outcome=None):
        super().__init__("ray")
        self.exceptions = types.SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError)
        self._nodes, self.node_calls = nodes, 0
        self.outcome = outcome or (lambda group, attempt: [("cfg", [], {"run": s.run_id}, []) for s in group])
        self.submitted, self.options_seen, self.in_flight, self.most_in_flight = [], [], [], 0
        self.cancelled, self.inits, self.shutdowns = [], [], 0
        self.attempts = {}

    def nodes(self):
        self.node_calls += 1
        return self._nodes

    def remote(self, fn):
        ray = self

        class Remote:
            def __init__(self, opts=None):
                self.opts = opts

            def options(self, **kw):
                return Remote(kw)

            def remote(self, group, threads, executor):
                ray.options_seen.append(self.opts)
                ray.submitted.append(([s.run_id for s in group], threads, executor))
                ref = object()
                ray.in_flight.append((ref, group))
                ray.most_in_flight = max(ray.most_in_flight, len(ray.in_flight))
                return ref

        assert fn is cluster.train_group   # the task is exactly what a local worker runs
        return Remote()

    def wait(self, refs, num_returns):
        assert num_returns == 1 and set(refs) == {r for r, _ in self.in_flight}
        return [self.in_flight[0][0]], refs[1:]

    def get(self, ref):
        i = next(i for i, (r, _) in enumerate(self.in_flight) if r is ref)
        _, group = self.in_flight.pop(i)
        key = group[0].run_id
        self.attempts[key] = n = self.attempts.get(key, 0) + 1
        got = self.outcome(group, n)
        if isinstance(got, BaseException):
            raise got
        return got

    def cancel(self, ref, force=False):
        self.cancelled.append((ref, force))

    def init(self, **kw):
        self.inits.append(kw)

    def shutdown(self):
        self.shutdowns += 1


def _stand_in(monkeypatch, nodes=({"CPU": 2.0},), alive=True, **kw) -> StandIn:
    ray = StandIn([{"Alive": alive, "Resources": dict(n)} for n in nodes], **kw)
    monkeypatch.setitem(sys.modules, "ray", ray)
    return ray


def _groups(*sizes: int) -> list[list[RunSpec]]:
    out, k = [], 0
    for n in sizes:
        out.append([RunSpec(f"r{k + i}", "v", {}, k + i, {**CFG, "seed": k + i}) for i in range(n)])
        k += n
    return out


ONE_CPU = {"cpus": 1, "gpus": 0}


# ------------------------------------------------------------------------------ the cluster's size, as it changes

def test_describe_counts_live_nodes_and_their_cpus_and_gpus(monkeypatch):
    _stand_in(monkeypatch, nodes=[{"CPU": 16.0, "GPU": 2.0}, {"CPU": 8.0}, {"CPU": 0.5, "GPU": 1.0}])
    assert Session().describe() == "ray: 3 nodes, 24.5 CPUs, 3 GPUs"
    _stand_in(monkeypatch, nodes=[{"CPU": 4.0}])
    assert Session().describe() == "ray: 1 node, 4 CPUs"     # no GPU: not mentioned
    ray = _stand_in(monkeypatch, nodes=[{"CPU": 4.0}])
    ray._nodes.append({"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}})   # a node that left
    assert Session().describe() == "ray: 1 node, 4 CPUs"


def test_the_node_list_is_asked_for_at_most_every_five_seconds(monkeypatch):
    ray = _stand_in(monkeypatch, nodes=[{"CPU": 2.0}])
    now = [100.0]
    monkeypatch.setattr(cluster.time, "monotonic", lambda: now[0])
    session = Session()
    assert session.describe() == "ray: 1 node, 2 CPUs" and ray.node_calls == 1   # the first look asks at once
    ray._nodes.append({"Alive": True, "Resources": {"CPU": 6.0}})                 # a node joins
    now[0] = 105.0
    assert session.describe() == "ray: 1 node, 2 CPUs" and session.slots(ONE_CPU) == 2 and ray.node_calls == 1
    now[0] = 105.001
    assert session.describe() == "ray: 2 nodes, 8 CPUs" and ray.node_calls == 2
    assert session.slots(ONE_CPU) == 8 and ray.node_calls == 2
    # a clock that starts near 0 (a fresh boot) still asks on the first look
    now[0] = 0.0
    assert Session().describe() == "ray: 2 nodes, 8 CPUs"


@pytest.mark.parametrize("resources, want", [
    ({"cpus": 1, "gpus": 0}, 3 + 8 + 0),
    ({"cpus": 2, "gpus": 0}, 1 + 4 + 0),
    ({"cpus": 1, "gpus": 1}, 1 + 0 + 0),          # the CPU-only nodes hold no GPU task
    ({"cpus": 1, "gpus": 0.5}, 2 + 0 + 0),        # a fraction of a GPU packs two populations on one device
    ({"cpus": 0.1, "gpus": 0}, 30 + 80 + 0),      # 3 / 0.1 is 29.999...: a whole 30, not 29
])
def test_slots_are_what_each_node_holds_summed(monkeypatch, resources, want):
    # a node without a CPU entry (a GPU-only resource view) holds no task
    _stand_in(monkeypatch, nodes=[{"CPU": 3.0, "GPU": 1.0}, {"CPU": 8.0}, {"GPU": 4.0}])
    assert Session().slots(resources) == want


# ------------------------------------------------------------------------------------------- what it submits

def test_each_population_is_one_task_named_by_its_runs(monkeypatch):
    ray = _stand_in(monkeypatch)
    todo = _groups(3, 1, 2)
    got = list(Session().results(todo, 4, ONE_CPU, 0, print))
    assert [s.run_id for s, _ in got] == [f"r{k}" for k in range(6)]
    assert [r[2]["run"] for _, r in got] == [f"r{k}" for k in range(6)]   # each spec with its own result
    assert ray.submitted == [(["r0", "r1", "r2"], 4, "ray"), (["r3"], 4, "ray"), (["r4", "r5"], 4, "ray")]
    assert [o["name"] for o in ray.options_seen] == ["r0+2", "r3", "r4+1"]
    # Ray retries nothing itself: the driver counts, logs and bounds retries
    assert all(o == {"name": o["name"], "num_cpus": 1, "num_gpus": 0, "max_retries": 0, "retry_exceptions": False}
               for o in ray.options_seen)
    assert ray.cancelled == []


def test_a_population_asks_for_the_ablations_resources(monkeypatch):
    ray = _stand_in(monkeypatch, nodes=[{"CPU": 16.0, "GPU": 2.0}])
    list(Session().results(_groups(1), 1, {"cpus": 4, "gpus": 0.25}, 0, print))
    assert (ray.options_seen[0]["num_cpus"], ray.options_seen[0]["num_gpus"]) == (4, 0.25)


def test_no_more_than_twice_what_the_cluster_holds_plus_eight_in_flight(monkeypatch):
    ray = _stand_in(monkeypatch, nodes=[{"CPU": 3.0}])
    got = list(Session().results(_groups(*[1] * 40), 1, ONE_CPU, 0, print))
    assert len(got) == 40 and ray.most_in_flight == 2 * 3 + 8


def test_a_task_no_node_can_hold_is_an_error_naming_the_nodes(monkeypatch):
    ray = _stand_in(monkeypatch, nodes=[{"CPU": 3.0, "GPU": 1.0}, {"CPU": 8.0}])
    with pytest.raises(ConfigError, match=r"resources: cpus=16, gpus=0: no node of this Ray cluster has that much "
                                          r"\(nodes: 3 CPUs/1 GPUs, 8 CPUs/0 GPUs\)"):
        next(Session().results(_groups(1), 1, {"cpus": 16, "gpus": 0}, 3, print))
    assert ray.submitted == []


# ------------------------------------------------------------------------------------------------------ faults

def test_a_lost_worker_is_retried_first_up_to_the_bound_then_its_runs_fail(monkeypatch):
    lost = WorkerCrashedError("The worker died unexpectedly\nwhile running the task")

    def outcome(group, attempt):
        if group[0].run_id == "r0" and attempt <= 3 or group[0].run_id == "r2" and attempt <= 1:
            return lost
        return [("cfg", [], {"run": s.run_id, "status": "ok"}, []) for s in group]

    ray = _stand_in(monkeypatch, nodes=[{"CPU": 1.0}], outcome=outcome)
    log = []
    todo = _groups(2, *[1] * 11)                      # 12 tasks, 10 in flight at once: two wait in the queue
    out = [(s.run_id, r[2]) for s, r in Session().results(todo, 2, ONE_CPU, 2, log.append)]
    got = dict(out)
    assert len(out) == len(got) == 13                 # each run once: a retried one is not also recorded failed
    why = "WorkerCrashedError: The worker died unexpectedly"
    # each population counts its own losses
    assert log == [f"run r0+1: worker lost ({why}); retry 1 of 2", f"run r2: worker lost ({why}); retry 1 of 2",
                   f"run r0+1: worker lost ({why}); retry 2 of 2"]
    assert got["r0"]["status"] == got["r1"]["status"] == "failed"
    assert got["r0"]["error"] == f"worker lost 3 times, last: {why}"
    assert (got["r0"]["population"], got["r0"]["executor"], got["r0"]["threads"]) == (2, "ray", 2)
    assert got["r2"]["status"] == "ok" and ray.attempts["r0"] == 3
    # a lost population goes back to the front of the queue, ahead of the two that had not started
    names = [o["name"] for o in ray.options_seen]
    assert names[:10] == ["r0+1", *(f"r{k}" for k in range(2, 11))] and names[10:14] == ["r0+1", "r2", "r11", "r12"]


def test_with_no_retries_one_loss_fails_the_runs(monkeypatch):
    def outcome(group, attempt):
        return WorkerCrashedError("")
    _stand_in(monkeypatch, outcome=outcome)
    log = []
    (spec, (_, rows, summary, _)), = Session().results(_groups(1), 1, ONE_CPU, 0, log.append)
    assert log == [] and rows == []
    assert summary["status"] == "failed" and summary["error"] == "worker lost 1 time, last: WorkerCrashedError: "


def test_a_population_that_raised_fails_at_once_with_its_cause(monkeypatch):
    def outcome(group, attempt):
        e = RayTaskError("ray::r0+1 (pid=7) traceback ...\nRuntimeError: no memory")
        if group[0].run_id == "r0":
            e.cause = RuntimeError("no memory")
        return e
    ray = _stand_in(monkeypatch, outcome=outcome)
    log = []
    got = [(s.run_id, r[2]) for s, r in Session().results(_groups(2, 1), 3, ONE_CPU, 3, log.append)]
    assert log == [] and ray.attempts == {"r0": 1, "r2": 1}      # not retried
    assert [(run, s["status"], s["error"]) for run, s in got] == [
        ("r0", "failed", "RuntimeError: no memory"), ("r1", "failed", "RuntimeError: no memory"),
        ("r2", "failed", "RayTaskError: ray::r0+1 (pid=7) traceback ...")]   # no cause given: the error itself
    assert got[0][1]["traceback"].endswith("RuntimeError: no memory") and got[0][1]["population"] == 2


def test_stopping_early_cancels_every_task_in_flight(monkeypatch):
    ray = _stand_in(monkeypatch)
    results = Session().results(_groups(1, 1, 1, 1), 1, ONE_CPU, 0, print)
    next(results)
    left = [r for r, _ in ray.in_flight]
    assert len(left) == 3 and ray.cancelled == []
    results.close()                                     # Ctrl-C in the driver, or the sweep stopped
    assert ray.cancelled == [(r, True) for r in left]


# ------------------------------------------------------------------------------------- joining and leaving

def test_the_job_ships_this_checkout(tmp_path):
    root = Path(__file__).resolve().parents[1]
    env = cluster.runtime_env(tmp_path)
    assert env["working_dir"] == str(root) and "/results" in env["excludes"] and "/tests" in env["excludes"]
    assert cluster.PACKAGE == root / "grpo_bench"


def test_a_local_instance_is_started_without_a_dashboard_and_shut_down(monkeypatch, tmp_path):
    ray = _stand_in(monkeypatch)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with cluster.connect(None, tmp_path) as session:
        assert isinstance(session, Session) and ray.shutdowns == 0
    assert ray.inits == [{"address": "local", "runtime_env": cluster.runtime_env(tmp_path),
                          "logging_level": logging.ERROR, "log_to_driver": False, "include_dashboard": False}]
    assert ray.shutdowns == 1
    with pytest.raises(KeyError), cluster.connect("local", tmp_path):
        raise KeyError("the sweep failed")
    assert ray.shutdowns == 2                           # left on an error too


@pytest.mark.parametrize("given, env", [(None, "auto"), ("auto", None), ("auto", "10.0.0.1:6379")])
def test_a_running_cluster_is_joined_where_ray_address_or_the_option_says(monkeypatch, tmp_path, given, env):
    ray = _stand_in(monkeypatch)
    probed = []
    monkeypatch.setattr(cluster, "_probe", probed.append)
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    with cluster.connect(given, tmp_path):
        pass
    assert [i["address"] for i in ray.inits] == ["auto"] and "include_dashboard" not in ray.inits[0]
    assert probed == []                                 # "auto" finds a cluster on this node: nothing to probe


def test_an_address_is_probed_before_ray_init(monkeypatch, tmp_path):
    ray = _stand_in(monkeypatch)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    probed = []
    monkeypatch.setattr(cluster, "_probe", probed.append)
    with cluster.connect(None, tmp_path):
        pass
    assert probed == ["10.0.0.9:6379"] and ray.inits[0]["address"] == "10.0.0.9:6379"
    with cluster.connect("ray://head:10001", tmp_path):
        pass
    assert probed[1:] == ["ray://head:10001"] and "include_dashboard" not in ray.inits[1]


def test_a_failed_init_is_one_line_and_nothing_to_shut_down(monkeypatch, tmp_path):
    ray = _stand_in(monkeypatch)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def init(**kw):
        raise ray_error
    monkeypatch.setattr(ray, "init", init)
    for ray_error, said in [(ConnectionError("Could not find any running Ray instance.\nPlease specify ..."),
                             "Could not find any running Ray instance."), (RuntimeError(), "RuntimeError")]:
        with pytest.raises(ConfigError) as e, cluster.connect("auto", tmp_path):
            pass
        assert str(e.value).endswith(f"cannot connect to a Ray cluster: {said}") and "\n" not in str(e.value)
        assert e.value.__cause__ is None and e.value.__suppress_context__
    assert ray.shutdowns == 0


def test_probe_fails_in_seconds_on_an_address_nobody_listens_on(monkeypatch):
    with socket.socket() as s:                          # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}", "127.0.0.1:port", "nowhere"):
        with pytest.raises(ConfigError, match=rf"--address: {address}: cannot reach a Ray cluster there: "):
            cluster._probe(address)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        cluster._probe(f"127.0.0.1:{port}")
        cluster._probe(f"ray://127.0.0.1:{port}")
    if socket.has_ipv6:
        with socket.socket(socket.AF_INET6) as listening:  # an IPv6 address in brackets
            try:
                listening.bind(("::1", 0))
            except OSError:    # no IPv6 loopback on this machine
                pass
            else:
                listening.listen()
                cluster._probe(f"[::1]:{listening.getsockname()[1]}")
    # an address that drops packets would hang for minutes without a timeout: the probe gives it seconds
    seen = []

    def connection(address, timeout=None):
        seen.append((address, timeout))
        raise TimeoutError("timed out")
    monkeypatch.setattr(cluster.socket, "create_connection", connection)
    with pytest.raises(ConfigError, match="timed out"):
        cluster._probe("10.255.255.1:6379")
    assert seen[0][0] == ("10.255.255.1", 6379) and 0 < seen[0][1] <= 10
