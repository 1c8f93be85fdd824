"""A generation batch streamed (rollout.groups_per_chunk > 0): groups scored as they finish.

Each rollout worker hands back chunks of whole groups as they finish (RolloutWorker.generate_chunks,
a Ray streaming call); every chunk goes to the reward pool the moment it arrives, so scoring runs
while later groups still generate, and one long completion holds back only its own group. The
rollout service (cluster/rollout_service.py) reads the scored chunks as they come and can stop the
rollout once it has what it needs (dynamic sampling); the rows go in group order (training/rows.py
`batch_rows`), so which group finished first never shows.

    streamed = StreamedRollout(cfg, workers, prompts, sampling, group_offset, version)
    while not streamed.done:
        streamed.advance()            # a chunk arrived (its scoring starts) or a scoring finished
    streamed.cancel()                 # stop early: the workers abort what is still generating
    streamed.scored_chunks()          # [(ref, rows, ScoredSlice)], in worker and arrival order
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import ray

from grpo_ray.cluster.dispatch import (
    CallFailed,
    StalledError,
    chunk_stream,
    collect_scores,
    reissue_lost_part,
    score_tasks,
)
from grpo_ray.cluster.roles import Workers
from grpo_ray.cluster.rollout_kinds import Flight, RolloutKind, StopRule
from grpo_ray.cluster.shares import chunk_sizes, worker_share
from grpo_ray.config import Config
from grpo_ray.types import Prompt, SamplingSettings, ScoredBatch, ScoredSlice


@dataclass
class Chunk:
    ref: object  # RolloutSlice ref
    rows: int
    tasks: tuple  # its scoring calls (dispatch.score_tasks)
    scored: ScoredSlice | None = None


class StreamedRollout:
    def __init__(
        self,
        cfg: Config,
        workers: Workers,
        prompts: list[Prompt],
        sampling: SamplingSettings,
        group_offset: int,
        version: int,
    ):
        self.cfg, self.workers, self.prompts, self.sampling = cfg, workers, prompts, sampling
        self.group_offset = group_offset
        self.chunks: dict[int, list[Chunk]] = {}  # per rollout worker, its chunks in arrival order
        self.due: dict[int, list[int]] = {}  # per rollout worker, the group count of each chunk it owes
        self.streams: dict[int, object] = {}  # per rollout worker still yielding, its ObjectRefGenerator
        self.progressed = time.monotonic()  # the last time a chunk arrived or a scoring finished
        for index in range(len(workers.rollouts)):
            self.issue(index, version)

    def issue(self, index: int, version: int) -> None:
        """(Again) ask rollout worker `index` for its whole share; chunks it sent before are dropped
        (a replaced worker samples its share again with the same seeds)."""
        share, offset = worker_share(self.prompts, index, len(self.workers.rollouts))
        self.chunks[index] = []
        self.due[index] = chunk_sizes(len(share), self.cfg.rollout.groups_per_chunk)
        self.streams[index] = chunk_stream(
            self.workers.rollouts[index],
            share,
            self.group_offset + offset,
            self.sampling,
            self.cfg.rollout.groups_per_chunk,
            version,
        )

    @property
    def arrived(self) -> bool:
        """Every chunk is in (its scoring may still run)."""
        return not self.streams

    @property
    def done(self) -> bool:
        return self.arrived and all(c.scored is not None for chunks in self.chunks.values() for c in chunks)

    def advance(self, timeout: float = 1.0) -> None:
        """Wait (up to `timeout` s) for a chunk to arrive or a scoring to finish, and take what did:
        an arrived chunk's scoring starts; a finished scoring is collected (CallFailed when a call
        failed: a rollout or reward worker died)."""
        scoring = [c for chunks in self.chunks.values() for c in chunks if c.scored is None]
        waiting = list(self.streams.values()) + [ref for c in scoring for ref in _task_refs(c.tasks)]
        if waiting:
            ray.wait(waiting, num_returns=1, timeout=timeout, fetch_local=False)
        arrived = sum(len(chunks) for chunks in self.chunks.values()) + len(self.streams)
        for index, stream in list(self.streams.items()):
            self._take_arrivals(index, stream)
        for chunk in scoring:
            refs = _task_refs(chunk.tasks)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
            if len(ready) == len(refs):
                chunk.scored = collect_scores(chunk.tasks, self.cfg.reward.model.weight)
        now = time.monotonic()
        if sum(len(chunks) for chunks in self.chunks.values()) + len(self.streams) != arrived or any(
            c.scored for c in scoring
        ):
            self.progressed = now
        elif now - self.progressed > self.cfg.weight_sync.timeout_s:
            owing = [f"rollout-{index}" for index in sorted(self.streams)] or ["the reward workers scoring it"]
            raise StalledError(
                f"streamed rollout made no progress for {self.cfg.weight_sync.timeout_s:g} s "
                f"(weight_sync.timeout_s): no chunk and no score from {', '.join(owing)}; raise "
                "weight_sync.timeout_s if one chunk legitimately takes longer"
            )

    def _take_arrivals(self, index: int, stream) -> None:
        while True:
            ready, _ = ray.wait([stream], num_returns=1, timeout=0, fetch_local=False)
            if not ready:
                return
            try:
                ref = next(stream)
            except StopIteration:
                del self.streams[index]
                return
            owed = self.due[index]
            groups = owed[len(self.chunks[index])] if len(self.chunks[index]) < len(owed) else owed[-1]
            rows = groups * self.sampling.samples_per_prompt
            self.chunks[index].append(Chunk(ref, rows, score_tasks(self.workers, ref, rows)))

    def cancel(self) -> None:
        """Stop every stream still yielding: the workers abort the requests still generating."""
        for stream in self.streams.values():
            ray.cancel(stream)
        self.streams.clear()

    def reissue_lost_scoring(self, index: int) -> int:
        """After reward worker `index` was replaced: its unfinished parts of every chunk, again."""
        return sum(
            reissue_lost_part(self.workers.rewards, c.tasks, index, c.ref, c.rows)
            for chunks in self.chunks.values()
            for c in chunks
            if c.scored is None
        )

    def scored_chunks(self) -> list[tuple[object, int, ScoredSlice]]:
        """Every scored chunk as (ref, rows, scores), worker by worker, each in arrival order."""
        return [
            (c.ref, c.rows, c.scored)
            for index in sorted(self.chunks)
            for c in self.chunks[index]
            if c.scored is not None
        ]


def group_order(scored: list[ScoredSlice], end: int) -> np.ndarray:
    """The chunks' rows (one after the other) in group order, a group's in sample order, those of
    groups from `end` on left out: the rows are the seed's whichever group finished first, and
    only the groups the stop rule kept stay."""
    group_ids = np.concatenate([s.group_ids for s in scored])
    order = np.argsort(group_ids, kind="stable")
    return order[group_ids[order] < end]


def _task_refs(tasks: tuple) -> list:
    parts, model = tasks
    return list(parts.values()) + ([model] if model is not None else [])


@dataclass
class StreamedFlight(Flight):
    streamed: StreamedRollout | None = None


class Streamed(RolloutKind):
    """rollout.groups_per_chunk > 0: groups scored as they finish; the recipe's stop rule may end
    the rollout once the batch's first groups, read in id order, hold what it needs."""

    def __init__(self, cfg: Config, workers: Workers, recovery):
        self.cfg, self.workers, self.recovery = cfg, workers, recovery

    def issue(self, prompts: list[Prompt], sampling: SamplingSettings, group_offset: int, version: int) -> Flight:
        streamed = StreamedRollout(self.cfg, self.workers, prompts, sampling, group_offset, version)
        return StreamedFlight(prompts, sampling, group_offset, version, streamed)

    def generated(self, flight: StreamedFlight) -> bool:
        return flight.streamed.arrived

    def cancel(self, flight: StreamedFlight) -> None:
        flight.streamed.cancel()

    def collect(self, flight: StreamedFlight, timer, current: int, stop: StopRule | None) -> ScoredBatch:
        cut = self._drive(flight, timer, current, stop)
        chunks = flight.streamed.scored_chunks()
        scored = [c[2] for c in chunks]
        kept = len(flight.prompts) if cut is None else cut
        return ScoredBatch(
            [c[0] for c in chunks],
            [c[1] for c in chunks],
            scored,
            flight.group_offset,
            order=group_order(scored, flight.group_offset + kept),
            unused_groups=len(flight.prompts) - kept,
        )

    def _drive(self, flight: StreamedFlight, timer, current: int, stop: StopRule | None) -> int | None:
        """Run the stream until every chunk is in and scored, or until `stop` says how many of the
        batch's groups to keep; then the rest is cancelled. Returns that count, None: all."""
        streamed, num_groups = flight.streamed, len(flight.prompts)
        while not streamed.done:
            with timer("reward" if streamed.arrived else "rollout"):
                try:
                    streamed.advance()
                except CallFailed as failed:
                    self._recover(failed, flight, current)
                    continue
            if stop is not None and (chunks := streamed.scored_chunks()):
                cut = stop([scored for _, _, scored in chunks], streamed.group_offset, num_groups)
                if cut is not None and cut < num_groups:
                    streamed.cancel()
                    return cut
        return None

    def _recover(self, failed: CallFailed, flight: StreamedFlight, current: int) -> None:
        """The dead worker replaced, then what it held issued again: a reward worker's unfinished
        scoring calls, or a rollout worker's whole share (its chunks that had arrived are dropped)."""
        if self.recovery is None:
            raise failed.cause from None
        role, index = self.recovery.recover(failed.cause)
        if role == "reward":
            parts = flight.streamed.reissue_lost_scoring(index)
            self.recovery.log(f"re-issued reward-{index}'s {parts} unfinished scoring calls")
            return
        share, _ = worker_share(flight.prompts, index, len(self.workers.rollouts))
        self.recovery.reissued_prompts += len(share)
        self.recovery.reissue(flight.version, current, lambda: flight.streamed.issue(index, flight.version))
        self.recovery.log(f"re-issued rollout-{index}'s {len(share)} prompts")
