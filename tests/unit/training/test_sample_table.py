"""The sample table (training/sample_table.py) on hand-made slices: an episode's row shows its calls,
replies, turns and reward; a single answer's row is what it always was."""

import json

import numpy as np

from grpo_ray.actors.episodes import Episode, episode_sample
from grpo_ray.actors.slices import pack_samples, pack_slice
from grpo_ray.envs.episode import EpisodeTokens
from grpo_ray.training.rows import KeptResponse, SliceAssembly, assemble_slice
from grpo_ray.training.sample_table import episode_text, sample_rows
from grpo_ray.types import Completion, Prompt, RolloutSlice

PAD = 0
PROMPT = Prompt(uid=3, text="123*456=", token_ids=(7, 8), answer="56088")
CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 123, "b": 456}}</tool_call>'


def calculator_episode() -> Episode:
    """A call, the calculator's reply, the answer: two turns, one tool call."""
    tokens = EpisodeTokens(prompt=[7, 8])
    tokens.add_turn([30, 31], [-0.5, -0.25])
    tokens.add_reply([40, 41, 42])
    tokens.add_turn([32], [-0.5])
    episode = Episode(tokens, answer="56088", reward=0.0)
    episode.counts.update(tool_calls=1)
    episode.messages = [
        {"role": "user", "content": "123*456="},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "56088"},
        {"role": "assistant", "content": "56088"},
    ]
    return episode


def episode_slice(keep_messages: bool) -> RolloutSlice:
    return pack_samples(
        [(0, PROMPT, episode_sample(calculator_episode()))], PAD, 0, {0: 1.0}, keep_messages=keep_messages
    )


def test_an_episodes_row_shows_its_call_the_reply_its_turns_and_reward():
    [row] = sample_rows(episode_slice(keep_messages=True), count=8, rewards=[1.0])
    assert row == {
        "prompt": "123*456=",
        "episode": f"user: 123*456=\nassistant: {CALL}\ntool: 56088\nassistant: 56088",
        "completion": "56088",
        "answer": "56088",
        "reward": 1.0,
        "turns": 2,
        "tool_calls": 1,
        "tool_errors": 0,
        "finish_reason": "stop",
    }
    # Column order is the table's: the conversation right after the prompt.
    assert list(row)[:3] == ["prompt", "episode", "completion"]


def test_a_step_that_logs_no_table_carries_no_conversation():
    quiet = episode_slice(keep_messages=False)
    assert quiet.messages is None
    [row] = sample_rows(quiet, 8, [1.0])
    assert row["episode"] == "" and row["turns"] == 2 and row["completion"] == "56088"


def test_the_conversation_follows_its_row_and_a_rescued_row_has_none():
    slice_ = episode_slice(keep_messages=True)
    both = RolloutSlice.concat([slice_, slice_.select(np.array([0]))], PAD)
    assert both.messages == [slice_.messages[0]] * 2
    mixed = RolloutSlice.concat([slice_, episode_slice(keep_messages=False)], PAD)
    assert mixed.messages == [slice_.messages[0], None]
    kept = KeptResponse([33], [-0.5], "7", "stop", 0.0, {})
    plan = SliceAssembly(np.array([0, 0]), np.array([0, 0]), np.array([0, 0]), {1: kept})
    rescued = assemble_slice(plan, [slice_], PAD)
    assert rescued.messages == [slice_.messages[0], None]


def test_a_single_answers_row_is_unchanged():
    completion = Completion(token_ids=(9, 2), logprobs=(-0.5, -0.5), text="56088", finish_reason="stop")
    [row] = sample_rows(pack_slice([(0, PROMPT, completion)], PAD, 0), 8, [0.5])
    assert row == {
        "prompt": "123*456=",
        "completion": "56088",
        "answer": "56088",
        "reward": 0.5,
        "finish_reason": "stop",
    }


def test_structured_tool_calls_and_empty_contents_are_written_out():
    calls = [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 1, "b": 2}}}]
    text = episode_text([{"role": "assistant", "content": None, "tool_calls": calls}, {"role": "tool", "content": "2"}])
    assert text == f"assistant: {json.dumps(calls)}\ntool: 2"
