"""The tool calls in a model's turn, in the format chat templates of the Qwen2.5/Hermes family write
and read: each call a JSON object {"name": ..., "arguments": {...}} between <tool_call> and
</tool_call>. A turn with no such block is an answer; a block that is not a valid call is
reported (unparsable), never guessed at.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedTurn:
    calls: tuple[ToolCall, ...]  # the valid calls, in order
    errors: tuple[str, ...]  # one line per block that is not a valid call

    @property
    def is_answer(self) -> bool:
        """No tool call was attempted: the turn answers."""
        return not self.calls and not self.errors


def parse_tool_calls(text: str) -> ParsedTurn:
    calls, errors = [], []
    for match in _BLOCK.finditer(text):
        body = match.group(1).strip()
        if not match.group(0).endswith(CLOSE):
            errors.append(f"a {OPEN} block without {CLOSE}")
            continue
        try:
            value = json.loads(body)
        except json.JSONDecodeError as err:
            errors.append(f"not JSON ({err.msg} at character {err.pos}): {body[:80]!r}")
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
            errors.append(f'not {{"name": ..., "arguments": {{...}}}}: {body[:80]!r}')
            continue
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some templates write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            errors.append(f"the arguments of {value['name']!r} are not an object: {body[:80]!r}")
            continue
        calls.append(ToolCall(value["name"], arguments))
    return ParsedTurn(tuple(calls), tuple(errors))


def render_tool_call(call: ToolCall) -> str:
    """The text a model writes for `call` (the pre-training of a tool-using model learns it)."""
    return f"{OPEN}\n{json.dumps({'name': call.name, 'arguments': call.arguments})}\n{CLOSE}"
