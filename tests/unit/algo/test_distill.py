"""On-policy distillation's per-token signal (algo/distill.py), on hand-worked arrays."""

import math

import numpy as np
import torch

from grpo_ray.algo.distill import (
    StudentSums,
    behaviour_logprobs,
    distilled_advantages,
    merge_teachers,
    student_metrics,
    student_sums,
    taught_rows,
    teacher_metrics,
    teacher_of_rows,
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


def test_each_row_is_known_by_the_teacher_that_scored_it():
    a = np.array([[1.0, 2.0], [NAN, NAN], [NAN, NAN]], dtype=np.float32)
    b = np.array([[NAN, NAN], [NAN, 4.0], [NAN, NAN]], dtype=np.float32)
    assert teacher_of_rows([a, b]).tolist() == [0, 1, -1]  # row 2: nobody's (or its request failed)


def test_the_behaviour_log_prob_is_the_learners_own_but_on_rows_older_weights_sampled():
    learner = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    rollout = torch.tensor([[-1.5, -2.5], [-3.5, -4.5]])
    # Row 1 was sampled by weights one update old (pipelined): the rollout's record is its behaviour.
    assert behaviour_logprobs(learner, rollout, torch.tensor([False, True])).tolist() == [[-1.0, -2.0], [-3.5, -4.5]]


def test_the_teachers_side_of_its_metrics_counts_its_taught_model_tokens():
    sums = teacher_sums(TEACHER, MASK)
    # Row 0's two model tokens (the reply's column is not the model's): -0.25 - 4; row 1 untaught.
    assert (sums.teacher_logprob, sums.tokens, sums.rows) == (-4.25, 2, 1)
    second = teacher_sums(np.array([[0, 0, -1.5, -1.0, 0]], dtype=np.float32), MASK[1:])
    metrics = teacher_metrics({"big": [sums, second]})
    assert metrics == {
        "distill/big/teacher_logprob": (-4.25 - 2.5) / 4,
        "distill/big/rows": 2.0,
        "distill/big/failed_rows": 0.0,
    }
    assert math.isnan(
        teacher_metrics({"idle": [teacher_sums(np.full_like(TEACHER, NAN), MASK)]})["distill/idle/teacher_logprob"]
    )


def test_the_students_side_is_summed_per_teacher_and_divided_over_every_rank():
    # Row 0 taught by teacher "a" (gaps -1 - (-0.25) = -0.75 and -2 - (-4) = 2), row 1 by "b" (its
    # two model tokens: -0.5 - (-1.5) = 1 and -3 - (-1) = -2).
    teacher = torch.tensor([[0, 0, -0.25, 0, -4.0], [0, 0, -1.5, -1.0, 0]])
    sums = student_sums(torch.from_numpy(BEHAVIOUR), teacher, torch.from_numpy(MASK), torch.tensor([0, 1]), ("a", "b"))
    assert sums == {"a": StudentSums(1.25, -3.0, 2), "b": StudentSums(-1.0, -3.5, 2)}
    # A second rank taught one token of a's: gap 0.75, log-prob -0.5.
    metrics = student_metrics({"a": [sums["a"], StudentSums(0.75, -0.5, 1)], "b": [sums["b"]]})
    assert metrics["distill/a/reverse_kl"] == 2.0 / 3 and metrics["distill/a/student_logprob"] == -3.5 / 3
    assert metrics["distill/b/reverse_kl"] == -0.5 and metrics["distill/b/student_logprob"] == -1.75
    assert metrics["distill/reverse_kl"] == 1.0 / 5  # (1.25 + 0.75 - 1) over five tokens
    assert math.isnan(student_metrics({"idle": [StudentSums(0.0, 0.0, 0)]})["distill/reverse_kl"])
