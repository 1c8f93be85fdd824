"""Every cross-field check of a recipe, run once at load (config/loading.py): the plans' (roles,
batches, placement: plans.py) and the schedule's (training_plan.py). Here, not in either, so that
neither module imports the other."""

from __future__ import annotations

from grpo_ray.algo.advantages import turn_slope
from grpo_ray.config.plans import check_plans
from grpo_ray.config.schema import Config, ConfigError
from grpo_ray.config.training_plan import check_training


def check_config(cfg: Config) -> None:
    """Raises ConfigError (one line naming the field) for the first combination that cannot run."""
    check_plans(cfg)
    check_training(cfg)
    if cfg.environment.reward_per_turn and cfg.environment.spec is None:
        raise ConfigError(
            "environment.reward_per_turn: per-turn credit is for episodes; set environment.spec, or leave it false"
        )
    if cfg.environment.reward_per_turn:
        try:
            turn_slope(cfg.algorithm.advantage)
        except ValueError as err:
            raise ConfigError(f"algorithm.advantage: {err}, or set environment.reward_per_turn: false") from None
