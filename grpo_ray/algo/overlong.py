"""What to do with completions cut off at max_new_tokens (no end-of-turn token).

Three treatments, by name:
- "none": nothing special; the reward functions decide.
- "zero_reward" (POLARIS, DeepScaleR): a truncated completion scores 0, whatever it contains.
- "mask": truncated completions stay out of the loss altogether (row weight 0), and out of their
  group's advantage statistics.
- "soft_penalty" (DAPO's overlong reward shaping): no change up to max_len - buffer tokens, then a
  penalty growing linearly to `penalty` at max_len: r - penalty * (len - (max_len - buffer)) / buffer.

    >>> lengths, truncated = np.array([10, 20]), np.array([False, True])
    >>> rewards, weights = shape_overlong_rewards(np.array([1.0, 1.0]), lengths, truncated, "zero_reward", 20)
    >>> rewards.tolist(), weights.tolist()
    ([1.0, 0.0], [1.0, 1.0])
"""

from __future__ import annotations

from enum import Enum

import numpy as np


class OverlongTreatment(str, Enum):
    NONE = "none"
    ZERO_REWARD = "zero_reward"
    MASK = "mask"
    SOFT_PENALTY = "soft_penalty"


def shape_overlong_rewards(
    rewards: np.ndarray,
    lengths: np.ndarray,
    truncated: np.ndarray,
    treatment: OverlongTreatment | str,
    max_len: int,
    buffer: int = 0,
    penalty: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(rewards [N], row loss weights [N]) after the treatment; inputs are not modified.

    rewards [N] float (NaN = failed, left as is), lengths [N] completion tokens, truncated [N] bool.
    """
    treatment = OverlongTreatment(treatment)
    rewards = np.asarray(rewards, dtype=np.float64).copy()
    weights = np.ones(len(rewards), dtype=np.float64)
    truncated = np.asarray(truncated, dtype=bool)
    if treatment is OverlongTreatment.ZERO_REWARD:
        rewards[truncated & np.isfinite(rewards)] = 0.0
    elif treatment is OverlongTreatment.MASK:
        weights[truncated] = 0.0
    elif treatment is OverlongTreatment.SOFT_PENALTY:
        if not 0 < buffer <= max_len:
            raise ValueError(f"soft_penalty needs 0 < buffer <= max_len, got buffer={buffer}, max_len={max_len}")
        start = max_len - buffer
        over = np.clip(np.asarray(lengths, dtype=np.float64) - start, 0.0, buffer)
        rewards = rewards - penalty * over / buffer
    return rewards, weights
