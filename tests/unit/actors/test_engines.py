"""build_engine: the backend named is the engine built; an unknown one is refused in one line."""

import pytest

from grpo_ray.actors.engines import EngineSpec, build_engine
from grpo_ray.actors.hf_engine import HFEngine
from grpo_ray.models.loading import load_tokenizer
from grpo_ray.models.tiny import ensure_tiny_artifacts


def test_hf_is_built_with_the_specs_dtype():
    model_dir = str(ensure_tiny_artifacts().model_dir)
    engine = build_engine(EngineSpec("hf", model_dir, "bfloat16"), load_tokenizer(model_dir))
    assert isinstance(engine, HFEngine) and str(engine.model.dtype) == "torch.bfloat16"


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="rollout.backend: 'sglang' is not an engine; use hf or vllm"):
        build_engine(EngineSpec("sglang", "unused", "float32"), None)
