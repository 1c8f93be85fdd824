"""reference.model_path and distillation.teachers: a reference other than the policy, or a teacher,
refused at start in one line when its tokenizer maps tokens to other ids than the policy's.

A second tiny-shaped model (another seed, so other weights, the same tokenizer) must pass and
serve as the reference; the real Qwen2 tokenizer (151K tokens) must be refused. A teacher may know
tokens the student does not (it scores only the student's), never the other way round.
"""

from pathlib import Path

import numpy as np
import pytest

from grpo_ray.actors.reference import ReferenceWorker
from grpo_ray.config import ConfigError, config_from_dict
from grpo_ray.models.loading import ModelLoadError, load_tokenizer
from grpo_ray.models.reference_vocab import check_reference_tokenizer, check_teacher_tokenizer, vocabulary_difference
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


@pytest.mark.skipif(not QWEN2_TOKENIZER.is_dir(), reason="the shared Qwen2 tokenizer is not on this machine")
def test_a_teacher_of_another_family_is_refused_at_start_naming_both_models(other_tiny):
    cfg = config_from_dict(
        {"distillation": {"teachers": [{"name": "big", "model_path": other_tiny, "tokenizer": str(QWEN2_TOKENIZER)}]}}
    )
    with pytest.raises(ModelLoadError) as error:
        prepare_inputs(cfg)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"distillation.teachers.0.tokenizer (teacher big): the tokenizer of {QWEN2_TOKENIZER} maps the tokens of "
        "the student tiny to other ids ("
    )
    assert message.endswith(
        "for the teacher); a teacher must share the student's vocabulary (distillation compares both models' "
        "log-probs of the same token ids): use a teacher of the student's family"
    )


@pytest.fixture(scope="module")
def tiny_with_one_more_token(tmp_path_factory) -> str:
    """The tiny tokenizer and one added token after its 55 (id 55), saved as a tokenizer folder."""
    folder = tmp_path_factory.mktemp("tiny-plus")
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens(["<think>"])
    save_tiny_tokenizer(tokenizer, folder)
    return str(folder)


def test_a_teacher_may_know_more_tokens_than_the_student_but_not_fewer(other_tiny, tiny_with_one_more_token):
    # It scores only tokens the student sampled, each under the same id.
    check_teacher_tokenizer(load_tokenizer("tiny"), "tiny", "distillation.teachers.0", "big", other_tiny, None)
    check_teacher_tokenizer(
        load_tokenizer("tiny"), "tiny", "distillation.teachers.0", "big", other_tiny, tiny_with_one_more_token
    )
    with pytest.raises(ModelLoadError) as error:
        student = load_tokenizer(tiny_with_one_more_token)
        check_teacher_tokenizer(student, "plus", "distillation.teachers.1", "small", other_tiny, None)
    assert str(error.value).startswith(
        f"distillation.teachers.1.model_path (teacher small): the tokenizer of {other_tiny} maps the tokens of the "
        "student plus to other ids (1 of 56 tokens differ, e.g. '<think>' is 55 for the student and absent for the "
        "teacher)"
    )
