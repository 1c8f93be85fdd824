"""algo/policy_move.py: how far an update moved the sampled tokens, on hand-worked numbers."""

import math

import pytest
import torch

from grpo_ray.algo.policy_move import clip_log_bound, update_move


def test_the_clips_bound_is_its_nearer_side_in_nats():
    # 0.2 / 0.2: log 1.2 = 0.1823 above, -log 0.8 = 0.2231 below; the nearer is above.
    assert clip_log_bound(0.2, 0.2) == pytest.approx(0.18232, abs=1e-5)
    # DAPO's 0.2 / 0.28: log 1.28 = 0.2469 above, so below (0.2231) is the nearer.
    assert clip_log_bound(0.2, 0.28) == pytest.approx(0.22314, abs=1e-5)


def test_the_move_of_the_sampled_tokens_is_their_mean_absolute_log_ratio():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]])
    new = torch.tensor([[-0.5, -2.0, -5.5], [-1.3, -1.2, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the third column (moved by 5) is padding
    got = update_move(new, old, mask, clip_low=0.2, clip_high=0.2)
    # Log ratios 0.5, 0, -0.3, -0.2: |.| averages (0.5 + 0 + 0.3 + 0.2) / 4 = 0.25.
    assert got["update/moved"] == pytest.approx(0.25)
    # Ratios e^0.5 = 1.649 (over 1.2), 1, e^-0.3 = 0.741 (under 0.8), e^-0.2 = 0.819 (inside): 2 of 4 outside.
    assert got["update/outside_clip"] == pytest.approx(0.5)
    # k3 = r - 1 - log r: 0.14872, 0, 0.04082, 0.01873; mean 0.052068.
    k3 = [math.exp(x) - 1 - x for x in (0.5, 0.0, -0.3, -0.2)]
    assert got["update/kl"] == pytest.approx(sum(k3) / 4) and sum(k3) / 4 == pytest.approx(0.052068, abs=1e-6)


def test_no_loss_token_measures_nothing():
    got = update_move(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2), clip_low=0.2, clip_high=0.2)
    assert all(math.isnan(value) for value in got.values())
