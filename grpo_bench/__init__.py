"""grpo_bench: what each design choice of GRPO does, measured."""
from . import registry
from .logprobs import selective_log_softmax

__all__ = ["registry", "selective_log_softmax"]
