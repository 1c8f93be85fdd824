"""Pipelined vllm runs: a weight sync lands while the engine generates the batch started ahead
(vLLM's in-flight protocol: requests paused and kept, weights swapped, KV recomputed, resumed)
rather than waiting for it, and the run still proves every sync (digests, the probe every step)."""

import math

import pytest

from grpo_ray.config import load_config
from grpo_ray.train.loop import train

from .conftest import HAS_VLLM
from .test_train_e2e import TINY, metric_history

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]

# Long, hot completions (up to 48 tokens at vLLM's highest temperature) so that a batch is still
# generating when the update before it ends; one learner thread, so the update is quick beside it.
SETTINGS = ["train.steps=6", "train.eval_every=0", "data.eval_limit=8", "rollout.backend=vllm",
            "rollout.vllm.cpu_kv_cache_gb=0.25", "rollout.max_staleness=1", "rollout.max_new_tokens=48",
            "rollout.temperature=2.0", "weight_sync.probe_every=1", "learner.torch_threads=1",
            "train.checkpoint_every=0"]


def test_syncs_land_during_generation_and_every_one_is_proven(tmp_path):
    result = train(load_config(TINY, [f"output_dir={tmp_path / 'run'}", *SETTINGS]))
    landed = metric_history(result, "sync/during_generation")
    assert sorted(landed) == [1, 2, 3, 4, 5, 6]
    assert sum(landed.values()) >= 1, f"no sync landed while the engine generated: {landed}"
    # Each of those syncs was proven like any other: digests equal (else the run fails) and the
    # engine's probe log-probs the learner's to within the tolerance.
    probe = metric_history(result, "sync/probe_max_abs_diff")
    assert sorted(probe) == [1, 2, 3, 4, 5, 6] and max(probe.values()) <= 1e-3, probe
    losses = metric_history(result, "loss/total")
    assert all(math.isfinite(v) for v in losses.values())
    # Rows keep the version their batch started with: one update behind, as any pipelined batch.
    staleness = metric_history(result, "batch/staleness")
    assert all(v <= 1.0 for v in staleness.values()) and max(staleness.values()) == 1.0


def test_a_pipelined_run_with_syncs_after_generation_never_lands_one_during_it(tmp_path):
    result = train(load_config(TINY, [f"output_dir={tmp_path / 'run'}", *SETTINGS, "train.steps=3",
                                      "rollout.vllm.sync_during_generation=false"]))
    assert set(metric_history(result, "sync/during_generation").values()) == {0.0}
