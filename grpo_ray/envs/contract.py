"""The environment contract: what a user writes, in a file of their own named in the recipe
(`environment.spec: path/to/file.py:ClassName`), to train a model that acts over several turns.

    class Guess(Environment):
        def reset(self, row):            # the data row -> the episode's first messages
            self.secret = int(row["answer"])
            return [{"role": "user", "content": row["prompt"]}]

        def step(self, text):            # the model's turn -> the environment's reply
            guess = int(text) if text.strip().isdigit() else -1
            if guess == self.secret:
                return StepResult([], reward=1.0, done=True)
            hint = "higher" if guess < self.secret else "lower"
            return StepResult([{"role": "user", "content": hint}])

The common case, an environment that is a set of tools, is a class whose public methods are the
tools (their schemas from signature and docstring, tools.py): `ToolEnvironment` runs it, parsing
the model's tool calls (tool_calls.py), calling the methods, and replying with their results as
"tool" messages; a turn without a tool call is the answer and ends the episode. A class written
for TRL's `environment_factory` (`reset(**row)`, public tool methods, optional `get_reward()`) is
such a class, used unchanged.

Rewards: each step's `reward` adds up into the episode's, plus `reward()` (an environment's) or
`get_reward()` (a TRL class's) at the end; the recipe's reward functions score the final answer
as for single-turn rows, and the episode's reward is their weighted sum plus the environment's.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from grpo_ray.envs.failures import where
from grpo_ray.envs.tool_calls import parse_tool_calls
from grpo_ray.errors import first_line
from grpo_ray.envs.tools import tool_schema

Message = dict[str, Any]  # {"role": "user" | "assistant" | "tool" | "system", "content": str}
# The row key of a prompt's whole chat (its messages before the user's, then the user's), present
# when the data's prompt was a chat list with a system message or earlier turns.
PROMPT_MESSAGES = "prompt_messages"


def prompt_messages(row: dict[str, Any]) -> list[Message]:
    """The episode's first messages as the data gives them: the row's whole chat when it has one,
    else the prompt as the user's message."""
    chat = row.get(PROMPT_MESSAGES)
    if chat:
        return [dict(message) for message in chat]
    return [{"role": "user", "content": str(row["prompt"])}]


@dataclass(frozen=True)
class StepResult:
    messages: list[Message]  # the environment's reply, appended to the conversation
    reward: float = 0.0  # this turn's reward
    done: bool = False
    # What happened, counted into the run's metrics: tool_calls, unparsable_calls, tool_errors.
    counts: dict[str, int] = field(default_factory=dict)
    # One line per tool call that failed (its error, and where the tool raised): the run's console
    # quotes the first when every call fails (envs/failures.py).
    errors: tuple[str, ...] = ()


class Environment:
    """Subclass and override reset and step (and reward when the episode's outcome is scored at
    its end). One instance per episode; instances never share state."""

    def reset(self, row: dict[str, Any]) -> list[Message]:
        """The episode's first messages. row: the data row ("prompt", "answer" and its other fields;
        "prompt_messages" when the prompt came with a system message or earlier turns)."""
        return prompt_messages(row)

    def step(self, text: str) -> StepResult:
        raise NotImplementedError(f"{type(self).__name__}.step: return the environment's reply to the model's turn")

    def reward(self) -> float | None:
        """The episode's reward at its end, added to the steps' (None: none)."""
        return None

    def tools(self) -> list[dict[str, Any]]:
        """The tools the chat template announces to the model (none by default)."""
        return []


# Method names of a tool class that are not tools: the TRL contract's and the Environment's own.
NOT_TOOLS = frozenset({"reset", "step", "reward", "get_reward", "tools", "close"})


class ToolEnvironment(Environment):
    """A tool set as an environment: `target`'s public methods (but reset and get_reward) are the
    tools. Works for a TRL environment_factory class instance as is."""

    def __init__(self, target: Any):
        self.target = target
        self.methods = {
            name: member
            for name, member in inspect.getmembers(target, callable)
            if not name.startswith("_") and name not in NOT_TOOLS and inspect.ismethod(member)
        }

    def reset(self, row: dict[str, Any]) -> list[Message]:
        messages = prompt_messages(row)
        reset = getattr(self.target, "reset", None)
        if callable(reset):
            # TRL's contract: reset(**row); a string it returns is an observation added to the prompt.
            observation = reset(**row)
            if isinstance(observation, str) and observation:
                messages[-1]["content"] += "\n" + observation
        return messages

    def step(self, text: str) -> StepResult:
        turn = parse_tool_calls(text)
        if turn.is_answer:
            return StepResult([], done=True)
        replies = [{"role": "tool", "content": f"error: {error}"} for error in turn.errors]
        errors: list[str] = []
        for call in turn.calls:
            method = self.methods.get(call.name)
            if method is None:
                known = ", ".join(sorted(self.methods)) or "none"
                errors.append(f"the model called no tool {call.name!r} (tools: {known})")
                replies.append({"role": "tool", "content": f"error: no tool {call.name!r} (tools: {known})"})
                continue
            try:
                result = method(**call.arguments)
            except Exception as err:  # noqa: BLE001 - a tool's failure is the model's to read, as TRL replies
                result = f"error: {type(err).__name__}: {err}"
                errors.append(self._raised(call.name, err))
            replies.append({"role": "tool", "content": str(result)})
        counts = {"tool_calls": len(turn.calls), "unparsable_calls": len(turn.errors), "tool_errors": len(errors)}
        return StepResult(replies, counts=counts, errors=tuple(errors))

    def _raised(self, tool: str, err: Exception) -> str:
        """'Calculator.multiply raised ValueError: ... (calculator.py:14 in multiply)'."""
        try:
            source = inspect.getsourcefile(type(self.target))
        except TypeError:  # a class without a file
            source = None
        line = first_line(err, with_type=True, limit=300)
        return f"{type(self.target).__name__}.{tool} raised {line}{where(err, source)}"

    def reward(self) -> float | None:
        get_reward = getattr(self.target, "get_reward", None)
        return float(get_reward()) if callable(get_reward) else None

    def tools(self) -> list[dict[str, Any]]:
        return [tool_schema(method) for method in self.methods.values()]


def as_environment(instance: Any) -> Environment:
    """An Environment as is; any other object as a tool set (a TRL environment_factory class)."""
    return instance if isinstance(instance, Environment) else ToolEnvironment(instance)
