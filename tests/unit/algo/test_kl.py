"""KL estimators on hand values, and their expectation under the sampling policy."""

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_ray.algo import KLEstimator, kl_divergence, sequence_kl

# x = logp - ref per token: +1, -1, 0
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5]])
REF_LOGPROBS = torch.tensor([[-2.0, -1.0, -0.5]])


def test_k1():
    # k1 = x
    assert_close(kl_divergence(LOGPROBS, REF_LOGPROBS, "k1"), torch.tensor([[1.0, -1.0, 0.0]]))


def test_k2():
    # k2 = x^2 / 2: 0.5 for x = +-1, 0 for x = 0
    actual = kl_divergence(LOGPROBS, REF_LOGPROBS, KLEstimator.K2)
    assert_close(actual, torch.tensor([[0.5, 0.5, 0.0]]))


def test_k3():
    # k3 = exp(ref - logp) - (ref - logp) - 1
    # x = +1: e^-1 + 1 - 1 = 0.3679;  x = -1: e^1 - 1 - 1 = 0.7183;  x = 0: 0
    expected = torch.tensor([[math.exp(-1), math.e - 2, 0.0]])
    assert_close(kl_divergence(LOGPROBS, REF_LOGPROBS, "k3"), expected)


def test_k3_is_default_and_non_negative():
    x = torch.linspace(-5, 5, 101).unsqueeze(0)
    k3 = kl_divergence(x, torch.zeros_like(x))
    assert_close(k3, kl_divergence(x, torch.zeros_like(x), "k3"))
    assert (k3 >= 0).all()


def test_clamp_keeps_k3_finite():
    logprobs = torch.tensor([[-100.0, 50.0]])
    ref = torch.zeros_like(logprobs)
    # x = -100 clamps to -20: k3 = e^20 - 20 - 1 (finite); x = 50 clamps to 20: e^-20 + 20 - 1
    clamped = kl_divergence(logprobs, ref, "k3")
    expected = torch.tensor([[math.exp(20) - 21, math.exp(-20) + 19]])
    assert_close(clamped, expected)
    # Without the clamp, e^100 overflows float32.
    assert torch.isinf(kl_divergence(logprobs, ref, "k3", log_ratio_clamp=None)[0, 0])
    # The clamp applies to every estimator: k1 of x = 50 reads 20.
    assert_close(kl_divergence(logprobs, ref, "k1")[0, 1], torch.tensor(20.0))


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_unbiased_estimators_match_exact_kl_in_expectation(estimator):
    # E_{y~p}[k(y)] summed exactly over a categorical support equals KL(p || q) for k1 and k3:
    # for k3, E_p[q/p - 1 - log(q/p)] = sum(q) - 1 + KL(p||q) = KL(p||q).
    gen = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(8, generator=gen, dtype=torch.float64), -1)
    logq = torch.log_softmax(torch.randn(8, generator=gen, dtype=torch.float64), -1)
    exact = (logp.exp() * (logp - logq)).sum()
    per_token = kl_divergence(logp.unsqueeze(0), logq.unsqueeze(0), estimator)
    assert_close((logp.exp() * per_token[0]).sum(), exact)


def test_gradient_flows_to_logprobs():
    logprobs = LOGPROBS.clone().requires_grad_(True)
    kl_divergence(logprobs, REF_LOGPROBS, "k3").sum().backward()
    # d k3 / dx = 1 - e^-x: 1 - e^-1 = 0.6321, 1 - e = -1.7183, 0
    assert_close(logprobs.grad, torch.tensor([[1 - math.exp(-1), 1 - math.e, 0.0]]))


def test_unknown_estimator():
    with pytest.raises(ValueError, match="choose one of"):
        kl_divergence(LOGPROBS, REF_LOGPROBS, "k4")


def test_sequence_kl_sums_the_masked_tokens_only():
    logprobs = torch.tensor([[0.0, -1.0, -2.0], [-1.0, -1.0, -3.0]])
    ref = torch.tensor([[5.0, -2.0, -1.0], [-1.0, -3.0, -1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    # k1 = logp - ref: row 0 tokens 1, 2 -> 1 + (-1) = 0; row 1 token 1 -> 2 (tokens 0 and 2 masked).
    assert_close(sequence_kl(logprobs, ref, mask, "k1"), torch.tensor([0.0, 2.0]))
    # k3 = e^-x + x - 1: row 0: (e^-1 + 0) + (e + -2) ; row 1: e^-2 + 1.
    expected = torch.tensor([math.exp(-1) + math.e - 2, math.exp(-2) + 1])
    assert_close(sequence_kl(logprobs, ref, mask, "k3"), expected)
