"""StepGraph's CUDA path (grpo_bench/engine/graphs.py) on the CPU, with torch.cuda's streams and graphs stood in
for: the warm-up on a side stream, one capture, replays that read each new input from the graph's own buffers,
and a failed capture that warns once and leaves every later step eager. What a real capture records and replays is
checked on a GPU (scripts/gpu_run.sh's population stage); the bookkeeping around it is held here, where a
mistake would otherwise cost a GPU session to find. A stand-in "kernel" runs when it is launched, or, launched
during a capture, is recorded and runs at each replay, as a captured kernel does."""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from grpo_bench.engine.graphs import StepGraph


class OnCuda(torch.Tensor):
    """A CPU tensor that says it is on the GPU, and counts the copies made into tensors like it."""
    copies = 0

    @property
    def device(self):
        return torch.device("cuda")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            cls.copies += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def cuda(*values) -> OnCuda:
    return torch.tensor(values, dtype=torch.float32).as_subclass(OnCuda)


class FakeCuda:
    """torch.cuda's streams and graphs as StepGraph uses them, with a log of what happened in which order."""

    def __init__(self):
        self.log, self.default, self.capturing, self.graphs = [], self.Stream(self, "default"), None, []
        self.current = self.default

    class Stream:
        made = 0

        def __init__(self, cuda=None, name=None):
            if name is None:
                FakeCuda.Stream.made += 1
                name = f"side{FakeCuda.Stream.made}"
            self.cuda, self.name = cuda, name

        def wait_stream(self, other):
            self.cuda.log.append(f"{self.name} waits for {other.name}")

    def install(self, monkeypatch):
        me = self

        class Stream(FakeCuda.Stream):
            def __init__(self):
                super().__init__(me)

        class CUDAGraph:
            def __init__(self):
                self.kernels, self.replays = [], 0
                me.graphs.append(self)

            def replay(self):
                self.replays += 1
                for kernel in self.kernels:
                    kernel()

        @contextlib.contextmanager
        def stream(s):
            before, me.current = me.current, s
            try:
                yield
            finally:
                me.current = before

        @contextlib.contextmanager
        def graph(g):
            me.log.append("capture")
            me.capturing = g
            try:
                yield
            finally:
                me.capturing = None

        for name, value in {"Stream": Stream, "CUDAGraph": CUDAGraph, "stream": stream, "graph": graph,
                            "current_stream": lambda: me.current,
                            "synchronize": lambda: me.log.append("synchronize")}.items():
            monkeypatch.setattr(torch.cuda, name, value)

    def launch(self, kernel):
        """Run a kernel now, or record it into the graph being captured."""
        if self.capturing is not None:
            self.capturing.kernels.append(kernel)
        else:
            kernel()


@pytest.fixture
def fake(monkeypatch):
    FakeCuda.Stream.made, OnCuda.copies = 0, 0
    f = FakeCuda()
    f.install(monkeypatch)
    return f


def _step(fake, fail_capture: bool = False):
    """A training step as the trainer's: reads its inputs, updates state in place, writes its output in place."""
    state, out, calls = cuda(0.0), cuda(0.0, 0.0), []

    def fn(inputs):
        calls.append(fake.current.name)
        if fail_capture and fake.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing")

        def kernel():
            out.copy_(inputs["x"] * 2 + inputs["k"] + state)
            state.add_(1)
        fake.launch(kernel)
        return out
    return fn, state, calls


def test_warm_up_on_a_side_stream_then_one_capture_then_replays(fake):
    fn, state, calls = _step(fake)
    k = cuda(100.0, 100.0)                          # shared: the caller fills it in place before each step
    g = StepGraph(fn, shared=("k",))                # the trainer's: the default warm-up of two steps
    x = [cuda(1.0, 2.0), cuda(3.0, 4.0), cuda(5.0, 6.0), cuda(7.0, 8.0), cuda(9.0, 10.0)]
    got = []
    for i, xi in enumerate(x):
        k.fill_(100.0 * (i + 1))
        got.append(g({"x": xi, "k": k}).clone())
    # each step saw its own epoch's x and k, and the state as the step before left it
    want = [[2 * a + 100 * (i + 1) + i, 2 * b + 100 * (i + 1) + i] for i, (a, b) in enumerate(t.tolist() for t in x)]
    assert [t.tolist() for t in got] == want and state.item() == 5
    # two eager steps, each on a side stream that waits for the caller's stream and is waited for after
    assert calls[:2] == ["side1", "side2"]
    assert fake.log[:4] == ["side1 waits for default", "default waits for side1",
                            "side2 waits for default", "default waits for side2"]
    # then one capture on the caller's stream, replayed at once and at every later step; fn never runs again
    assert fake.log[4:] == ["capture"] and len(calls) == 3 and len(fake.graphs) == 1
    assert fake.graphs[0].replays == 3 and g.graph is fake.graphs[0] and g.calls == 5 and g.failed is None
    assert g.static["k"] is k                       # read where it is, never copied


def test_a_new_input_is_copied_into_the_graphs_buffer_once(fake):
    fn, _, _ = _step(fake)
    g = StepGraph(fn, warmup=0)
    x, k = cuda(1.0, 1.0), cuda(0.0, 0.0)
    g({"x": x, "k": k})
    assert g.static["x"] is not x and OnCuda.copies == 1    # the first inputs cloned; the one copy is the output
    g({"x": x, "k": k})                             # the same tensors again (inner steps of one epoch): no copy
    assert OnCuda.copies == 2
    before = g.static["x"]
    y = cuda(2.0, 2.0)
    assert g({"x": y, "k": k}).tolist() == [4.0 + 2, 4.0 + 2]   # the next epoch's x, state 2
    assert g.static["x"] is before and OnCuda.copies == 4       # copied into the same buffer: one input, one output


def test_a_capture_that_fails_warns_once_and_every_later_step_runs_eagerly(fake):
    fn, state, calls = _step(fake, fail_capture=True)
    g = StepGraph(fn, warmup=1)
    k = cuda(0.0, 0.0)
    g({"x": cuda(1.0, 1.0), "k": k})
    with pytest.warns(UserWarning, match=r"^cuda_graphs: capture failed \(RuntimeError: operation not permitted "
                                         r"when stream is capturing\); steps run eagerly$"):
        out = g({"x": cuda(2.0, 2.0), "k": k})
    assert out.tolist() == [4.0 + 1, 4.0 + 1] and isinstance(g.failed, RuntimeError) and g.graph is None
    assert fake.log[-2:] == ["capture", "synchronize"]      # the aborted capture is waited out before going on
    x3 = cuda(3.0, 3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # no second warning
        assert g({"x": x3, "k": k}).tolist() == [6.0 + 2, 6.0 + 2]
    assert fake.log.count("capture") == 1 and len(fake.graphs) == 1 and state.item() == 3
    assert g.static["x"].tolist() == [2.0, 2.0]     # after the failure the caller's tensors are used as they are
    assert calls == ["side1", "default", "default", "default"]


def test_on_the_cpu_the_step_runs_on_the_graphs_copies(fake):
    calls = []
    g = StepGraph(lambda inputs: calls.append(inputs["x"]) or inputs["x"].sum())
    x = torch.ones(3)
    assert g({"x": x}).item() == 3 and calls[0] is not x and calls[0] is g.static["x"]
    assert fake.log == [] and g.calls == 0 and fake.graphs == []
