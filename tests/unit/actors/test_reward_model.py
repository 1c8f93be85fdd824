"""RewardModelWorker on the offline tiny reward model: inputs, padding, determinism, bad heads."""

import numpy as np
import pytest
import torch
from transformers import AutoConfig

from grpo_ray.actors.reward_model import (
    RewardModelWorker,
    build_tiny_reward_model,
    padding_id,
    reward_model_inputs,
)
from grpo_ray.models.loading import ModelLoadError
from grpo_ray.models.tiny import build_tiny_tokenizer
from grpo_ray.types import RolloutSlice

PROMPTS = ["37+45=", "1+1=", "12+30=", "9+9=", "37+45="]
COMPLETIONS = ["82", "2", "the answer is 42", "18", "81"]


def _slice(prompts, completions) -> RolloutSlice:
    """A RolloutSlice whose text fields are set; the token arrays are placeholders (unused)."""
    n = len(prompts)
    zeros = np.zeros((n, 1))
    return RolloutSlice(
        group_ids=np.arange(n),
        prompt_uids=np.arange(n),
        input_ids=zeros.astype(np.int64),
        attention_mask=zeros.astype(np.int64),
        completion_mask=zeros.astype(np.float32),
        rollout_logprobs=zeros.astype(np.float32),
        prompts=list(prompts),
        completions=list(completions),
        answers=[""] * n,
        finish_reasons=["stop"] * n,
        row_fields={},
        policy_versions=np.zeros(n, dtype=np.int64),
        group_diversity=np.zeros(n),
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"), seed=0)


@pytest.fixture(scope="module")
def worker(model_dir):
    return RewardModelWorker(str(model_dir), batch_size=32)


def test_inputs_are_the_chat_template_tokens():
    tokenizer = build_tiny_tokenizer()
    (ids,) = reward_model_inputs(tokenizer, ["1+1="], ["2"], max_length=64)
    text = "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
    assert tokenizer.decode(ids) == text
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    # Truncation keeps the first max_length tokens.
    assert reward_model_inputs(tokenizer, ["1+1="], ["2"], max_length=5) == [ids[:5]]
    # No chat template: the plain text prompt + completion.
    tokenizer.chat_template = None
    assert reward_model_inputs(tokenizer, ["1+1="], ["2"], 64) == [tokenizer("1+1=2")["input_ids"]]


def test_padding_id_avoids_real_last_tokens():
    assert padding_id([[5, 7], [3]], preferred=0) == 0
    # Row 0 ends with the preferred id 0: the smallest id ending no row (ends are {0, 3}) is 1.
    assert padding_id([[5, 0], [3]], preferred=0) == 1
    assert padding_id([[0], [1], [2]], preferred=0) == 3


def test_scores_are_finite_deterministic_and_depend_on_the_completion(worker):
    batch = _slice(PROMPTS, COMPLETIONS)
    scores = worker.score(batch)
    assert worker.ready() == "reward_model"
    assert scores.shape == (5,) and scores.dtype == np.float64 and np.isfinite(scores).all()
    np.testing.assert_array_equal(worker.score(batch), scores)
    # Rows 0 and 4: same prompt, completions "82" and "81".
    assert scores[0] != scores[4]
    assert len(set(scores.tolist())) == 5
    assert worker.score(_slice([], [])).shape == (0,)


def test_batch_size_one_and_thirty_two_agree(worker, model_dir):
    # Rows of different lengths: batch 32 pads all but the longest, batch 1 pads nothing.
    batch = _slice(PROMPTS * 3, [c * (i % 3 + 1) for i, c in enumerate(COMPLETIONS * 3)])
    one = RewardModelWorker(str(model_dir), batch_size=1).score(batch)
    np.testing.assert_allclose(worker.score(batch), one, rtol=0, atol=1e-5)


def test_a_row_ending_with_the_pad_token_is_read_at_its_true_last_token(model_dir):
    worker = RewardModelWorker(str(model_dir), batch_size=8)
    worker.tokenizer.chat_template = None  # plain text: the row ends with what the completion does
    pad = worker.tokenizer.pad_token  # "<|endoftext|>", id 0
    batch = _slice(["1+1=", "2+2="], ["2" + pad, "4"])
    (row, _) = reward_model_inputs(worker.tokenizer, batch.prompts, batch.completions, 64)
    assert row[-1] == worker.tokenizer.pad_token_id
    # Reference: that row alone, the head told there is no padding, so it reads position -1.
    worker.model.config.pad_token_id = None
    with torch.no_grad():
        expected = worker.model(input_ids=torch.tensor([row])).logits[0, 0].item()
    assert worker.score(batch)[0] == pytest.approx(expected, abs=1e-5)


def test_a_head_with_two_labels_is_refused_in_one_line(model_dir, tmp_path):
    config = AutoConfig.from_pretrained(model_dir)
    config.num_labels = 2
    config.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="num_labels=2.*num_labels=1") as caught:
        RewardModelWorker(str(tmp_path))
    assert isinstance(caught.value, ValueError)
    assert str(tmp_path) in str(caught.value) and "\n" not in str(caught.value)
