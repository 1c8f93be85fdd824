"""Pure-torch GRPO algorithm: advantages, KL estimators, policy loss and its aggregation.

Nothing here imports ray, deepspeed, vllm or a config object: every function takes tensors and
plain numbers, and every variant is chosen by a `str, Enum` name through a registry.
"""

from grpo_ray.algo.advantages import (
    AdvantageEstimator,
    GroupRewardStats,
    advantage_slopes,
    compute_advantages,
    get_advantage_estimator,
    group_reward_stats,
)
from grpo_ray.algo.aggregation import (
    LossAggregation,
    MaskCounts,
    aggregate_loss,
    get_loss_aggregation,
    mask_counts,
    masked_mean,
)
from grpo_ray.algo.kl import LOG_RATIO_CLAMP, KLEstimator, get_kl_estimator, kl_divergence, sequence_kl
from grpo_ray.algo.logits import entropy_from_logits, token_logprobs_from_logits
from grpo_ray.algo.loss import (
    GRPOLossOutput,
    PolicyLossTerms,
    behaviour_is_weights,
    grpo_loss,
    mismatch_stats,
    policy_gradient_loss,
    truncated_is_weights,
)

__all__ = [
    "LOG_RATIO_CLAMP",
    "AdvantageEstimator",
    "GRPOLossOutput",
    "GroupRewardStats",
    "KLEstimator",
    "LossAggregation",
    "MaskCounts",
    "PolicyLossTerms",
    "aggregate_loss",
    "behaviour_is_weights",
    "compute_advantages",
    "advantage_slopes",
    "entropy_from_logits",
    "get_advantage_estimator",
    "get_kl_estimator",
    "get_loss_aggregation",
    "grpo_loss",
    "group_reward_stats",
    "kl_divergence",
    "sequence_kl",
    "mask_counts",
    "masked_mean",
    "mismatch_stats",
    "policy_gradient_loss",
    "token_logprobs_from_logits",
    "truncated_is_weights",
]
