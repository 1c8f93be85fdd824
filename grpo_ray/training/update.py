"""From a step's training rows to one optimizer step on every learner rank.

    payloads, sizes = learner_payloads(batch, num_ranks, pad_id)   # per rank: RolloutSlice refs, row counts
    train, kl = kl_reward_penalty(workers, payloads, train, ...)   # only with algorithm.kl_placement: reward
    advantages = group_advantages(train, estimator, normalize_by_std)
    slopes = turn_slopes(train, estimator, normalize_by_std, per_turn)  # None unless environment.reward_per_turn
    stats = run_update(workers, payloads, sizes, train, advantages, ref_refs, step, ..., slopes=slopes)

Rank r trains on the r-th contiguous cut of the rows. When that cut is whole rollout slices, in
order, the learner fetches them as they are; otherwise (rows were dropped, copied or replaced) a
small task assembles the rank's slice next to the data first.

Next hop: the learners' call (cluster/roles.py `Workers.update`, actors/learner.py `train_step`),
then the weight sync (cluster/weight_broadcast.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from grpo_ray.algo import advantage_slopes, compute_advantages
from grpo_ray.cluster.dispatch import CallFailed, fetch, gather_fail_fast
from grpo_ray.cluster.placement import ClusterError, error_line
from grpo_ray.cluster.roles import Workers
from grpo_ray.cluster.tasks import beside_data
from grpo_ray.training.batch import StepBatch
from grpo_ray.training.distill import Taught
from grpo_ray.training.rows import StepRows, assemble_slices
from grpo_ray.types import LearnerShard, LearnerStats


def learner_payloads(batch: StepBatch, num_ranks: int, pad_id: int) -> tuple[list[list], list[list[int]]]:
    """(per rank: its RolloutSlice refs, per rank: the row count of each of those refs)."""
    payloads, sizes = [], []
    for plan in batch.train.split(num_ranks):
        whole = plan.whole_slices(batch.slice_rows)
        if whole is not None:
            payloads.append([batch.refs[s] for s in whole])
            sizes.append([batch.slice_rows[s] for s in whole])
        else:
            payloads.append([beside_data(assemble_slices, plan, pad_id, *[batch.refs[s] for s in plan.sources_used])])
            sizes.append([len(plan.rows)])
    return payloads, sizes


def reference_signal(
    workers: Workers,
    payloads: list[list],
    train: StepRows,
    temperature: float,
    estimator: str,
    kl_coef: float,
    kl_in_loss: bool,
    metrics: dict[str, float],
) -> tuple[StepRows, list[list] | None]:
    """The reference's part of a step (algorithm.kl_coef > 0): (the rows, their rewards less the KL
    penalty when the KL is in the reward; per rank the reference log-prob refs of its slices when it
    is in the loss, else None). The penalty's mean KL goes into `metrics` (kl/reward_penalty_kl)."""
    if workers.reference is None:
        return train, None
    if kl_in_loss:
        return train, workers.reference_logprobs(payloads, temperature)
    train, metrics["kl/reward_penalty_kl"] = kl_reward_penalty(
        workers, payloads, train, temperature, estimator, kl_coef
    )
    return train, None


def kl_reward_penalty(
    workers: Workers, payloads: list[list], train: StepRows, temperature: float, estimator: str, kl_coef: float
) -> tuple[StepRows, float]:
    """Rewards minus kl_coef (this step's: algorithm.kl_controller) x the completion's KL to the
    reference by `estimator` (algorithm.kl_estimator), rows out of the loss untouched; also the mean
    KL of the rows in the loss."""
    kl = np.concatenate(fetch(workers.reference_sequence_kl(payloads, temperature, estimator)))
    in_loss = train.row_weights > 0
    rewards = np.where(in_loss, train.rewards - kl_coef * kl, train.rewards)
    return train.with_rewards(rewards), float(kl[in_loss].mean()) if in_loss.any() else 0.0


def group_advantages(rows: StepRows, estimator: str, normalize_by_std: bool, of=compute_advantages) -> np.ndarray:
    """[N] advantages by `estimator` (algorithm.advantage, algorithm.normalize_by_std). Failed rows
    (NaN) and rows out of the loss get 0 and stay out of group stats. of=advantage_slopes: each
    row's advantage per unit of its own reward instead (per-turn credit), 0 for the same rows."""
    valid = np.isfinite(rows.rewards) & (rows.row_weights > 0)
    advantages = np.zeros(len(rows), dtype=np.float32)
    if valid.any():
        advantages[valid] = of(
            estimator,
            torch.from_numpy(rows.rewards[valid]).float(),
            torch.from_numpy(rows.group_ids[valid]),
            normalize_by_std=normalize_by_std,
        ).numpy()
    return advantages


def turn_slopes(rows: StepRows, estimator: str, normalize_by_std: bool, per_turn: bool) -> np.ndarray | None:
    """With per-turn credit (per_turn: environment.reward_per_turn), each row's advantage per unit of
    its own reward (algo.advantage_slopes), which the learner turns into per-token advantages; else None."""
    if not per_turn:
        return None
    return group_advantages(rows, estimator, normalize_by_std, of=advantage_slopes)


def run_update(
    workers: Workers,
    payloads: list[list],
    sizes: list[list[int]],
    train: StepRows,
    advantages: np.ndarray,
    ref_refs: list[list] | None,
    step: int,
    temperature: float,
    norm_length: float,
    while_running: Callable[[], None] | None = None,
    kl_coef: float | None = None,
    slopes: np.ndarray | None = None,
    taught: Taught | None = None,
    distill_coef: float | None = None,
) -> list[LearnerStats]:
    """One optimizer step on every rank; the loss normalisers count the whole step's loss rows.
    taught (distillation, training/distill.py): per rank, the teachers' log-prob refs of its slices,
    teacher by teacher; each token's advantage then moves by distill_coef x its reverse KL.

    `while_running` is called once every rank has its call, before waiting for them: the driver's
    own work there (queueing the next batches' rollout) overlaps the update instead of delaying it.
    """
    # Normalisers count what is in the loss: weighted tokens, and sequences that have any token
    # (aggregation skips empty rows too).
    global_tokens = float((train.completion_lengths * train.row_weights).sum())
    global_sequences = int(((train.completion_lengths > 0) & (train.row_weights > 0)).sum())
    bounds = np.cumsum([0] + [n for rank_sizes in sizes for n in rank_sizes])
    cut = lambda values, k: values[bounds[k] : bounds[k + 1]]  # noqa: E731 - k-th payload's rows
    shards, k = [], 0
    for rank in range(len(workers.learners)):
        mine = range(k, k + len(payloads[rank]))
        k += len(payloads[rank])
        shards.append(
            LearnerShard(
                step=step,
                advantages=[cut(advantages, i) for i in mine],
                row_weights=[cut(train.row_weights, i) for i in mine],
                global_tokens=max(global_tokens, 1.0),
                global_sequences=global_sequences,
                temperature=temperature,
                norm_length=norm_length,
                kl_coef=kl_coef,
                advantage_slopes=None if slopes is None else [cut(slopes, i) for i in mine],
                distill_coef=distill_coef,
                teachers=taught.names if taught else (),
            )
        )
    # Beside each rank's slices: their reference log-probs, then the teachers' (actors/learner_batch.split_payload).
    beside = [
        (ref_refs[rank] if ref_refs else []) + (taught.refs[rank] if taught else []) for rank in range(len(shards))
    ]
    calls = workers.update(shards, payloads, beside)
    if while_running is not None:
        while_running()
    try:
        return gather_fail_fast(calls)
    except CallFailed as failed:
        raise ClusterError(f"learner update failed at step {step}: {error_line(failed.cause)}") from None
