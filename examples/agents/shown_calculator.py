"""A calculator for a model that was never taught its tools, for configs/smollm2-tools.yaml.

SmolLM2-135M-Instruct's chat template drops `tools=` (so does tiny-tools'): the model is never told
what it may call, and it calls nothing. Told in a system message alone (Qwen2.5's tool block, or
SmolLM2's own function-calling prompt) it still calls nothing (0 of 64 samples); with one worked
call before the question, 14 of 32 samples open a <tool_call> but none is a valid call. So this
environment shows the tools and one worked call in the episode's first messages, and its step
rewards pay for the call itself: 1.0 for a call that ran, 0.25 for a <tool_call> block that did not,
so the first steps have something to tell apart; the recipe's reward function pays for the right
product on top. docs/agents.md, "A tool the model does not know", has the figures.
"""

import json

from grpo_ray.envs import StepResult, ToolEnvironment
from grpo_ray.envs.tool_calls import OPEN, ToolCall, render_tool_call

CALL_RAN = 1.0  # a turn whose calls all ran
CALL_TRIED = 0.25  # a turn with a <tool_call> block that did not run (not JSON, no such tool, it raised)


class Tools:
    def multiply(self, a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: the first factor
            b: the second factor
        """
        return int(a) * int(b)


def tools_system_message(tools: list[dict]) -> str:
    """The tools in the words of Qwen2.5's chat template, the format grpo-ray reads calls in."""
    listed = "\n".join(json.dumps(tool) for tool in tools)
    return (
        "You may call functions to answer the user.\n\nYou are provided with function signatures within "
        f"<tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\nFor each function call, return a json "
        "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


# One worked call: the question, the call, the tool's reply, the answer.
WORKED_CALL = [
    {"role": "user", "content": "What is 312 * 457? Answer with just the number."},
    {"role": "assistant", "content": render_tool_call(ToolCall("multiply", {"a": 312, "b": 457}))},
    {"role": "tool", "content": "142584"},
    {"role": "assistant", "content": "142584"},
]


class ShownCalculator(ToolEnvironment):
    def __init__(self):
        super().__init__(Tools())

    def reset(self, row):
        system = {"role": "system", "content": tools_system_message(self.tools())}
        return [system, *WORKED_CALL, {"role": "user", "content": str(row["prompt"])}]

    def step(self, text):
        result = super().step(text)
        ran = result.counts.get("tool_calls", 0) > result.counts.get("tool_errors", 0)
        reward = CALL_RAN if ran else CALL_TRIED if OPEN in text else 0.0
        return StepResult(result.messages, reward=reward, done=result.done, counts=result.counts)
