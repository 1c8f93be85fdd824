"""The sample table of a step (tracking.samples_every) and of `grpo-ray eval --config`: one row per
sample, read beside its slice so that only the table's rows travel.

A single answer is a row of prompt, completion, answer, reward and finish reason. An episode is a
row that also shows what happened in it, one line per message in `episode`:

    user: 123*456=
    assistant: <tool_call>{"name": "multiply", "arguments": {"a": 123, "b": 456}}</tool_call>
    tool: 56088
    assistant: 56088

with its turns, tool calls and tool errors as columns of their own (the row fields an episode
carries, actors/episodes.py). The conversation travels only in slices sampled with
SamplingSettings.keep_messages (the steps that log a table); a row without one shows its last answer.
Pure: no Ray.
"""

from __future__ import annotations

import json

from grpo_ray.types import EPISODE_FIELD_PREFIX, RolloutSlice

# An episode's figures shown as columns, from its row fields episode_<name>.
EPISODE_COLUMNS = ("turns", "tool_calls", "tool_errors")


def sample_rows(batch: RolloutSlice, count: int, rewards: list[float]) -> list[dict]:
    """The first `count` rows of a slice as table rows (prompt, completion, answer, reward; an
    episode's conversation, turns and tool calls too)."""
    episodes = EPISODE_FIELD_PREFIX + "turns" in batch.row_fields
    rows = []
    for i in range(min(count, batch.num_rows)):
        row = {"prompt": batch.prompts[i]}
        if episodes:
            messages = batch.messages[i] if batch.messages is not None else None
            row["episode"] = episode_text(messages) if messages is not None else ""
        row.update(completion=batch.completions[i], answer=batch.answers[i], reward=rewards[i])
        if episodes:
            row.update({name: _count(batch.row_fields[EPISODE_FIELD_PREFIX + name][i]) for name in EPISODE_COLUMNS})
        row["finish_reason"] = batch.finish_reasons[i]
        rows.append(row)
    return rows


def episode_text(messages: list[dict]) -> str:
    """An episode's conversation, one `role: content` line per message in order (a message's own
    line breaks kept); structured tool calls, where a message has them, as their JSON."""
    lines = []
    for message in messages:
        content = message.get("content")
        text = (
            content if isinstance(content, str) else "" if content is None else json.dumps(content, ensure_ascii=False)
        )
        if message.get("tool_calls"):
            calls = json.dumps(message["tool_calls"], ensure_ascii=False)
            text = f"{text} {calls}" if content else calls
        lines.append(f"{message.get('role', '?')}: {text}")
    return "\n".join(lines)


def _count(value) -> int | None:
    """A count row field (a float after packing) as an int; None where the row has none."""
    return None if value is None else int(value)
