"""grpo-ray from Python: the same runs and checks as `grpo-ray train` and `grpo-ray validate`.

    import grpo_ray

    checked = grpo_ray.validate("configs/tiny.yaml", {"train.steps": 20})
    print(checked.plan_lines[-1], checked.train_prompts)
    result = grpo_ray.train("configs/tiny.yaml", {"train.steps": 20, "output_dir": "runs/api"})
    print(result.eval_accuracy[0], "->", result.eval_accuracy[20], "model in", result.model_dir)

A recipe is a YAML file's path (its relative paths are relative to its folder), a dict shaped as
the YAML (its relative paths, like the overrides', relative to the working directory), or a loaded
`Config`. Overrides are {"dotted.key": value} or ["dotted.key=value", ...], as `--set` takes them.
Errors are the CLI's, raised: ConfigError, DataError, ModelLoadError, RewardSpecError... each with a
one-line message naming the field or file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from grpo_ray.config import Config, config_from_mapping, load_config

if TYPE_CHECKING:
    from grpo_ray.training.run import TrainResult

Recipe = str | Path | Mapping[str, Any] | Config
Overrides = Mapping[str, Any] | Sequence[str]


@dataclass(frozen=True)
class Validation:
    config: Config
    plan_lines: list[str]  # what `grpo-ray validate` prints: resolved config, resources, batch, memory, LR
    warnings: list[str]  # the memory plan's
    checked_on: str  # what the plan was checked against ("this machine (...)", "the cluster at ...")
    train_prompts: int
    eval_prompts: int
    # The first training prompt as the model sees it: its tokens decoded, special tokens (a BOS, the
    # chat template's markers) shown.
    first_prompt: str = ""


def load(recipe: Recipe, overrides: Overrides = ()) -> Config:
    """The recipe as a checked `Config` (ConfigError naming every wrong field)."""
    sets = _override_strings(overrides)
    if isinstance(recipe, Config):
        return config_from_mapping(recipe.model_dump(mode="json"), sets) if sets else recipe
    if isinstance(recipe, Mapping):
        return config_from_mapping(recipe, sets)
    return load_config(recipe, sets)


def validate(recipe: Recipe, overrides: Overrides = (), address: str | None = None, gpu_memory_gb: float = 80.0):
    """What `grpo-ray validate` checks: models, reward functions, data and the plan against this
    machine or the cluster at `address` (default ray.address, then RAY_ADDRESS). Returns a
    Validation; raises the error of the one problem found, or PreflightError naming every one."""
    from grpo_ray.commands.validate import plan_report
    from grpo_ray.training.preflight import preflight

    cfg = load(recipe, overrides)
    lines, warnings = plan_report(cfg, gpu_memory_gb, with_config=True)
    checked = preflight(cfg, address)
    return Validation(
        cfg,
        lines,
        warnings,
        checked.where,
        len(checked.inputs.train_prompts),
        len(checked.inputs.eval_prompts),
        checked.inputs.first_prompt_shown,
    )


def train(recipe: Recipe, overrides: Overrides = (), resume: str = "auto", verbose: bool = False) -> TrainResult:
    """Run the recipe as `grpo-ray train` does (a local Ray unless ray.address or RAY_ADDRESS names a
    cluster); returns the TrainResult: run_id, tracking_uri, steps, eval_accuracy {step: accuracy},
    model_dir, last_metrics. resume: "auto" (from output_dir's newest checkpoint if any), "require"
    or "never" (start over, old checkpoints moved aside)."""
    from grpo_ray.quiet import quiet_driver, set_verbose
    from grpo_ray.training.loop import train as run_training

    cfg = load(recipe, overrides)
    set_verbose(verbose)
    quiet_driver()
    return run_training(cfg, resume=resume)


def _override_strings(overrides: Overrides) -> list[str]:
    if isinstance(overrides, Mapping):
        # As YAML, so that a value reads back as the same type ("1e-6" a float, [a, b] a list).
        return [
            f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
            for key, value in overrides.items()
        ]
    if isinstance(overrides, str):
        raise TypeError(
            "overrides: a {'dotted.key': value} dict or a list of 'dotted.key=value' strings, not one string"
        )
    return list(overrides)
