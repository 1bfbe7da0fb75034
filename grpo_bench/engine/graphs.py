"""One training step captured as a CUDA graph and replayed (RunConfig.cuda_graphs): CUDA only.

A population's inner step on the toy is hundreds of small kernels whose launches, not their
work, set a GPU's pace. Captured once, a step is one graph launch. The step function reads every
tensor that changes between epochs from `inputs` (copied into the graph's own buffers when a
new tensor arrives, once an epoch) and updates trainer state in place; it must not sync with the
host or copy from it. The first `warmup` calls run eagerly on a side stream (real training steps:
CUDA's lazy initialisations happen there, not inside the capture), the next captures and replays,
the rest replay. If capture raises, every later call runs eagerly and `failed` says why: a run is
never lost to a graph. The trainer drops the graph when the population's shape changes (a member
fails). The capture itself cannot be tested without a GPU: tests/test_graphs.py holds the bookkeeping around it
with torch.cuda stood in for, and tests/test_population.py runs the trainer's step through a StepGraph's input
copies on the CPU.
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor


class StepGraph:
    # where the trainer builds one; elsewhere than CUDA a StepGraph runs the step on its own copies of the
    # inputs, as a replay would read them (tests/test_population.py adds "cpu" to check that plumbing)
    devices: tuple[str, ...] = ("cuda",)

    def __init__(self, fn, warmup: int = 2, shared: tuple[str, ...] = ()):
        """shared: inputs the graph reads where they are, not from copies (the caller updates them in place)."""
        self.fn, self.warmup, self.calls, self.shared = fn, warmup, 0, shared
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[str, Tensor] | None = None
        self.last: dict[str, Tensor] = {}
        self.out = None
        self.failed: BaseException | None = None

    def _load(self, inputs: dict[str, Tensor]) -> None:
        if self.static is None:
            self.static = {k: v if k in self.shared else v.clone() for k, v in inputs.items()}
        else:
            for k, v in inputs.items():
                if v is not self.static[k] and v is not self.last.get(k):  # a new epoch's tensor
                    self.static[k].copy_(v)
        self.last = dict(inputs)

    def __call__(self, inputs: dict[str, Tensor]):
        if self.failed is not None:
            return self.fn(inputs)
        self._load(inputs)
        if next(iter(self.static.values())).device.type != "cuda":
            return self.fn(self.static)
        self.calls += 1
        if self.calls <= self.warmup:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self.fn(self.static)
            torch.cuda.current_stream().wait_stream(side)
            return out
        if self.graph is None:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    self.out = self.fn(self.static)
            except Exception as e:  # noqa: BLE001 - any capture failure falls back to eager steps
                self.failed = e
                warnings.warn(f"cuda_graphs: capture failed ({type(e).__name__}: {e}); steps run eagerly")
                torch.cuda.synchronize()
                return self.fn(self.static)
            self.graph = graph
        self.graph.replay()
        return self.out
