"""The engine arguments grpo-ray gives vLLM (where an engine's shards run) and those a recipe gives it."""

import pytest

pytest.importorskip("vllm", exc_type=ImportError)

from grpo_ray.actors.vllm_compat import check_engine_options, engine_args  # noqa: E402
from grpo_ray.actors.vllm_engine import EXTENSION  # noqa: E402
from grpo_ray.actors.vllm_transfer import BACKEND  # noqa: E402


@pytest.mark.parametrize("shards, executor", [(1, "uni"), (2, "mp"), (4, "mp")])
def test_one_shard_runs_in_the_engine_core_and_several_in_processes_of_their_own(shards, executor):
    args = engine_args(BACKEND, EXTENSION, model="tiny", tensor_parallel_size=shards)
    assert args.distributed_executor_backend == executor
    assert args.worker_extension_cls == EXTENSION


def test_a_misspelt_key_of_an_engine_option_is_one_line_naming_the_option_and_the_key():
    # vLLM builds compilation_config as its AsyncEngineArgs is made; a misspelt key used to surface
    # only as the engine started, as pydantic's last line: a link to its docs.
    check_engine_options({"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}, "max_num_seqs": 8})
    with pytest.raises(ValueError) as refused:
        check_engine_options({"compilation_config": {"cudagraph_capture_sizez": [1, 2, 4], "mode": "fast"}})
    line = str(refused.value)
    assert "\n" not in line and line.startswith(
        "rollout.vllm.engine_args.compilation_config: mode: Invalid compilation"
    )
    assert "; cudagraph_capture_sizez: Unexpected keyword argument (vLLM 0." in line and line.endswith(
        "fix or remove it"
    )
