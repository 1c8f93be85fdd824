"""The environment's reward as a reward function, so that it adds into the total as every other
does (weighted, logged as reward/environment/*), and the lines that say why an episode failed.

An episode's rollout writes its environment reward (the steps' rewards plus the environment's
reward() at the end) into the row field `environment_reward`, NaN when the episode failed (an
environment error or timeout): that row then fails here, never scores 0. Its failures are the
environment's, not a reward function's: the run counts them under environment.max_failure_rate
(envs/failures.py), and the reward workers carry the first line of each kind to the driver
(`episode_errors`).
"""

from __future__ import annotations

import math

# The reward function's name in the run's reward pool (cluster/roles.py) and metrics.
NAME = "environment"
# The row fields the rollout writes (actors/episodes.py) and this module reads.
FIELD = "environment_reward"
ERROR_FIELD = "environment_error"  # why the episode failed (its own request), one line
LOST_FIELD = "environment_lost"  # an episode lost with a process another episode's request ended
TOOL_ERROR_FIELD = "environment_tool_error"  # its first tool call that failed


def environment_reward(completions: list[str], environment_reward: list[float], **row_fields) -> list[float | None]:
    return [None if value is None or not math.isfinite(float(value)) else float(value) for value in environment_reward]


def episode_errors(row_fields: dict[str, list]) -> dict[str, str]:
    """The first line of each kind among these rows' episodes: "failure" (its own reset, step or
    reward failed), "lost" (lost with its process), "tool" (a tool call failed); empty for rows
    that are not episodes."""
    found = {}
    for key, name in (("failure", ERROR_FIELD), ("lost", LOST_FIELD), ("tool", TOOL_ERROR_FIELD)):
        line = next((value for value in row_fields.get(name, ()) if value), None)
        if line:
            found[key] = line
    return found
