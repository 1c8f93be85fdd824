"""Clipped policy loss, importance weights, mismatch statistics and the combined GRPO loss."""

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_ray.algo import (
    behaviour_is_weights,
    grpo_loss,
    mask_counts,
    mismatch_stats,
    policy_gradient_loss,
    truncated_is_weights,
)


def _ratios(values: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """logprobs with the given ratios against old_logprobs = 0."""
    logprobs = torch.tensor(values).log().requires_grad_(True)
    return logprobs, torch.zeros_like(logprobs)


def test_asymmetric_clip():
    # clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28]
    # row 0, A = +1: ratio 1.3  -> min(1.3, 1.28) = 1.28, loss -1.28, clipped (no gradient)
    #                ratio 0.7  -> min(0.7, 0.8)  = 0.7,  loss -0.7,  not clipped
    #                ratio 1.25 -> inside the range,       loss -1.25 (symmetric 0.2 would clip)
    # row 1, A = -1: ratio 0.7  -> min(-0.7, -0.8) = -0.8, loss 0.8, clipped (no gradient)
    #                ratio 1.3  -> min(-1.3, -1.28) = -1.3, loss 1.3, not clipped
    #                ratio 0.9  -> inside the range,        loss 0.9
    logprobs, old = _ratios([[1.3, 0.7, 1.25], [0.7, 1.3, 0.9]])
    terms = policy_gradient_loss(
        logprobs, old, torch.tensor([1.0, -1.0]), torch.ones(2, 3), clip_low=0.2, clip_high=0.28
    )
    assert_close(terms.per_token_loss, torch.tensor([[-1.28, -0.7, -1.25], [0.8, 1.3, 0.9]]))
    assert terms.clipped.tolist() == [[True, False, False], [True, False, False]]
    assert_close(terms.ratio, torch.tensor([[1.3, 0.7, 1.25], [0.7, 1.3, 0.9]]))
    # Unclipped tokens: d(-A * ratio)/d logp = -A * ratio; clipped tokens: 0.
    terms.per_token_loss.sum().backward()
    assert_close(logprobs.grad, torch.tensor([[0.0, -0.7, -1.25], [0.0, 1.3, 0.9]]))


def test_dual_clip():
    # clip range [0.8, 1.2], dual clip c = 3
    # A = -1, ratio 5: PPO loss max(5, 1.2) = 5, capped at -c*A = 3 -> 3, dual-clipped
    # A = -1, ratio 2: PPO loss 2 < 3 -> 2
    # A = +1, ratio 5: PPO loss -1.2 (clipped); the cap only applies to A < 0
    logprobs, old = _ratios([[5.0, 2.0], [5.0, 1.0]])
    advantages = torch.tensor([-1.0, 1.0])
    terms = policy_gradient_loss(
        logprobs, old, advantages, torch.ones(2, 2), clip_low=0.2, clip_high=0.2, dual_clip=3.0
    )
    assert_close(terms.per_token_loss, torch.tensor([[3.0, 2.0], [-1.2, -1.0]]))
    assert terms.dual_clipped.tolist() == [[True, False], [False, False]]
    mask = torch.ones(2, 2)
    without = policy_gradient_loss(logprobs, old, advantages, mask, clip_low=0.2, clip_high=0.2)
    assert_close(without.per_token_loss[0, 0], torch.tensor(5.0))
    with pytest.raises(ValueError, match="dual_clip"):
        policy_gradient_loss(logprobs, old, advantages, mask, clip_low=0.2, clip_high=0.2, dual_clip=1.0)


def test_masked_positions_are_zero():
    logprobs, old = _ratios([[1.5, 2.0, 0.5]])
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    advantages = torch.tensor([1.0])
    terms = policy_gradient_loss(logprobs, old, advantages, mask, clip_low=0.2, clip_high=0.2)
    # token 0: ratio 1.5 clipped to 1.2 -> -1.2; tokens 1, 2 masked out
    assert_close(terms.per_token_loss, torch.tensor([[-1.2, 0.0, 0.0]]))
    assert terms.clipped.tolist() == [[True, False, False]]


def test_truncated_is_weights():
    old = torch.tensor([[math.log(0.5), math.log(2.0), math.log(10.0)]])
    rollout = torch.zeros_like(old)
    # pi_old / pi_rollout = [0.5, 2, 10], capped at 3 -> [0.5, 2, 3]
    weights = truncated_is_weights(old.requires_grad_(True), rollout, cap=3.0)
    assert_close(weights, torch.tensor([[0.5, 2.0, 3.0]]))
    assert not weights.requires_grad
    # A huge gap stays finite and capped.
    huge_gap = truncated_is_weights(torch.tensor([500.0]), torch.tensor([0.0]), cap=2.0)
    assert_close(huge_gap, torch.tensor([2.0]))


def test_behaviour_is_weights_reweight_only_stale_rows():
    # Row 0 fresh, row 1 sampled by an older policy. pi_old / mu per token:
    # row 0 [2, 0.5], row 1 [4, 0.25].
    old = torch.tensor([[math.log(2.0), math.log(0.5)], [math.log(4.0), math.log(0.25)]])
    mu = torch.zeros_like(old)
    stale = torch.tensor([False, True])
    # Without tis_cap fresh rows weigh 1; the stale row is capped at 3: [3, 0.25].
    weights = behaviour_is_weights(old, mu, stale, stale_cap=3.0, tis_cap=None)
    assert_close(weights, torch.tensor([[1.0, 1.0], [3.0, 0.25]]))
    # With tis_cap 1.5 the fresh row gets truncated IS too: [1.5, 0.5].
    weights = behaviour_is_weights(old, mu, stale, stale_cap=3.0, tis_cap=1.5)
    assert_close(weights, torch.tensor([[1.5, 0.5], [3.0, 0.25]]))


def test_behaviour_is_weights_nothing_to_reweight_is_none():
    old = torch.zeros(2, 3)
    assert behaviour_is_weights(old, old, torch.tensor([False, False]), stale_cap=2.0, tis_cap=None) is None
    # All fresh with tis_cap: exactly truncated_is_weights.
    mu = torch.full((2, 3), -1.0)
    assert_close(
        behaviour_is_weights(old, mu, torch.tensor([False, False]), 2.0, 2.5), truncated_is_weights(old, mu, 2.5)
    )


def test_mismatch_stats():
    learner = torch.tensor([[-1.0, -2.0, 30.0]])
    rollout = torch.tensor([[-1.5, -1.0, -30.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token's huge gap must not count
    # d = learner - rollout = [0.5, -1.0]
    # abs diff mean 0.75, max 1.0
    # is ratio exp(d) = [1.6487, 0.3679], mean 1.0083
    # k3 of KL(rollout || learner) = exp(d) - d - 1 = [0.1487, 0.3679], mean 0.2583
    stats = mismatch_stats(learner, rollout, mask)
    expected = {
        "mismatch/abs_diff_mean": 0.75,
        "mismatch/abs_diff_max": 1.0,
        "mismatch/kl_k3": (math.exp(0.5) - 1.5 + math.exp(-1.0)) / 2,
        "mismatch/is_ratio_mean": (math.exp(0.5) + math.exp(-1.0)) / 2,
    }
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-5), key


def test_mismatch_stats_all_masked():
    stats = mismatch_stats(torch.zeros(2, 2), torch.ones(2, 2), torch.zeros(2, 2))
    assert all(value == 0.0 for value in stats.values())


def test_grpo_loss_hand_worked():
    # rho = 1 (single update), A = [+1, -1], row 1 has one loss token: 3 tokens in all.
    logprobs = torch.full((2, 2), -1.0, requires_grad=True)
    old = torch.full((2, 2), -1.0)
    ref = torch.tensor([[-2.0, -1.0], [-1.0, -1.0]])  # x = logp - ref = 1 on token (0, 0) only
    entropy = torch.tensor([[1.0, 2.0], [3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = grpo_loss(
        logprobs, old, torch.tensor([1.0, -1.0]), mask,
        clip_low=0.2, clip_high=0.28,
        ref_logprobs=ref, kl_coef=0.1, kl_estimator="k3",
        entropy=entropy, entropy_coef=0.01,
    )  # fmt: skip
    # policy: per token -A = [-1, -1, +1] -> token mean -1/3
    # kl: k3 = e^-1 = 0.3679 on one token -> mean 0.1226, times 0.1 -> 0.01226
    # entropy: (1 + 2 + 3) / 3 = 2, times -0.01 -> -0.02
    policy, kl, ent = -1 / 3, math.exp(-1) / 3, 2.0
    expected = {
        "loss/policy": policy,
        "loss/kl": 0.1 * kl,
        "loss/entropy": -0.01 * ent,
        "loss/total": policy + 0.1 * kl - 0.01 * ent,
        "actor/clip_fraction": 0.0,
        "actor/ratio_mean": 1.0,
        "actor/kl": kl,
        "actor/entropy": ent,
    }
    assert out.metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert out.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert_close(out.loss, torch.tensor(expected["loss/total"]))

    # gradient / token: (-A + 0.1 * dk3/dx) / 3 with dk3/dx = 1 - e^-x (x = 1 on token (0, 0))
    out.loss.backward()
    g = (-1 + 0.1 * (1 - math.exp(-1))) / 3
    assert_close(logprobs.grad, torch.tensor([[g, -1 / 3], [1 / 3, 0.0]]))


def test_grpo_loss_kl_measured_but_not_added_when_coef_zero():
    logprobs = torch.zeros(1, 2)
    ref = torch.tensor([[-1.0, 0.0]])  # x = 1 on token 0: k3 = e^-1, mean over 2 tokens e^-1 / 2
    advantages, mask = torch.tensor([1.0]), torch.ones(1, 2)
    base = grpo_loss(logprobs, logprobs, advantages, mask, clip_low=0.2, clip_high=0.2)
    out = grpo_loss(logprobs, logprobs, advantages, mask, clip_low=0.2, clip_high=0.2, ref_logprobs=ref)
    assert_close(out.loss, base.loss)
    assert out.metrics["actor/kl"] == pytest.approx(math.exp(-1) / 2)
    assert out.metrics["loss/kl"] == 0.0
    assert "actor/kl" not in base.metrics


def test_grpo_loss_is_weights_scale_policy_term_only():
    logprobs = torch.zeros(1, 2)
    ref = torch.tensor([[-1.0, -1.0]])
    weights = torch.tensor([[0.5, 2.0]])
    out = grpo_loss(
        logprobs, logprobs, torch.tensor([1.0]), torch.ones(1, 2),
        clip_low=0.2, clip_high=0.2, ref_logprobs=ref, kl_coef=1.0, is_weights=weights,
    )  # fmt: skip
    # policy: -1 * [0.5, 2] -> mean -1.25; kl: e^-1 on both tokens, unweighted
    assert out.metrics["loss/policy"] == pytest.approx(-1.25)
    assert out.metrics["loss/kl"] == pytest.approx(math.exp(-1))


def test_grpo_loss_requires_its_inputs():
    x = torch.zeros(1, 2)
    common = dict(clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(x, x, torch.ones(1), torch.ones(1, 2), kl_coef=0.1, **common)
    with pytest.raises(ValueError, match="entropy"):
        grpo_loss(x, x, torch.ones(1), torch.ones(1, 2), entropy_coef=0.01, **common)


def test_grpo_loss_all_masked_row_no_nan():
    logprobs = torch.tensor([[-1.0, -2.0], [float("-inf"), float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    for mode in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
        out = grpo_loss(
            logprobs, old, torch.tensor([1.0, 1.0]), mask, clip_low=0.2, clip_high=0.2,
            ref_logprobs=old, kl_coef=0.1, aggregation=mode, norm_length=2,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(out.loss, logprobs)
        assert torch.isfinite(out.loss), mode
        assert all(math.isfinite(v) for v in out.metrics.values()), mode
        assert torch.isfinite(grad).all(), mode


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_grpo_loss_micro_batches_sum_to_full_batch(mode):
    gen = torch.Generator().manual_seed(0)
    n, t = 6, 5
    logprobs = -torch.rand(n, t, generator=gen) * 3
    old = logprobs + 0.3 * torch.randn(n, t, generator=gen)  # ratios well outside the clip range
    ref = logprobs + 0.2 * torch.randn(n, t, generator=gen)
    advantages = torch.randn(n, generator=gen)
    mask = (torch.arange(t) < torch.tensor([5, 3, 0, 1, 4, 2]).unsqueeze(1)).float()
    tokens, sequences = mask_counts(mask)
    common = dict(
        clip_low=0.2, clip_high=0.28, dual_clip=3.0, aggregation=mode, norm_length=t,
        global_tokens=tokens, global_sequences=sequences, kl_coef=0.05,
    )  # fmt: skip

    full_input = logprobs.clone().requires_grad_(True)
    full = grpo_loss(full_input, old, advantages, mask, ref_logprobs=ref, **common).loss
    full.backward()
    split_input = logprobs.clone().requires_grad_(True)
    summed = sum(
        grpo_loss(
            split_input[rows],
            old[rows],
            advantages[rows],
            mask[rows],
            ref_logprobs=ref[rows],
            **common,
        ).loss  # fmt: skip
        for rows in (slice(0, 2), slice(2, 3), slice(3, 6))
    )
    summed.backward()

    assert_close(summed, full)
    assert_close(split_input.grad, full_input.grad)
