"""An environment's failures named as what they are (envs/failures.py), and the run's watch over its
episodes: the stop line past environment.max_failure_rate, and one word on tools after the first steps."""

import pytest

from grpo_ray.envs.failures import (
    FAILURE_KINDS,
    EnvironmentMonitor,
    episode_timeout_line,
    failure_kind,
    failure_line,
    where,
)

RESET_TIMED_OUT = "Adder.reset timed out after 1 s: raise environment.step_timeout_s, or make reset return sooner"
LOST = "lost with its environment process, killed when another episode's reset timed out after 1 s"


@pytest.mark.parametrize(
    "op, failure, kind",
    [
        ("reset", "timed_out", "reset_timeouts"),
        ("reset", "raised", "reset_errors"),
        ("step", "died", "step_errors"),
        ("step", "timed_out", "step_timeouts"),
        ("finish", "raised", "reward_errors"),  # the pool's "finish" runs the environment's reward()
        ("finish", "timed_out", "reward_timeouts"),
        ("step", "lost", "lost_with_process"),
    ],
)
def test_each_failure_counts_under_its_method_and_how(op, failure, kind):
    assert failure_kind(op, failure) == kind and kind in FAILURE_KINDS


def test_a_failure_line_names_the_method_and_what_to_change():
    assert failure_line("Adder", "reset", "timed_out", "timed out after 1 s") == RESET_TIMED_OUT
    assert (
        failure_line("Adder", "step", "raised", "ValueError: bad (adder.py:9 in step)")
        == "Adder.step failed: ValueError: bad (adder.py:9 in step); fix the environment's code"
    )
    assert (
        failure_line("Adder", "finish", "died", "its environment process died (exit code 3)")
        == "Adder.reward failed: its environment process died (exit code 3); fix the environment's code"
    )
    assert failure_line("Adder", "step", "lost", LOST) == LOST
    assert episode_timeout_line(300) == (
        "the episode ran past environment.episode_timeout_s (300 s): raise it, or lower environment.max_turns"
    )


def _raise_in_a_helper():
    raise KeyError("answer")


def test_where_names_the_innermost_frame_of_the_environments_own_file():
    try:
        _raise_in_a_helper()
    except KeyError as error:
        line = _raise_in_a_helper.__code__.co_firstlineno + 1
        assert where(error, __file__) == f" (test_failures.py:{line} in _raise_in_a_helper)"
        assert where(error, "/elsewhere/env.py") == f" (test_failures.py:{line} in _raise_in_a_helper)"
    assert where(ValueError("never raised"), __file__) == ""


def test_the_run_stops_past_the_rate_naming_the_kinds_and_an_episodes_own_failure_first():
    monitor = EnvironmentMonitor(window_steps=4, max_rate=0.2)
    for _ in range(3):  # three healthy steps of 32 episodes
        monitor.record(32, {"failed": 0.0, "tool_calls": 9.0}, {})
        assert monitor.check() is None
    # The fourth: one reset hangs, its process is killed, the 31 other episodes it hosted are lost.
    # 32 of 128 = 25% > 20%. The lost line comes first in the slice, the reset's own line is named.
    monitor.record(
        32,
        {"failed": 32.0, "reset_timeouts": 1.0, "lost_with_process": 31.0},
        {"lost": LOST, "failure": RESET_TIMED_OUT},
    )
    assert monitor.check() == (
        "environment: 32 of 128 episodes failed over the last 4 steps, more than environment.max_failure_rate 0.2 "
        f"(reset timeouts 1, lost with process 31); the first: {RESET_TIMED_OUT}"
    )


def test_failures_at_the_rate_or_out_of_the_window_do_not_stop_the_run():
    monitor = EnvironmentMonitor(window_steps=2, max_rate=0.5)
    monitor.record(10, {"failed": 10.0, "step_errors": 10.0}, {"failure": "Adder.step failed: ..."})
    assert monitor.check().startswith("environment: 10 of 10 episodes failed over the last 1 step, ")
    monitor.record(10, {"failed": 0.0}, {})
    assert monitor.check() is None  # 10 of 20: at the rate, not past it
    restored = EnvironmentMonitor(window_steps=2, max_rate=0.5)
    restored.load_state_dict(monitor.state_dict())  # a resumed run keeps the window
    assert restored.state_dict() == monitor.state_dict()
    restored.record(10, {"failed": 6.0, "step_errors": 6.0}, {})
    assert restored.check() is None  # 6 of 20: the first step's 10 have left the window
    restored.load_state_dict(None)  # a checkpoint from before the monitor
    assert restored.state_dict() == {"window": []}


def test_tools_never_called_are_named_once_after_the_first_steps():
    monitor = EnvironmentMonitor(window_steps=10, max_rate=0.5, notice_after=3)
    notices = []
    for _ in range(5):
        monitor.record(32, {"tools": 32.0, "tool_calls": 0.0, "unparsable_calls": 2.0}, {})
        notices.append(monitor.end_batch())
    assert notices[:2] == [None, None] and notices[3:] == [None, None]
    assert notices[2] == (
        "warning: the model called none of the environment's tools in 3 steps (96 episodes; 6 calls it wrote could "
        "not be parsed): it may not know them or their call format, and many chat templates (smollm2-135m's, "
        "tiny-tools') drop the tools they are given: show them in reset's messages (docs/agents.md: a tool the model "
        "does not know)"
    )


def test_tool_calls_that_all_fail_are_named_with_the_first_error():
    first = "Calculator.multiply raised ValueError: down (calculator.py:14 in multiply)"
    monitor = EnvironmentMonitor(window_steps=10, max_rate=0.5, notice_after=2)
    monitor.record(32, {"tools": 32.0, "tool_calls": 9.0, "tool_errors": 9.0}, {"tool": first})
    assert monitor.end_batch() is None
    monitor.record(32, {"tools": 32.0, "tool_calls": 7.0, "tool_errors": 7.0}, {"tool": "another"})
    assert monitor.end_batch() == (
        f"warning: every one of the 16 tool calls in 2 steps failed; the first: {first}; the model reads each "
        "error as the tool's reply and cannot learn to use it: fix the tool"
    )


@pytest.mark.parametrize(
    "counts",
    [
        {"tools": 0.0, "tool_calls": 0.0},  # an environment that shows no tools (higher-lower)
        {"tools": 32.0, "tool_calls": 9.0, "tool_errors": 8.0},  # one call in nine worked
    ],
)
def test_no_word_when_the_tools_are_absent_or_some_calls_work(counts):
    monitor = EnvironmentMonitor(window_steps=10, max_rate=0.5, notice_after=1)
    monitor.record(32, counts, {"tool": "x"})
    assert monitor.end_batch() is None
