"""The vLLM engine arguments grpo-ray sets itself, each with the key a recipe sets it by: what
`rollout.vllm.engine_args` may not hold (the rest of vLLM's AsyncEngineArgs it passes through); and the
check that every name it holds is an engine argument of the vLLM at hand and that vLLM takes its value,
in one line, made by the driver's preflight and by the engine as it starts (each hands in the vLLM it
imported: this stays pure).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from grpo_ray.errors import first_line

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
    # One shard runs inside the engine core's process, several in a process each (actors/vllm_compat.py).
    "distributed_executor_backend": "rollout.tensor_parallel_size",
    "disable_log_stats": "nothing",
    "use_tqdm_on_load": "--verbose",
}


def check_engine_options(options: dict[str, Any], engine_args: type, version: str) -> None:
    """rollout.vllm.engine_args: every name is a field of `engine_args` (the AsyncEngineArgs of vLLM
    `version`: the set differs between versions, 0.26 and 0.32 each add and drop some), and each value
    one that `engine_args` takes, else a ValueError naming it."""
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(engine_args)})
    if unknown:
        raise ValueError(
            f"rollout.vllm.engine_args: {', '.join(unknown)} is not an engine option of vLLM {version} "
            "(its AsyncEngineArgs, the `vllm serve --help` options with - as _); remove or rename it"
        )
    for name, value in options.items():
        # AsyncEngineArgs builds its typed parts (compilation_config and the other *_config mappings)
        # as it is made: a misspelt key there would otherwise surface once the engine starts, as
        # pydantic's lines. One option at a time, so that the line names it. The model is a folder
        # that exists, so that vLLM's offline mode looks nothing up: only the option is checked.
        try:
            engine_args(model=os.curdir, **{name: value})
        except Exception as err:  # pydantic's ValidationError; an OSError for a model it looks up offline
            raise ValueError(
                f"rollout.vllm.engine_args.{name}: {_refusal(err)} (vLLM {version}); fix or remove it"
            ) from None


def _refusal(err: Exception) -> str:
    """One line of what vLLM refused: each of pydantic's errors as `key: message`, else the first line."""
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return first_line(err)
    parts = []
    for error in errors():
        where = ".".join(str(part) for part in error.get("loc", ()))
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}"[:300] if where else message[:300])
    return "; ".join(parts)
