"""One step's training batch: the recipe's decisions on rolled-out, scored prompts.

    builder = BatchBuilder(cfg, workers, stream, recovery, policy_version=lambda: sync.version)
    batch = builder.next_batch(sampling, timer)   # StepBatch; batch.train is None: skip the step
    builder.prefetch(sampling_for, 1)             # pipelined rollout: the next step's batch starts now

In order, each a config switch:
1. sample: prompts_per_step prompts drawn with their seed and handed to the rollout service
   (cluster/rollout_service.py), which rolls them out, scores them and brings back any worker that
   dies on the way, so the batch is the one an unhurt run draws;
2. score and shape: the ScoredBatch's rows (training/rows.py), reward failures counted and the run
   stopped when a function fails too often, or too many episodes fail in the environment
   (envs/failures.py), with the generation's figures logged first; rewards clipped and normalised;
3. filter (DAPO dynamic sampling): more batches of prompts until the step holds prompts_per_step
   groups with a reward spread, or the tries run out (a streamed rollout stops once it has them);
4. rescue (POLARIS): an all-failed group gets the prompt's kept correct response in place of its
   first row;
5. substitute (POLARIS): non-informative groups are overwritten by copies of informative ones, or
   the batch is skipped.
Every generated row, trained on or not, updates the per-prompt ledger and the rescue buffer.
Decisions are made on the small arrays of `StepRows`; token arrays stay in the object store.
A batch started ahead (prefetch) was sampled by the weights the workers held then; its metrics say
how many updates old they are (batch/staleness) and every row carries its policy version.
Next hop: training/update.py turns the step's rows into the learners' slices.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from grpo_ray.algo.filters import GroupAccumulator, groups_needed
from grpo_ray.algo.reward_shaping import RewardShaper
from grpo_ray.algo.polaris import PromptLedger, RescueBuffer, informative_substitution, latest_correct_rows, rescue_plan
from grpo_ray.cluster.dispatch import fetch
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.roles import Workers
from grpo_ray.cluster.rollout_service import Flight, RolloutService
from grpo_ray.cluster.tasks import beside_data
from grpo_ray.config import Config, plan_batches, total_steps
from grpo_ray.data.prompts import PromptStream
from grpo_ray.envs.failures import TOOL_NOTICE_AFTER, EnvironmentMonitor, episode_counts
from grpo_ray.rewards.environment import NAME as ENVIRONMENT
from grpo_ray.rewards.monitor import FailureMonitor
from grpo_ray.training.errors import EnvironmentFailureError, RewardFailureError, RunStoppedError
from grpo_ray.training.metrics import generation_metrics
from grpo_ray.training.rows import (
    KeptResponse,
    Overlong,
    StepRows,
    batch_rows,
    failure_counts,
    preview_rewards,
    read_responses,
)
from grpo_ray.types import Prompt, SamplingSettings, ScoredSlice


@dataclass
class StepBatch:
    refs: list  # RolloutSlice refs of every generation batch of the step; StepRows.sources index them
    slice_rows: list[int]  # rows of each of those slices
    generated: StepRows  # every generated row: what the policy did (metrics, ledger)
    train: StepRows | None  # the rows to train on, plans_batches' size exactly; None: skip the step
    metrics: dict[str, float] = field(default_factory=dict)  # batch/* and polaris/* of this step


@dataclass
class Generation:
    """A batch of prompts in flight (the rollout service's Flight) and the data cursor before it was
    drawn (a checkpoint rewinds to it). Pipelined rollout starts generations a step or more ahead."""

    flight: Flight
    cursor: dict


class BatchBuilder:
    def __init__(
        self,
        cfg: Config,
        workers: Workers,
        stream: PromptStream,
        recovery: WorkerRecovery | None = None,
        policy_version: Callable[[], int] = lambda: 0,
        log: Callable[[str], None] = lambda line: None,
    ):
        """log: where a warning line goes (the run's console)."""
        self.cfg = cfg
        self.workers = workers
        self.stream = stream
        self.service = RolloutService(cfg, workers, recovery)  # issue, wait, score, recover
        self.policy_version = policy_version  # the weights version the rollout workers hold now
        self.plan = plan_batches(cfg)
        self.failures = FailureMonitor(cfg.reward.failure_window_steps, cfg.reward.max_failure_rate)
        # Episodes: their failures under the environment's own rate, and a word on tools never called
        # or always failing after the first steps (envs/failures.py).
        self.environment = (
            EnvironmentMonitor(
                cfg.reward.failure_window_steps,
                cfg.environment.max_failure_rate,
                notice_after=min(TOOL_NOTICE_AFTER, total_steps(cfg)),
            )
            if cfg.environment.spec
            else None
        )
        self.log = log
        self.ledger = PromptLedger()
        self.rescue = RescueBuffer()
        self.shaper = RewardShaper(cfg.reward.clip, cfg.reward.normalize)  # reward.clip / reward.normalize
        a = cfg.algorithm
        self.overlong = Overlong(a.overlong, a.overlong_buffer, a.overlong_penalty)
        self.rng = np.random.default_rng([cfg.seed, 11])  # substitution's draws
        self.batches_drawn = 0  # generation batches so far: each samples with its own seed (1, 2, ...)
        self.pending: deque[Generation] = deque()  # started ahead of their step (rollout.max_staleness)
        self.last_batch: StepBatch | None = None  # for the sample tables
        # This step's groups its rollouts stopped without (dynamic sampling); None: they cannot stop early.
        self.unused_groups: int | None = None

    def prefetch(self, sampling_for: Callable[[int], SamplingSettings], count: int) -> None:
        """Start the next `count` steps' first generation batches now, with the weights the workers
        hold, so that they run while the learner updates (pipelined rollout). sampling_for(k): the
        sampling of the step k steps after the current one (the k-th batch queued)."""
        for _ in range(count):
            self.pending.append(self._start(sampling_for(len(self.pending) + 1), group_offset=0))

    def ahead(self) -> tuple[int, int]:
        """(batches started ahead, how many of them have finished generating), without waiting: read
        at the end of an update, what overlapped it. A streamed batch counts as generated once the
        builder has seen its last chunk."""
        generated = sum(self.service.generated(g.flight) for g in self.pending)
        return len(self.pending), generated

    def discard_pending(self) -> None:
        """Forget the batches started ahead (their prompts and seeds will be drawn again): before the
        prompts change at a stage end."""
        if self.pending:
            self._rewind(self.pending[0].cursor)
            for generation in self.pending:
                self.service.cancel(generation.flight)
            self.pending.clear()

    def next_batch(self, sampling: SamplingSettings, timer) -> StepBatch:
        cfg = self.cfg
        p = self.plan.prompts_per_step
        refs: list = []
        slice_rows: list[int] = []
        generations: list[StepRows] = []
        versions: list[int] = []
        accumulator = (
            GroupAccumulator(p, cfg.algorithm.dynamic_sampling_max_tries) if cfg.algorithm.dynamic_sampling else None
        )
        self.unused_groups = None
        if self.pending:
            generation = self.pending.popleft()
        else:
            with timer("rollout"):  # asking for the rollout is part of it (~2 ms of Ray calls)
                generation = self._start(sampling, group_offset=0)
        while True:
            versions.append(generation.flight.version)
            need = None if accumulator is None else accumulator.target_groups - accumulator.num_groups
            rows = self._finish(generation, refs, slice_rows, timer, need)
            generations.append(rows)
            if accumulator is None:
                break
            accumulator.add(len(generations) - 1, rows.rewards, rows.group_ids)
            if accumulator.done:
                break
            # Group ids run on across tries, so groups of different tries never merge.
            with timer("rollout"):
                generation = self._start(sampling, group_offset=len(generations) * p)
        generated = StepRows.concat(generations)
        # Updates between the weights that sampled the oldest batch and the learner's now.
        metrics = {
            "batch/generation_tries": float(len(generations)),
            "batch/staleness": float(self.policy_version() - min(versions)),
            "batch/policy_version": float(min(versions)),
        }
        if self.unused_groups is not None and accumulator is not None:
            metrics["batch/unused_groups"] = float(self.unused_groups)
        train = generated if accumulator is None else self._dynamic_sample(generated, generations, accumulator, metrics)

        if train is not None and cfg.polaris.rescue:
            train = self._rescue(train, metrics)
        self.ledger.record(generated.prompt_uids, generated.rewards)
        if cfg.polaris.rescue:
            self._keep_correct(refs, generated)
        if train is not None and cfg.polaris.substitution:
            train = self._substitute(train, metrics)
        metrics["polaris/ledger_prompts"] = float(len(self.ledger))
        metrics.update(self.shaper.metrics())
        # Two runs drew the same prompts in the same order at this step exactly when these agree.
        metrics["batch/prompt_digest"] = float(zlib.crc32(generated.prompt_uids.astype(np.int64).tobytes()))
        self.last_batch = StepBatch(refs, slice_rows, generated, train, metrics)
        if self.environment is not None and (notice := self.environment.end_batch()) is not None:
            self.log(notice)
        return self.last_batch

    # -- rollout and scoring ---------------------------------------------------------------------

    def _start(self, sampling: SamplingSettings, group_offset: int) -> Generation:
        """Draw the next prompts and their seed, and have them rolled out and scored; nothing is waited for."""
        cursor = self._cursor()
        prompts = self.stream.take(self.plan.prompts_per_step)
        self.batches_drawn += 1
        sampling = replace(sampling, seed=self.cfg.seed * 1_000_003 + self.batches_drawn)
        return Generation(self.service.issue(prompts, sampling, group_offset, self.policy_version()), cursor)

    def _finish(
        self, generation: Generation, refs: list, slice_rows: list[int], timer, need: int | None = None
    ) -> StepRows:
        """A generation's rows, once rolled out and scored (the rollout service); appends its slice refs
        to `refs` (and their row counts to `slice_rows`), so the rows' sources index `refs`. need: the
        informative groups dynamic sampling still needs (a streamed rollout stops once it has them)."""
        flight = generation.flight
        max_new_tokens = flight.sampling.max_new_tokens
        preview = partial(
            preview_rewards, max_new_tokens=max_new_tokens, overlong=self.overlong, clip=self.cfg.reward.clip
        )
        stop = None if need is None else partial(_enough_groups, need=need, preview=preview)
        batch = self.service.collect(flight, timer, self.policy_version(), stop)
        if batch.unused_groups is not None:  # groups dynamic sampling did not need: aborted, or finished unread
            self.unused_groups = (self.unused_groups or 0) + batch.unused_groups
        with timer("reward"):
            rows = self._accepted(batch_rows(batch, max_new_tokens, len(refs), self.overlong), batch.scored)
        refs.extend(batch.refs)
        slice_rows.extend(batch.rows)
        return rows

    def _accepted(self, rows: StepRows, scored: list[ScoredSlice]) -> StepRows:
        """A generation's rows, on either path: the reward failures of what it scored counted (the run
        stops once a function fails too often), then the rows clipped and normalised (reward.clip / reward.normalize)
        before anything reads the rewards. A failed episode is the environment's failure, not its
        reward function's: it counts under environment.max_failure_rate. The error that stops the
        run carries the generation's figures (what failed, by kind), which the loop logs first."""
        failures, completions, first_errors = failure_counts(scored)
        if self.environment is not None:
            failures.pop(ENVIRONMENT, None)
            self.environment.record(*episode_counts(scored))
            if (stop := self.environment.check()) is not None:
                raise EnvironmentFailureError(stop, generation_metrics(rows))
        self.failures.record(failures, completions, first_errors)
        if (stop := self.failures.check()) is not None:
            raise RewardFailureError(stop, generation_metrics(rows))
        if self.shaper.active:
            rows = rows.with_rewards(self.shaper([rows.rewards], [rows.row_weights])[0])
        return rows

    # -- dynamic sampling ------------------------------------------------------------------------

    def _dynamic_sample(
        self, generated: StepRows, generations: list[StepRows], accumulator: GroupAccumulator, metrics
    ) -> StepRows | None:
        """The informative groups collected, padded to the batch size with rows out of the loss.
        `generated` is the generations concatenated."""
        offsets = np.cumsum([0] + [len(g) for g in generations])
        kept = [offsets[key] + rows for key, rows in accumulator.take()]
        index = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
        metrics["batch/dropped_groups"] = float(accumulator.dropped_groups)
        metrics["batch/kept_groups"] = float(len(index) // self.cfg.rollout.samples_per_prompt)
        if len(index) == 0:
            return None
        short = self.plan.completions_per_step - len(index)
        metrics["batch/padded_rows"] = float(short)
        if short == 0:
            return generated.select(index)
        # DeepSpeed steps after a fixed number of micro-batches per rank, so the batch keeps its
        # size: the missing rows are copies with weight 0 (no loss, not counted by the normalisers).
        padding = generated.select(np.resize(index, short))
        padding = padding.with_weights(np.zeros(short)).with_group_ids(np.full(short, -1))
        return StepRows.concat([generated.select(index), padding])

    # -- POLARIS ---------------------------------------------------------------------------------

    def _rescue(self, train: StepRows, metrics) -> StepRows:
        threshold = self.cfg.polaris.correct_threshold
        # Rows out of the loss (padding, masked overlong) neither make a group all-failed nor get rescued.
        rewards = np.where(train.row_weights > 0, train.rewards, np.nan)
        plan = rescue_plan(rewards, train.group_ids, train.prompt_uids, self.rescue, threshold)
        for row, uid in plan:
            train = train.with_replacement(row, KeptResponse(**self.rescue.get(uid)))
        metrics["polaris/rescued_groups"] = float(len(plan))
        return train

    def _keep_correct(self, refs: list, generated: StepRows) -> None:
        """Record the latest correct response of every prompt that has one in this step."""
        latest = latest_correct_rows(generated.rewards, generated.prompt_uids, self.cfg.polaris.correct_threshold)
        by_source: dict[int, list[int]] = {}
        for i in latest.values():
            by_source.setdefault(int(generated.sources[i]), []).append(i)
        calls = []
        for source, rows in by_source.items():
            scores = [
                (float(generated.rewards[i]), {n: float(v[i]) for n, v in generated.per_function.items()}) for i in rows
            ]
            calls.append(
                (rows, beside_data(read_responses, refs[source], [int(generated.rows[i]) for i in rows], scores))
            )
        for rows, call in calls:
            for i, response in zip(rows, fetch(call)):
                # Stored as a plain dict: the buffer goes into checkpoints as JSON.
                self.rescue.record(int(generated.prompt_uids[i]), response.__dict__)

    def _substitute(self, train: StepRows, metrics) -> StepRows | None:
        result = informative_substitution(train.rewards, train.group_ids, self.plan.prompts_per_step, self.rng)
        metrics["polaris/informative_groups"] = float(result.num_informative)
        metrics["polaris/substituted_groups"] = float(result.num_substituted)
        if result.skip_batch:
            return None
        return train.select(result.row_order).with_group_ids(result.new_group_ids)

    # -- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything a resumed run needs to draw the same batches (JSON): the data cursor and the
        prompts still in play (drop-easy shrinks them), the sampling-seed counter (the rollout
        engines' only randomness), substitution's RNG, the ledger, rescue buffer and failure window."""
        # Batches started ahead are not in the checkpoint: a resumed run draws them again.
        cursor = self.pending[0].cursor if self.pending else self._cursor()
        return {
            "stream": {**cursor["stream"], "uids": [p.uid for p in self.stream.prompts]},
            "batches_drawn": cursor["batches_drawn"],
            "rng": self.rng.bit_generator.state,
            "ledger": self.ledger.state_dict(),
            "rescue": self.rescue.state_dict(),
            "failures": self.failures.state_dict(),
            "environment_failures": None if self.environment is None else self.environment.state_dict(),
            "reward_shaper": self.shaper.state_dict(),
        }

    def _cursor(self) -> dict:
        return {"stream": self.stream.state(), "batches_drawn": self.batches_drawn}

    def _rewind(self, cursor: dict) -> None:
        self.stream = PromptStream(self.stream.prompts, seed=self.cfg.seed, **cursor["stream"])
        self.batches_drawn = cursor["batches_drawn"]

    def load_state_dict(self, state: dict, all_prompts: list[Prompt]) -> None:
        stream = state["stream"]
        in_play = set(stream["uids"])
        prompts = [p for p in all_prompts if p.uid in in_play]
        if len(prompts) != len(in_play):
            raise RunStoppedError(
                f"the checkpoint's data cursor names {len(in_play)} prompts, {len(prompts)} of them are in this "
                "run's data; resume with the data files the run started with"
            )
        self.stream = PromptStream(prompts, seed=self.cfg.seed, epoch=stream["epoch"], position=stream["position"])
        self.batches_drawn = int(state["batches_drawn"])
        self.rng.bit_generator.state = state["rng"]
        self.ledger.load_state_dict(state["ledger"])
        self.rescue.load_state_dict(state["rescue"])
        self.failures.load_state_dict(state["failures"])
        if self.environment is not None:  # absent in checkpoints from before it
            self.environment.load_state_dict(state.get("environment_failures"))
        self.shaper.load_state_dict(state.get("reward_shaper"))  # absent in checkpoints from before it


def _enough_groups(scored: list[ScoredSlice], first_group: int, num_groups: int, need: int, preview) -> int | None:
    """The stop rule handed to a streamed rollout (rollout_kinds.StopRule): how many of the batch's
    groups, read in id order, hold the `need` informative groups dynamic sampling still wants, judged
    on `preview`'s rewards; None while the chunks scored so far do not settle it."""
    rewards = np.concatenate([preview(chunk) for chunk in scored])
    group_ids = np.concatenate([chunk.group_ids for chunk in scored])
    return groups_needed(rewards, group_ids, first_group, num_groups, need)
