import numpy as np
import pytest

from grpo_ray.algo.overlong import shape_overlong_rewards


def test_zero_reward_zeroes_truncated_rows_but_keeps_failures_failed():
    rewards = np.array([1.0, 1.0, np.nan, 0.5])
    truncated = np.array([False, True, True, True])
    shaped, weights = shape_overlong_rewards(rewards, np.array([5, 8, 8, 8]), truncated, "zero_reward", 8)
    np.testing.assert_array_equal(shaped[[0, 1, 3]], [1.0, 0.0, 0.0])
    assert np.isnan(shaped[2]) and weights.tolist() == [1, 1, 1, 1]


def test_mask_keeps_rewards_and_zeroes_the_row_weight():
    shaped, weights = shape_overlong_rewards(np.array([1.0, 0.0]), np.array([3, 8]), np.array([False, True]), "mask", 8)
    assert shaped.tolist() == [1.0, 0.0] and weights.tolist() == [1.0, 0.0]


def test_soft_penalty_is_linear_in_the_buffer():
    # max_len 20, buffer 4: no penalty up to 16 tokens; 18 tokens is half-way: 1 - 0.5 * 1.0 = 0.5;
    # 20 tokens is the full penalty: 1 - 1 = 0.
    shaped, _ = shape_overlong_rewards(
        np.ones(4),
        np.array([10, 16, 18, 20]),
        np.array([False, False, False, True]),
        "soft_penalty",
        20,
        buffer=4,
        penalty=1.0,
    )
    np.testing.assert_allclose(shaped, [1.0, 1.0, 0.5, 0.0])


def test_none_changes_nothing_and_bad_buffer_is_refused():
    shaped, weights = shape_overlong_rewards(np.array([1.0]), np.array([8]), np.array([True]), "none", 8)
    assert shaped.tolist() == [1.0] and weights.tolist() == [1.0]
    with pytest.raises(ValueError, match="buffer"):
        shape_overlong_rewards(np.array([1.0]), np.array([8]), np.array([True]), "soft_penalty", 8, buffer=0)
