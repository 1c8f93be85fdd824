"""Reducing a per-token loss [N, T] to the scalar that is backpropagated.

    token-mean               sum_{i,t} l_it m_it / sum_{i,t} m_it            (DAPO; default)
    seq-mean-token-mean      (1/S) sum_i [ sum_t l_it m_it / sum_t m_it ]     (original GRPO)
    seq-mean-token-sum-norm  (1/S) sum_i [ sum_t l_it m_it / L ]              (Dr. GRPO, L constant)

S counts sequences with at least one loss token: rows whose mask is all zero (padding rows added
to even out micro-batches) neither count nor contribute. L is `norm_length`, a constant such as
the maximum response length, so that the weight of a token does not depend on its sequence length.

Micro-batching and data parallelism: every mode is a sum over tokens or rows divided by a count.
When a step's batch is split into micro-batches on several ranks, pass the counts of the WHOLE
step (`global_tokens`, `global_sequences`, see `mask_counts`) and each piece returns its share of
the full-batch loss: summing the pieces' losses (gradient accumulation plus an all-reduce SUM)
gives exactly the full-batch loss and gradient. Dividing each piece by its own count and
averaging would weight a token of a short micro-batch more than one of a long micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import NamedTuple

import torch
from torch import Tensor

from grpo_ray.algo.registry import lookup


class LossAggregation(str, Enum):
    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"


class MaskCounts(NamedTuple):
    tokens: float  # number of loss tokens
    sequences: float  # number of rows with at least one loss token


def mask_counts(mask: Tensor) -> MaskCounts:
    """Counts to sum over all micro-batches and ranks of a step, then pass as global_* below.

    Args:
        mask: [N, T] 1.0 on loss tokens, 0.0 elsewhere.
    """
    tokens, sequences = torch.stack([mask.sum(), (mask.sum(-1) > 0).sum().to(mask.dtype)]).tolist()
    return MaskCounts(tokens, sequences)


def _masked(per_token: Tensor, mask: Tensor) -> Tensor:
    # where() rather than a bare product: 0 * inf and 0 * NaN at padding positions are NaN.
    return torch.where(mask != 0, per_token * mask, 0.0)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of values [N, T] over positions where mask [N, T] is non-zero; 0 if there are none."""
    return _masked(values, mask).sum() / mask.sum().clamp(min=1)


class _Counts(NamedTuple):
    """The caller's normalisers, passed through unchanged to every aggregation."""

    norm_length: float | None
    global_tokens: float | None
    global_sequences: float | None


def _denominator(global_count: float | None, local_count: Tensor) -> Tensor | float:
    # A count below 1 only happens when there is nothing to average; the numerator is then 0 and
    # the clamp turns 0/0 into 0 instead of NaN.
    if global_count is None:
        return local_count.clamp(min=1)
    return max(float(global_count), 1.0)


def _token_mean(per_token: Tensor, mask: Tensor, counts: _Counts) -> Tensor:
    return _masked(per_token, mask).sum() / _denominator(counts.global_tokens, mask.sum())


def _seq_mean_token_mean(per_token: Tensor, mask: Tensor, counts: _Counts) -> Tensor:
    row_tokens = mask.sum(-1)
    row_means = _masked(per_token, mask).sum(-1) / row_tokens.clamp(min=1)
    return row_means.sum() / _denominator(counts.global_sequences, (row_tokens > 0).sum())


def _seq_mean_token_sum_norm(per_token: Tensor, mask: Tensor, counts: _Counts) -> Tensor:
    norm_length = counts.norm_length
    if norm_length is None or norm_length <= 0:
        # No default on purpose: using this batch's T would make the loss depend on padding,
        # and differ between micro-batches, which is what Dr. GRPO's constant is there to avoid.
        message = f"seq-mean-token-sum-norm needs a positive norm_length; got {norm_length!r}"
        raise ValueError(message)
    sequences = _denominator(counts.global_sequences, (mask.sum(-1) > 0).sum())
    return _masked(per_token, mask).sum() / (norm_length * sequences)


AggregationFn = Callable[[Tensor, Tensor, _Counts], Tensor]

_AGGREGATIONS: dict[LossAggregation, AggregationFn] = {
    LossAggregation.TOKEN_MEAN: _token_mean,
    LossAggregation.SEQ_MEAN_TOKEN_MEAN: _seq_mean_token_mean,
    LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM: _seq_mean_token_sum_norm,
}


def get_loss_aggregation(mode: LossAggregation | str) -> AggregationFn:
    """Registry lookup; raises ValueError naming the valid choices for an unknown mode."""
    return lookup(_AGGREGATIONS, LossAggregation, mode, "loss aggregation")


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    mode: LossAggregation | str,
    *,
    norm_length: float | None = None,
    global_tokens: float | None = None,
    global_sequences: float | None = None,
) -> Tensor:
    """Scalar loss from a per-token loss (see the module docstring for the formulas).

    Args:
        per_token: [N, T] loss of each token; values at mask == 0 are ignored, even inf or NaN.
        mask: [N, T] 1.0 on tokens that count in the loss, 0.0 elsewhere.
        mode: a LossAggregation or its string value.
        norm_length: the constant L of seq-mean-token-sum-norm (required there, ignored elsewhere).
        global_tokens: loss tokens in the whole step across micro-batches and ranks; replaces
            this batch's own count in token-mean. Ignored by the other modes.
        global_sequences: non-empty rows in the whole step; replaces this batch's own count in
            the two seq-mean modes. Ignored by token-mean.

    Returns:
        Scalar tensor; 0 (not NaN) when no token is masked in.
    """
    fn = get_loss_aggregation(mode)
    return fn(per_token, mask, _Counts(norm_length, global_tokens, global_sequences))
