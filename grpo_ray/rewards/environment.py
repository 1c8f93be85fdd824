"""The environment's reward as a reward function, so that it adds into the total as every other
does (weighted, logged as reward/environment/*, its failures counted against reward.max_failure_rate).

An episode's rollout writes its environment reward (the steps' rewards plus the environment's
reward() at the end) into the row field `environment_reward`, NaN when the episode failed (an
environment error or timeout): that row then fails here, never scores 0.
"""

from __future__ import annotations

import math

# The row field the rollout writes (actors/episodes.py) and this function reads.
FIELD = "environment_reward"


def environment_reward(completions: list[str], environment_reward: list[float], **row_fields) -> list[float | None]:
    return [None if value is None or not math.isfinite(float(value)) else float(value) for value in environment_reward]
