"""Optimisation settings derived from a recipe and checked once: the LR schedule's segments, offload,
mixed precision, the KL controller and reward shaping."""

from __future__ import annotations

from grpo_ray.algo.schedules import LrSegment, warmup_from_ratio
from grpo_ray.config.plans import plan_stages
from grpo_ray.config.schema import Config, ConfigError


def plan_lr_segments(cfg: Config) -> tuple[LrSegment, ...]:
    """One LR schedule per run of stages: the first starts at step 1; a stage that sets lr or
    lr_schedule starts a fresh one (warmup again) that runs to the next such stage or the end."""
    lr = cfg.learner
    stages = plan_stages(cfg)
    configs = cfg.stages or (None,)
    starts = [0] + [
        i for i, stage in enumerate(configs) if i > 0 and (stage.lr is not None or stage.lr_schedule is not None)
    ]
    segments = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(stages)
        steps = sum(stage.steps for stage in stages[start:end])
        own = configs[start] if start > 0 else None
        peak = own.lr if own is not None and own.lr is not None else lr.lr
        kind = own.lr_schedule if own is not None and own.lr_schedule is not None else lr.lr_schedule
        warmup = warmup_from_ratio(lr.warmup_ratio, steps) if lr.warmup_ratio is not None else lr.warmup_steps
        segments.append(
            LrSegment(
                first_step=stages[start].first_step,
                steps=steps,
                peak_lr=peak,
                kind=kind,
                warmup_steps=warmup,
                min_lr=lr.min_lr,
            )
        )
    return tuple(segments)


def check_training(cfg: Config) -> None:
    """Cross-field checks of this module's switches; raises ConfigError naming the field."""
    lr, a = cfg.learner, cfg.algorithm
    if lr.warmup_ratio is not None and lr.warmup_steps:
        raise ConfigError("learner.warmup_ratio: set either warmup_steps or warmup_ratio, not both")
    for index, segment in enumerate(plan_lr_segments(cfg)):
        if lr.min_lr > segment.peak_lr:
            where = "learner.lr" if index == 0 else "the lr of a stage"
            raise ConfigError(
                f"learner.min_lr: {lr.min_lr:g} is above {where} ({segment.peak_lr:g}); the floor must be <= the peak"
            )
    if lr.offload_optimizer is not None and lr.zero_stage == 0:
        raise ConfigError(
            "learner.offload_optimizer: optimizer offload is part of ZeRO; set learner.zero_stage to 1, 2 or 3"
        )
    if lr.offload_params is not None and lr.zero_stage != 3:
        raise ConfigError(
            f"learner.offload_params: parameter offload needs learner.zero_stage: 3 (got {lr.zero_stage})"
        )
    if a.kl_controller == "adaptive" and a.kl_coef == 0:
        raise ConfigError(
            "algorithm.kl_controller: adaptive scales algorithm.kl_coef, which is 0; set a starting kl_coef > 0"
        )
    if cfg.reward.normalize == "running" and (cfg.polaris.rescue or cfg.polaris.drop_easy_threshold is not None):
        raise ConfigError(
            "reward.normalize: polaris.rescue and polaris.drop_easy_threshold compare raw rewards with thresholds, "
            "which normalised rewards break; turn one of them off"
        )


def describe_lr_segments(segments: tuple[LrSegment, ...]) -> list[str]:
    """One line per schedule for `grpo-ray validate`."""
    return [
        f"steps {s.first_step}-{s.last_step}  {s.kind}  lr {s.peak_lr:g}  warmup {s.warmup_steps} steps"
        + ("" if s.kind == "constant" else f"  min_lr {s.min_lr:g}")
        for s in segments
    ]
