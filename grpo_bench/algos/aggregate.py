"""Loss aggregation: per-token losses (B, G, T) and their mask -> one scalar.

One rule for every mode: a response with no unmasked token (a filter removed it, or it
was empty) is not part of the batch. It adds nothing to any sum and is not counted in any
mean over responses. The fused kernel (kernels/loss.py) writes each mode as a weight per
response on its masked token sum, and must agree with these definitions.
"""
from __future__ import annotations

from typing import Annotated

from torch import Tensor

from ..registry import Range, register
from .common import masked_sum

OptionalLength = Annotated[int | None, Range(1)]


def _per_response(per_token: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(masked token sums, token counts, number of responses with any token)."""
    sums = masked_sum(per_token, mask, dim=-1)
    lengths = (mask > 0).to(per_token.dtype).sum(-1)
    return sums, lengths, (lengths > 0).to(per_token.dtype).sum().clamp(min=1)


@register("aggregate", "token_mean")
def token_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """Mean over every unmasked token of the batch: long responses weigh more.

    Source: DAPO (Yu et al., 2025); verl loss_agg_mode=token-mean; TRL loss_type dapo/bnpo/cispo.
    """
    return masked_sum(per_token, mask) / (mask > 0).to(per_token.dtype).sum().clamp(min=1)


@register("aggregate", "token_sum")
def token_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    """Sum over every unmasked token of the batch: no normaliser, the gradient grows with the batch.

    Source: the unnormalised policy-gradient estimator; the base the other modes divide.
    """
    return masked_sum(per_token, mask)


@register("aggregate", "seq_mean_token_mean")
def seq_mean_token_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """Mean over each response's tokens, then over responses: 1/|o| per response (the GRPO paper).

    Source: GRPO (Shao et al., 2024); verl loss_agg_mode=seq-mean-token-mean; TRL loss_type=grpo.
    """
    sums, lengths, n = _per_response(per_token, mask)
    return (sums / lengths.clamp(min=1)).sum() / n


@register("aggregate", "seq_mean_token_sum")
def seq_mean_token_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    """Sum over each response's tokens, mean over responses.

    Source: verl loss_agg_mode=seq-mean-token-sum; with loss gspo it is LUSPO (TRL loss_type=luspo).
    """
    sums, _, n = _per_response(per_token, mask)
    return sums.sum() / n


@register("aggregate", "seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(per_token: Tensor, mask: Tensor, *, max_len: OptionalLength = None) -> Tensor:
    """Sum over each response's tokens / a constant max_len, mean over responses (Dr. GRPO).

    max_len null: the task's generation budget (max_new_tokens; n on the sorting toy), the
    constant TRL uses (max_completion_length); called directly, null means T.

    Source: Dr. GRPO (Liu et al., 2025); TRL loss_type=dr_grpo; verl seq-mean-token-sum-norm (which omits the mean over responses).
    """
    sums, _, n = _per_response(per_token, mask)
    norm = per_token.shape[-1] if max_len is None else max_len
    return sums.sum() / (n * norm)


@register("aggregate", "prompt_mean")
def prompt_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """Mean over each prompt's tokens (its whole group's), then over prompts: every prompt weighs the same.

    A prompt none of whose responses has a token is not part of the batch. With equal-length
    responses it equals token_mean and seq_mean_token_mean; with varying lengths it equals
    neither (TRL's grpo is seq_mean_token_mean, whatever huggingface/trl#5375 concluded).

    Source: ScaleRL (Khatri et al., 2025, arXiv 2510.13786) prompt-level loss averaging; SkyRL loss_reduction=prompt_mean (which also counts prompts without tokens).
    """
    sums = masked_sum(per_token, mask, dim=(-2, -1))                       # (B,)
    counts = (mask > 0).to(per_token.dtype).sum((-2, -1))
    n = (counts > 0).to(per_token.dtype).sum().clamp(min=1)
    return (sums / counts.clamp(min=1)).sum() / n
