"""reference.model_path: a reference other than the policy, refused at start in one line when its
tokenizer maps tokens to other ids than the policy's.

A second tiny-shaped model (another seed, so other weights, the same tokenizer) must pass and
serve as the reference; the real Qwen2 tokenizer (151K tokens) must be refused.
"""

from pathlib import Path

import numpy as np
import pytest

from grpo_ray.actors.reference import ReferenceWorker
from grpo_ray.config import ConfigError, config_from_dict
from grpo_ray.models.loading import ModelLoadError, load_tokenizer
from grpo_ray.models.reference_vocab import check_reference_tokenizer, vocabulary_difference
from grpo_ray.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_tokenizer
from grpo_ray.training.inputs import prepare_inputs
from grpo_ray.types import RolloutSlice

QWEN2_TOKENIZER = Path("/work/shared/tokenizers/qwen2")


@pytest.fixture(scope="module")
def other_tiny(tmp_path_factory) -> str:
    """The tiny architecture and tokenizer with seed 7's random weights, saved as a model folder."""
    folder = tmp_path_factory.mktemp("other-tiny")
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(len(tokenizer), seed=7).save_pretrained(folder)
    save_tiny_tokenizer(tokenizer, folder)
    return str(folder)


def test_same_tokenizer_other_weights_passes(other_tiny):
    check_reference_tokenizer(load_tokenizer("tiny"), other_tiny, None)


@pytest.mark.skipif(not QWEN2_TOKENIZER.is_dir(), reason="the shared Qwen2 tokenizer is not on this machine")
def test_another_familys_tokenizer_is_refused_at_start_in_one_line(other_tiny):
    # Loading the 151K-token Qwen2 tokenizer costs seconds here: one run start, checked whole.
    cfg = config_from_dict(
        {
            "algorithm": {"kl_coef": 0.1},
            "reference": {"model_path": other_tiny, "tokenizer": str(QWEN2_TOKENIZER)},
        }
    )
    with pytest.raises(ModelLoadError) as error:
        prepare_inputs(cfg)
    message = str(error.value)
    assert message.startswith("reference.tokenizer: ") and "\n" not in message
    assert "tokens differ" in message and "per-token KL" in message


def test_same_size_other_ids_is_a_difference():
    # Sizes alone would pass this: two tokens each, swapped ids.
    assert vocabulary_difference({"a": 0, "b": 1}, {"a": 1, "b": 0}) is not None
    assert vocabulary_difference({"a": 0, "b": 1}, {"b": 1, "a": 0}) is None


def test_the_reference_actor_serves_the_other_model(other_tiny):
    tokenizer = load_tokenizer("tiny")
    prompt, completion = tokenizer("12+30=")["input_ids"], tokenizer("42")["input_ids"]
    ids = np.array([prompt + completion], dtype=np.int64)
    mask = np.array([[0.0] * len(prompt) + [1.0] * len(completion)], dtype=np.float32)
    batch = RolloutSlice(
        group_ids=np.zeros(1),
        prompt_uids=np.zeros(1),
        input_ids=ids,
        attention_mask=np.ones_like(ids),
        completion_mask=mask,
        rollout_logprobs=np.zeros_like(mask),
        prompts=["12+30="],
        completions=["42"],
        answers=["42"],
        finish_reasons=["stop"],
        row_fields={},
        policy_versions=np.zeros(1, dtype=np.int64),
        group_diversity=np.zeros(1),
    )
    policy = ReferenceWorker("tiny", "float32", 8).logprobs(batch, 1.0)
    other = ReferenceWorker(other_tiny, "float32", 8).logprobs(batch, 1.0)
    assert (policy[mask == 0] == 0).all() and (other[mask == 0] == 0).all()
    # Seed 7's random weights against the pre-trained tiny model: clearly other log-probs.
    assert np.abs(policy - other)[mask == 1].max() > 0.1


@pytest.mark.parametrize(
    "sections, field",
    [
        ({"reference": {"model_path": "x"}}, "reference.model_path"),  # kl_coef 0: no reference runs
        ({"algorithm": {"kl_coef": 0.1}, "reference": {"tokenizer": "x"}}, "reference.tokenizer"),
        (
            {"algorithm": {"kl_coef": 0.1}, "reference": {"model_path": "x", "refresh_every": 5}},
            "reference.refresh_every",
        ),
    ],
)
def test_reference_settings_that_cannot_run_are_refused(sections, field):
    with pytest.raises(ConfigError) as error:
        config_from_dict(sections)
    assert str(error.value).startswith(field) and "\n" not in str(error.value)
