"""Every cross-field check of a recipe, run once at load (config/loading.py): the plans' (roles,
batches, placement: plans.py), the schedule's (training_plan.py), and what the rewards and the
teachers (distillation) give the advantages. Here, not in either module, so that neither imports
the other."""

from __future__ import annotations

from grpo_ray.algo.advantages import turn_slope
from grpo_ray.config.plans import check_plans
from grpo_ray.config.schema import Config, ConfigError
from grpo_ray.config.training_plan import check_training


def check_config(cfg: Config) -> None:
    """Raises ConfigError (one line naming the field) for the first combination that cannot run."""
    check_plans(cfg)
    check_training(cfg)
    _check_rewards(cfg)
    _check_teachers(cfg)
    if cfg.environment.reward_per_turn and cfg.environment.spec is None:
        raise ConfigError(
            "environment.reward_per_turn: per-turn credit is for episodes; set environment.spec, or leave it false"
        )
    if cfg.environment.reward_per_turn:
        try:
            turn_slope(cfg.algorithm.advantage)
        except ValueError as err:
            raise ConfigError(f"algorithm.advantage: {err}, or set environment.reward_per_turn: false") from None


def _check_rewards(cfg: Config) -> None:
    """Something to train on: a reward, or teachers alone (distillation.with_rewards: false), and no
    switch that works on rewards the advantages then leave out."""
    d, a = cfg.distillation, cfg.algorithm
    teachers_alone = cfg.use_distillation and not d.with_rewards
    if not cfg.reward.functions and cfg.reward.model.path is None and not teachers_alone:
        raise ConfigError(
            "reward.functions: empty, and distillation.with_rewards adds the GRPO advantage of the rewards; name a "
            "reward function, or set distillation.with_rewards: false to train on the teachers' signal alone"
            if cfg.use_distillation
            else "reward.functions: needs at least one reward function (or a reward.model.path, or "
            "distillation.teachers with distillation.with_rewards: false)"
        )
    if not teachers_alone:
        return
    reward_switches = {
        "algorithm.dynamic_sampling": a.dynamic_sampling,
        "polaris.substitution": cfg.polaris.substitution,
        "algorithm.kl_placement": cfg.use_reference and not a.kl_in_loss,
        f"algorithm.overlong: {a.overlong}": a.overlong in ("zero_reward", "soft_penalty"),
        "environment.reward_per_turn": cfg.environment.reward_per_turn,
    }
    for field, on in reward_switches.items():
        if on:
            raise ConfigError(
                f"{field}: works on the rewards, which distillation.with_rewards: false leaves out of the "
                "advantages (the teachers' signal alone trains); turn it off or set distillation.with_rewards: true"
            )


def _check_teachers(cfg: Config) -> None:
    """distillation.teachers: unique names, and each row taught by one teacher at most."""
    d = cfg.distillation
    if not d.teachers:
        if not d.with_rewards:
            raise ConfigError(
                "distillation.with_rewards: false leaves the rewards out of the advantages, and "
                "distillation.teachers is empty, so nothing would train; add a teacher or set it to true"
            )
        return
    names = [t.name for t in d.teachers]
    if len(set(names)) != len(names):
        raise ConfigError(f"distillation.teachers: names must be unique; got {', '.join(names)}")
    if len(d.teachers) == 1:
        return
    catch_all = [i for i, t in enumerate(d.teachers) if not t.sources]
    if len(catch_all) > 1:
        first, second = catch_all[:2]
        raise ConfigError(
            f"distillation.teachers.{second}.sources: empty, as are teachers.{first}'s ({d.teachers[first].name}); "
            "with several teachers at most one may leave sources empty (it teaches every row no other teacher "
            f"takes): name the {d.source_field} values each of the others teaches"
        )
    taught_by: dict[str, int] = {}
    for i, teacher in enumerate(d.teachers):
        for source in teacher.sources:
            if source in taught_by:
                other = taught_by[source]
                raise ConfigError(
                    f"distillation.teachers.{i}.sources: {source} is taught by teachers.{other} "
                    f"({d.teachers[other].name}) too; a row has one teacher at most, so name each source once"
                )
            taught_by[source] = i
