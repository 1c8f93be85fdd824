"""The KL controller (Ziegler et al. 2019) on hand-worked numbers."""

import math

import pytest

from grpo_ray.algo.kl_control import KLController, adaptive_kl_coef


def test_kl_above_target_raises_the_coefficient_by_at_most_the_clip():
    # kl / target - 1 = 0.03 / 0.02 - 1 = 0.5, clipped to 0.2; 64 of a 640-completion horizon:
    # coef * (1 + 0.2 * 0.1) = 0.1 * 1.02 = 0.102.
    assert adaptive_kl_coef(0.1, 0.03, 0.02, 64, 640) == pytest.approx(0.102)


def test_kl_a_little_below_target_lowers_it_proportionally():
    # 0.019 / 0.02 - 1 = -0.05 (inside the clip); 0.1 * (1 - 0.05 * 0.1) = 0.0995.
    assert adaptive_kl_coef(0.1, 0.019, 0.02, 64, 640) == pytest.approx(0.0995)
    # Far below: clipped to -0.2; a whole horizon in one step: 0.1 * 0.8 = 0.08.
    assert adaptive_kl_coef(0.1, 0.0, 0.02, 640, 640) == pytest.approx(0.08)


def test_a_step_without_a_kl_leaves_the_coefficient():
    assert adaptive_kl_coef(0.1, math.nan, 0.02, 64, 640) == 0.1


def test_fixed_controller_never_moves_and_adaptive_compounds():
    fixed = KLController("fixed", 0.05)
    assert [fixed.update(1.0, 64) for _ in range(3)] == [0.05] * 3
    adaptive = KLController("adaptive", 0.1, target=0.02, horizon=640)
    # Twice the clip: 0.1 * 1.02 * 1.02 = 0.10404.
    adaptive.update(0.03, 64)
    assert adaptive.update(0.03, 64) == pytest.approx(0.10404)


def test_state_round_trips_and_a_fixed_runs_state_does_not_override_adaptive():
    a = KLController("adaptive", 0.1, target=0.02, horizon=640)
    a.update(0.03, 64)
    b = KLController("adaptive", 0.1, target=0.02, horizon=640)
    b.load_state_dict(a.state_dict())
    assert b.coef == a.coef == pytest.approx(0.102)
    c = KLController("adaptive", 0.1, target=0.02, horizon=640)
    c.load_state_dict({"kind": "fixed", "coef": 0.5})
    assert c.coef == 0.1


def test_adaptive_needs_target_and_horizon():
    with pytest.raises(ValueError, match="target and a horizon"):
        KLController("adaptive", 0.1)
