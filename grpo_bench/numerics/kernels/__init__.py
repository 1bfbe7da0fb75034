"""Kernels behind grpo_bench.numerics.logprobs: the selected-token log-prob, the fused GRPO loss
(on log-probs or on logits) and the fused LM-head log-prob.

    chunked.py  pure torch, row-chunked: never holds an (N, V) fp32 tensor; the CPU path
    logprob.py  Triton: online-logsumexp log-prob (+ entropy), forward and backward
    loss.py     Triton: per-token ratio / clip / KL / mask / aggregation weights in one pass, the
                gradient written in the forward
    logits_loss.py  Triton: logits -> GRPO loss, each row's lse and gradient in one program
    linear.py   hidden @ W^T in row chunks (torch row ops) or in aligned vocabulary tiles (head.py)
    head.py     Triton: the tiled head's online-logsumexp fold and in-place gradient, its tuning table

Nothing is imported here, so that `grpo_bench.numerics.logprobs` can use the torch paths on a
machine where Triton is missing; the Triton modules are imported on first use.
"""
import os

import torch


def triton_usable(*tensors: torch.Tensor) -> bool:
    """Triton runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1 (the tests)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return all(t.is_cuda for t in tensors)


def check_triton(*tensors: torch.Tensor) -> None:
    if not triton_usable(*tensors):
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1); "
                         "use backend='chunked' or 'auto' on CPU")
