"""On-policy distillation's per-token signal (algo/distill.py), on hand-worked arrays."""

import math

import numpy as np
import torch

from grpo_ray.algo.distill import (
    distill_metrics,
    distilled_advantages,
    merge_teachers,
    taught_rows,
    teacher_sums,
)

NAN = float("nan")
# Two rows of width 5: prompt [0, 1], then the model's tokens; row 0 has an environment reply at
# column 3 (mask 0) between two turns, row 1 is shorter (column 4 is padding).
MASK = np.array([[0, 0, 1, 0, 1], [0, 0, 1, 1, 0]], dtype=np.float32)
BEHAVIOUR = np.array([[0, 0, -1.0, 0, -2.0], [0, 0, -0.5, -3.0, 0]], dtype=np.float32)
TEACHER = np.array([[0, 0, -0.25, 0, -4.0], [NAN] * 5], dtype=np.float32)  # row 1: another teacher's


def test_each_taught_model_token_moves_by_coef_times_the_teachers_gap():
    adv = distilled_advantages(
        torch.tensor([0.5, -1.0]), torch.from_numpy(BEHAVIOUR), torch.from_numpy(TEACHER), torch.from_numpy(MASK), 2.0
    )
    # Row 0: token 2: b - q = -1 - (-0.25) = -0.75 -> +1.5; token 4: -2 - (-4) = 2 -> -4.0; the
    # prompt and the reply keep A_row = 0.5. Row 1 untaught: -1.0 everywhere.
    assert adv.tolist() == [[0.5, 0.5, 2.0, 0.5, -3.5], [-1.0] * 5]


def test_per_token_advantages_take_the_signal_too():
    per_token = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.25], [0.0] * 5])
    adv = distilled_advantages(
        per_token, torch.from_numpy(BEHAVIOUR), torch.from_numpy(TEACHER), torch.from_numpy(MASK), 1.0
    )
    assert adv[0].tolist() == [0.0, 0.0, 1.75, 0.0, -1.75]


def test_rows_are_taught_by_their_source_or_all_without_sources():
    values = ["gsm8k", "math", None]
    assert taught_rows(values, 3, ()).tolist() == [True, True, True]
    assert taught_rows(values, 3, ("math",)).tolist() == [False, True, False]
    assert taught_rows(None, 2, ("math",)).tolist() == [False, False]  # the data has no such field
    # The teacher without sources beside one that takes math: every row but math's.
    assert taught_rows(values, 3, (), others=("math",)).tolist() == [True, False, True]


def test_teachers_merge_row_by_row():
    a = np.array([[1.0, 2.0], [NAN, NAN]], dtype=np.float32)
    b = np.array([[NAN, NAN], [3.0, 4.0]], dtype=np.float32)
    assert merge_teachers([a, b]).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert a[1, 0] != a[1, 0]  # the inputs are left as they were


def test_metrics_are_per_token_over_every_slice():
    first = teacher_sums(BEHAVIOUR, TEACHER, MASK)
    # Row 0's two model tokens: gaps -0.75 and 2 (sum 1.25), teacher -4.25, student -3; one row.
    assert (first.reverse_kl, first.teacher_logprob, first.student_logprob, first.tokens, first.rows) == (
        1.25,
        -4.25,
        -3.0,
        2,
        1,
    )
    second = teacher_sums(BEHAVIOUR[1:], np.array([[0, 0, -1.5, -1.0, 0]], dtype=np.float32), MASK[1:])
    metrics = distill_metrics({"big": [first, second]})
    # Second slice: gaps 1.0 and -2.0. Four tokens in all: (1.25 - 1.0) / 4.
    assert metrics["distill/big/reverse_kl"] == 0.0625 and metrics["distill/reverse_kl"] == 0.0625
    assert metrics["distill/big/teacher_logprob"] == (-4.25 - 2.5) / 4
    assert metrics["distill/big/student_logprob"] == (-3.0 - 3.5) / 4 and metrics["distill/big/rows"] == 2.0
    assert math.isnan(
        distill_metrics({"idle": [teacher_sums(BEHAVIOUR, np.full_like(TEACHER, NAN), MASK)]})["distill/reverse_kl"]
    )
