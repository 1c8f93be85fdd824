"""RewardWorker: scores rows of rollout slices with the configured reward functions.

With isolation "subprocess" (the default) every function runs in child processes that can be
killed at a hard timeout and replaced after a crash (`rewards/sandbox.py`); with "none" they run
in this process. Either way a failed score is NaN and counted per function, never a silent 0: the
driver turns counts into metrics and stops the run when failures pass the configured rate.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from grpo_ray.rewards import load_reward_function, score_completions
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
        self.sandbox = None
        if isolation.mode == "subprocess":
            from grpo_ray.rewards.sandbox import SandboxedScorer

            self.sandbox = SandboxedScorer(
                [(f.name, f.options) for f in functions],
                num_processes=isolation.processes,
                timeout_s=isolation.timeout_s,
                memory_limit_mb=isolation.memory_limit_mb,
            )
        else:
            self.loaded = [load_reward_function(f.name, f.options) for f in functions]

    def pid(self) -> int:
        """This process's id: a restarted worker answers with a new one."""
        return os.getpid()

    def ready(self) -> str:
        return "reward"

    def restarts(self) -> int:
        return self.sandbox.restarts if self.sandbox is not None else 0

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
        """(scores, error) per function, in config order."""
        args = (rows.completions, rows.prompts, rows.answers, rows.row_fields)
        if self.sandbox is not None:
            return [(r.scores, r.error) for r in self.sandbox.score_many(*args)]
        results = []
        for fn in self.loaded:
            try:
                results.append((score_completions(fn, *args), None))
            except Exception as err:  # a reward function's bug must not kill the step
                results.append(([None] * rows.num_rows, f"{type(err).__name__}: {err}".splitlines()[0]))
        return results

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
