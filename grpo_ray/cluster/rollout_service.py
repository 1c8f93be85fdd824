"""The rollout service: a batch of prompts from issue to scores, whoever dies on the way.

    service = RolloutService(cfg, workers, recovery)
    flight = service.issue(prompts, sampling, group_offset, version)       # queued; nothing waited for
    batch = service.collect(flight, timer, current, need, preview)         # a ScoredBatch

Two ways to the same scores, chosen by rollout.groups_per_chunk:
- whole shares: each rollout worker returns its share of the prompts as one RolloutSlice per
  learner rank (cluster/dispatch.py), and the reward pool scores each slice, queued behind it;
- streamed: each worker hands back groups as they finish and each chunk is scored on arrival
  (cluster/streams.py); with dynamic sampling (`need`) the rollout stops once the batch's first
  groups, read in id order, hold the informative groups the step still needs.
A worker that dies meanwhile is replaced, and only what it held is issued again (`_recover`, one
road for both ways): a rollout worker's share of the prompts with the same seeds and the weights
that sampled the rest of the batch, a reward worker's unfinished scoring calls. The batch is then
the one an unhurt run draws.

Next hop: the recipe (training/batch.py's BatchBuilder) turns the ScoredBatch into rows (training/rows.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from grpo_ray.algo.filters import groups_needed
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
from grpo_ray.cluster.shares import rank_major, worker_positions, worker_share
from grpo_ray.cluster.streams import StreamedRollout
from grpo_ray.config import Config
from grpo_ray.types import Prompt, SamplingSettings, ScoredBatch, ScoredSlice


@dataclass
class Flight:
    """One batch of prompts sent to the rollout workers, its scoring queued behind it."""

    prompts: list[Prompt]
    sampling: SamplingSettings  # with this batch's seed
    group_offset: int  # group id of its first prompt within the step
    version: int  # the weights the rollout workers held when it was issued
    per_worker: list[list] = field(
        default_factory=list
    )  # whole shares: per worker, its RolloutSlice refs (one per learner rank)
    rows_per_slice: int = 0
    tasks: list = field(default_factory=list)  # whole shares: per slice (rank-major order), its scoring calls
    streamed: StreamedRollout | None = None  # streamed: its chunks, in place of the three above


class RolloutService:
    def __init__(self, cfg: Config, workers: Workers, recovery: WorkerRecovery | None):
        self.cfg, self.workers, self.recovery = cfg, workers, recovery

    def issue(self, prompts: list[Prompt], sampling: SamplingSettings, group_offset: int, version: int) -> Flight:
        """Queue the prompts' rollout and scoring, sampled by the weights `version` the workers hold."""
        flight = Flight(prompts, sampling, group_offset, version)
        workers = self.workers
        if self.cfg.rollout.groups_per_chunk:
            flight.streamed = StreamedRollout(self.cfg, workers, prompts, sampling, group_offset, version)
            return flight
        flight.per_worker = rollout_refs(
            workers.rollouts, prompts, sampling, len(workers.learners), group_offset, version
        )
        flight.rows_per_slice = (
            len(prompts) * sampling.samples_per_prompt // (len(workers.learners) * len(workers.rollouts))
        )
        flight.tasks = [score_tasks(workers, ref, flight.rows_per_slice) for ref in rank_major(flight.per_worker)]
        return flight

    def generated(self, flight: Flight) -> bool:
        """Whether its rollout is over, without waiting (a streamed one as far as last seen)."""
        return flight.streamed.arrived if flight.streamed is not None else finished(rank_major(flight.per_worker))

    def cancel(self, flight: Flight) -> None:
        """Abort what still generates of a flight nobody will collect (a streamed one's requests)."""
        if flight.streamed is not None:
            flight.streamed.cancel()

    def collect(
        self,
        flight: Flight,
        timer,
        current: int,
        need: int | None = None,
        preview: Callable[[ScoredSlice], np.ndarray] | None = None,
    ) -> ScoredBatch:
        """Wait for the flight's rollout and scores (timed as "rollout" and "reward"); `current`: the
        weights version the workers hold now. need (streamed): the informative groups dynamic sampling
        still needs, judged on `preview`'s rewards of a chunk; the rollout stops once it has them."""
        if flight.streamed is not None:
            cut = self._drive(flight, timer, current, need, preview)
            chunks = flight.streamed.scored_chunks()
            return ScoredBatch(
                [c[0] for c in chunks],
                [c[1] for c in chunks],
                [c[2] for c in chunks],
                flight.group_offset,
                streamed=True,
                kept_groups=cut,
            )
        with timer("rollout"):  # the part of the rollout the step waits for
            wait_for(rank_major(flight.per_worker), rollout_owners(flight.per_worker), self.cfg.weight_sync.timeout_s)
        with timer("reward"):
            refs, scored = self._score_all(flight, current)
        return ScoredBatch(refs, [flight.rows_per_slice] * len(refs), scored, flight.group_offset)

    def _score_all(self, flight: Flight, current: int) -> tuple[list, list[ScoredSlice]]:
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

    def _drive(
        self, flight: Flight, timer, current: int, need: int | None, preview: Callable[[ScoredSlice], np.ndarray] | None
    ) -> int | None:
        """Run the stream until every chunk is in and scored, or until (`need` given) the batch's first
        groups hold `need` informative ones; then the rest is cancelled. Returns how many of the
        batch's groups to keep, None: all. Reading in id order, never in finishing order, keeps the
        step's data a function of the seed."""
        streamed, num_groups = flight.streamed, len(flight.prompts)
        while not streamed.done:
            with timer("reward" if streamed.arrived else "rollout"):
                try:
                    streamed.advance()
                except CallFailed as failed:
                    self._recover(failed, flight, current)
                    continue
            if need is not None and (chunks := streamed.scored_chunks()):
                rewards = np.concatenate([preview(scored) for _, _, scored in chunks])
                group_ids = np.concatenate([scored.group_ids for _, _, scored in chunks])
                cut = groups_needed(rewards, group_ids, streamed.group_offset, num_groups, need)
                if cut is not None and cut < num_groups:
                    streamed.cancel()
                    return cut
        return None

    def _recover(self, failed: CallFailed, flight: Flight, current: int, scored: set[int] = frozenset()) -> list[int]:
        """The dead worker behind `failed` replaced (WorkerRecovery), then only what it held issued
        again: a rollout worker's share of the flight's prompts, with the same seeds, by the weights
        that sampled the flight (`current`: the workers' now), and its scoring; a reward worker's
        unfinished calls (`scored`: the whole-share slices whose scores are in). Returns the
        whole-share slices sampled again (their scores are void)."""
        if self.recovery is None:
            raise failed.cause from None
        role, index = self.recovery.recover(failed.cause)
        workers = self.workers
        if role == "reward":
            if flight.streamed is not None:
                parts = flight.streamed.reissue_lost_scoring(index)
            else:
                refs = rank_major(flight.per_worker)
                parts = sum(
                    reissue_lost_part(workers.rewards, flight.tasks[i], index, refs[i], flight.rows_per_slice)
                    for i in range(len(flight.tasks))
                    if i not in scored
                )
            self.recovery.log(f"re-issued reward-{index}'s {parts} unfinished scoring calls")
            return []
        share, offset = worker_share(flight.prompts, index, len(workers.rollouts))
        self.recovery.reissued_prompts += len(share)
        if flight.streamed is not None:
            self.recovery.reissue(flight.version, current, lambda: flight.streamed.issue(index, flight.version))
            self.recovery.log(f"re-issued rollout-{index}'s {len(share)} prompts")
            return []
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
