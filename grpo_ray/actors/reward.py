"""RewardWorker: scores rows of rollout slices with the configured reward functions.

With isolation "subprocess" (the default) every function runs in child processes that can be
killed at a hard timeout and replaced after a crash (`rewards/sandbox.py`); with "none" they run
in this process. Either way a failed score is NaN and counted per function, never a silent 0: the
driver turns counts into metrics and stops the run when failures pass the configured rate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from grpo_ray.rewards import load_reward_function, score_completions
from grpo_ray.rewards.by_source import RewardPlan, score_routed, take_rows
from grpo_ray.rewards.registry import takes_completion_ids
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
        self.sandbox = None
        if isolation.mode == "subprocess":
            from grpo_ray.rewards.sandbox import SandboxedScorer

            self.sandbox = SandboxedScorer(
                self.plan.specs,
                num_processes=isolation.processes,
                timeout_s=isolation.timeout_s,
                memory_limit_mb=isolation.memory_limit_mb,
            )
            self.wants_completion_ids = self.sandbox.wants_completion_ids
        else:
            self.loaded = [load_reward_function(spec, options) for spec, options in self.plan.specs]
            self.wants_completion_ids = any(takes_completion_ids(fn) for fn in self.loaded)

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
        )

    def _raw_scores(self, functions: list[int], batch: tuple) -> list[tuple[list[float | None], str | None]]:
        """(scores, error) of each of ``functions`` (plan indices) over the batch, in that order."""
        if self.sandbox is not None:
            return [(r.scores, r.error) for r in self.sandbox.score_many(*batch, functions=functions)]
        results = []
        for index in functions:
            try:
                results.append((score_completions(self.loaded[index], *batch), None))
            except Exception as err:  # a reward function's bug must not kill the step
                results.append(([None] * len(batch[0]), f"{type(err).__name__}: {err}".splitlines()[0]))
        return results

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()


def completion_token_ids(rows: RolloutSlice) -> list[list[int]]:
    """[N] token ids of each completion (the generated positions of input_ids), as TRL passes them."""
    return [ids[mask > 0].tolist() for ids, mask in zip(rows.input_ids, rows.completion_mask)]
