"""pi_old and off-policy weights, on hand-worked log-probs."""

import math

import numpy as np
import torch

from grpo_ray.algo.off_policy import pi_old_and_weights, stale_rows


def test_a_row_is_stale_when_sampled_before_the_learners_weights():
    # During step 5 the learner holds version 4: versions 4 is fresh, 3 and 0 are stale.
    assert stale_rows(np.array([4, 3, 0]), step=5).tolist() == [False, True, True]
    assert stale_rows(np.array([0]), step=1).tolist() == [False]


def test_one_pass_takes_pi_old_from_the_learner_and_weights_stale_rows():
    learner_old = torch.tensor([[math.log(0.5)], [math.log(0.5)]])
    rollout = torch.tensor([[math.log(0.25)], [math.log(0.25)]])
    stale = torch.tensor([False, True])
    old, weights = pi_old_and_weights(learner_old, rollout, stale, 1, stale_cap=10.0, tis_cap=None)
    assert torch.equal(old, learner_old)
    # Fresh row: weight 1. Stale row: pi_old / mu = 0.5 / 0.25 = 2, under the cap of 10.
    assert torch.allclose(weights, torch.tensor([[1.0], [2.0]]))


def test_the_stale_weight_is_capped():
    learner_old = torch.tensor([[math.log(0.5)]])
    rollout = torch.tensor([[math.log(0.05)]])  # pi_old / mu = 10, capped at 2
    _, weights = pi_old_and_weights(learner_old, rollout, torch.tensor([True]), 1, stale_cap=2.0, tis_cap=None)
    assert torch.allclose(weights, torch.tensor([[2.0]]))


def test_several_passes_take_pi_old_from_the_behaviour_policy_and_weight_nothing():
    learner_old = torch.tensor([[math.log(0.5)]])
    rollout = torch.tensor([[math.log(0.25)]])
    old, weights = pi_old_and_weights(learner_old, rollout, torch.tensor([True]), 2, stale_cap=10.0, tis_cap=None)
    assert torch.equal(old, rollout)
    assert weights is None  # the ratio is against mu already: no stale weighting, no tis_cap


def test_tis_cap_still_weights_fresh_rows_in_several_passes():
    learner_old = torch.tensor([[math.log(0.5)]])
    rollout = torch.tensor([[math.log(0.25)]])  # 0.5 / 0.25 = 2, truncated at 1.5
    _, weights = pi_old_and_weights(learner_old, rollout, torch.tensor([True]), 2, stale_cap=10.0, tis_cap=1.5)
    assert torch.allclose(weights, torch.tensor([[1.5]]))
