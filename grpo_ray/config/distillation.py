"""The recipe's `distillation` section: on-policy distillation from one or more teacher models.

The student (the policy) samples; each teacher scores every sampled token of the rows it teaches;
each token's advantage gets -coef x (behaviour log-prob - teacher log-prob) (algo/distill.py).
With the schema's other modules, the only home of these defaults.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from grpo_ray.config.base import _RoleSection, _Section


class TeacherConfig(_RoleSection):
    # The teacher's name: its actor (teacher-<name>), its role in the placement plan and its
    # metrics (distill/<name>/reverse_kl, teacher_logprob, student_logprob, rows).
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    # Hub id, local folder or built-in model ("tiny", ...) run as an actor of its own. Its tokenizer
    # must map each of the student's tokens to the student's id (checked at start: the two models'
    # log-probs of the same token ids are compared); tokens the student lacks do no harm.
    model_path: str = Field(min_length=1)
    # Its tokenizer; null: model_path's own.
    tokenizer: str | None = None
    # The data sources it teaches: rows whose distillation.source_field is one of these. Empty:
    # every row (or, beside teachers that name theirs, every row no other teacher takes).
    sources: tuple[str, ...] = ()
    # CPUs reserved for the teacher's actor.
    num_cpus: float = Field(0.5, gt=0)
    # GPUs for the teacher's actor (a fraction below 1 may share the learner's GPU; the memory
    # plan of `grpo-ray validate` then counts both there).
    num_gpus: float = Field(0.0, ge=0)

    @field_validator("sources")
    @classmethod
    def _sources_are_named_once(cls, sources: tuple[str, ...]) -> tuple[str, ...]:
        if any(not source for source in sources):
            raise ValueError("a source is a non-empty value of distillation.source_field")
        if len(set(sources)) != len(sources):
            raise ValueError("name each source once")
        return sources


class DistillationConfig(_Section):
    # Teacher models whose per-token log-probs of the student's samples become its training signal
    # (on-policy distillation: the reverse KL to the teacher on the student's own tokens). Several
    # teachers each name the data sources they teach; a row is taught by at most one. Empty: no
    # distillation.
    teachers: tuple[TeacherConfig, ...] = ()
    # Coefficient of the per-token reverse KL: each sampled token's advantage gets
    # -coef x (behaviour log-prob - teacher log-prob); environment replies and the prompt get none.
    coef: float = Field(1.0, gt=0)
    # true: that term is added to the GRPO advantage of the rewards. false: the teacher's signal
    # alone (the rewards are still scored, for their metrics and the held-out accuracy, when reward
    # functions exist; reward.functions may then be empty).
    with_rewards: bool = True
    # The row field that names a row's data source, which `sources` match (as reward.source_field).
    source_field: str = Field("data_source", min_length=1)
