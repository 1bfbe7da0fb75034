"""grpo_bench: what each design choice of GRPO does, measured.

The package is in wings (docs/files.md; pyproject.toml's import-linter contracts hold the layers):
registry and algos/ (the parts), numerics/, tasks/, config/, engine/, store/, sweep/, analysis/.
Importing it imports nothing heavy: reading a results directory (plot, compare, findings) needs no torch.
"""
from __future__ import annotations

import importlib

__all__ = ["registry", "selective_log_softmax"]


def __getattr__(name: str):
    if name == "registry":
        return importlib.import_module(".registry", __name__)
    if name == "selective_log_softmax":
        return importlib.import_module(".numerics.logprobs", __name__).selective_log_softmax
    raise AttributeError(f"module 'grpo_bench' has no attribute {name!r}")
