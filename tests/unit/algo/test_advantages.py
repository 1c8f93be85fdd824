"""Advantage estimators: hand-worked values, and agreement with a slow per-group loop."""

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_ray.algo import AdvantageEstimator, compute_advantages, group_reward_stats


def _reference_advantages(
    estimator: AdvantageEstimator, rewards: torch.Tensor, group_ids: torch.Tensor,
    normalize_by_std: bool, eps: float,
) -> torch.Tensor:  # fmt: skip
    """One group at a time, in float64, written straight from the formulas."""
    rewards = rewards.double()
    out = torch.zeros_like(rewards)
    for gid in group_ids.unique().tolist():
        rows = (group_ids == gid).nonzero().flatten().tolist()
        group = rewards[rows]
        if len(rows) == 1 or bool((group == group[0]).all()):
            continue  # no spread: advantage 0 under every estimator
        mean, std = group.mean(), group.std()  # torch.std is unbiased by default
        for row in rows:
            r = rewards[row]
            if estimator is AdvantageEstimator.GRPO:
                out[row] = (r - mean) / (std + eps) if normalize_by_std else r - mean
            elif estimator is AdvantageEstimator.RLOO:
                others = [rewards[k] for k in rows if k != row]
                out[row] = r - sum(others) / len(others)
            else:  # DR_GRPO and the first half of REINFORCE_PP_BASELINE
                out[row] = r - mean
    if estimator is AdvantageEstimator.REINFORCE_PP_BASELINE:
        out = (out - out.mean()) / (out.std() + eps) if len(out) > 1 else torch.zeros_like(out)
    return out.float()


def test_grpo_hand_worked_with_zero_variance_group():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    # group 0 [1,0,1,0]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.5774,
    #   so A = +-0.5 / 0.5774 = +-0.866
    # group 1 [0.5]*3: zero variance, A = 0 (not 0/eps)
    a = 0.5 / math.sqrt(1 / 3)
    expected = torch.tensor([a, -a, a, -a, 0.0, 0.0, 0.0])
    assert_close(compute_advantages("grpo", rewards, group_ids), expected, rtol=1e-5, atol=1e-5)


def test_grpo_non_contiguous_unequal_groups():
    rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 2.0, 6.0, 9.0])
    group_ids = torch.tensor([7, 3, 7, 3, 7, 3, 42])
    # group 7 (rows 0,2,4) [1,0,2]: mean 1, std sqrt((0+1+1)/2) = 1 -> A = [0, -1, 1]
    # group 3 (rows 1,3,5) [2,4,6]: mean 4, std sqrt((4+0+4)/2) = 2 -> A = [-1, 0, 1]
    # group 42 (row 6) alone: A = 0
    expected = torch.tensor([0.0, -1.0, -1.0, 0.0, 1.0, 1.0, 0.0])
    assert_close(compute_advantages(AdvantageEstimator.GRPO, rewards, group_ids, eps=0.0), expected)


def test_constant_group_is_exactly_zero_despite_rounding():
    # mean of three 0.1s is not exactly 0.1 in float32; without the min == max test r - mean would
    # be ~1e-9 and dividing by std + eps = 1e-6 would leave a spurious ~1e-3 advantage.
    rewards = torch.tensor([0.1, 0.1, 0.1])
    group_ids = torch.zeros(3, dtype=torch.int64)
    for estimator in AdvantageEstimator:
        assert torch.equal(compute_advantages(estimator, rewards, group_ids), torch.zeros(3))


def test_grpo_without_std_is_dr_grpo():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 3.0, 5.0])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.5 -> +-0.5; group 1 [3,5]: mean 4 -> [-1, 1]
    expected = torch.tensor([0.5, -0.5, 0.5, -0.5, -1.0, 1.0])
    assert_close(compute_advantages("dr_grpo", rewards, group_ids), expected)
    assert_close(compute_advantages("grpo", rewards, group_ids, normalize_by_std=False), expected)


def test_rloo_hand_worked_with_singleton():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0])
    group_ids = torch.tensor([0, 0, 0, 0, 1])
    # row 0: 1 - mean(0,0,0) = 1; rows 1-3: 0 - mean(1,0,0) = -1/3; row 4 alone: 0
    expected = torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0])
    assert_close(compute_advantages("rloo", rewards, group_ids), expected)


def test_reinforce_pp_baseline_hand_worked():
    rewards = torch.tensor([1.0, 0.0, 3.0, 3.0])
    group_ids = torch.tensor([0, 0, 1, 1])
    # centred: [0.5, -0.5, 0, 0]; batch mean 0, unbiased std sqrt(0.5 / 3) = 0.4082
    # whitened: +-0.5 / 0.4082 = +-1.2247
    s = 0.5 / math.sqrt(0.5 / 3)
    expected = torch.tensor([s, -s, 0.0, 0.0])
    actual = compute_advantages("reinforce_pp_baseline", rewards, group_ids)
    assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_single_row_batch_is_zero_not_nan():
    for estimator in AdvantageEstimator:
        a = compute_advantages(estimator, torch.tensor([3.0]), torch.tensor([0]))
        assert torch.equal(a, torch.zeros(1))


def test_group_reward_stats():
    rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 2.0, 6.0, 9.0])
    group_ids = torch.tensor([7, 3, 7, 3, 7, 3, 42])
    mean, std, ids = group_reward_stats(rewards, group_ids)
    # ids sorted: 3 -> [2,4,6] mean 4 std 2; 7 -> [1,0,2] mean 1 std 1;
    # 42 -> [9] mean 9, std 0 by definition
    assert torch.equal(ids, torch.tensor([3, 7, 42]))
    assert_close(mean, torch.tensor([4.0, 1.0, 9.0]))
    assert_close(std, torch.tensor([2.0, 1.0, 0.0]))


def test_integer_rewards_are_cast():
    a = compute_advantages("dr_grpo", torch.tensor([1, 0]), torch.tensor([0, 0]))
    assert_close(a, torch.tensor([0.5, -0.5]))


def test_unknown_estimator_names_choices():
    with pytest.raises(ValueError, match="choose one of"):
        compute_advantages("ppo", torch.zeros(2), torch.zeros(2, dtype=torch.int64))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match=r"\[N\]"):
        compute_advantages("grpo", torch.zeros(3), torch.zeros(2, dtype=torch.int64))


def _random_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Groups of 1..6 rows, shuffled; half the groups binary (some then have zero variance)."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 7, (12,), generator=gen).tolist()
    group_ids = torch.cat([torch.full((n,), 100 + 3 * g) for g, n in enumerate(sizes)])
    rewards = torch.cat([
        torch.randint(0, 2, (n,), generator=gen).float() if g % 2 else torch.randn(n, generator=gen)
        for g, n in enumerate(sizes)
    ])  # fmt: skip
    perm = torch.randperm(len(group_ids), generator=gen)
    return rewards[perm], group_ids[perm]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("estimator", list(AdvantageEstimator))
@pytest.mark.parametrize("normalize_by_std", [True, False])
def test_vectorised_matches_loop(seed, estimator, normalize_by_std):
    rewards, group_ids = _random_batch(seed)
    expected = _reference_advantages(estimator, rewards, group_ids, normalize_by_std, eps=1e-6)
    actual = compute_advantages(estimator, rewards, group_ids, normalize_by_std=normalize_by_std, eps=1e-6)
    assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_advantage_slopes_turn_the_reward_a_turn_did_not_earn_into_its_advantage_offset():
    from grpo_ray.algo import advantage_slopes

    # Group 0: rewards 1, 3 (mean 2, unbiased std sqrt(2)); group 1 constant; group 2 of one.
    rewards = torch.tensor([1.0, 3.0, 5.0, 5.0, 7.0])
    groups = torch.tensor([0, 0, 1, 1, 2])
    root2 = 2**0.5
    grpo = advantage_slopes("grpo", rewards, groups, eps=0.0)
    assert torch.allclose(grpo, torch.tensor([1 / root2, 1 / root2, 0.0, 0.0, 0.0]))
    # The slope is the estimator's own: r_i - e in place of r_i, the group's mean and std held.
    e = 0.5
    shifted = (rewards[0] - e - 2.0) / root2
    assert torch.isclose(compute_advantages("grpo", rewards, groups, eps=0.0)[0] - grpo[0] * e, shifted)
    for name in ("dr_grpo", "rloo"):  # rloo's baseline leaves the row out: one unit of reward, one of advantage
        assert advantage_slopes(name, rewards, groups).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert advantage_slopes("grpo", rewards, groups, normalize_by_std=False).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    # REINFORCE++: centred rewards -1, 1, 0, 0, 0 have batch std sqrt(0.5).
    pp = advantage_slopes("reinforce_pp_baseline", rewards, groups, eps=0.0)
    assert torch.allclose(pp, torch.tensor([0.5**-0.5, 0.5**-0.5, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        advantage_slopes("ppo", rewards, groups)


def test_an_estimator_registered_without_a_slope_is_refused_under_per_turn_credit_in_one_line(monkeypatch):
    from grpo_ray.algo import advantage_slopes
    from grpo_ray.algo.advantages import _ADVANTAGE_ESTIMATORS, Estimator

    rloo = _ADVANTAGE_ESTIMATORS[AdvantageEstimator.RLOO]
    monkeypatch.setitem(_ADVANTAGE_ESTIMATORS, AdvantageEstimator.RLOO, Estimator(rloo.advantages, turn_slope=None))
    rewards, groups = torch.tensor([1.0, 3.0]), torch.tensor([0, 0])
    with pytest.raises(ValueError) as refused:
        advantage_slopes("rloo", rewards, groups)
    assert str(refused.value) == (
        "advantage estimator 'rloo' registers no per-turn slope, which per-turn credit "
        "(environment.reward_per_turn) needs; choose one of ['grpo', 'dr_grpo', 'reinforce_pp_baseline']"
    )
    # Its advantages are unchanged: only per-turn credit needs the slope. Rewards 1, 3: A = -2, 2.
    assert compute_advantages("rloo", rewards, groups).tolist() == [-2.0, 2.0]


def test_an_estimator_registered_with_a_slope_is_credited_by_that_slope(monkeypatch):
    from grpo_ray.algo import advantage_slopes
    from grpo_ray.algo.advantages import _ADVANTAGE_ESTIMATORS, Estimator

    def half(groups, normalize_by_std, eps):
        return torch.full_like(groups.centred, 0.5)

    dr_grpo = _ADVANTAGE_ESTIMATORS[AdvantageEstimator.DR_GRPO]
    monkeypatch.setitem(_ADVANTAGE_ESTIMATORS, AdvantageEstimator.DR_GRPO, Estimator(dr_grpo.advantages, half))
    # Group 0 (rewards 1, 3) has spread: the registered 0.5; group 1 (5, 5) none: 0, whatever is registered.
    slopes = advantage_slopes("dr_grpo", torch.tensor([1.0, 3.0, 5.0, 5.0]), torch.tensor([0, 0, 1, 1]))
    assert slopes.tolist() == [0.5, 0.5, 0.0, 0.0]
