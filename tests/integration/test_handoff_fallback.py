"""A rollout rank on the learner's device whose hand-off is refused takes the broadcast, with one
line saying why: here the learner cannot make its ring (GRPO_RAY_SHM_DIR names no folder, as a
container without a usable /dev/shm would leave it), and the sync goes through gloo, proven."""

import numpy as np
import pytest

from grpo_ray.cluster.weight_broadcast import WeightBroadcaster

from .conftest import ray_started

from .test_learner_and_sync import make_cfg, shard_for, step_batch  # noqa: F401 (step_batch: a fixture)
from .test_vllm_engine import start_pair


@pytest.fixture(scope="module")
def ray_without_shm():
    with ray_started(GRPO_RAY_SHM_DIR="/nonexistent-shm") as ray:
        yield ray


def test_a_refused_handoff_falls_back_to_the_broadcast_in_one_line(ray_without_shm, step_batch):  # noqa: F811
    ray = ray_without_shm
    batch, _, advantages, probe = step_batch
    placement, learners, rollouts = start_pair(ray, make_cfg())
    try:
        sync = WeightBroadcaster(learners, rollouts, bucket_mb=0.5, timeout_s=120, probe=probe)
        assert (sync.handoff_ranks, sync.broadcast_ranks) == (0, 1)
        [note] = sync.notes
        assert note.startswith("weight sync: rollout-0 shares learner rank 0's device but cannot take the hand-off (")
        assert (
            "/nonexistent-shm is not a directory" in note
            and note.endswith("it takes the broadcast")
            and "\n" not in note
        )
        assert "over gloo" in sync.route_line
        ray.get(learners[0].train_step.remote(shard_for(batch, advantages, np.arange(batch.num_rows)), batch))
        assert sync.sync(version=1, probe=probe, probe_tolerance=1e-4).probe_max_abs_diff <= 1e-4
    finally:
        for actor in learners + rollouts:
            ray.kill(actor)
        placement.remove()
