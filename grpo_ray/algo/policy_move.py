"""How far one update moved the policy on the tokens it was trained on, against what the clip allows.

The clip bounds the ratio rho_t = pi_theta / pi_old to [1 - clip_low, 1 + clip_high], i.e. the log
ratio to [log(1 - clip_low), log(1 + clip_high)]: about +-0.2 nats at the usual 0.2. But it only bounds
what a *later* pass over the same batch may do. With one update per batch (the default) rho = 1
throughout the step and the clip never binds, so nothing stops one optimizer step from moving the
sampled tokens' log-probs by nats. Measured after the update, on the step's own sampled tokens
(tokens drawn from pi_old), the log ratio log pi_new - log pi_old shows the move the clip meant to
bound; with mu > 1 inner epochs it is the whole step's move, every epoch's included.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpo_ray.algo.aggregation import masked_mean
from grpo_ray.algo.kl import LOG_RATIO_CLAMP


def clip_log_bound(clip_low: float, clip_high: float) -> float:
    """The |log ratio| at which the recipe's clip starts to bind on its nearer side (nats):
    min(log(1 + clip_high), -log(1 - clip_low)); 0.182 at 0.2 / 0.2."""
    low = -math.log1p(-clip_low) if clip_low < 1 else math.inf
    return min(math.log1p(clip_high), low)


@torch.no_grad()
def update_move(new_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, clip_low: float, clip_high: float) -> dict:
    """How far an update moved the sampled tokens' log-probs.

    Args:
        new_logprobs: [N, T] log pi of the sampled tokens after the update.
        old_logprobs: [N, T] log pi of the same tokens before it (pi_old, which sampled them).
        mask: [N, T] 1.0 on loss tokens.
        clip_low, clip_high: the recipe's clip range (algorithm.clip_low / clip_high).

    Returns:
        "update/moved": mean |log pi_new - log pi_old| over the mask (nats);
        "update/kl": k3 estimate of KL(pi_old || pi_new), the tokens being pi_old's samples;
        "update/outside_clip": fraction of the tokens whose ratio left [1 - clip_low, 1 + clip_high].
        NaN each when the mask is empty.
    """
    # Clamped as the loss's: a token gone to -inf must not make the means inf.
    log_ratio = (new_logprobs - old_logprobs).double().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    outside = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
    values = {
        "update/moved": log_ratio.abs(),
        "update/kl": ratio - 1.0 - log_ratio,  # k3 with q = pi_old (sampled), p = pi_new
        "update/outside_clip": outside.double(),
    }
    if not bool((mask != 0).any()):
        return {key: math.nan for key in values}
    return {key: float(masked_mean(value, mask.double())) for key, value in values.items()}
