"""Per-token estimators of KL(pi || pi_ref) from log-probs of tokens sampled from pi.

With x = logp - ref_logp for a token sampled from pi (Schulman, "Approximating KL divergence"):

    k1 = x                        unbiased, high variance, can be negative per token
    k2 = x^2 / 2                  biased, low variance; its gradient is that of the true KL
    k3 = exp(-x) - (-x) - 1       unbiased and always >= 0; the GRPO paper's estimator (default)

The same functions measure any pair of log-prob sets: `mismatch_stats` in loss.py uses k3 with
the rollout engine's log-probs as `logprobs` to estimate KL(rollout || learner).

Numerical safety: x is clamped to [-20, 20] (`LOG_RATIO_CLAMP`, as verl does) before any estimator
runs. Without it k3 overflows to inf for x < -88 in float32 and one token poisons the whole loss;
exp(20) is about 4.9e8, finite in float32 and bfloat16, and a token whose log-prob differs by more
than 20 nats between the two models carries no usable signal anyway. Tokens outside the range get
zero gradient. Pass `log_ratio_clamp=None` to disable the clamp.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import torch
from torch import Tensor

from grpo_ray.algo.registry import lookup

LOG_RATIO_CLAMP = 20.0


class KLEstimator(str, Enum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


def _k1(log_ratio: Tensor) -> Tensor:
    return log_ratio


def _k2(log_ratio: Tensor) -> Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: Tensor) -> Tensor:
    # exp(-x) + x - 1 written with expm1: for |x| << 1 the terms nearly cancel, and expm1 keeps
    # the small result accurate where exp(-x) - 1 would lose it to rounding.
    return torch.expm1(-log_ratio) + log_ratio


KLFn = Callable[[Tensor], Tensor]

_KL_ESTIMATORS: dict[KLEstimator, KLFn] = {
    KLEstimator.K1: _k1,
    KLEstimator.K2: _k2,
    KLEstimator.K3: _k3,
}


def get_kl_estimator(estimator: KLEstimator | str) -> KLFn:
    """Registry lookup: a function of x = logp - ref_logp; unknown names raise ValueError."""
    return lookup(_KL_ESTIMATORS, KLEstimator, estimator, "KL estimator")


def kl_divergence(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    estimator: KLEstimator | str = KLEstimator.K3,
    *,
    log_ratio_clamp: float | None = LOG_RATIO_CLAMP,
) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate.

    Args:
        logprobs: [N, T] log pi of the sampled tokens (gradients flow through it).
        ref_logprobs: [N, T] log pi_ref of the same tokens.
        estimator: k1, k2 or k3 (see the module docstring).
        log_ratio_clamp: clamp logprobs - ref_logprobs to [-c, c] first; None disables it.

    Returns:
        [N, T] per-token estimate; positions outside the loss mask hold arbitrary values.
    """
    fn = get_kl_estimator(estimator)
    log_ratio = logprobs - ref_logprobs
    if log_ratio_clamp is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    return fn(log_ratio)


def sequence_kl(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    estimator: KLEstimator | str = KLEstimator.K1,
) -> Tensor:
    """[N] per-sequence KL: the per-token estimate summed over the masked (generated) tokens.

    The KL-in-reward placement: reward_i - beta * sequence_kl_i, computed from the log-probs the
    rollout engine recorded (no gradient flows; the penalty is part of the reward). mask [N, T] is
    1.0 on generated tokens; other positions do not count, whatever they hold.
    """
    return (kl_divergence(logprobs, ref_logprobs, estimator) * mask).sum(dim=1)
