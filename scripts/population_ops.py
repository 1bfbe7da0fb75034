"""How a population's host work grows with P, measured on the CPU: ATen calls and Python lines per epoch.

    python scripts/population_ops.py [--task toy|lm] [--sizes 8,64,256,1024] [--epochs 12] [--device-path]

A GPU runs a population as fast as the host can launch its kernels, so what the host does per
epoch, counted on any device, predicts the GPU's pace: an ATen call is (about) a kernel launch
or a host-side tensor op, a line of grpo_bench's Python is host time. A population whose every
step is batched across members does the same count at every P; one that loops over members
grows with P. Counted on the harness's toy (loss_modes' clipped variant on sort_converge, 10 inner
steps an epoch, metrics logged every 10th epoch, no evaluation, backend torch) or, with --task lm, the
harness's LM (arithmetic_lora's grpo: a rollout of generation, old log-probs and inner steps an epoch), for each P:
  aten_ops, py_lines, host_syncs   per epoch that logs nothing (the median over epochs 1..):
      calls that reach torch's dispatcher below autograd and vmap (TorchDispatchMode), lines of
      grpo_bench's own code executed (sys.settrace), and host syncs: reads of a tensor's value by
      the host (.item(), .tolist(), bool()) and nonzero. An upper bound for a GPU: the toy's one_hot
      checks its indices on the CPU (two reads a forward), on CUDA with a device assert instead
  log_*   what an epoch that logs adds (its last step writes every member's metric rows)
  eval_*  the final held-out evaluation (after the last epoch; the LM's greedy pass over the task's
          held-out problems, every member at once), counted the same way
--device-path runs the paths a CUDA run takes (rng.DEVICE_PATHS) on the CPU, so that they are counted here.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_bench.numerics import rng  # noqa: E402
from grpo_bench.engine.trainer import train_population  # noqa: E402

PACKAGE = str(ROOT / "grpo_bench")
# what makes the host wait for a GPU: reading a value, or a result whose size depends on values
READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default, torch.ops.aten.is_nonzero.default}


class Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        if func in READS:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def configs(task: str, p: int, epochs: int) -> list:
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_population  # the harness's own tasks, so these counts describe what it times
    cfgs = gpu_population.configs(task, list(range(p)), "cpu", tiny=False)
    for c in cfgs:
        c.epochs, c.eval_every = epochs, 0
    return cfgs


def count(p: int, epochs: int, task: str = "toy") -> dict:
    lines = [0]

    def tracer(frame, event, arg):
        if not frame.f_code.co_filename.startswith(PACKAGE):
            return None

        def local(frame, event, arg):
            if event == "line":
                lines[0] += 1
            return local
        return local

    cfgs = configs(task, p, epochs)
    marks = []
    mode = Counter()

    def on_epoch(_members):
        marks.append((sum(mode.ops.values()), lines[0], mode.reads))

    sys.settrace(tracer)
    try:
        with mode:
            train_population(cfgs, None, on_epoch=on_epoch)
    finally:
        sys.settrace(None)
    per = [tuple(b - a for a, b in zip(m0, m1)) for m0, m1 in zip(marks, marks[1:])]
    med = [statistics.median(x[i] for x in per) for i in range(3)]
    top = [max(x[i] for x in per) - med[i] for i in range(3)]
    final = (sum(mode.ops.values()) - marks[-1][0], lines[0] - marks[-1][1], mode.reads - marks[-1][2])
    names = ("aten_ops", "py_lines", "host_syncs")
    return {"P": p, **{k: int(v) for k, v in zip(names, med)}, **{f"log_{k}": int(v) for k, v in zip(names, top)},
            **{f"eval_{k}": int(v) for k, v in zip(names, final)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=("toy", "lm"), default="toy")
    ap.add_argument("--sizes", default=None, help="default 8,64,256,1024 (toy), 1,2,4,8 (lm)")
    ap.add_argument("--epochs", type=int, default=None, help="default 12 (toy: the 10th logs), 4 (lm)")
    ap.add_argument("--device-path", action="store_true", help="count the paths a CUDA run takes (on the CPU)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng.DEVICE_PATHS = True if args.device_path else None
    sizes = args.sizes or ("8,64,256,1024" if args.task == "toy" else "1,2,4,8")
    epochs = args.epochs or (12 if args.task == "toy" else 4)
    for i, p in enumerate(map(int, sizes.split(","))):
        r = count(p, epochs, args.task)
        if i == 0:
            print(",".join(r), flush=True)
        print(",".join(str(v) for v in r.values()), flush=True)


if __name__ == "__main__":
    main()
