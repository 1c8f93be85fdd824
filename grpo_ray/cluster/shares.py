"""How a step's prompts and rows are split across rollout workers, learner ranks and reward workers.

Pure index arithmetic (no Ray): prompts split evenly across rollout workers; each worker returns one
slice per learner rank, flattened rank by rank; each slice's rows split evenly across the reward
workers. Recovery re-issues exactly one worker's share, so these must agree with the first issue.
"""

from __future__ import annotations

from grpo_ray.types import Prompt


def worker_share(prompts: list[Prompt], index: int, num_workers: int) -> tuple[list[Prompt], int]:
    """Worker `index`'s prompts and the position of its first one."""
    per_worker = len(prompts) // num_workers
    return prompts[index * per_worker : (index + 1) * per_worker], index * per_worker


def rank_major(per_worker: list[list]) -> list:
    """Flatten [worker][rank] refs rank by rank: learner rank r's slices are then contiguous."""
    return [per_worker[w][r] for r in range(len(per_worker[0])) for w in range(len(per_worker))]


def worker_positions(worker: int, num_workers: int, num_ranks: int) -> list[int]:
    """Where rollout worker `worker`'s slices sit in rank_major's order: rank r's is r * num_workers + worker."""
    return [r * num_workers + worker for r in range(num_ranks)]


def pool_bounds(rows: int, num_workers: int) -> list[tuple[int, int]]:
    """Reward worker j's rows [start, stop) of a slice, j = 0..num_workers-1: an even split."""
    bounds = [rows * j // num_workers for j in range(num_workers + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def chunk_sizes(groups: int, groups_per_chunk: int) -> list[int]:
    """The group count of each chunk a rollout worker streams for `groups` prompts, in order: the
    worker yields every `groups_per_chunk` finished groups, and what is left at the end."""
    return [min(groups_per_chunk, groups - start) for start in range(0, groups, groups_per_chunk)]
