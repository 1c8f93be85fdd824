"""Learning-rate schedules: the LR of a step is a pure function of the step number.

    segments = plan_lr_segments(cfg)          # grpo_ray.config: one segment per schedule of the run
    lr = schedule_lr(step, segments)          # the learner sets it before step `step`'s update

Nothing is counted at run time, so a resumed run sets exactly the LRs the straight run set.

Within a segment of N steps with W warmup steps, peak `lr` and floor `min_lr`, local step
s = 1..N (the segment's i-th update, i = s - 1) gets:

    warmup (s <= W):   lr * s / W                 (step W reaches the peak; no step trains at 0,
                                                   unlike Hugging Face's, whose first step has LR 0)
    after warmup:      progress p = (s - 1 - W) / (N - W), in [0, 1)
                       constant: lr
                       linear:   min_lr + (lr - min_lr) * (1 - p)
                       cosine:   min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2

The first step after warmup trains at the peak; the decay would reach min_lr one step after the
last (Hugging Face's get_linear/cosine_schedule_with_warmup place it there too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum


class LrSchedule(str, Enum):
    CONSTANT = "constant"
    LINEAR = "linear"
    COSINE = "cosine"


@dataclass(frozen=True)
class LrSegment:
    """One schedule over global steps first_step .. first_step + steps - 1."""

    first_step: int  # global step (counting from 1) that is this schedule's step 1
    steps: int  # N: steps the schedule spans
    peak_lr: float
    kind: LrSchedule | str
    warmup_steps: int  # W
    min_lr: float

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1


def segment_lr(
    local_step: int, steps: int, peak_lr: float, kind: LrSchedule | str, warmup_steps: int, min_lr: float
) -> float:
    """The LR of the segment's step `local_step` (1-based); see the module docstring."""
    if local_step < 1:
        raise ValueError(f"local_step counts from 1; got {local_step}")
    kind = LrSchedule(kind)
    if local_step <= warmup_steps:
        return peak_lr * local_step / warmup_steps
    if kind is LrSchedule.CONSTANT:
        return peak_lr
    # Steps past the segment (none in a run; the schedule's end) stay at the floor.
    progress = min((local_step - 1 - warmup_steps) / max(steps - warmup_steps, 1), 1.0)
    if kind is LrSchedule.LINEAR:
        return min_lr + (peak_lr - min_lr) * (1.0 - progress)
    return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def schedule_lr(step: int, segments: tuple[LrSegment, ...] | list[LrSegment]) -> float:
    """The LR of global step `step` (1-based): the latest segment that started at or before it."""
    current = None
    for segment in segments:
        if segment.first_step <= step:
            current = segment
    if current is None:
        raise ValueError(f"no learning-rate segment covers step {step}")
    return segment_lr(
        step - current.first_step + 1,
        current.steps,
        current.peak_lr,
        current.kind,
        current.warmup_steps,
        current.min_lr,
    )


def warmup_from_ratio(ratio: float, steps: int) -> int:
    """Warmup steps for a warmup ratio of a segment of `steps` (rounded up, as Hugging Face does)."""
    return math.ceil(ratio * steps)
