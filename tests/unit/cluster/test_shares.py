"""What a dead worker held, worked out by hand: the slices of a rollout worker, a reward worker's rows."""

import pytest

from grpo_ray.cluster.shares import chunk_sizes, pool_bounds, rank_major, worker_positions, worker_share
from grpo_ray.types import Prompt


@pytest.mark.parametrize("workers, ranks", [(1, 1), (2, 1), (1, 3), (3, 2), (4, 4)])
def test_worker_positions_are_where_rank_major_puts_that_workers_slices(workers, ranks):
    # per_worker[w][r] = (w, r); rank_major lays them out rank by rank.
    flat = rank_major([[(w, r) for r in range(ranks)] for w in range(workers)])
    for w in range(workers):
        assert [flat[i] for i in worker_positions(w, workers, ranks)] == [(w, r) for r in range(ranks)]


def test_worker_positions_by_hand():
    # 3 workers, 2 ranks: [w0r0, w1r0, w2r0, w0r1, w1r1, w2r1]; worker 1 holds positions 1 and 4.
    assert worker_positions(1, 3, 2) == [1, 4]


def test_pool_bounds_cover_every_row_once():
    # 10 rows over 3 workers: 10*j//3 = 0, 3, 6, 10.
    assert pool_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    # More workers than rows: some get none (start == stop) and are not called.
    assert pool_bounds(2, 3) == [(0, 0), (0, 1), (1, 2)]


def test_a_workers_share_is_the_same_prompts_at_the_same_offset_when_issued_again():
    prompts = [Prompt(uid=u, text=str(u), token_ids=(1,), answer="") for u in range(8)]
    share, offset = worker_share(prompts, 1, 2)
    assert [p.uid for p in share] == [4, 5, 6, 7] and offset == 4
    assert worker_share(prompts, 1, 2) == (share, offset)


def test_a_worker_streams_whole_chunks_and_the_rest_at_the_end():
    assert chunk_sizes(10, 4) == [4, 4, 2]
    assert chunk_sizes(8, 4) == [4, 4]
    assert chunk_sizes(3, 8) == [3]
    assert chunk_sizes(0, 4) == []
