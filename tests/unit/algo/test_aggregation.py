"""Loss aggregation: hand-worked modes, NaN safety, and the micro-batch split invariance."""

import pytest
import torch
from torch.testing import assert_close

from grpo_ray.algo import LossAggregation, aggregate_loss, mask_counts, masked_mean

# Row 0: 4 tokens, row 1: 2 tokens, row 2: no loss token (its 7.0 and the NaN must be ignored).
PER_TOKEN = torch.tensor([
    [1.0, 2.0, 3.0, 4.0],
    [5.0, 6.0, 0.0, float("nan")],
    [7.0, 0.0, float("inf"), 0.0],
])  # fmt: skip
MASK = torch.tensor([
    [1.0, 1.0, 1.0, 1.0],
    [1.0, 1.0, 0.0, 0.0],
    [0.0, 0.0, 0.0, 0.0],
])  # fmt: skip


def test_token_mean():
    # (1+2+3+4+5+6) / 6 tokens = 3.5
    assert_close(aggregate_loss(PER_TOKEN, MASK, "token-mean"), torch.tensor(3.5))


def test_seq_mean_token_mean():
    # row means 10/4 = 2.5 and 11/2 = 5.5; the empty row does not count: (2.5 + 5.5) / 2 = 4.0
    actual = aggregate_loss(PER_TOKEN, MASK, LossAggregation.SEQ_MEAN_TOKEN_MEAN)
    assert_close(actual, torch.tensor(4.0))


def test_seq_mean_token_sum_norm():
    # row sums 10 and 11, each / L = 8, mean over 2 sequences: (10/8 + 11/8) / 2 = 1.3125
    actual = aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum-norm", norm_length=8)
    assert_close(actual, torch.tensor(1.3125))


def test_seq_mean_token_sum_norm_requires_norm_length():
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum-norm")


def test_global_counts_replace_local_ones():
    # token-mean: 21 / 12 = 1.75; seq-mean-token-mean: (2.5 + 5.5) / 5 = 1.6;
    # seq-mean-token-sum-norm: 21 / (8 * 5) = 0.525
    kwargs = dict(global_tokens=12, global_sequences=5, norm_length=8)
    assert_close(aggregate_loss(PER_TOKEN, MASK, "token-mean", **kwargs), torch.tensor(1.75))
    actual = aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-mean", **kwargs)
    assert_close(actual, torch.tensor(1.6))
    actual = aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum-norm", **kwargs)
    assert_close(actual, torch.tensor(0.525))


@pytest.mark.parametrize("mode", list(LossAggregation))
def test_all_masked_is_zero_with_finite_gradient(mode):
    per_token = torch.randn(2, 3, requires_grad=True)
    loss = aggregate_loss(per_token, torch.zeros(2, 3), mode, norm_length=3)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.isfinite(per_token.grad).all()


@pytest.mark.parametrize("mode", list(LossAggregation))
def test_nan_at_masked_positions_is_ignored_in_value_and_gradient(mode):
    per_token = PER_TOKEN.clone().requires_grad_(True)
    aggregate_loss(per_token, MASK, mode, norm_length=8).backward()
    assert torch.isfinite(per_token.grad).all()
    assert (per_token.grad[MASK == 0] == 0).all()


def test_masked_mean_and_counts():
    # masked values 1..6 -> 3.5; 6 tokens in 2 non-empty rows
    assert_close(masked_mean(PER_TOKEN, MASK), torch.tensor(3.5))
    assert mask_counts(MASK) == (6.0, 2.0)
    assert masked_mean(PER_TOKEN, torch.zeros_like(MASK)).item() == 0.0


def _random_batch(seed: int, n: int = 7, t: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (n,), generator=gen)
    lengths[2] = 0  # always one empty row, as padding rows are
    mask = (torch.arange(t) < lengths.unsqueeze(1)).float()
    return torch.randn(n, t, generator=gen), mask


SPLITS = [[slice(0, 3), slice(3, 7)], [slice(0, 2), slice(2, 5), slice(5, 7)]]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("splits", SPLITS, ids=["2-way", "3-way"])
@pytest.mark.parametrize("mode", list(LossAggregation))
def test_micro_batches_with_global_counts_sum_to_full_batch(seed, splits, mode):
    values, mask = _random_batch(seed)
    full_input = values.clone().requires_grad_(True)
    full = aggregate_loss(full_input, mask, mode, norm_length=6)
    full.backward()

    # Each piece (a micro-batch, or a data-parallel rank's shard) knows only the step's counts.
    tokens, sequences = mask_counts(mask)
    split_input = values.clone().requires_grad_(True)
    pieces = [
        aggregate_loss(
            split_input[rows],
            mask[rows],
            mode,
            norm_length=6,
            global_tokens=tokens,
            global_sequences=sequences,
        )  # fmt: skip
        for rows in splits
    ]
    summed = torch.stack(pieces).sum()
    summed.backward()  # gradient accumulation plus an all-reduce SUM, in one go

    assert_close(summed, full)
    assert_close(split_input.grad, full_input.grad)


def test_averaging_local_losses_would_be_wrong():
    # Why the global counts exist: row 0 has 4 tokens, row 1 has 1. Token-mean of the batch is
    # (4*1 + 1*3)/5 = 1.4; the mean of the two micro-batch means is (1 + 3)/2 = 2.
    values = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    full = aggregate_loss(values, mask, "token-mean")
    local = [aggregate_loss(values[i : i + 1], mask[i : i + 1], "token-mean") for i in range(2)]
    shared = [aggregate_loss(values[i : i + 1], mask[i : i + 1], "token-mean", global_tokens=5) for i in range(2)]
    assert_close(full, torch.tensor(1.4))
    assert_close(sum(local) / 2, torch.tensor(2.0))
    assert_close(sum(shared), full)


def test_unknown_mode():
    with pytest.raises(ValueError, match="choose one of"):
        aggregate_loss(PER_TOKEN, MASK, "sum")
