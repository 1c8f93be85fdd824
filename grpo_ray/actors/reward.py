"""RewardWorker: scores rollout slices with the configured reward functions.

A failed score is NaN and counted per function, never a silent 0: the driver turns counts into
metrics and decides what a failed row means for the update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from grpo_ray.rewards import load_reward_function, score_completions
from grpo_ray.types import RolloutSlice, ScoredSlice


@dataclass(frozen=True)
class RewardFunctionSetting:
    name: str
    weight: float
    options: dict


class RewardWorker:
    def __init__(self, functions: list[RewardFunctionSetting]):
        self.functions = [(f.name, f.weight, load_reward_function(f.name, f.options)) for f in functions]

    def ready(self) -> str:
        return "reward"

    def score(self, batch: RolloutSlice) -> ScoredSlice:
        n = batch.num_rows
        total = np.zeros(n, dtype=np.float64)
        per_function: dict[str, np.ndarray] = {}
        failures: dict[str, int] = {}
        first_errors: dict[str, str] = {}
        for name, weight, fn in self.functions:
            scores = np.full(n, np.nan, dtype=np.float64)
            try:
                values = score_completions(fn, batch.completions, batch.prompts, batch.answers, batch.row_fields)
                scores[:] = [math.nan if v is None else float(v) for v in values]
                if np.isnan(scores).any():
                    first_errors[name] = "returned None (could not score)"
            except Exception as err:  # a reward function's bug must not kill the step
                first_errors[name] = f"{type(err).__name__}: {err}".splitlines()[0]
            per_function[name] = scores
            failures[name] = int(np.isnan(scores).sum())
            total += weight * scores  # NaN propagates: a row with any failed function is failed
        return ScoredSlice(
            group_ids=batch.group_ids,
            prompt_uids=batch.prompt_uids,
            rewards=total,
            per_function=per_function,
            failures=failures,
            first_errors=first_errors,
            completion_lengths=batch.completion_lengths,
            truncated=np.array([r == "length" for r in batch.finish_reasons], dtype=bool),
        )
