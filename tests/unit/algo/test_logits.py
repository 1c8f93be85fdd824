"""Token log-probs and entropy from logits."""

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_ray.algo import entropy_from_logits, token_logprobs_from_logits


def test_entropy_of_uniform_is_log_v():
    # equal logits -> uniform over V = 5 -> H = log 5 = 1.6094, whatever the common value
    logits = torch.full((2, 3, 5), 7.0)
    assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(5)))


def test_entropy_of_one_hot_is_zero_and_finite():
    # one logit 1e4 above the rest: softmax is one-hot in float32, H = 0 (no 0 * log 0 NaN)
    logits = torch.zeros(1, 1, 4)
    logits[0, 0, 2] = 1e4
    assert_close(entropy_from_logits(logits), torch.zeros(1, 1))


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_entropy_matches_categorical(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 11, generator=gen) * 3
    expected = torch.distributions.Categorical(logits=logits / temperature).entropy()
    assert_close(entropy_from_logits(logits, temperature), expected)


def test_logprobs_hand_worked():
    # logits [0, log 3] -> probs [1/4, 3/4]
    # temperature 0.5 -> logits [0, 2 log 3] -> probs [1/10, 9/10]
    logits = torch.tensor([[[0.0, math.log(3)]]])
    target = torch.tensor([[1]])
    assert_close(token_logprobs_from_logits(logits, target), torch.tensor([[math.log(0.75)]]))
    actual = token_logprobs_from_logits(logits, target, temperature=0.5)
    assert_close(actual, torch.tensor([[math.log(0.9)]]))


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_logprobs_match_log_softmax_gather(temperature):
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(4, 5, 50, generator=gen) * 4).requires_grad_(True)
    target = torch.randint(0, 50, (4, 5), generator=gen)

    actual = token_logprobs_from_logits(logits, target, temperature)
    (grad_actual,) = torch.autograd.grad(actual.sum(), logits)
    expected = torch.log_softmax(logits / temperature, -1).gather(-1, target.unsqueeze(-1))
    expected = expected.squeeze(-1)
    (grad_expected,) = torch.autograd.grad(expected.sum(), logits)

    assert_close(actual, expected)
    assert_close(grad_actual, grad_expected)


def test_non_positive_temperature_raises():
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_from_logits(torch.zeros(1, 1, 2), torch.zeros(1, 1, dtype=torch.int64), 0.0)
