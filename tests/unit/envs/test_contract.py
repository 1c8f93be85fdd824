"""The environment contract: a hand-written environment, a tool set, and a class written for TRL's
environment_factory, used unchanged."""

import pytest

from grpo_ray.envs.contract import Environment, StepResult, ToolEnvironment, as_environment


class Guess(Environment):
    def reset(self, row):
        self.secret = int(row["answer"])
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        guess = int(text) if text.strip().isdigit() else -1
        if guess == self.secret:
            return StepResult([], reward=1.0, done=True)
        return StepResult([{"role": "user", "content": "higher" if guess < self.secret else "lower"}])


class TrlCalculator:
    """As TRL's docs write one: reset(**kwargs), public methods as tools, get_reward."""

    def reset(self, **kwargs):
        self.calls = 0
        self.answer = kwargs["answer"]
        return "You have a calculator."

    def multiply(self, a: int, b: int) -> int:
        """Multiply two numbers.

        Args:
            a: first factor
            b: second factor
        """
        self.calls += 1
        return a * b

    def divide(self, a: int, b: int) -> float:
        """Divide a by b."""
        return a / b

    def get_reward(self) -> float:
        return 0.1 * self.calls

    def _helper(self):
        raise AssertionError("private methods are not tools")


ROW = {"prompt": "What is 12*34?", "answer": "408", "source": "tiny"}


def test_a_hand_written_environment_plays_its_game():
    env = as_environment(Guess())
    assert env.reset(ROW) == [{"role": "user", "content": "What is 12*34?"}]
    assert env.step("100") == StepResult([{"role": "user", "content": "higher"}])
    assert env.step("408").done and env.step("408").reward == 1.0
    assert env.reward() is None and env.tools() == []


def test_a_trl_environment_factory_class_runs_unchanged():
    env = as_environment(TrlCalculator())
    assert isinstance(env, ToolEnvironment)
    assert sorted(env.methods) == ["divide", "multiply"]
    assert [tool["function"]["name"] for tool in env.tools()] == ["divide", "multiply"]
    # reset(**row), its string added to the prompt.
    assert env.reset(ROW) == [{"role": "user", "content": "What is 12*34?\nYou have a calculator."}]
    step = env.step('<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>')
    assert step == StepResult(
        [{"role": "tool", "content": "408"}], counts={"tool_calls": 1, "unparsable_calls": 0, "tool_errors": 0}
    )
    assert env.step("408").done  # no tool call: the answer
    assert env.reward() == pytest.approx(0.1)


def test_bad_calls_are_replied_to_and_counted():
    env = as_environment(TrlCalculator())
    env.reset(ROW)
    step = env.step(
        '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>'
        '<tool_call>{"name": "sqrt", "arguments": {}}</tool_call><tool_call>oops</tool_call>'
    )
    assert [m["content"] for m in step.messages] == [
        "error: not JSON (Expecting value at character 0): 'oops'",
        "error: ZeroDivisionError: division by zero",
        "error: no tool 'sqrt' (tools: divide, multiply)",
    ]
    assert step.counts == {"tool_calls": 2, "unparsable_calls": 1, "tool_errors": 2} and not step.done
    # What the run's console quotes when every call fails: each failed call, with where the tool raised.
    divide_line = TrlCalculator.divide.__code__.co_firstlineno + 2
    assert step.errors == (
        f"TrlCalculator.divide raised ZeroDivisionError: division by zero (test_contract.py:{divide_line} in divide)",
        "the model called no tool 'sqrt' (tools: divide, multiply)",
    )


def test_a_step_left_unwritten_says_what_to_write():
    with pytest.raises(NotImplementedError, match="Environment.step: return the environment's reply"):
        Environment().step("x")
