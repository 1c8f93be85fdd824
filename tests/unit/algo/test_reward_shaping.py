"""Reward clipping and running normalisation on hand-worked numbers."""

import numpy as np
import pytest

from grpo_ray.algo.reward_shaping import NORMALIZE_EPS, RewardShaper, RunningMeanStd, clip_rewards


def test_clip_bounds_finite_rewards_and_keeps_failures():
    got = clip_rewards(np.array([-3.0, 0.5, 2.0, np.nan]), -1.0, 1.0)
    np.testing.assert_array_equal(got, [-1.0, 0.5, 1.0, np.nan])


def test_running_stats_merge_batches_exactly():
    stats = RunningMeanStd()
    stats.update(np.array([1.0, 3.0]))  # mean 2, m2 = 1 + 1 = 2
    stats.update(np.array([5.0]))  # 1, 3, 5: mean 3, variance (4 + 0 + 4) / 3 = 8/3
    assert stats.count == 3 and stats.mean == pytest.approx(3.0) and stats.std == pytest.approx(np.sqrt(8 / 3))
    # (5 - 3) / sqrt(8/3) = 1.224745 (the 1e-6 eps moves the 7th digit).
    assert stats.normalize(np.array([5.0]))[0] == pytest.approx(1.224745, abs=1e-6)


def test_shaper_clips_then_normalises_over_steps_and_skips_rows_out_of_the_loss():
    shaper = RewardShaper(clip=(0.0, 1.0), normalize="running")
    # Slice 1: [2 -> 1, 0]; slice 2: [0.5, NaN (failed), 9 (weight 0: out of the stats, clipped to 1)].
    out = shaper([np.array([2.0, 0.0]), np.array([0.5, np.nan, 9.0])], [np.ones(2), np.array([1.0, 1.0, 0.0])])
    # Stats over 1, 0, 0.5: mean 0.5, variance (0.25 + 0.25 + 0) / 3 = 1/6.
    std = np.sqrt(1 / 6)
    np.testing.assert_allclose(out[0], [0.5 / (std + NORMALIZE_EPS), -0.5 / (std + NORMALIZE_EPS)])
    assert out[1][0] == 0.0 and np.isnan(out[1][1]) and out[1][2] == pytest.approx(0.5 / (std + NORMALIZE_EPS))
    # Two of the four finite rewards (2, 0, 0.5, 9) were outside [0, 1].
    assert shaper.metrics() == pytest.approx(
        {"reward/clipped_fraction": 0.5, "reward/running_mean": 0.5, "reward/running_std": std}
    )
    # The next batch [1.0] joins the stats: 1, 0, 0.5, 1 -> mean 0.625; nothing clipped this time.
    shaper([np.array([1.0])], [np.ones(1)])
    assert shaper.stats.mean == pytest.approx(0.625) and shaper.metrics()["reward/clipped_fraction"] == 0.0


def test_shaper_state_round_trips_and_old_checkpoints_start_afresh():
    a = RewardShaper(None, "running")
    a([np.array([1.0, 2.0, 4.0])], [np.ones(3)])
    b = RewardShaper(None, "running")
    b.load_state_dict(a.state_dict())
    assert b.stats.state_dict() == a.stats.state_dict()
    c = RewardShaper(None, "running")
    c.load_state_dict(None)  # a checkpoint from before reward shaping
    assert c.stats.count == 0


def test_off_by_default_changes_nothing():
    shaper = RewardShaper(None, "none")
    rewards = [np.array([3.0, -2.0])]
    assert not shaper.active and shaper(rewards, [np.ones(2)])[0] is rewards[0] and shaper.metrics() == {}
