"""An episode's tokens, exact, on two real chat templates: the tiny model's and Qwen2's."""

from pathlib import Path

import numpy as np
import pytest

from grpo_ray.chat_template import reply_tokens
from grpo_ray.envs.episode import EpisodeTokens
from grpo_ray.models.tiny_tokenizer import build_tiny_tokenizer

QWEN2 = Path(__file__).resolve().parents[4] / "shared" / "tokenizers" / "qwen2"


def renderer(tokenizer):
    def render(messages, add_generation_prompt):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    return render


def tokenizers():
    found = [pytest.param(build_tiny_tokenizer(), id="tiny")]
    if QWEN2.is_dir():
        from transformers import AutoTokenizer

        found.append(pytest.param(AutoTokenizer.from_pretrained(QWEN2), id="qwen2"))
    return found


@pytest.mark.parametrize("tokenizer", tokenizers())
def test_an_episode_is_the_conversation_the_template_writes_with_the_models_tokens_kept(tokenizer):
    render = renderer(tokenizer)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first = [{"role": "user", "content": "what is 12*34"}]
    episode = EpisodeTokens(prompt=render(first, True))
    # The model's first turn, as sampled (its end-of-turn token included), then the reply.
    turn = tokenizer.encode("call", add_special_tokens=False) + [end]
    episode.add_turn(turn, [-0.5] * len(turn))
    reply = [{"role": "user", "content": "408"}]
    episode.add_reply(reply_tokens(render, end, reply))
    answer = tokenizer.encode("408", add_special_tokens=False) + [end]
    episode.add_turn(answer, [-0.25] * len(answer))
    conversation = (
        first + [{"role": "assistant", "content": "call"}] + reply + [{"role": "assistant", "content": "408"}]
    )
    written = render(conversation, False)
    ids, mask, logprobs = episode.arrays()
    # The template ends the last turn with a newline the model never writes: the rest is equal.
    assert ids.tolist() == written[: len(ids)] and len(written) - len(ids) <= 1
    assert mask.sum() == len(turn) + len(answer) and episode.turns == 2
    model = np.flatnonzero(mask)
    assert ids[model].tolist() == turn + answer
    assert np.allclose(logprobs[model], [-0.5] * len(turn) + [-0.25] * len(answer))
    assert (logprobs[mask == 0] == 0).all() and (mask[: len(episode.prompt)] == 0).all()


def test_a_template_that_does_not_end_turns_with_the_token_is_refused():
    render = renderer(build_tiny_tokenizer())
    with pytest.raises(ValueError, match="does not end an assistant turn with token 999"):
        reply_tokens(render, 999, [{"role": "user", "content": "x"}])


def test_tokens_and_log_probs_must_pair():
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        EpisodeTokens(prompt=[1]).add_turn([5, 6], [-1.0])
