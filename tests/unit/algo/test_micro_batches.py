"""Micro-batch plans on hand-worked lengths."""

import numpy as np
import pytest

from grpo_ray.algo.micro_batches import (
    plan_micro_batches,
    row_count_micro_batches,
    spread,
    token_budget_micro_batches,
)

LENGTHS = np.array([5, 40, 6, 7, 38, 5])  # two long rows among four short


def _as_lists(groups):
    return [group.tolist() for group in groups]


def test_row_count_keeps_batch_order():
    assert _as_lists(row_count_micro_batches(5, 2)) == [[0, 1], [2, 3], [4]]


def test_padded_budget_groups_rows_of_like_length():
    # Longest first: 40 (1), 38 (4), 7 (3), 6 (2), 5 (0), 5 (5). Padded cost = rows x first row.
    # [1, 4] costs 2 x 40 = 80 <= 80; adding 3 would cost 120. [3, 2, 0, 5] costs 4 x 7 = 28.
    assert _as_lists(token_budget_micro_batches(LENGTHS, 80, packed=False)) == [[1, 4], [3, 2, 0, 5]]
    # Row-count micro-batches of 3 would pay 3 x 40 + 3 x 38 = 234 tokens; these pay 108.


def test_packed_budget_sums_lengths():
    # 40 + 38 = 78 <= 80, + 7 = 85 > 80: a new one; 7 + 6 + 5 + 5 = 23.
    assert _as_lists(token_budget_micro_batches(LENGTHS, 80, packed=True)) == [[1, 4], [3, 2, 0, 5]]
    # At 45 the two long rows cannot share: 40 | 38 + 7 = 45 | 6 + 5 + 5.
    assert _as_lists(token_budget_micro_batches(LENGTHS, 45, packed=True)) == [[1], [4, 3], [2, 0, 5]]


def test_a_row_over_the_budget_goes_alone():
    assert _as_lists(token_budget_micro_batches(LENGTHS, 10, packed=True)) == [[1], [4], [3], [2], [0, 5]]


def test_every_row_lands_once():
    lengths = np.random.default_rng(0).integers(1, 300, size=97)
    for packed in (True, False):
        groups = token_budget_micro_batches(lengths, 700, packed)
        assert sorted(np.concatenate(groups).tolist()) == list(range(97))
        for group in groups:
            cost = lengths[group].sum() if packed else len(group) * lengths[group].max()
            assert cost <= 700 or len(group) == 1


def test_spread_splits_the_costliest_then_pads_with_empty():
    groups = token_budget_micro_batches(LENGTHS, 80, packed=True)  # [1, 4] (78), [3, 2, 0, 5] (23)
    assert _as_lists(spread(groups, 3, LENGTHS)) == [[1], [4], [3, 2, 0, 5]]
    assert _as_lists(spread(groups, 7, LENGTHS)) == [[1], [4], [3], [2], [0], [5], []]
    with pytest.raises(ValueError, match="cannot fit 2 micro-batches into 1"):
        spread(groups, 1, LENGTHS)


def test_the_plan_is_by_tokens_only_when_a_budget_is_set():
    assert _as_lists(plan_micro_batches(LENGTHS, 4, 0, packed=True)) == [[0, 1, 2, 3], [4, 5]]
    assert _as_lists(plan_micro_batches(LENGTHS, 4, 80, packed=True)) == [[1, 4], [3, 2, 0, 5]]
