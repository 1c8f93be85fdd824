"""Outcome advantages: one scalar per completion, the same for every token of that completion.

Every estimator maps `rewards [N]` and `group_ids [N]` to `advantages [N]`. Rows that share a group
id are the G completions of one prompt. Groups may differ in size (filters drop rows) and need not
be contiguous (shards are reshuffled), so group statistics go through `torch.unique` and
`index_add_`: no Python loop over groups.

    grpo                   A_i = (r_i - mean_g) / (std_g + eps)      DeepSeekMath GRPO
                                 (normalize_by_std=False: r_i - mean_g)
    dr_grpo                A_i = r_i - mean_g                         Dr. GRPO: dividing by std_g
                                                                      favours near-solved prompts
    rloo                   A_i = r_i - mean of the other G-1 rewards  leave-one-out baseline
    reinforce_pp_baseline  A_i = whiten_batch(r_i - mean_g)           REINFORCE++, group baseline

Choices worth knowing:
- std_g is the unbiased (Bessel-corrected, `torch.std` default) group std, as in TRL and verl.
  For binary rewards with G=4 and two successes that is 0.577, not 0.5, so |A| = 0.866, not 1.
- A group of one has no spread: its std is defined as 0 (`torch.std` would give NaN) and its
  advantage is 0 under every estimator.
- A group whose rewards are all equal gets an advantage of exactly 0. Computed naively, r - mean
  can be ~1e-8 from rounding (mean of three 0.1s), and dividing by std + eps = 1e-6 would turn that
  into a spurious ~1e-2 advantage; such groups are detected with min == max and zeroed.
- The batch whitening of reinforce_pp_baseline uses the unbiased std over all N rows; after group
  centring the batch mean is 0 up to rounding, subtracting it is kept for fidelity to REINFORCE++.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import NamedTuple

import torch
from torch import Tensor

from grpo_ray.algo.registry import lookup


class AdvantageEstimator(str, Enum):
    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    RLOO = "rloo"
    REINFORCE_PP_BASELINE = "reinforce_pp_baseline"


class GroupRewardStats(NamedTuple):
    """Per-group statistics, ordered like `group_ids` (sorted ascending)."""

    mean: Tensor  # [K] mean reward of each group
    std: Tensor  # [K] unbiased std; 0 for groups of one and for constant groups
    group_ids: Tensor  # [K] int64, the distinct ids


class _Groups(NamedTuple):
    """What the estimators need: group statistics plus the row -> group map."""

    stats: GroupRewardStats
    inverse: Tensor  # [N] index of each row's group in stats
    counts: Tensor  # [K] rows per group, float
    centred: Tensor  # [N] r_i - mean_g, exactly 0 for constant groups


def _groups(rewards: Tensor, group_ids: Tensor) -> _Groups:
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be [N]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()
    unique_ids, inverse, counts_int = torch.unique(group_ids, return_inverse=True, return_counts=True)
    num_groups = unique_ids.numel()
    counts = counts_int.to(rewards.dtype)

    mean = rewards.new_zeros(num_groups).index_add_(0, inverse, rewards) / counts
    # Equal min and max is an exact test for "no spread", immune to the rounding in mean.
    empty = rewards.new_zeros(num_groups)
    low = empty.scatter_reduce(0, inverse, rewards, "amin", include_self=False)
    high = empty.scatter_reduce(0, inverse, rewards, "amax", include_self=False)
    constant = low == high  # also true for every group of one

    centred = torch.where(constant[inverse], 0.0, rewards - mean[inverse])
    # Two-pass variance (deviations first) rather than E[r^2] - E[r]^2, which cancels badly.
    squared = rewards.new_zeros(num_groups).index_add_(0, inverse, centred.square())
    std = torch.where(constant, 0.0, (squared / (counts - 1).clamp(min=1)).sqrt())
    return _Groups(GroupRewardStats(mean, std, unique_ids), inverse, counts, centred)


def group_reward_stats(rewards: Tensor, group_ids: Tensor) -> GroupRewardStats:
    """Mean and unbiased std of the rewards of each group.

    Args:
        rewards: [N] one scalar reward per completion.
        group_ids: [N] int64; rows with the same id belong to one prompt.

    Returns:
        GroupRewardStats(mean [K], std [K], group_ids [K]) for the K distinct ids, sorted.
    """
    return _groups(rewards, group_ids).stats


def _grpo(groups: _Groups, normalize_by_std: bool, eps: float) -> Tensor:
    if not normalize_by_std:
        return groups.centred
    std = groups.stats.std[groups.inverse]
    # Constant groups have centred == 0 and std == 0: keep 0 even when eps is 0.
    return torch.where(std > 0, groups.centred / (std + eps), 0.0)


def _dr_grpo(groups: _Groups, normalize_by_std: bool, eps: float) -> Tensor:
    return groups.centred


def _rloo(groups: _Groups, normalize_by_std: bool, eps: float) -> Tensor:
    # r_i - (S - r_i)/(G-1) = G/(G-1) * (r_i - S/G): the leave-one-out baseline is a rescaled
    # group mean, so no second pass is needed. Groups of one have centred == 0, the clamp only
    # keeps their scale finite.
    scale = groups.counts / (groups.counts - 1).clamp(min=1)
    return groups.centred * scale[groups.inverse]


def _reinforce_pp_baseline(groups: _Groups, normalize_by_std: bool, eps: float) -> Tensor:
    centred, std = groups.centred, _batch_std(groups.centred)
    # Every group constant (or one row): nothing to whiten; keep 0 even when eps is 0.
    return torch.where(std > 0, (centred - centred.mean()) / (std + eps), 0.0)


def _batch_std(centred: Tensor) -> Tensor:
    """The unbiased std of all N rows; 0 for fewer than two (the std of one value is undefined)."""
    return centred.std() if centred.numel() > 1 else centred.new_zeros(())


# Per-turn slopes: how far a row's advantage moves per unit of its own reward, the group's baseline
# and spread held (see `advantage_slopes`); rows of groups with no spread are zeroed there.


def _grpo_slope(groups: _Groups, normalize_by_std: bool, eps: float) -> Tensor:
    if not normalize_by_std:
        return _unit_slope(groups, normalize_by_std, eps)
    std = groups.stats.std[groups.inverse]
    return torch.ones_like(std) / (std + eps)


def _unit_slope(groups: _Groups, normalize_by_std: bool, eps: float) -> Tensor:
    # dr_grpo: r_i - mean_g; rloo: r_i - the mean of the others, which leaves r_i out.
    return torch.ones_like(groups.centred)


def _reinforce_pp_baseline_slope(groups: _Groups, normalize_by_std: bool, eps: float) -> Tensor:
    std = _batch_std(groups.centred)
    return torch.where(std > 0, torch.ones_like(groups.centred) / (std + eps), 0.0)


AdvantageFn = Callable[[_Groups, bool, float], Tensor]
EstimatorName = AdvantageEstimator | str


class Estimator(NamedTuple):
    """An advantage estimator as registered: `advantages` [N], and `turn_slope` [N], what per-turn
    credit needs (`advantage_slopes`), or None where the estimator has none: per-turn credit with it
    is then refused, never credited with a guessed slope."""

    advantages: AdvantageFn
    turn_slope: AdvantageFn | None


_ADVANTAGE_ESTIMATORS: dict[AdvantageEstimator, Estimator] = {
    AdvantageEstimator.GRPO: Estimator(_grpo, turn_slope=_grpo_slope),
    AdvantageEstimator.DR_GRPO: Estimator(_dr_grpo, turn_slope=_unit_slope),
    AdvantageEstimator.RLOO: Estimator(_rloo, turn_slope=_unit_slope),
    AdvantageEstimator.REINFORCE_PP_BASELINE: Estimator(
        _reinforce_pp_baseline, turn_slope=_reinforce_pp_baseline_slope
    ),
}


def get_advantage_estimator(estimator: EstimatorName) -> Estimator:
    """Registry lookup; raises ValueError naming the valid choices for an unknown name."""
    return lookup(_ADVANTAGE_ESTIMATORS, AdvantageEstimator, estimator, "advantage estimator")


def turn_slope(estimator: EstimatorName) -> AdvantageFn:
    """The estimator's registered per-turn slope; a ValueError (one line: what to choose instead)
    where it registers none, or the name is unknown."""
    slope = get_advantage_estimator(estimator).turn_slope
    if slope is None:
        with_slopes = [name.value for name, entry in _ADVANTAGE_ESTIMATORS.items() if entry.turn_slope is not None]
        raise ValueError(
            f"advantage estimator {AdvantageEstimator(estimator).value!r} registers no per-turn slope, which "
            f"per-turn credit (environment.reward_per_turn) needs; choose one of {with_slopes}"
        )
    return slope


def compute_advantages(
    estimator: EstimatorName, rewards: Tensor, group_ids: Tensor, *, normalize_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Advantages of N completions from their rewards and prompt groups.

    Args:
        estimator: an AdvantageEstimator or its string value.
        rewards: [N] float reward of each completion (integer rewards are cast to float32).
        group_ids: [N] int64; rows with equal ids are completions of the same prompt.
        normalize_by_std: only read by GRPO; False drops the division by the group std.
        eps: added to the std before dividing (GRPO and the REINFORCE++ batch whitening).

    Returns:
        [N] advantages, constant over each completion's tokens; no gradient is expected to flow.
    """
    fn = get_advantage_estimator(estimator).advantages
    return fn(_groups(rewards, group_ids), normalize_by_std, eps)


def advantage_slopes(
    estimator: EstimatorName, rewards: Tensor, group_ids: Tensor, *, normalize_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """[N] how far each row's advantage moves per unit of its own reward, its baseline held: what
    per-turn credit (environment.reward_per_turn) multiplies the reward a turn did not earn by.
    Arguments as for `compute_advantages`; the estimator's registered `turn_slope` gives the value.

    A turn of an episode is credited with the reward earned from it on (reward-to-go): its advantage
    is the estimator's with r_i - e in place of r_i (e: what the steps before the turn earned) and
    the group's baseline and spread unchanged, i.e. A_i - slope_i * e.

        grpo                   1 / (std_g + eps)   (normalize_by_std=False: 1)
        dr_grpo, rloo          1                   (rloo's baseline leaves r_i out)
        reinforce_pp_baseline  1 / (batch std of r - mean_g + eps)

    A group with no spread (constant, or of one) has advantage 0 and slope 0: it carries no signal.
    An estimator registered without a slope raises ValueError (`turn_slope`).
    """
    slope = turn_slope(estimator)
    groups = _groups(rewards, group_ids)
    spread = groups.stats.std[groups.inverse] > 0
    return torch.where(spread, slope(groups, normalize_by_std, eps), 0.0)
