"""Token log-probs and entropy from language-model logits, without a full log_softmax copy.

Logits are the largest tensor of a step ([N, T, V] with V around 150k), so both functions use
log p(y) = z_y - logsumexp(z): one reduction over V and a gather, instead of materialising a
second [N, T, V] tensor of log-probabilities. The computation runs in the logits' own dtype;
pass float32 logits where log-prob precision matters (bfloat16 keeps about 3 significant digits).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    if temperature <= 0:
        raise ValueError(f"temperature must be positive; got {temperature}")
    # Skipping the division at temperature 1 saves a full [N, T, V] copy.
    return logits if temperature == 1.0 else logits / temperature


def token_logprobs_from_logits(logits: Tensor, target_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each target token under softmax(logits / temperature).

    The temperature must be the sampling temperature of the rollout, so that the learner scores
    tokens under the distribution they were actually drawn from.

    Args:
        logits: [N, T, V] logits at the positions that predict target_ids.
        target_ids: [N, T] int64 token ids.
        temperature: sampling temperature, > 0.

    Returns:
        [N, T] log-probs, differentiable w.r.t. logits.
    """
    scaled = _scaled(logits, temperature)
    target_logits = scaled.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    return target_logits - torch.logsumexp(scaled, dim=-1)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) at every position.

    H = logsumexp(z) - sum_v p_v z_v, which stays finite for large finite logits where
    -sum p log p would meet 0 * log 0 (a -inf logit still gives NaN: 0 * -inf).

    Args:
        logits: [N, T, V], finite.
        temperature: as in token_logprobs_from_logits, > 0.

    Returns:
        [N, T] entropy in nats, differentiable w.r.t. logits.
    """
    scaled = _scaled(logits, temperature)
    probs = torch.softmax(scaled, dim=-1)
    return torch.logsumexp(scaled, dim=-1) - (probs * scaled).sum(-1)
