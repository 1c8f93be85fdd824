"""Which policy a micro-batch's ratio is taken against (pi_old), and how off-policy rows are weighted.

    stale = stale_rows(policy_versions, step)               # [N] rows sampled by older weights
    old, weights = pi_old_and_weights(learner_old, rollout, stale, epochs_per_batch, stale_cap, tis_cap)

One pass over a batch (epochs_per_batch = 1): pi_old is the learner's own log-probs before the
update (ratio 1 in value; decoupled PPO keeps the trust region around the current policy), and a
row sampled by older weights (pipelined rollout, a rescued response) is weighted by
min(pi_old / mu, stale_cap), mu being the behaviour policy the rollout engine recorded.
Several passes (mu > 1 epochs): pi_old is the behaviour policy itself, so the ratio already
corrects for it and no row is reweighted as stale; only tis_cap's engine-mismatch weights remain.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from grpo_ray.algo.loss import behaviour_is_weights


def stale_rows(policy_versions: np.ndarray, step: int) -> np.ndarray:
    """[N] bool: rows sampled by weights older than the learner's. During step s the learner holds
    version s - 1 (the weights after step s - 1's update)."""
    return np.asarray(policy_versions) < step - 1


def pi_old_and_weights(
    learner_old: Tensor,
    rollout_logprobs: Tensor,
    stale: Tensor,
    epochs_per_batch: int,
    stale_cap: float,
    tis_cap: float | None,
) -> tuple[Tensor, Tensor | None]:
    """(pi_old log-probs [N, T], per-token importance weights [N, T] or None).

    learner_old: [N, T] the learner's log-probs in the first pass; rollout_logprobs: [N, T] the
    behaviour policy's; stale: [N] bool from stale_rows.
    """
    if epochs_per_batch == 1:
        return learner_old, behaviour_is_weights(learner_old, rollout_logprobs, stale, stale_cap, tis_cap)
    no_stale = torch.zeros_like(stale)
    return rollout_logprobs, behaviour_is_weights(learner_old, rollout_logprobs, no_stale, stale_cap, tis_cap)
