"""RewardWorker: scores rows of rollout slices with the configured reward functions.

A thin shell over rewards/scorer.py's RowScorer, the scorer `grpo-ray rewards score` uses too:
functions run in killable child processes (isolation "subprocess", the default) or in this
process ("none"), and a failed batch call is retried row by row. A failed score is NaN and counted
per function, never a silent 0: the driver turns counts into metrics and stops the run when
failures pass the configured rate.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from grpo_ray.rewards.scorer import RowScorer
from grpo_ray.types import RolloutSlice, ScoredSlice


@dataclass(frozen=True)
class RewardFunctionSetting:
    name: str
    weight: float
    options: dict


@dataclass(frozen=True)
class RewardIsolation:
    mode: str = "subprocess"  # "subprocess" | "none"
    processes: int = 1
    timeout_s: float = 30.0
    memory_limit_mb: int | None = None


class RewardWorker:
    def __init__(self, functions: list[RewardFunctionSetting], isolation: RewardIsolation = RewardIsolation()):
        self.functions = functions
        # The same scorer `grpo-ray rewards score` uses: a failed batch call is retried row by row.
        self.scorer = RowScorer([(f.name, f.options) for f in functions], isolation=isolation.mode,
                                timeout_s=isolation.timeout_s, processes=isolation.processes,
                                memory_limit_mb=isolation.memory_limit_mb)

    def pid(self) -> int:
        """This process's id: a restarted worker answers with a new one."""
        return os.getpid()

    def ready(self) -> str:
        return "reward"

    def restarts(self) -> int:
        return self.scorer.restarts

    def score(self, batch: RolloutSlice, start: int = 0, stop: int | None = None) -> ScoredSlice:
        """Scores of rows [start, stop) of the slice (the pool splits a slice across its workers)."""
        rows = batch if (start, stop) in ((0, None), (0, batch.num_rows)) else batch.select(np.arange(start, stop))
        results = self._raw_scores(rows)
        n = rows.num_rows
        total = np.zeros(n, dtype=np.float64)
        per_function: dict[str, np.ndarray] = {}
        failures: dict[str, int] = {}
        first_errors: dict[str, str] = {}
        for setting, (values, error) in zip(self.functions, results):
            scores = np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)
            if error is not None:
                first_errors[setting.name] = error
            elif np.isnan(scores).any():
                first_errors[setting.name] = "returned None (could not score)"
            per_function[setting.name] = scores
            failures[setting.name] = int(np.isnan(scores).sum())
            total += setting.weight * scores  # NaN propagates: a row with any failed function is failed
        return ScoredSlice(
            group_ids=rows.group_ids,
            prompt_uids=rows.prompt_uids,
            rewards=total,
            per_function=per_function,
            failures=failures,
            first_errors=first_errors,
            completion_lengths=rows.completion_lengths,
            truncated=np.array([r == "length" for r in rows.finish_reasons], dtype=bool),
            group_diversity=rows.group_diversity,
        )

    def _raw_scores(self, rows: RolloutSlice) -> list[tuple[list[float | None], str | None]]:
        """(scores, first error) per function, in config order."""
        return self.scorer.score(rows.completions, rows.prompts, rows.answers, rows.row_fields)

    def close(self) -> None:
        self.scorer.close()
