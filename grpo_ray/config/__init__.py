"""The recipe: YAML in, a typed, frozen `Config` out, and the plans derived from it.

Loading never raises anything but `ConfigError`, whose message is one line that names the field
and what is allowed.

    >>> cfg = load_config("configs/tiny.yaml", overrides=["train.steps=5"])
    >>> plan_batches(cfg).completions_per_step
    256
"""

from grpo_ray.config.checks import check_config
from grpo_ray.config.loading import config_from_dict, config_from_mapping, config_to_dict, flatten, load_config
from grpo_ray.config.plans import (
    BatchPlan,
    RoleResources,
    StagePlan,
    describe_resources,
    longest_completion,
    longest_sequence,
    syncs_during_generation,
    syncs_lora_adapter,
    plan_batches,
    prefetch_room,
    time_checkpoint_due,
    plan_resources,
    plan_stages,
    total_steps,
)
from grpo_ray.config.training_plan import check_training, plan_lr_segments
from grpo_ray.config.schema import *  # noqa: F403 - every section class is part of the API
from grpo_ray.config.schema import Config, ConfigError

__all__ = [
    "BatchPlan",
    "Config",
    "ConfigError",
    "RoleResources",
    "StagePlan",
    "check_config",
    "check_training",
    "config_from_dict",
    "config_from_mapping",
    "config_to_dict",
    "describe_resources",
    "flatten",
    "load_config",
    "longest_completion",
    "longest_sequence",
    "syncs_during_generation",
    "syncs_lora_adapter",
    "plan_batches",
    "plan_lr_segments",
    "prefetch_room",
    "time_checkpoint_due",
    "plan_resources",
    "plan_stages",
    "total_steps",
]
