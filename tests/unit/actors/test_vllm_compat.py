"""The engine arguments grpo-ray gives vLLM: where an engine's shards run."""

import pytest

pytest.importorskip("vllm", exc_type=ImportError)

from grpo_ray.actors.vllm_compat import engine_args  # noqa: E402
from grpo_ray.actors.vllm_engine import EXTENSION  # noqa: E402
from grpo_ray.actors.vllm_transfer import BACKEND  # noqa: E402


@pytest.mark.parametrize("shards, executor", [(1, "uni"), (2, "mp"), (4, "mp")])
def test_one_shard_runs_in_the_engine_core_and_several_in_processes_of_their_own(shards, executor):
    args = engine_args(BACKEND, EXTENSION, model="tiny", tensor_parallel_size=shards)
    assert args.distributed_executor_backend == executor
    assert args.worker_extension_cls == EXTENSION
