"""The one place a rollout engine's backend is chosen: rollout workers and `grpo-ray eval` both
build theirs here, from an EngineSpec.

    engine = build_engine(EngineSpec("vllm", model_path, "bfloat16", enforce_eager=False), tokenizer)

hf (actors/hf_engine.py) runs the model in this process with Hugging Face; vllm
(actors/vllm_engine.py, imported only when chosen) runs vLLM's engine. Both answer the same calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineSpec:
    backend: str  # "hf" | "vllm"
    model_path: str  # a local folder (models.loading.resolve_model_path)
    dtype: str
    seed: int = 0
    lora: Any = None  # actors.rollout.LoraShape: an adapter the engine applies itself
    config_overrides: dict | None = None  # model config fields replaced at load (e.g. YaRN rope scaling)
    # vllm only:
    max_model_len: int = 1024
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.5
    cpu_kv_cache_gb: float = 1.0
    tensor_parallel_size: int = 1
    sleep_mode: bool = False  # the engine can sleep (rollout.vllm.sleep_level > 0; GPU only)


def build_engine(spec: EngineSpec, tokenizer):
    """The engine of `spec.backend`."""
    if spec.backend == "vllm":
        from grpo_ray.actors.vllm_engine import VllmEngine

        return VllmEngine(
            spec.model_path,
            tokenizer,
            dtype=spec.dtype,
            seed=spec.seed,
            max_model_len=spec.max_model_len,
            enforce_eager=spec.enforce_eager,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            cpu_kv_cache_gb=spec.cpu_kv_cache_gb,
            tensor_parallel_size=spec.tensor_parallel_size,
            config_overrides=spec.config_overrides,
            lora=spec.lora,
            sleep_mode=spec.sleep_mode,
        )
    if spec.backend != "hf":
        raise ValueError(f"rollout.backend: {spec.backend!r} is not an engine; use hf or vllm")
    from grpo_ray.actors.hf_engine import HFEngine

    return HFEngine(
        spec.model_path, tokenizer, dtype=spec.dtype, config_overrides=spec.config_overrides, lora=spec.lora
    )
