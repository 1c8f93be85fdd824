"""On-policy distillation: a teacher's log-prob of each token the student sampled, as its signal.

For a token x_t the student sampled, its behaviour log-prob b_t = log pi_old(x_t | x_<t) under the
weights that sampled it, and the teacher's log-prob of the same token q_t = log pi_T(x_t | x_<t):

    reverse KL per token   k_t = b_t - q_t           (its mean over sampled tokens estimates
                                                       KL(pi_old || pi_T), the reverse KL)
    advantage              A_t = A_row + (-coef * k_t)

b_t is the learner's own log-prob in its first pass when the learner holds the weights that
sampled the row (every on-policy row), and the rollout engine's record when it no longer does (a
pipelined row sampled by older weights): `behaviour_logprobs`. So the signal carries no
sampler-trainer kernel gap where there is none to carry, and comes out the same, bit for bit,
however the rollout engine batched the row (a resumed run's steps are the straight run's).

A_row is the GRPO advantage of the row (0 when the teacher is the only signal), and A_t then
enters the same clipped policy loss. A token the teacher rates above the student is pushed up, one
it rates below is pushed down, each by how far the two disagree on it (Thinking Machines' and
tinker-cookbook's on-policy distillation; TRL's and verl's use the same per-token reverse KL).
Only the model's own tokens carry it: the prompt and an environment's replies (mask 0) carry none,
and a row no teacher scored (NaN: another data source's) keeps A_row alone.

The teacher's side of the metrics (TeacherSums) is summed where the teacher scores, the student's
(StudentSums) where the learner computes b_t; teacher_metrics and student_metrics divide a step's sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

NAN = float("nan")


@dataclass(frozen=True)
class TeacherSums:
    """A teacher's scoring of one slice, summed over the model tokens of the rows it taught; the
    teacher actor returns it beside its log-probs."""

    teacher_logprob: float  # sum of the teacher's log-probs of the sampled tokens
    tokens: int
    rows: int  # taught rows with model tokens, scored
    # Rows its server could not score after its retries (a url teacher's): left untaught (NaN), so
    # they keep their GRPO advantage; with the first one's error line ("" when none failed).
    failed_rows: int = 0
    first_error: str = ""


@dataclass(frozen=True)
class StudentSums:
    """The student's side of one teacher's gaps on one learner rank in one step, summed over the
    model tokens that teacher taught there (the learner's first pass: `student_sums`)."""

    reverse_kl: float  # sum of b_t - q_t
    student_logprob: float  # sum of b_t
    tokens: int

    def __add__(self, other: StudentSums) -> StudentSums:
        return StudentSums(
            self.reverse_kl + other.reverse_kl, self.student_logprob + other.student_logprob, self.tokens + other.tokens
        )


def taught_rows(
    values: Sequence[object] | None, num_rows: int, sources: Sequence[str], others: Sequence[str] = ()
) -> np.ndarray:
    """[N] bool: the rows a teacher scores, by their source field (`values`, one per row; None: the
    data has no such field). `sources` given: the rows of those sources. Empty: every row, but for
    those of the sources other teachers take (`others`)."""
    if sources:
        wanted = set(sources)
        return np.array([values is not None and values[i] in wanted for i in range(num_rows)], dtype=bool)
    taken = set(others)
    return np.array([values is None or values[i] not in taken for i in range(num_rows)], dtype=bool)


def merge_teachers(logprobs: Sequence[np.ndarray]) -> np.ndarray:
    """One [N, T] array from each teacher's (NaN on the rows it did not score): a row takes the
    first teacher that scored it (routing gives each row one teacher at most)."""
    merged = np.array(logprobs[0], dtype=np.float32, copy=True)
    for other in logprobs[1:]:
        fill = np.isnan(merged) & ~np.isnan(other)
        merged[fill] = other[fill]
    return merged


def teacher_of_rows(logprobs: Sequence[np.ndarray]) -> np.ndarray:
    """[N] int64: which teacher (its index in `logprobs`, each [N, T] with NaN on the rows it did not
    score) scored each row, the first that did; -1 where none did."""
    scored = np.stack([~np.isnan(np.asarray(own)).all(axis=1) for own in logprobs])  # [teachers, N]
    return np.where(scored.any(axis=0), scored.argmax(axis=0), -1).astype(np.int64)


def behaviour_logprobs(learner_first_pass: Tensor, rollout_logprobs: Tensor, stale: Tensor) -> Tensor:
    """[N, T] b_t: the learner's own first-pass log-probs on the rows its weights sampled, the
    rollout engine's record on stale rows (`stale` [N] bool: sampled by older weights)."""
    return torch.where(stale[:, None], rollout_logprobs, learner_first_pass)


def reverse_kl_per_token(behaviour: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """[N, T] b_t - q_t on the model's tokens of taught rows, 0 elsewhere (a NaN teacher: untaught)."""
    taught = (mask > 0) & ~torch.isnan(teacher)
    return torch.where(taught, behaviour - torch.nan_to_num(teacher), torch.zeros_like(behaviour))


def distilled_advantages(advantages: Tensor, behaviour: Tensor, teacher: Tensor, mask: Tensor, coef: float) -> Tensor:
    """[N, T] A_row (or an [N, T] per-token advantage, per-turn credit's) plus -coef x reverse KL on
    every taught model token."""
    per_token = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(behaviour)
    return per_token - coef * reverse_kl_per_token(behaviour, teacher, mask)


def teacher_sums(teacher: np.ndarray, mask: np.ndarray) -> TeacherSums:
    """The teacher's side of its metrics over the taught model tokens of one slice (NaN: untaught)."""
    taught = (mask > 0) & ~np.isnan(teacher)
    return TeacherSums(
        teacher_logprob=float(teacher[taught].astype(np.float64).sum()),
        tokens=int(taught.sum()),
        rows=int(taught.any(axis=1).sum()),
    )


def student_sums(
    behaviour: Tensor, teacher: Tensor, mask: Tensor, taught_by: Tensor, names: Sequence[str]
) -> dict[str, StudentSums]:
    """Per teacher (`names`, in teacher_of_rows' order), the student's side of its gaps over the
    taught model tokens of the rows it scored (`taught_by` [N])."""
    gaps = reverse_kl_per_token(behaviour, teacher, mask).double()
    taught = ((mask > 0) & ~torch.isnan(teacher)).double()
    sums = {}
    for index, name in enumerate(names):
        mine = taught * (taught_by == index).double()[:, None]
        sums[name] = StudentSums(
            reverse_kl=float((gaps * mine).sum()),
            student_logprob=float((behaviour.double() * mine).sum()),
            tokens=int(mine.sum()),
        )
    return sums


def teacher_metrics(sums_by_teacher: dict[str, list[TeacherSums]]) -> dict[str, float]:
    """distill/<teacher>/teacher_logprob per token, /rows and /failed_rows (the teacher phase's)."""
    metrics: dict[str, float] = {}
    for name, parts in sums_by_teacher.items():
        tokens = sum(p.tokens for p in parts)
        metrics[f"distill/{name}/teacher_logprob"] = sum(p.teacher_logprob for p in parts) / tokens if tokens else NAN
        metrics[f"distill/{name}/rows"] = float(sum(p.rows for p in parts))
        metrics[f"distill/{name}/failed_rows"] = float(sum(p.failed_rows for p in parts))
    return metrics


def student_metrics(sums_by_teacher: dict[str, list[StudentSums]]) -> dict[str, float]:
    """distill/<teacher>/{reverse_kl, student_logprob} per token (every learner rank's sums), and
    distill/reverse_kl over every teacher's tokens (the update's)."""
    metrics: dict[str, float] = {}
    total = StudentSums(0.0, 0.0, 0)
    for name, parts in sums_by_teacher.items():
        mine = sum(parts, StudentSums(0.0, 0.0, 0))
        metrics[f"distill/{name}/reverse_kl"] = mine.reverse_kl / mine.tokens if mine.tokens else NAN
        metrics[f"distill/{name}/student_logprob"] = mine.student_logprob / mine.tokens if mine.tokens else NAN
        total = total + mine
    metrics["distill/reverse_kl"] = total.reverse_kl / total.tokens if total.tokens else NAN
    return metrics


def teacher_failure(sums_by_teacher: dict[str, list[TeacherSums]], limits: dict[str, tuple[str, float]]) -> str | None:
    """One line naming the first teacher (in `limits`' order: name -> (its url, its max_failure_rate))
    that failed on more than its rate of the rows it was asked in a step (`sums_by_teacher`: the
    step's sums), with its first error; None when none did.

    >>> ok, bad = TeacherSums(0, 10, 3), TeacherSums(0, 0, 0, failed_rows=2, first_error="HTTP 503")
    >>> teacher_failure({"big": [ok, bad]}, {"big": ("http://h:8000/v1", 0.5)}) is None  # 2 of 5 rows
    True
    >>> print(teacher_failure({"big": [bad]}, {"big": ("http://h:8000/v1", 0.5)}).split(", more")[0])
    teacher big (http://h:8000/v1) failed on 2 of 2 rows this step
    """
    for name, (url, max_rate) in limits.items():
        parts = sums_by_teacher.get(name, [])
        failed = sum(p.failed_rows for p in parts)
        asked = failed + sum(p.rows for p in parts)
        if failed and failed > max_rate * asked:
            first = next(p.first_error for p in parts if p.failed_rows)
            return (
                f"teacher {name} ({url}) failed on {failed} of {asked} rows this step, more than its "
                f"max_failure_rate {max_rate:g} (first error: {first}); fix the server or raise "
                "distillation.teachers[].max_failure_rate"
            )
    return None
