"""One step's training batch: rollout and scoring, then the batch-level techniques of the recipe.

    builder = BatchBuilder(cfg, workers, stream)
    batch = builder.next_batch(sampling, step, timer)   # StepBatch; batch.train is None: skip the step

In order, each a config switch:
1. rollout + scoring of prompts_per_step prompts; with dynamic sampling (DAPO), more batches of
   prompts until the step holds prompts_per_step groups with a reward spread, or the tries run out;
2. rollout rescue (POLARIS): an all-failed group gets the prompt's kept correct response in place of
   its first row;
3. informative substitution (POLARIS): non-informative groups are overwritten by copies of
   informative ones, or the batch is skipped.
Every generated row, trained on or not, updates the per-prompt ledger and the rescue buffer.
Decisions are made on the small arrays of `StepRows`; token arrays stay in the object store.
A rollout or reward worker that dies mid-batch is replaced (cluster/recovery.py) and only what it
held is issued again, with the same sampling seed: the batch is the one an unhurt run draws.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace

import numpy as np
import ray

from grpo_ray.algo.filters import GroupAccumulator
from grpo_ray.algo.overlong import shape_overlong_rewards
from grpo_ray.algo.polaris import PromptLedger, RescueBuffer, informative_substitution, latest_correct_rows, rescue_plan
from grpo_ray.batching import KeptResponse, StepRows, read_response
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.roles import Workers
from grpo_ray.config import Config, plan_batches
from grpo_ray.data.prompts import PromptStream
from grpo_ray.rewards.monitor import FailureMonitor
from grpo_ray.types import Prompt, SamplingSettings, ScoredSlice


class RunStoppedError(RuntimeError):
    """The run cannot usefully go on; the message is one line that says why and what to change."""


class RewardFailureError(RunStoppedError):
    """A reward function failed on too many completions; the message names it and its first error."""


class NothingToLearnError(RunStoppedError):
    """Too many batches in a row had no learning signal, or drop-easy left no training prompt."""


@dataclass
class StepBatch:
    refs: list  # RolloutSlice refs of every generation batch of the step; StepRows.sources index them
    slice_rows: list[int]  # rows of each of those slices
    generated: StepRows  # every generated row: what the policy did (metrics, ledger)
    train: StepRows | None  # the rows to train on, plans_batches' size exactly; None: skip the step
    metrics: dict[str, float] = field(default_factory=dict)  # batch/* and polaris/* of this step


class BatchBuilder:
    def __init__(self, cfg: Config, workers: Workers, stream: PromptStream, recovery: WorkerRecovery | None = None):
        self.cfg = cfg
        self.workers = workers
        self.stream = stream
        self.recovery = recovery  # brings back a rollout or reward worker that died mid-step
        self.reissued_prompts = 0
        self.plan = plan_batches(cfg)
        self.failures = FailureMonitor(cfg.reward.failure_window_steps, cfg.reward.max_failure_rate)
        self.ledger = PromptLedger()
        self.rescue = RescueBuffer()
        self.rng = np.random.default_rng([cfg.seed, 11])  # substitution's draws
        self.batches_drawn = 0  # generation batches so far: each samples with its own seed (1, 2, ...)
        self.last_batch: StepBatch | None = None  # for the sample tables

    def next_batch(self, sampling: SamplingSettings, timer) -> StepBatch:
        cfg = self.cfg
        p = self.plan.prompts_per_step
        refs: list = []
        slice_rows: list[int] = []
        generations: list[StepRows] = []
        faults_before = (dict(self.recovery.replaced) if self.recovery else {}, self.reissued_prompts)
        accumulator = GroupAccumulator(p, cfg.algorithm.dynamic_sampling_max_tries) if cfg.algorithm.dynamic_sampling else None
        while True:
            # Group ids run on across tries, so groups of different tries never merge.
            rows = self._generate(self.stream.take(p), sampling, len(generations) * p, refs, slice_rows, timer)
            generations.append(rows)
            if accumulator is None:
                break
            accumulator.add(len(generations) - 1, rows.rewards, rows.group_ids)
            if accumulator.done:
                break
        generated = StepRows.concat(generations)
        metrics = {"batch/generation_tries": float(len(generations))}
        train = generated if accumulator is None else self._dynamic_sample(generated, generations, accumulator, metrics)

        if train is not None and cfg.polaris.rescue:
            train = self._rescue(train, metrics)
        self.ledger.record(generated.prompt_uids, generated.rewards)
        if cfg.polaris.rescue:
            self._keep_correct(refs, generated)
        if train is not None and cfg.polaris.substitution:
            train = self._substitute(train, metrics)
        metrics["polaris/ledger_prompts"] = float(len(self.ledger))
        if self.recovery is not None:
            for role in ("rollout", "reward"):
                metrics[f"faults/{role}_replaced"] = float(self.recovery.replaced[role] - faults_before[0].get(role, 0))
            metrics["faults/reissued_prompts"] = float(self.reissued_prompts - faults_before[1])
        # Two runs drew the same prompts in the same order at this step exactly when these agree.
        metrics["batch/prompt_digest"] = float(zlib.crc32(generated.prompt_uids.astype(np.int64).tobytes()))
        self.last_batch = StepBatch(refs, slice_rows, generated, train, metrics)
        return self.last_batch

    # -- rollout and scoring ---------------------------------------------------------------------

    def _generate(self, prompts: list[Prompt], sampling: SamplingSettings, group_offset: int,
                  refs: list, slice_rows: list[int], timer) -> StepRows:
        """Sample and score one batch of prompts; appends its slice refs to `refs` (and their row
        counts to `slice_rows`), so the returned rows' sources index `refs`."""
        workers = self.workers
        first_source = len(refs)
        self.batches_drawn += 1
        sampling = replace(sampling, seed=self.cfg.seed * 1_000_003 + self.batches_drawn)
        with timer("rollout"):
            per_worker = rollout_refs(workers.rollouts, prompts, sampling, len(workers.learners), group_offset)
            ray.wait(rank_major(per_worker), num_returns=len(workers.learners) * len(workers.rollouts), fetch_local=False)
        rows_per_slice = len(prompts) * sampling.samples_per_prompt // (len(workers.learners) * len(workers.rollouts))
        with timer("reward"):
            new_refs, scored = self._score_all(per_worker, prompts, sampling, group_offset, rows_per_slice)
            self.failures.record(*failure_counts(scored))
            if (stop := self.failures.check()) is not None:
                raise RewardFailureError(stop)
        refs.extend(new_refs)
        slice_rows.extend([rows_per_slice] * len(new_refs))
        rewards, weights = shape_rewards(self.cfg, scored, sampling.max_new_tokens)
        return StepRows.from_scored(scored, rewards, weights, first_source)

    def _score_all(self, per_worker: list[list], prompts: list[Prompt], sampling: SamplingSettings, group_offset: int,
                   rows_per_slice: int) -> tuple[list, list[ScoredSlice]]:
        """Score every slice. A rollout worker that died is replaced (WorkerRecovery) and only its
        share of the prompts is generated again, with the same seed; a reward worker that died is
        replaced and the slices not yet scored are scored again. Every prompt's group is then in
        the batch exactly once."""
        scored: dict[int, ScoredSlice] = {}
        while True:
            refs = rank_major(per_worker)
            tasks = {i: score_tasks(self.workers, ref, rows_per_slice) for i, ref in enumerate(refs) if i not in scored}
            try:
                for i, slice_tasks in tasks.items():
                    scored[i] = collect_scores(self.cfg, slice_tasks)
                return refs, [scored[i] for i in range(len(refs))]
            except ray.exceptions.RayError as err:
                if self.recovery is None:
                    raise
                role, index = self.recovery.recover(err)
                if role == "rollout":
                    share, offset = worker_share(prompts, index, len(self.workers.rollouts))
                    per_worker[index] = generate_refs(self.workers.rollouts[index], share, group_offset + offset, sampling,
                                                      len(self.workers.learners))
                    self.reissued_prompts += len(share)
                    # rank_major: the slice of rank r from worker w is at r * R + w.
                    for r in range(len(self.workers.learners)):
                        scored.pop(r * len(self.workers.rollouts) + index, None)
                    self.recovery.log(f"re-issued rollout-{index}'s {len(share)} prompts")

    # -- dynamic sampling ------------------------------------------------------------------------

    def _dynamic_sample(self, generated: StepRows, generations: list[StepRows], accumulator: GroupAccumulator,
                        metrics) -> StepRows | None:
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
            scores = [(float(generated.rewards[i]), {n: float(v[i]) for n, v in generated.per_function.items()}) for i in rows]
            calls.append((rows, read_responses.remote(refs[source], [int(generated.rows[i]) for i in rows], scores)))
        for rows, call in calls:
            for i, response in zip(rows, ray.get(call)):
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
        return {
            "stream": {**self.stream.state(), "uids": [p.uid for p in self.stream.prompts]},
            "batches_drawn": self.batches_drawn,
            "rng": self.rng.bit_generator.state,
            "ledger": self.ledger.state_dict(),
            "rescue": self.rescue.state_dict(),
            "failures": self.failures.state_dict(),
        }

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


@ray.remote(num_cpus=0)
def read_responses(batch, rows: list[int], scores: list[tuple[float, dict[str, float]]]) -> list[KeptResponse]:
    """Cut the given rows' completions out of a slice, where the slice is (for the rescue buffer)."""
    return [read_response(batch, row, reward, per_function) for row, (reward, per_function) in zip(rows, scores)]


@ray.remote(num_cpus=0)
def sample_rows(batch, count: int, rewards: list[float]) -> list[dict]:
    """The first `count` rows of a slice as table rows (prompt, completion, answer, reward)."""
    return [
        {"prompt": batch.prompts[i], "completion": batch.completions[i], "answer": batch.answers[i],
         "reward": rewards[i], "finish_reason": batch.finish_reasons[i]}
        for i in range(min(count, batch.num_rows))
    ]


# ---------------------------------------------------------------------------------------------
# Rollout and reward calls
# ---------------------------------------------------------------------------------------------


def rollout_refs(rollouts: list, prompts: list[Prompt], sampling: SamplingSettings, num_slices: int, group_offset: int = 0) -> list[list]:
    """Split prompts evenly across workers; per worker, `num_slices` RolloutSlice refs."""
    refs = []
    for i, worker in enumerate(rollouts):
        share, offset = worker_share(prompts, i, len(rollouts))
        refs.append(generate_refs(worker, share, group_offset + offset, sampling, num_slices))
    return refs


def worker_share(prompts: list[Prompt], index: int, num_workers: int) -> tuple[list[Prompt], int]:
    """Worker `index`'s prompts and the position of its first one."""
    per_worker = len(prompts) // num_workers
    return prompts[index * per_worker : (index + 1) * per_worker], index * per_worker


def generate_refs(worker, prompts: list[Prompt], group_offset: int, sampling: SamplingSettings, num_slices: int) -> list:
    out = worker.generate.options(num_returns=num_slices).remote(prompts, group_offset, sampling, num_slices)
    return out if num_slices > 1 else [out]


def rank_major(per_worker: list[list]) -> list:
    """Flatten [worker][rank] refs rank by rank: learner rank r's slices are then contiguous."""
    return [per_worker[w][r] for r in range(len(per_worker[0])) for w in range(len(per_worker))]


def score_slices(workers: Workers, cfg: Config, slice_refs: list, rows: list[int]) -> list[ScoredSlice]:
    """Every slice's rows split evenly across the reward workers, plus the reward model's score."""
    tasks = [score_tasks(workers, ref, n) for ref, n in zip(slice_refs, rows)]  # all in flight, then collected
    return [collect_scores(cfg, slice_tasks) for slice_tasks in tasks]


def score_tasks(workers: Workers, slice_ref, rows: int) -> tuple[list, object | None]:
    """One slice's scoring calls: the reward pool's parts of its rows, and the reward model's call."""
    model = workers.reward_model.score.remote(slice_ref) if workers.reward_model is not None else None
    return pool_tasks(workers.rewards, slice_ref, rows), model


def pool_tasks(rewards: list, slice_ref, rows: int) -> list:
    """The slice's rows split evenly across the reward workers: one call per worker with rows."""
    k = len(rewards)
    bounds = [rows * j // k for j in range(k + 1)]
    return [rewards[j].score.remote(slice_ref, bounds[j], bounds[j + 1]) for j in range(k) if bounds[j] < bounds[j + 1]]


def collect_scores(cfg: Config, tasks: tuple[list, object | None]) -> ScoredSlice:
    parts, model = tasks
    scored = ScoredSlice.concat(ray.get(parts))
    return scored if model is None else scored.with_function("reward_model", ray.get(model), cfg.reward.model.weight)


def pool_scores(rewards: list, slice_refs: list, rows: list[int]) -> list[ScoredSlice]:
    """Every slice's rows split evenly across the reward workers; one ScoredSlice per slice."""
    parts = [pool_tasks(rewards, ref, n) for ref, n in zip(slice_refs, rows)]
    return [ScoredSlice.concat(ray.get(per_slice)) for per_slice in parts]


def failure_counts(scored: list[ScoredSlice]) -> tuple[dict[str, int], int, dict[str, str]]:
    failures: dict[str, int] = {}
    first_errors: dict[str, str] = {}
    for part in scored:
        for name, count in part.failures.items():
            failures[name] = failures.get(name, 0) + count
        for name, error in part.first_errors.items():
            first_errors.setdefault(name, error)
    return failures, int(sum(len(s.rewards) for s in scored)), first_errors


def shape_rewards(cfg: Config, scored: list[ScoredSlice], max_new_tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per slice: rewards after the overlong treatment, and row loss weights (0 = out of the loss)."""
    a = cfg.algorithm
    shaped = [
        shape_overlong_rewards(s.rewards, s.completion_lengths, s.truncated, a.overlong,
                               max_new_tokens, a.overlong_buffer, a.overlong_penalty)
        for s in scored
    ]
    return [r for r, _ in shaped], [w for _, w in shaped]
