"""Distillation's part of a step (distillation.teachers): the teachers score what the learners
will train on, and the update takes their log-probs beside the slices (algo/distill.py).

    taught = teach(workers, payloads, temperature, recovery, cfg.distillation, metrics)  # or None
    advantages = rewards_signal(advantages, with_rewards)            # 0: the teacher's signal alone
    run_update(..., taught=taught, distill_coef=cfg.distillation.coef)

The teachers score the tokens the rollout sampled (a pipelined batch's, by older weights,
included); the learners take the student's side of each gap in their first pass and report it
(LearnerStats.student_sums, step_metrics' distill/*/reverse_kl).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_ray.algo.distill import teacher_failure, teacher_metrics
from grpo_ray.cluster.dispatch import fetch
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.roles import Workers
from grpo_ray.config import DistillationConfig
from grpo_ray.training.errors import TeacherFailureError


@dataclass(frozen=True)
class Taught:
    """The teachers' log-probs of a step, for the learners."""

    refs: list[list]  # per rank, in the order its payload wants them: the first teacher's arrays, then the next's
    names: tuple[str, ...]  # the teachers, in that order


def teach(
    workers: Workers,
    payloads: list[list],
    temperature: float,
    recovery: WorkerRecovery,
    distillation: DistillationConfig,
    metrics: dict[str, float],
) -> Taught | None:
    """Every teacher's log-probs of each rank's slices, as refs for the learners; the teachers' side
    of the step's distill/* metrics into `metrics`. A teacher that died is replaced (`recovery`) and
    its calls issued again; a teacher server that failed on more of the step's rows than its
    max_failure_rate stops the run (TeacherFailureError, the step's metrics kept). None without
    teachers (distillation.teachers)."""
    if not distillation.teachers:
        return None
    per_rank, sums = workers.teacher_logprobs(payloads, temperature, recovery)
    fetched = {name: fetch(refs) for name, refs in sums.items()}
    metrics.update(teacher_metrics(fetched))
    limits = {t.name: (t.url, t.max_failure_rate) for t in distillation.teachers if t.url}
    if (line := teacher_failure(fetched, limits)) is not None:
        raise TeacherFailureError(line, metrics)
    refs = [[ref for teacher in rank for ref in teacher] for rank in per_rank]
    return Taught(refs, tuple(workers.teacher_names))


def rewards_signal(advantages: np.ndarray, with_rewards: bool) -> np.ndarray:
    """The rows' GRPO advantages, or zeros where the teacher's signal stands alone
    (distillation.with_rewards: false)."""
    return advantages if with_rewards else np.zeros_like(advantages)
