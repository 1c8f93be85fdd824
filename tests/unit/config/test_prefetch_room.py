"""How many later steps' batches pipelined rollout may start: rollout.max_staleness ahead, never
past a checkpoint or the stage's end (so a resumed run draws the next batch exactly as the run did)."""

import pytest

from grpo_ray.config import config_from_dict, prefetch_room
from grpo_ray.config.plans import StagePlan

STAGE = StagePlan(name="s", steps=10, first_step=1, max_new_tokens=5, temperature=1.0, top_p=1.0, eval_temperature=0.0)


def _cfg(max_staleness: int, checkpoint_every: int = 0):
    return config_from_dict(
        {"rollout": {"max_staleness": max_staleness}, "train": {"steps": 10, "checkpoint_every": checkpoint_every}}
    )


def test_on_policy_never_prefetches():
    assert prefetch_room(_cfg(0), STAGE, step=3, pending=0) == 0


@pytest.mark.parametrize("step, pending, room", [(1, 0, 2), (1, 1, 1), (1, 2, 0), (8, 0, 2), (9, 0, 1), (10, 0, 0)])
def test_up_to_max_staleness_ahead_within_the_stage(step, pending, room):
    # Steps step+1 .. step+2 may be in flight, none beyond the stage's last step 10.
    assert prefetch_room(_cfg(2), STAGE, step, pending) == room


@pytest.mark.parametrize("step, room", [(3, 1), (4, 0), (5, 2), (7, 1), (8, 0)])
def test_never_past_a_checkpoint(step, room):
    # checkpoint_every 4: steps 4 and 8 write checkpoints; step 5's batch is drawn after step 4's.
    assert prefetch_room(_cfg(2, checkpoint_every=4), STAGE, step, pending=0) == room


def test_a_later_stage_counts_from_its_first_step():
    stage = StagePlan(
        name="t", steps=5, first_step=11, max_new_tokens=5, temperature=1.0, top_p=1.0, eval_temperature=0.0
    )
    assert prefetch_room(_cfg(1), stage, step=14, pending=0) == 1
    assert prefetch_room(_cfg(1), stage, step=15, pending=0) == 0


def test_a_time_checkpoint_is_due_once_the_minutes_have_passed():
    from grpo_ray.config import time_checkpoint_due

    assert not time_checkpoint_due(10.0, 599.0)
    assert time_checkpoint_due(10.0, 600.0)
    assert not time_checkpoint_due(0.0, 10_000.0)  # 0 turns it off
