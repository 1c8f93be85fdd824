"""Calls to the rollout and reward actors, and the waits on them.

A step's prompts are split evenly across the rollout workers, each returning one RolloutSlice ref
per learner rank; each slice's rows are split evenly across the reward workers. A worker that died
is found from the error of the call that waited on it (`CallFailed` carries it to the rollout
service, cluster/rollout_service.py, which decides what to issue again); cluster/recovery.py
brings it back. Called by: the rollout service, evaluation, the learners' update.

Naming rule (from OpenRLHF): functions here that return object references end in `_refs`.
"""

from __future__ import annotations

import ray

from grpo_ray.cluster.placement import ClusterError
from grpo_ray.cluster.roles import Workers
from grpo_ray.cluster.shares import pool_bounds, worker_share
from grpo_ray.cluster.tasks import task_cancelled
from grpo_ray.types import Prompt, SamplingSettings, ScoredSlice


class StalledError(ClusterError):
    """A phase whose calls stopped returning for weight_sync.timeout_s; names the phase and the workers."""


class CallFailed(RuntimeError):
    """A rollout or reward call failed; `cause` is Ray's error (WorkerRecovery reads which actor)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def wait_for(refs: list, owners: dict | None = None, stall_s: float | None = None, phase: str = "rollout") -> None:
    """Until every ref is ready, without pulling the data here (the driver only forwards slices).

    stall_s: when no ref became ready for that long, the phase has stopped making progress: one
    line naming the phase and the workers (`owners`: ref -> name) still owing a result."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=stall_s, fetch_local=False)
        if not ready:
            names = sorted({(owners or {}).get(ref, "?") for ref in pending})
            raise StalledError(
                f"{phase} made no progress for {stall_s:g} s (weight_sync.timeout_s): nothing came back "
                f"from {', '.join(names)}; raise weight_sync.timeout_s if one call legitimately takes longer"
            )


def finished(refs: list) -> bool:
    """Whether every call behind `refs` has returned, without waiting or fetching."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
    return len(ready) == len(refs)


def fetch(ref):
    return ray.get(ref)


def rollout_owners(per_worker: list[list]) -> dict:
    """ref -> "rollout-i" for rollout_refs' result (what a stalled wait names)."""
    return {ref: f"rollout-{index}" for index, refs in enumerate(per_worker) for ref in refs}


def rollout_refs(
    rollouts: list,
    prompts: list[Prompt],
    sampling: SamplingSettings,
    num_slices: int,
    group_offset: int = 0,
    version: int | None = None,
) -> list[list]:
    """Split prompts evenly across workers; per worker, `num_slices` RolloutSlice refs. `version`: the
    weights every worker must hold (a worker restarted while idle refuses, see StaleWeightsError)."""
    refs = []
    for i, worker in enumerate(rollouts):
        share, offset = worker_share(prompts, i, len(rollouts))
        refs.append(generate_refs(worker, share, group_offset + offset, sampling, num_slices, version))
    return refs


def generate_refs(
    worker,
    prompts: list[Prompt],
    group_offset: int,
    sampling: SamplingSettings,
    num_slices: int,
    version: int | None = None,
) -> list:
    out = worker.generate.options(num_returns=num_slices).remote(prompts, group_offset, sampling, num_slices, version)
    return out if num_slices > 1 else [out]


def chunk_stream(
    worker,
    prompts: list[Prompt],
    group_offset: int,
    sampling: SamplingSettings,
    groups_per_chunk: int,
    version: int | None = None,
):
    """A streaming call: an ObjectRefGenerator of RolloutSlice refs, one per `groups_per_chunk`
    finished groups (RolloutWorker.generate_chunks). ray.cancel(stream) makes the worker abort."""
    return worker.generate_chunks.options(num_returns="streaming").remote(
        prompts, group_offset, sampling, groups_per_chunk, version, task_cancelled
    )


def score_slices(workers: Workers, model_weight: float, slice_refs: list, rows: list[int]) -> list[ScoredSlice]:
    """Every slice's rows split evenly across the reward workers, plus the reward model's score
    at `model_weight` (reward.model.weight)."""
    tasks = [score_tasks(workers, ref, n) for ref, n in zip(slice_refs, rows)]  # all in flight, then collected
    return [collect_scores(slice_tasks, model_weight) for slice_tasks in tasks]


def score_tasks(workers: Workers, slice_ref, rows: int) -> tuple[dict[int, object], object | None]:
    """One slice's scoring calls: the reward pool's parts of its rows, and the reward model's call."""
    model = workers.reward_model.score.remote(slice_ref) if workers.reward_model is not None else None
    return pool_tasks(workers.rewards, slice_ref, rows), model


def pool_tasks(rewards: list, slice_ref, rows: int) -> dict[int, object]:
    """The slice's rows split evenly across the reward workers: reward worker index -> its call,
    for the workers that get rows."""
    return {
        j: rewards[j].score.remote(slice_ref, start, stop)
        for j, (start, stop) in enumerate(pool_bounds(rows, len(rewards)))
        if start < stop
    }


def reissue_lost_part(
    rewards: list, tasks: tuple[dict[int, object], object | None], worker: int, slice_ref, rows: int
) -> int:
    """After reward worker `worker` was replaced: call it again for its part of the slice when that
    call did not finish (every call in flight on a dead actor fails; Ray does not retry them).
    Returns the number of calls issued again (0 or 1)."""
    parts = tasks[0]
    if worker not in parts or not call_lost(parts[worker]):
        return 0
    start, stop = pool_bounds(rows, len(rewards))[worker]
    parts[worker] = rewards[worker].score.remote(slice_ref, start, stop)
    return 1


def call_lost(ref) -> bool:
    """Whether a call's result is missing: it failed with an actor's death, or has not finished."""
    try:
        ray.get(ref, timeout=0)
        return False
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return True
    except ray.exceptions.RayError:  # the call itself failed: collecting it says how
        return False


def collect_scores(tasks: tuple[dict[int, object], object | None], model_weight: float) -> ScoredSlice:
    """The slice's scores, its parts concatenated, the reward model's (if called) added at
    `model_weight` (reward.model.weight); CallFailed when a call failed (a worker died)."""
    parts, model = tasks
    try:
        scored = ScoredSlice.concat(ray.get(list(parts.values())))
        return scored if model is None else scored.with_function("reward_model", ray.get(model), model_weight)
    except ray.exceptions.RayError as err:
        raise CallFailed(err) from err


def gather_fail_fast(calls: list) -> list:
    """Every call's result; the first failure ends the wait (CallFailed), since a dead learner rank
    leaves the others blocked in a collective that would never return."""
    pending = list(calls)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
        return ray.get(calls)
    except ray.exceptions.RayError as err:
        raise CallFailed(err) from err


def evaluation_refs(
    rollouts: list, prompts: list[Prompt], sampling: SamplingSettings, version: int
) -> tuple[list, list[int]]:
    """Held-out prompts split across the rollout workers, one slice each: (refs, rows of each).
    Uneven shares are fine here: evaluation slices do not go to the learners."""
    # np.array_split's shares: the first len % workers get one prompt more; empty shares are skipped.
    n, k = len(prompts), len(rollouts)
    sizes = [n // k + (i < n % k) for i in range(k)]
    refs, rows, start = [], [], 0
    for worker, size in zip(rollouts, sizes):
        if size:
            refs.append(worker.generate.remote(prompts[start : start + size], start, sampling, 1, version))
            rows.append(size * sampling.samples_per_prompt)
        start += size
    return refs, rows
