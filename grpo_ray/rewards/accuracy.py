"""Accuracy: the one definition the run's held-out evaluation and `grpo-ray eval` share.

A sample's score is the first reward function's value. A sample that could not be scored (the
function failed: NaN or None) counts as wrong, 0, never as missing: leaving it out would raise the
accuracy of a model whose answers break the verifier. Failures are counted and reported beside it.

    >>> accuracy_scores([1.0, None, float("nan"), 0.5]).tolist()
    [1.0, 0.0, 0.0, 0.5]
    >>> mean_accuracy([1.0, None, 1.0, 0.0])
    0.5
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accuracy_scores(scores: Sequence[float | None] | np.ndarray) -> np.ndarray:
    """[N] float64 scores with every failed one (None or NaN) as 0."""
    values = np.array([np.nan if s is None else float(s) for s in scores], dtype=np.float64)
    return np.where(np.isnan(values), 0.0, values)


def mean_accuracy(scores: Sequence[float | None] | np.ndarray) -> float:
    """Mean over every sample, a failed one counting 0; NaN when there is no sample."""
    values = accuracy_scores(scores)
    return float(values.mean()) if len(values) else float("nan")


def failed_count(scores: Sequence[float | None] | np.ndarray) -> int:
    return int(sum(s is None or (isinstance(s, float) and np.isnan(s)) for s in scores))
