"""Build the shipped tiny checkpoint and its manifest: python tasks/arithmetic_tiny/build.py

The recipe: the 2-layer, width-128 GPT-2 over the character tokenizer, fresh weights
(seed 0), 450 supervised steps of 64 two-digit additions at a constant 3e-3 after a
45-step warm-up, on one CPU thread. It stops on purpose in the middle of the model's jump
in held-out accuracy, so that GRPO has accuracy to gain within the CPU budget; exactly
that makes the result depend on the machine's float rounding, which is why the result is
shipped rather than rebuilt. Running this again overwrites checkpoint/ and manifest.json;
commit them together.
"""
from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path

import torch
import transformers

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from grpo_bench.config.run import resolve_run  # noqa: E402
from grpo_bench.lm import models, shipped, warmstart  # noqa: E402
from grpo_bench.registry import get  # noqa: E402

TASK = {"name": "arithmetic", "ops": {"add": [0, 99]}, "template": "auto", "eval_size": 200, "eval_seed": 1234,
        "model": {"source": "tiny-scratch", "layers": 2, "width": 128, "heads": 4},
        "warmstart": {"steps": 450, "batch": 64, "lr": 3e-3, "seed": 0}}


def heldout_accuracy(path: Path) -> float:
    """Greedy accuracy of the model at `path` on the held-out set, as the task measures it."""
    cfg = resolve_run({"task": {**TASK, "model": {"source": str(path)}, "warmstart": {"steps": 0}}})
    task = get("task", "arithmetic")(cfg.task, cfg)
    return task._base_accuracy()  # the adapter switched off: the base model itself


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    cfg = resolve_run({"task": TASK})
    model, tokenizer, token_accuracy = warmstart._build(cfg.task, torch.device("cpu"))
    out = shipped.directory()
    shutil.rmtree(out, ignore_errors=True)
    with models.quiet_progress():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    accuracy = heldout_accuracy(out)
    manifest = {
        "files": shipped.file_hashes(out),
        "task": {k: TASK[k] for k in shipped.SPLIT_KEYS if k in TASK} | {"template": "plain"},
        "recipe": {k: TASK[k] for k in ("model", "warmstart")},
        "heldout_greedy_accuracy": accuracy,
        "last_batch_token_accuracy": token_accuracy,
        "built_with": {"torch": torch.__version__, "transformers": transformers.__version__, "cpu": cpu_name()},
    }
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"held-out greedy accuracy {accuracy:.3f}; wrote {out} and manifest.json")


if __name__ == "__main__":
    main()
