"""Which rows of a learner rank's batch go into each micro-batch.

Row-count micro-batches (`learner.micro_batch_size` rows each, in batch order) pay for the longest
row of each micro-batch on every row: one long completion makes seven short ones as expensive as
itself. Token-budget micro-batches (`learner.max_tokens_per_micro_batch`) sort the rows longest
first and fill each micro-batch up to the budget, so rows of like length share one. The cost of a
micro-batch is what its forward computes: rows x longest row when padded, the sum of the lengths
when packed (models.packing). A row longer than the budget goes alone (rows are never split).

The loss is normalised by the step's global token or sequence count (algo.aggregation), not per
micro-batch, so any grouping gives the same gradients to float rounding. Data-parallel ranks must
agree on the number of micro-batches (ZeRO reduces gradients at every backward): `spread` splits a
rank's plan into more micro-batches, and pads with empty ones when it runs out of rows.
"""

from __future__ import annotations

import numpy as np


def row_count_micro_batches(num_rows: int, size: int) -> list[np.ndarray]:
    """Rows in batch order, `size` at a time."""
    return [np.arange(start, min(start + size, num_rows)) for start in range(0, num_rows, size)]


def token_budget_micro_batches(lengths: np.ndarray, max_tokens: int, packed: bool) -> list[np.ndarray]:
    """Row indices of each micro-batch: rows longest first, each micro-batch filled while its cost
    (sum of lengths if `packed`, else rows x its first, longest row) stays within `max_tokens`."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1; got {max_tokens}")
    order = np.argsort(-np.asarray(lengths), kind="stable")
    groups: list[list[int]] = []
    cost = 0
    for row in order:
        length = int(lengths[row])
        added = length if packed else (int(lengths[groups[-1][0]]) if groups else 0)
        if groups and cost + added <= max_tokens:
            groups[-1].append(int(row))
            cost += added
        else:
            groups.append([int(row)])
            cost = length
    return [np.array(group, dtype=np.int64) for group in groups]


def spread(groups: list[np.ndarray], count: int, lengths: np.ndarray) -> list[np.ndarray]:
    """`groups` as exactly `count` micro-batches (count >= len(groups)): the costliest splits in two
    (longer half first) while one has two rows; then empty micro-batches make up the count."""
    if count < len(groups):
        raise ValueError(f"cannot fit {len(groups)} micro-batches into {count}")
    groups = list(groups)
    while len(groups) < count:
        splittable = [i for i, group in enumerate(groups) if len(group) > 1]
        if not splittable:
            groups.append(np.array([], dtype=np.int64))
            continue
        widest = max(splittable, key=lambda i: int(lengths[groups[i]].sum()))
        group = groups.pop(widest)
        half = (len(group) + 1) // 2
        groups[widest:widest] = [group[:half], group[half:]]
    return groups


def plan_micro_batches(lengths: np.ndarray, micro_batch_size: int, max_tokens: int, packed: bool) -> list[np.ndarray]:
    """The learner's and the reference's plan: by token budget when `max_tokens` > 0
    (learner.max_tokens_per_micro_batch), else `micro_batch_size` rows at a time."""
    if max_tokens > 0:
        return token_budget_micro_batches(lengths, max_tokens, packed)
    return row_count_micro_batches(len(lengths), micro_batch_size)
