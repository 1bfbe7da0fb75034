"""Per-token log-probs of chosen labels.  (Placeholder: the kernels helper replaces this
module with chunked / Triton backends; keep the public API.)"""
from __future__ import annotations

import torch
from torch import Tensor


def selective_log_softmax(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[..., label] in fp32; logits (..., V), labels (...) -> (...)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def token_logprobs(logits: Tensor, labels: Tensor, backend: str = "auto",
                   with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    lp = torch.log_softmax(logits.float(), dim=-1)
    out = lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ent = -(lp.exp() * lp).sum(-1) if with_entropy else None
    return out, ent
