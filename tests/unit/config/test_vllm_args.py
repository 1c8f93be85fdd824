"""rollout.vllm.engine_args against a vLLM's engine arguments (config/vllm_args.py): the one check the
driver's preflight and the engine both make, here on a made-up AsyncEngineArgs, so without vLLM."""

from dataclasses import dataclass

import pytest

from grpo_ray.config.vllm_args import check_engine_options


@dataclass
class EngineArgs:  # stands where vLLM's AsyncEngineArgs would: its field names, and what it refuses as it is made
    model: str = ""
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    compilation_config: dict | None = None
    tokenizer: str | None = None

    def __post_init__(self):
        if self.tokenizer:  # vLLM looks a model up as it is made, under HF_HUB_OFFLINE
            raise OSError("Cannot find an appropriate cached snapshot folder\nfor the specified revision")
        if self.compilation_config and set(self.compilation_config) - {"cudagraph_capture_sizes"}:
            raise ValueError("1 validation error for CompilationConfig\nUnexpected keyword argument")


def test_names_the_engine_takes_pass():
    check_engine_options({"max_num_seqs": 8, "max_num_batched_tokens": 512}, EngineArgs, "0.32.0")
    check_engine_options({}, EngineArgs, "0.32.0")


def test_unknown_names_are_one_line_naming_each_and_the_version():
    with pytest.raises(ValueError) as refused:
        check_engine_options({"max_num_seq": 8, "async_scheduling": True, "max_num_seqs": 4}, EngineArgs, "0.26.1")
    assert str(refused.value) == (
        "rollout.vllm.engine_args: async_scheduling, max_num_seq is not an engine option of vLLM 0.26.1 "
        "(its AsyncEngineArgs, the `vllm serve --help` options with - as _); remove or rename it"
    )


def test_a_value_the_engine_refuses_as_it_is_made_is_one_line_naming_the_option():
    check_engine_options({"compilation_config": {"cudagraph_capture_sizes": [1, 2]}}, EngineArgs, "0.32.0")
    with pytest.raises(ValueError) as refused:
        check_engine_options(
            {"max_num_seqs": 8, "compilation_config": {"cudagraph_capture_sizez": [1, 2]}}, EngineArgs, "0.32.0"
        )
    assert str(refused.value) == (
        "rollout.vllm.engine_args.compilation_config: 1 validation error for CompilationConfig (vLLM 0.32.0); "
        "fix or remove it"
    )
    with pytest.raises(ValueError) as refused:
        check_engine_options({"tokenizer": "someone/nothing"}, EngineArgs, "0.32.0")
    assert str(refused.value) == (
        "rollout.vllm.engine_args.tokenizer: Cannot find an appropriate cached snapshot folder (vLLM 0.32.0); "
        "fix or remove it"
    )
