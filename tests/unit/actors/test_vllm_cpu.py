"""What a vLLM engine's processes are started with on CPU (no vLLM needed: environment only)."""

import os

import pytest
import torch

from grpo_ray.actors.vllm_cpu import uncompiled_helpers

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the engine keeps torch.compile")


@pytest.fixture(autouse=True)
def no_dynamo_setting(monkeypatch):
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)


def test_an_eager_engine_starts_its_processes_with_torch_compile_off_and_the_actor_keeps_it():
    with uncompiled_helpers(enforce_eager=True):
        assert os.environ["TORCHDYNAMO_DISABLE"] == "1"
    assert "TORCHDYNAMO_DISABLE" not in os.environ


def test_an_engine_that_compiles_its_model_keeps_torch_compile():
    with uncompiled_helpers(enforce_eager=False):
        assert "TORCHDYNAMO_DISABLE" not in os.environ


def test_the_users_own_setting_is_left_as_it_was(monkeypatch):
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")
    with uncompiled_helpers(enforce_eager=True):
        assert os.environ["TORCHDYNAMO_DISABLE"] == "0"
    assert os.environ["TORCHDYNAMO_DISABLE"] == "0"
