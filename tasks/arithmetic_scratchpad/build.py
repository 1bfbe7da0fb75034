"""Build the shipped scratchpad checkpoint and its manifest: python tasks/arithmetic_scratchpad/build.py

The recipe: the 2-layer, width-128 GPT-2 over the character tokenizer, fresh weights
(seed 0), 2000 supervised steps of 64 additions of 1- to 4-digit operands (a digit count
drawn first), 30% of them worked out column by column before the result
(`(7+5=12 4+8+1=13 3+0+1=4)432`) and the rest answered at once, at a constant 3e-3 after
a 200-step warm-up, on one CPU thread. It stops where the model works additions out far
better than it answers them (about 70% against 25% on the held-out problems) but still
opens most answers without working: greedy accuracy is 28% while some of 8 samples is
right for 75% of the problems. Which of the two to do is what GRPO learns first (see
results/headroom_search/README.md for the search that chose this point). The result
depends on the machine's float rounding, so it is shipped rather than rebuilt. Running
this again overwrites checkpoint/ and manifest.json; commit them together.
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
from grpo_bench.lm import shipped, warmstart  # noqa: E402
from grpo_bench.registry import get  # noqa: E402

NAME = HERE.name
TASK = {"name": "arithmetic", "ops": {"add": [0, 9999]}, "operands": "digits", "template": "auto",
        "eval_size": 1000, "eval_seed": 1234, "sampling": {"max_new_tokens": 40},
        "model": {"source": "tiny-scratch", "layers": 2, "width": 128, "heads": 4},
        "warmstart": {"steps": 2000, "batch": 64, "lr": 3e-3, "seed": 0, "scratchpad": 0.3}}


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
    # the warm-start cache's own build (warmstart._build, one thread): a search that ran this
    # setting has already built it, and ships the very model it searched from
    built = warmstart.checkpoint(cfg.task, torch.device("cpu"))
    token_accuracy = json.loads((built / "done.json").read_text())["last_batch_token_accuracy"]
    out = shipped.directory(NAME)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(built, out, ignore=shutil.ignore_patterns("done.json"))
    for f in out.iterdir():
        f.chmod(0o644)  # the cache's files may be private to their builder
    accuracy = heldout_accuracy(out)
    manifest = {
        "files": shipped.file_hashes(out),
        "task": {k: TASK[k] for k in shipped.SPLIT_KEYS} | {"template": "plain"},
        "recipe": {k: TASK[k] for k in ("model", "warmstart")},
        "heldout_greedy_accuracy": accuracy,
        "last_batch_token_accuracy": token_accuracy,
        "built_with": {"torch": torch.__version__, "transformers": transformers.__version__, "cpu": cpu_name()},
    }
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"held-out greedy accuracy {accuracy:.3f}; wrote {out} and manifest.json")


if __name__ == "__main__":
    main()
