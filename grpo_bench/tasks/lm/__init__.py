"""Causal-LM pieces of the LM tasks: char tokenizer, model loading and LoRA, problems, rewards, warm-start.

Imported only when an LM task is built, so listing tasks never pays for transformers.
"""
import os
from pathlib import Path


def cache_root() -> Path:
    """Where warm starts (lm/warmstart.py) and dequantised weights (lm/pretrained.py) are kept: $GRPO_BENCH_CACHE,
    else .cache/grpo_bench in the repository."""
    env = os.environ.get("GRPO_BENCH_CACHE")
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".cache" / "grpo_bench"
