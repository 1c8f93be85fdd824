"""RewardWorker: scores rows of rollout slices with the configured reward functions.

A thin shell over rewards/scorer.py's RowScorer, the scorer `grpo-ray rewards score` uses too:
functions run in killable child processes (isolation "subprocess", the default) or in this
process ("none"), and a failed batch call is retried row by row; rows are routed to their data
source's functions (rewards/by_source.py). A failed score is NaN and counted per function, never a
silent 0: the driver turns counts into metrics and stops the run when failures pass the configured rate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from grpo_ray.rewards.by_source import RewardPlan, score_routed, take_rows
from grpo_ray.rewards.environment import episode_errors
from grpo_ray.rewards.scorer import RowScorer
from grpo_ray.types import EPISODE_FIELD_PREFIX, RolloutSlice, ScoredSlice


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
    """Scores slices; ``by_source`` (source -> functions) routes rows by ``source_field``."""

    def __init__(
        self,
        functions: list[RewardFunctionSetting],
        isolation: RewardIsolation = RewardIsolation(),
        by_source: dict[str, list[RewardFunctionSetting]] | None = None,
        source_field: str = "data_source",
    ):
        self.functions = functions
        entries = lambda settings: [(f.name, f.weight, f.options) for f in settings]  # noqa: E731
        self.plan = RewardPlan.build(
            entries(functions), {s: entries(fs) for s, fs in (by_source or {}).items()}, source_field
        )
        self.scorer = RowScorer(
            self.plan.specs,
            isolation=isolation.mode,
            timeout_s=isolation.timeout_s,
            processes=isolation.processes,
            memory_limit_mb=isolation.memory_limit_mb,
        )
        self.wants_completion_ids = self.scorer.wants_completion_ids

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
        row_fields = rows.row_fields
        if self.wants_completion_ids:  # TRL's argument; gathered only when a function takes it
            row_fields = {**row_fields, "completion_ids": completion_token_ids(rows)}
        batch = (rows.completions, rows.prompts, rows.answers, row_fields)
        sources = self.plan.row_sources(row_fields, rows.num_rows)
        results = score_routed(self.plan, sources, lambda fs, picked: self._raw_scores(fs, take_rows(batch, picked)))
        routed = self.plan.combine(sources, results)
        return ScoredSlice(
            group_ids=rows.group_ids,
            prompt_uids=rows.prompt_uids,
            rewards=routed.totals,
            per_function=routed.per_function,
            failures=routed.failures,
            first_errors=routed.first_errors,
            completion_lengths=rows.completion_lengths,
            truncated=np.array([r == "length" for r in rows.finish_reasons], dtype=bool),
            group_diversity=rows.group_diversity,
            episode_stats={
                name.removeprefix(EPISODE_FIELD_PREFIX): np.asarray(values, dtype=np.float64)
                for name, values in rows.row_fields.items()
                if name.startswith(EPISODE_FIELD_PREFIX)
            },
            episode_errors=episode_errors(rows.row_fields),
        )

    def _raw_scores(self, functions: list[int], batch: tuple) -> list[tuple[list[float | None], str | None]]:
        """(scores, first error) of each of ``functions`` (plan indices) over the batch, in that order."""
        return self.scorer.score(*batch, functions=functions)

    def close(self) -> None:
        self.scorer.close()


def completion_token_ids(rows: RolloutSlice) -> list[list[int]]:
    """[N] token ids of each completion (the generated positions of input_ids), as TRL passes them."""
    return [ids[mask > 0].tolist() for ids, mask in zip(rows.input_ids, rows.completion_mask)]
