"""Whole shares (cluster/rollout_kinds.py): each rollout worker returns its share of the prompts as
one RolloutSlice per learner rank (cluster/dispatch.py), and the reward pool scores each slice,
queued behind it.

A worker that dies meanwhile is replaced, and only what it held is issued again: a rollout
worker's share with the same seeds and the weights that sampled the rest of the flight, a reward
worker's unfinished scoring calls. The batch is then the one an unhurt run draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_ray.cluster.dispatch import (
    CallFailed,
    collect_scores,
    finished,
    generate_refs,
    reissue_lost_part,
    rollout_owners,
    rollout_refs,
    score_tasks,
    wait_for,
)
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.roles import Workers
from grpo_ray.cluster.rollout_kinds import Flight, RolloutKind, StopRule
from grpo_ray.cluster.shares import rank_major, worker_positions, worker_share
from grpo_ray.config import Config
from grpo_ray.types import Prompt, SamplingSettings, ScoredBatch, ScoredSlice


@dataclass
class WholeShareFlight(Flight):
    per_worker: list[list] = field(default_factory=list)  # per worker, its RolloutSlice refs (one per learner rank)
    rows_per_slice: int = 0
    tasks: list = field(default_factory=list)  # per slice (rank-major order), its scoring calls


class WholeShares(RolloutKind):
    def __init__(self, cfg: Config, workers: Workers, recovery: WorkerRecovery | None):
        self.cfg, self.workers, self.recovery = cfg, workers, recovery

    def issue(self, prompts: list[Prompt], sampling: SamplingSettings, group_offset: int, version: int) -> Flight:
        workers = self.workers
        per_worker = rollout_refs(workers.rollouts, prompts, sampling, len(workers.learners), group_offset, version)
        rows = len(prompts) * sampling.samples_per_prompt // (len(workers.learners) * len(workers.rollouts))
        tasks = [score_tasks(workers, ref, rows) for ref in rank_major(per_worker)]
        return WholeShareFlight(prompts, sampling, group_offset, version, per_worker, rows, tasks)

    def generated(self, flight: WholeShareFlight) -> bool:
        return finished(rank_major(flight.per_worker))

    def collect(self, flight: WholeShareFlight, timer, current: int, stop: StopRule | None) -> ScoredBatch:
        with timer("rollout"):  # the part of the rollout the step waits for
            wait_for(rank_major(flight.per_worker), rollout_owners(flight.per_worker), self.cfg.weight_sync.timeout_s)
        with timer("reward"):
            refs, scored = self._score_all(flight, current)
        return ScoredBatch(refs, [flight.rows_per_slice] * len(refs), scored, flight.group_offset)

    def _score_all(self, flight: WholeShareFlight, current: int) -> tuple[list, list[ScoredSlice]]:
        """Every slice's scores; nothing scored twice (a slice sampled again is scored again)."""
        scored: dict[int, ScoredSlice] = {}
        while True:
            try:
                for i, slice_tasks in enumerate(flight.tasks):
                    if i not in scored:
                        scored[i] = collect_scores(slice_tasks, self.cfg.reward.model.weight)
                refs = rank_major(flight.per_worker)
                return refs, [scored[i] for i in range(len(refs))]
            except CallFailed as failed:
                for i in self._recover(failed, flight, current, set(scored)):
                    scored.pop(i, None)  # scores belong with the slice they were taken from

    def _recover(self, failed: CallFailed, flight: WholeShareFlight, current: int, scored: set[int]) -> list[int]:
        """The dead worker replaced (WorkerRecovery), then what it held issued again; returns the
        slices sampled again (their scores are void)."""
        if self.recovery is None:
            raise failed.cause from None
        role, index = self.recovery.recover(failed.cause)
        workers = self.workers
        refs = rank_major(flight.per_worker)
        if role == "reward":
            parts = sum(
                reissue_lost_part(workers.rewards, flight.tasks[i], index, refs[i], flight.rows_per_slice)
                for i in range(len(flight.tasks))
                if i not in scored
            )
            self.recovery.log(f"re-issued reward-{index}'s {parts} unfinished scoring calls")
            return []
        share, offset = worker_share(flight.prompts, index, len(workers.rollouts))
        self.recovery.reissued_prompts += len(share)
        flight.per_worker[index] = self.recovery.reissue(
            flight.version,
            current,
            lambda: generate_refs(
                workers.rollouts[index],
                share,
                flight.group_offset + offset,
                flight.sampling,
                len(workers.learners),
                flight.version,
            ),
        )
        refs = rank_major(flight.per_worker)
        again = worker_positions(index, len(workers.rollouts), len(workers.learners))
        for i in again:
            flight.tasks[i] = score_tasks(workers, refs[i], flight.rows_per_slice)
        self.recovery.log(f"re-issued rollout-{index}'s {len(share)} prompts")
        return list(again)
