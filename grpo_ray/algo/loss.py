"""The GRPO policy loss, as the learner computes it on one micro-batch.

For completion i of a prompt, token t (all tensors [N, T], advantages [N]):

    rho_t   = exp(logp_t - old_logp_t)                              pi_theta / pi_old
    pg_t    = -min(rho_t A_i, clip(rho_t, 1 - clip_low, 1 + clip_high) A_i)
    pg_t    = min(pg_t, -dual_clip * A_i)            if A_i < 0 and dual_clip is set
    loss_t  = w_t pg_t + kl_coef KL_t - entropy_coef H_t
    loss    = aggregate(loss_t, mask)                token-mean by default (see aggregation.py)

A_i comes from advantages.py; KL_t = k3 = exp(ref - logp) - (ref - logp) - 1 by default (kl.py);
H_t is the policy entropy; w_t are optional truncated importance weights between the rollout
engine and the learner.

How this departs from the GRPO paper (DeepSeekMath):
- Asymmetric clipping (clip_low, clip_high), DAPO's "clip-higher": raising only the upper bound
  lets unlikely tokens with positive advantage grow, which keeps entropy from collapsing. Equal
  values give the paper's symmetric epsilon.
- Token-mean aggregation by default (DAPO). The paper's per-sequence mean ("seq-mean-token-mean")
  gives a token of a long answer less weight than a token of a short one.
- Optional dual clip (Ye et al., 2020): with A < 0 and a huge ratio the unclipped branch is
  unbounded; capping it at -dual_clip * A bounds the update from stale, badly-off tokens.
- The KL term is added to the per-token loss (not to the reward), as in the paper; kl_coef = 0
  drops it and the reference model is not needed.
- Rollout engines (vLLM) compute log-probs with other kernels than the learner; truncated
  importance sampling (Yao et al., "Your efficient RL framework secretly brings you off-policy
  RL training") reweights each token by min(pi_old / pi_rollout, cap).

- Off-policy rows (pipelined rollout with max_staleness > 0, rescued responses): the sampling
  policy mu is older than pi_old. As in decoupled PPO (Hilton et al., 2022; AReaL), the ratio
  stays pi_theta / pi_old (the learner's own log-probs: the trust region is around the current
  policy) and each token of such a row is weighted by min(pi_old / mu, cap) from the behaviour
  log-probs the rollout engine recorded, so the gradient estimates the on-policy one.

With one update per rollout batch old_logp equals logp numerically, rho = 1 and the clip never
binds; the loss still has the right gradient, -A_i * grad logp_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_ray.algo.aggregation import LossAggregation, aggregate_loss, masked_mean
from grpo_ray.algo.kl import LOG_RATIO_CLAMP, KLEstimator, kl_divergence


@dataclass(frozen=True)
class PolicyLossTerms:
    per_token_loss: Tensor  # [N, T] clipped surrogate loss, 0 where mask == 0
    clipped: Tensor  # [N, T] bool, the clipped branch was taken (its gradient is 0)
    dual_clipped: Tensor  # [N, T] bool, the dual-clip cap was taken; all False without dual_clip
    ratio: Tensor  # [N, T] pi_theta / pi_old


@dataclass(frozen=True)
class GRPOLossOutput:
    loss: Tensor  # scalar, carries the gradient
    metrics: dict[str, float]  # batch-local values, see grpo_loss


def policy_gradient_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> PolicyLossTerms:
    """PPO clipped surrogate with asymmetric bounds and optional dual clip.

    Args:
        logprobs: [N, T] log pi_theta of the sampled tokens (gradients flow through it).
        old_logprobs: [N, T] log pi_old, detached.
        advantages: [N] one advantage per sequence (an [N, T] per-token advantage also works).
        mask: [N, T] 1.0 on loss tokens.
        clip_low: the ratio is clipped below at 1 - clip_low, e.g. 0.2.
        clip_high: the ratio is clipped above at 1 + clip_high, e.g. 0.28.
        dual_clip: c > 1; for A < 0 the loss is capped at -c * A. None disables it.
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0; got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1; got {dual_clip}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.detach()

    # Clamped like the KL log-ratio: exp of a garbage log-prob gap must not reach inf.
    log_ratio = (logprobs - old_logprobs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped_loss = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    # The pessimistic bound: take the larger loss. A strict > marks the clipped branch only where
    # it changes the value (and removes the gradient).
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = clipped_loss > unclipped

    dual_clipped = torch.zeros_like(clipped)
    if dual_clip is not None:
        cap = -dual_clip * advantages
        dual_clipped = (advantages < 0) & (loss > cap)
        loss = torch.where(dual_clipped, cap.expand_as(loss), loss)

    in_loss = mask != 0
    return PolicyLossTerms(
        per_token_loss=torch.where(in_loss, loss, 0.0),
        clipped=clipped & in_loss,
        dual_clipped=dual_clipped & in_loss,
        ratio=ratio,
    )


def truncated_is_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, cap: float) -> Tensor:
    """Per-token importance weights min(pi_old / pi_rollout, cap), detached.

    Multiply the per-token policy loss by them: the rollout engine sampled from pi_rollout, the
    loss assumes samples from pi_old. Truncating at cap trades a little bias for bounded variance.

    Args:
        old_logprobs: [N, T] learner log-probs of the sampled tokens before the update.
        rollout_logprobs: [N, T] log-probs the rollout engine reported for the same tokens.
        cap: upper bound on a weight, > 0 (typically 2 to 5).

    Returns:
        [N, T] weights in (0, cap]; no gradient.
    """
    if cap <= 0:
        raise ValueError(f"cap must be positive; got {cap}")
    # Clamping the exponent at log(cap) gives min(ratio, cap) without ever forming exp of a
    # large gap.
    log_ratio = (old_logprobs - rollout_logprobs).detach()
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, math.log(cap)))


def behaviour_is_weights(
    old_logprobs: Tensor, rollout_logprobs: Tensor, stale_rows: Tensor, stale_cap: float, tis_cap: float | None
) -> Tensor | None:
    """Per-token importance weights of a micro-batch whose rows may come from older policies.

    Rows sampled with older weights (stale_rows) get min(pi_old / mu, stale_cap), mu being the
    behaviour policy whose log-probs the rollout engine recorded; fresh rows get truncated IS at
    tis_cap when that is set (engine mismatch only), else 1.

    Args:
        old_logprobs: [N, T] learner log-probs before the update (pi_old).
        rollout_logprobs: [N, T] behaviour log-probs of the same tokens.
        stale_rows: [N] bool, True where the row's policy version is older than the learner's.
        stale_cap: upper bound of a stale row's weight.
        tis_cap: upper bound of a fresh row's weight; None: fresh rows are not reweighted.

    Returns:
        [N, T] weights, no gradient; None when nothing is reweighted (no stale row, no tis_cap).
    """
    fresh = truncated_is_weights(old_logprobs, rollout_logprobs, tis_cap) if tis_cap is not None else None
    if not bool(stale_rows.any()):
        return fresh
    stale = truncated_is_weights(old_logprobs, rollout_logprobs, stale_cap)
    return torch.where(stale_rows[:, None], stale, fresh if fresh is not None else torch.ones_like(stale))


@torch.no_grad()
def mismatch_stats(learner_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the learner's, over loss tokens.

    Args:
        learner_logprobs: [N, T] learner log-probs of the sampled tokens.
        rollout_logprobs: [N, T] rollout engine log-probs of the same tokens.
        mask: [N, T] 1.0 on loss tokens.

    Returns:
        "mismatch/abs_diff_mean", "mismatch/abs_diff_max": |learner - rollout| in nats;
        "mismatch/kl_k3": k3 estimate of KL(rollout || learner), tokens were sampled by rollout;
        "mismatch/is_ratio_mean": mean of pi_learner / pi_rollout (1 when they agree).
    """
    log_ratio = learner_logprobs - rollout_logprobs
    abs_diff = log_ratio.abs()
    # The appended 0 keeps max() defined for an empty batch; |diff| >= 0 so it never wins.
    in_loss_diffs = torch.where(mask != 0, abs_diff, 0.0).flatten()
    # k3 with the rollout log-probs in the policy slot: the rollout engine drew the samples.
    kl = kl_divergence(rollout_logprobs, learner_logprobs, KLEstimator.K3)
    values = {
        "mismatch/abs_diff_mean": masked_mean(abs_diff, mask),
        "mismatch/abs_diff_max": torch.cat([in_loss_diffs, abs_diff.new_zeros(1)]).max(),
        "mismatch/kl_k3": masked_mean(kl, mask),
        "mismatch/is_ratio_mean": masked_mean(torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), mask),
    }
    floats = torch.stack(list(values.values())).tolist()
    return dict(zip(values, floats))


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    aggregation: LossAggregation | str = LossAggregation.TOKEN_MEAN,
    norm_length: float | None = None,
    global_tokens: float | None = None,
    global_sequences: float | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator | str = KLEstimator.K3,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    is_weights: Tensor | None = None,
) -> GRPOLossOutput:
    """The learner's loss for one micro-batch (formula in the module docstring).

    Args:
        logprobs, old_logprobs, advantages, mask, clip_low, clip_high, dual_clip:
            as in policy_gradient_loss.
        aggregation, norm_length, global_tokens, global_sequences: as in aggregate_loss; pass
            the step's global counts when the batch is split into micro-batches or ranks.
        ref_logprobs: [N, T] reference log-probs; needed when kl_coef > 0, and measured
            ("actor/kl") whenever given.
        kl_coef: weight beta of the KL term, >= 0.
        kl_estimator: k1, k2 or k3.
        entropy: [N, T] policy entropy (entropy_from_logits); needed when entropy_coef != 0.
        entropy_coef: the loss subtracts entropy_coef * entropy (a bonus when positive).
        is_weights: [N, T] truncated importance weights, multiply the policy term only.

    Returns:
        GRPOLossOutput. metrics are plain floats computed on this micro-batch alone:
        "loss/policy", "loss/kl", "loss/entropy", "loss/total" are the three terms and their sum
        aggregated with this batch's own counts (policy + kl + entropy = total);
        "actor/clip_fraction", "actor/ratio_mean" are token means over the mask, as are
        "actor/kl" (only when ref_logprobs is given) and "actor/entropy" (only when entropy is
        given); "actor/dual_clip_fraction" is added when dual_clip is set.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0; got {kl_coef}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if entropy_coef != 0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs entropy")

    terms = policy_gradient_loss(
        logprobs, old_logprobs, advantages, mask,
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
    )  # fmt: skip
    policy = terms.per_token_loss
    if is_weights is not None:
        policy = policy * is_weights.detach()
    zeros = torch.zeros_like(policy)
    kl = None
    if ref_logprobs is not None:
        kl = kl_divergence(logprobs, ref_logprobs.detach(), kl_estimator)
    kl_term = kl_coef * kl if kl is not None and kl_coef > 0 else zeros
    entropy_term = -entropy_coef * entropy if entropy is not None and entropy_coef != 0 else zeros
    total = policy + kl_term + entropy_term

    loss = aggregate_loss(
        total, mask, aggregation,
        norm_length=norm_length, global_tokens=global_tokens, global_sequences=global_sequences,
    )  # fmt: skip

    parts = {"loss/policy": policy, "loss/kl": kl_term, "loss/entropy": entropy_term, "loss/total": total}
    return GRPOLossOutput(loss, _loss_metrics(parts, terms, mask, aggregation, norm_length, dual_clip, kl, entropy))


@torch.no_grad()
def _loss_metrics(
    parts: dict[str, torch.Tensor],
    terms: PolicyLossTerms,
    mask: torch.Tensor,
    aggregation: str,
    norm_length: float | None,
    dual_clip: float | None,
    kl: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> dict[str, float]:
    """grpo_loss's metrics. Each term is aggregated with this batch's own counts: with global counts a
    micro-batch's loss is only its share of the step's, which reads badly on a chart. The terms add
    up to loss/total."""
    values = {key: aggregate_loss(part, mask, aggregation, norm_length=norm_length) for key, part in parts.items()}
    dtype = parts["loss/policy"].dtype
    values["actor/clip_fraction"] = masked_mean(terms.clipped.to(dtype), mask)
    values["actor/ratio_mean"] = masked_mean(terms.ratio, mask)
    if dual_clip is not None:
        values["actor/dual_clip_fraction"] = masked_mean(terms.dual_clipped.to(dtype), mask)
    if kl is not None:
        values["actor/kl"] = masked_mean(kl, mask)
    if entropy is not None:
        values["actor/entropy"] = masked_mean(entropy, mask)
    # One stack and one tolist: a single device-to-host copy instead of a sync per metric.
    floats = torch.stack([v.to(dtype) for v in values.values()]).tolist()
    return dict(zip(values, floats))
