"""The vLLM engine arguments grpo-ray sets itself, each with the key a recipe sets it by: what
`rollout.vllm.engine_args` may not hold (the rest of vLLM's AsyncEngineArgs it passes through); and the
check that every name it holds is an engine argument of the vLLM at hand, in one line, made by the
driver's preflight and by the engine as it starts (each hands in the vLLM it imported: this stays pure).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

# vLLM engine arguments grpo-ray sets (actors/vllm_engine.py, actors/vllm_compat.py), and where from.
VLLM_ARGS_SET_BY_GRPO_RAY = {
    "model": "model.path",
    "dtype": "model.dtype",
    "seed": "seed",
    "max_model_len": "rollout.vllm.max_model_len",
    "enforce_eager": "rollout.vllm.enforce_eager",
    "gpu_memory_utilization": "rollout.vllm.gpu_memory_utilization",
    "kv_cache_memory_bytes": "rollout.vllm.cpu_kv_cache_gb",
    "block_size": "rollout.vllm.block_size",
    "enable_sleep_mode": "rollout.vllm.sleep_level",
    "tensor_parallel_size": "rollout.tensor_parallel_size",
    "enable_lora": "model.lora",
    "max_lora_rank": "model.lora",
    "max_loras": "model.lora",
    "hf_overrides": "the model's own config (evaluation sets its overrides)",
    "logprobs_mode": "nothing (the rollout log-probs must be the sampled distribution's)",
    "weight_transfer_config": "nothing (the weight sync's transport)",
    "worker_extension_cls": "nothing (the weight sync's receiver)",
    "distributed_executor_backend": "nothing (engines run their shards as processes)",
    "disable_log_stats": "nothing",
    "use_tqdm_on_load": "--verbose",
}


def check_engine_options(options: Iterable[str], engine_args: type, version: str) -> None:
    """rollout.vllm.engine_args: every name is a field of `engine_args` (the AsyncEngineArgs of vLLM
    `version`: the set differs between versions, 0.26 and 0.32 each add and drop some), else a
    ValueError naming it."""
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(engine_args)})
    if unknown:
        raise ValueError(
            f"rollout.vllm.engine_args: {', '.join(unknown)} is not an engine option of vLLM {version} "
            "(its AsyncEngineArgs, the `vllm serve --help` options with - as _); remove or rename it"
        )
