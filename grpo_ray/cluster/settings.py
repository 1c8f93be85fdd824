"""Each actor's settings dataclass, built from the Config, so actors never see the Config object.

Pure (no Ray): cluster/roles.py starts the actors with these.
"""

from __future__ import annotations

from grpo_ray.actors.engines import EngineSpec
from grpo_ray.actors.episodes import EpisodeSettings
from grpo_ray.actors.http_teacher import ServerSettings
from grpo_ray.actors.learner_settings import LearnerSettings
from grpo_ray.actors.reward import RewardFunctionSetting, RewardIsolation
from grpo_ray.actors.rollout import LoraShape, RolloutWorkerSettings
from grpo_ray.actors.teacher import TeacherSettings
from grpo_ray.config import BatchPlan, Config, EnvironmentConfig, longest_sequence, plan_lr_segments, syncs_lora_adapter


def learner_settings(cfg: Config, plan: BatchPlan) -> LearnerSettings:
    a, lr, lora = cfg.algorithm, cfg.learner, cfg.model.lora
    return LearnerSettings(
        model_path=cfg.model.path,
        tokenizer_path=cfg.model.tokenizer or cfg.model.path,
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        zero_stage=lr.zero_stage,
        micro_batch_size=plan.micro_batch_size,
        grad_accum_steps=plan.grad_accum_steps,
        lr=lr.lr,
        weight_decay=lr.weight_decay,
        betas=tuple(lr.betas),
        grad_clip=lr.grad_clip,
        torch_threads=lr.torch_threads,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        # With the KL placed in the reward, the loss has no KL term.
        kl_coef=a.kl_coef if a.kl_in_loss else 0.0,
        kl_estimator=a.kl_estimator,
        entropy_coef=a.entropy_coef,
        loss_aggregation=a.loss_aggregation,
        epochs_per_batch=a.epochs_per_batch,
        dual_clip=a.dual_clip,
        tis_cap=a.tis_cap,
        staleness_is_cap=a.staleness_is_cap,
        lora_enabled=lora.enabled,
        lora_rank=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        lora_target_modules=tuple(lora.target_modules),
        gradient_checkpointing=lr.gradient_checkpointing,
        share_prompts=lr.share_prompts,
        quantization=cfg.model.quantization,
        lr_segments=plan_lr_segments(cfg),
        offload_optimizer=lr.offload_optimizer,
        offload_params=lr.offload_params,
        loss_scale=lr.loss_scale,
        initial_scale_power=lr.initial_scale_power,
        loss_scale_window=lr.loss_scale_window,
        logprob_chunk_tokens=lr.logprob_chunk_tokens,
        logprob_kernel=lr.logprob_kernel,
        packing=lr.packing,
        max_tokens_per_micro_batch=lr.max_tokens_per_micro_batch,
        offload_states_between_updates=lr.offload_states_between_updates,
    )


def rollout_settings(cfg: Config, index: int) -> RolloutWorkerSettings:
    r = cfg.rollout
    return RolloutWorkerSettings(
        index=index,
        backend=r.backend,
        model_path=cfg.model.path,
        tokenizer_path=cfg.model.tokenizer or cfg.model.path,
        dtype=cfg.model.dtype,
        seed=cfg.seed + index,
        torch_threads=r.torch_threads,
        max_model_len=r.vllm.max_model_len or longest_sequence(cfg),
        vllm_enforce_eager=r.vllm.enforce_eager,
        vllm_gpu_memory_utilization=r.vllm.gpu_memory_utilization,
        vllm_cpu_kv_cache_gb=r.vllm.cpu_kv_cache_gb,
        vllm_block_size=r.vllm.block_size,
        vllm_sleep_level=r.vllm.sleep_level,
        vllm_engine_args=dict(r.vllm.engine_args),
        tensor_parallel_size=r.tensor_parallel_size,
        # The engine holds the same adapter as the learner, and each sync sends only its matrices.
        lora=LoraShape(cfg.model.lora.rank, cfg.model.lora.alpha, cfg.model.lora.target_modules)
        if syncs_lora_adapter(cfg)
        else None,
        environment=episode_settings(cfg.environment),
        vllm_log_file=f"{cfg.output_dir}/logs/vllm-rollout-{index}.log",
    )


def teacher_settings(cfg: Config, plan: BatchPlan, index: int) -> TeacherSettings:
    """distillation.teachers[index]'s actor: its model at model.dtype, with the learner's forward
    (micro-batches, packing, LM-head chunks and kernel), as the reference runs it; or its vLLM
    engine (backend vllm), or its server (url). An engine's or a server's context holds the
    recipe's longest sequence and the one token a prompt-log-prob request generates."""
    teacher, lr = cfg.distillation.teachers[index], cfg.learner
    context = longest_sequence(cfg) + 1
    engine = server = None
    if teacher.backend == "vllm":
        engine = EngineSpec(
            "vllm",
            teacher.model_path,
            cfg.model.dtype,
            seed=cfg.seed,
            max_model_len=context,
            enforce_eager=teacher.enforce_eager,
            gpu_memory_utilization=teacher.gpu_memory_utilization,
            cpu_kv_cache_gb=teacher.cpu_kv_cache_gb,
            log_file=f"{cfg.output_dir}/logs/vllm-teacher-{teacher.name}.log",
        )
    if teacher.url is not None:
        server = ServerSettings(
            field=f"distillation.teachers.{index}",
            name=teacher.name,
            url=teacher.url,
            model=teacher.model,
            timeout_s=teacher.timeout_s,
            max_retries=teacher.max_retries,
            max_concurrent_requests=teacher.max_concurrent_requests,
            context_tokens=context,
        )
    return TeacherSettings(
        name=teacher.name,
        model_path=teacher.model_path,
        dtype=cfg.model.dtype,
        micro_batch_size=plan.micro_batch_size,
        source_field=cfg.distillation.source_field,
        sources=tuple(teacher.sources),
        others=tuple(s for other in cfg.distillation.teachers if other is not teacher for s in other.sources),
        torch_threads=lr.torch_threads,
        chunk_tokens=lr.logprob_chunk_tokens,
        packing=lr.packing,
        max_tokens_per_micro_batch=lr.max_tokens_per_micro_batch,
        logprob_kernel=lr.logprob_kernel,
        engine=engine,
        server=server,
    )


def reward_worker_args(
    cfg: Config,
) -> tuple[list[RewardFunctionSetting], RewardIsolation, dict[str, list[RewardFunctionSetting]], str]:
    """A RewardWorker's arguments: the recipe's functions (an episode's environment reward beside them,
    rewards/environment.py), its sandbox, the functions of each data source and the field naming it."""
    settings = lambda functions: [RewardFunctionSetting(f.name, f.weight, dict(f.options)) for f in functions]  # noqa: E731
    r = cfg.reward
    functions = settings(r.functions)
    if cfg.environment.spec:
        functions.append(RewardFunctionSetting("environment", cfg.environment.reward_weight, {}))
    # No function at all (a teacher's signal alone): nothing to isolate, and a sandbox needs a function.
    mode = r.isolation if functions or r.by_source else "none"
    isolation = RewardIsolation(mode, r.processes_per_worker, r.timeout_s, r.memory_limit_mb)
    return functions, isolation, {source: settings(fs) for source, fs in r.by_source.items()}, r.source_field


def episode_settings(env: EnvironmentConfig) -> EpisodeSettings | None:
    if env.spec is None:
        return None
    return EpisodeSettings(
        spec=env.spec,
        options=dict(env.options),
        max_turns=env.max_turns,
        max_episode_tokens=env.max_episode_tokens,
        step_timeout_s=env.step_timeout_s,
        episode_timeout_s=env.episode_timeout_s,
        processes=env.processes_per_worker,
        turn_credit=env.reward_weight if env.reward_per_turn else 0.0,
    )
