"""Streamed rollout (rollout.groups_per_chunk) on the vllm backend, whose requests finish one by one.

A straight run (each worker's share in one piece) and a streamed one (a chunk per finished group)
with dynamic sampling: the streamed run scores groups as they finish and stops the rollout once the
groups, read in id order, hold the step's informative groups. What it trains on must not depend on
which group finished first: the same groups, in the same order, so the same losses.
"""

import pytest

from grpo_ray.config import load_config
from grpo_ray.training.loop import train

from .conftest import HAS_VLLM
from .test_train_e2e import TINY, metric_history

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]

SETTINGS = [
    "train.steps=2",
    "train.eval_every=0",
    "data.eval_limit=20",
    "rollout.backend=vllm",
    "rollout.vllm.cpu_kv_cache_gb=0.25",
    "rollout.num_workers=2",
    "algorithm.dynamic_sampling=true",
]


def test_a_streamed_rollout_trains_on_what_the_seed_draws_and_stops_once_it_has_enough(tmp_path):
    whole = train(load_config(TINY, [f"output_dir={tmp_path / 'whole'}", *SETTINGS]))
    streamed = train(
        load_config(TINY, [f"output_dir={tmp_path / 'streamed'}", *SETTINGS, "rollout.groups_per_chunk=1"])
    )

    for key in ("loss/total", "loss/policy", "batch/kept_groups", "actor/entropy"):
        want, got = metric_history(whole, key), metric_history(streamed, key)
        assert sorted(got) == [1, 2], key
        for step in want:
            assert got[step] == pytest.approx(want[step], rel=1e-6, abs=1e-9), (key, step)
    # The tiny model's groups are mostly all-wrong, so each step takes more than one try; the last
    # try's groups past the one that completed the step were never waited for.
    unused = metric_history(streamed, "batch/unused_groups")
    assert sorted(unused) == [1, 2] and sum(unused.values()) > 0, unused
    assert not metric_history(whole, "batch/unused_groups")
