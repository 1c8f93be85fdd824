"""What a learner rank is built with (cluster/settings.py makes it from the recipe): plain values,
so that the actor never reads the config."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_ray.algo.schedules import LrSegment


@dataclass(frozen=True)
class LearnerSettings:
    model_path: str
    tokenizer_path: str
    dtype: str
    seed: int
    zero_stage: int
    micro_batch_size: int
    grad_accum_steps: int
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    grad_clip: float
    torch_threads: int
    clip_low: float
    clip_high: float
    kl_coef: float
    kl_estimator: str
    entropy_coef: float
    loss_aggregation: str
    epochs_per_batch: int = 1
    dual_clip: float | None = None
    tis_cap: float | None = None
    staleness_is_cap: float = 2.0
    lora_enabled: bool = False
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = ()
    gradient_checkpointing: bool = False
    share_prompts: bool = True
    quantization: str | None = None  # model.quantization: "4bit" | "8bit" base under the LoRA adapter
    # The LR of every step (grpo_ray.config.plan_lr_segments); empty: lr throughout.
    lr_segments: tuple[LrSegment, ...] = ()
    offload_optimizer: str | None = None
    offload_params: str | None = None
    loss_scale: float = 0.0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    logprob_chunk_tokens: int = 0
    logprob_kernel: str = "torch"
    packing: bool = False
    max_tokens_per_micro_batch: int = 0
    offload_states_between_updates: bool = False
