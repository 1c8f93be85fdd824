"""What `grpo-ray validate` prints about a recipe's plan: (--verbose) the resolved config, each role's resources,
the batch arithmetic, the stages, the memory plan per GPU and the learning rate. The checks of
what a run needs (models, rewards, data, resources) are training/preflight.py's, shared with `train`."""

from __future__ import annotations

import os

import yaml

from grpo_ray.config import Config, config_to_dict, describe_resources, plan_batches, plan_resources, plan_stages
from grpo_ray.config.host_memory import MachineMemory, host_memory_warning, host_plan_lines, host_roles, on_the_cpu
from grpo_ray.config.memory import GIB, SIZE_NOT_KNOWN, memory_plan, served_teacher_lines
from grpo_ray.config.training_plan import describe_lr_segments, plan_lr_segments
from grpo_ray.types import Prompt


def plan_report(
    cfg: Config, gpu_memory_gb: float, with_config: bool = False, machine: MachineMemory | None = None
) -> tuple[list[str], list[str]]:
    """(lines to print, warnings of the memory plan); with_config: the resolved config first (about
    230 lines: `validate --verbose`, where it would otherwise bury the verdict). machine: the memory
    the host plan is weighed against (default: this machine's now)."""
    plan = plan_batches(cfg)
    lines = (
        ["# resolved config", yaml.safe_dump(config_to_dict(cfg), sort_keys=False).rstrip(), ""] if with_config else []
    )
    lines.append("# resources")
    lines += describe_resources(plan_resources(cfg))
    reference = f"yes ({cfg.reference.model_path or 'the initial policy'})" if cfg.use_reference else "no (kl_coef = 0)"
    lines += [
        "",
        "# batch per step",
        f"prompts per step               {plan.prompts_per_step}",
        f"completions per step           {plan.completions_per_step} ({cfg.rollout.samples_per_prompt} per prompt)",
        f"prompts per rollout worker     {plan.prompts_per_rollout_worker}",
        f"sequences per learner rank     {plan.sequences_per_learner_rank}",
        f"sequences per micro-batch      {plan.micro_batch_size} ({plan.grad_accum_steps} accumulation steps)",
        f"reference model                {reference}",
        f"distillation                   {_distillation(cfg)}",
        "",
        "# stages",
    ]
    lines += [
        f"{stage.name:<12} steps {stage.first_step}-{stage.last_step}  max_new_tokens {stage.max_new_tokens}  "
        f"temperature {stage.temperature:g}  top_p {stage.top_p:g}  eval temperature {stage.eval_temperature:g}"
        for stage in plan_stages(cfg)
    ]
    switches = {
        "dynamic sampling": cfg.algorithm.dynamic_sampling,
        "substitution": cfg.polaris.substitution,
        "rescue": cfg.polaris.rescue,
        "drop-easy": cfg.polaris.drop_easy_threshold is not None,
    }
    lines.append("batch techniques               " + (", ".join(name for name, on in switches.items() if on) or "none"))
    warnings = []
    if any(role.num_gpus for role in plan_resources(cfg)):
        memory, warnings = memory_plan(cfg, gpu_memory_gb)
        lines += ["", f"# memory per GPU (estimate; --gpu-memory-gb {gpu_memory_gb:g})", *memory]
    if on_the_cpu(cfg):
        host, warning = _host_plan(cfg, machine or machine_memory())
        lines += host
        warnings += [warning] if warning else []
    lines += ["", "# learning rate (learner.lr_schedule; actor/lr in MLflow)"]
    lines += describe_lr_segments(plan_lr_segments(cfg))
    return lines, warnings


def _host_plan(cfg: Config, machine: MachineMemory) -> tuple[list[str], str | None]:
    """The host memory section of the roles on the CPU, and its warning near Ray's memory monitor."""
    header = (
        f"# host memory of the roles on the CPU (estimate; this machine {machine.total / GIB:.1f} GiB, "
        f"{machine.available / GIB:.1f} available now; Ray kills workers above {machine.threshold:g} of it)"
    )
    roles = host_roles(cfg)
    if roles is None:
        return ["", header, f"policy {cfg.model.path}: {SIZE_NOT_KNOWN}"], None
    return ["", header, *host_plan_lines(roles), *served_teacher_lines(cfg)], host_memory_warning(roles, machine)


def machine_memory() -> MachineMemory:
    """This machine's total and available memory now (psutil), and the threshold of Ray's memory
    monitor as a local Ray will read it (RAY_memory_usage_threshold, Ray's default 0.95)."""
    import psutil

    memory = psutil.virtual_memory()
    threshold = float(os.environ.get("RAY_memory_usage_threshold", "0.95"))
    return MachineMemory(float(memory.total), float(memory.available), threshold)


def _distillation(cfg: Config) -> str:
    """ "big (Qwen/Qwen2.5-7B-Instruct: gsm8k), small (tiny: the other rows); coef 1, beside the rewards"."""
    d = cfg.distillation
    if not d.teachers:
        return "no (distillation.teachers is empty)"
    rest = "every row" if len(d.teachers) == 1 else "the other rows"
    teachers = ", ".join(f"{t.name} ({t.shown}: {', '.join(t.sources) or rest})" for t in d.teachers)
    signal = "beside the rewards' advantage" if d.with_rewards else "the teachers' signal alone"
    return f"{teachers}; coef {d.coef:g}, {signal}"


def first_prompt_lines(first: list[Prompt], shown: str) -> list[str]:
    """The first training prompt (`first`: it alone, or none) as the model will see it, `shown` its
    tokens decoded with the special tokens visible, each line behind "| " so that leading and
    trailing spaces and blank lines show; after a blank line."""
    if not first:
        return []
    return [
        "",
        f"# the first training prompt as the model sees it ({len(first[0].token_ids)} tokens, special tokens shown)",
        *(f"| {line}" for line in shown.split("\n")),
    ]


def checked_line(cfg: Config, train_prompts: int, eval_prompts: int, where: str) -> str:
    """What a passing check covered, the last line before the verdict."""
    environment = f"the environment {cfg.environment.spec}, " if cfg.environment.spec else ""
    return (
        f"# checked: models, reward functions, {environment}{train_prompts} training and {eval_prompts} "
        f"evaluation prompts, the plan on {where}"
    )
