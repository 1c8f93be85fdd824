"""The environments' processes (envs/runner.py): real child processes running a user's file, with
hard timeouts, crashes and bad specs, each one line; nothing left running."""

import time

import psutil
import pytest

from grpo_ray.envs.contract import StepResult
from grpo_ray.envs.runner import EnvironmentPool, EnvironmentSpecError

ENV_FILE = """
import os, time
from grpo_ray.envs.contract import Environment, StepResult

class Echo(Environment):
    def __init__(self, prefix="echo"):
        self.prefix = prefix

    def reset(self, row):
        self.turns = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.turns += 1
        if text == "raise":
            raise ValueError("bad move")
        if text == "hang":
            time.sleep(600)
        if text == "exit":
            os._exit(3)
        if text.startswith("sleep "):
            time.sleep(float(text.split()[1]))
        return StepResult([{"role": "user", "content": f"{self.prefix} {text}"}], reward=0.5, done=text == "stop")

    def reward(self):
        return float(self.turns)
"""


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "envs.py"
    path.write_text(ENV_FILE)
    return f"{path}:Echo"


def collect(pool, count, timeout=60.0):
    replies, deadline = [], time.monotonic() + timeout
    while len(replies) < count and time.monotonic() < deadline:
        replies += pool.poll(1.0)
    return replies


def test_an_episode_resets_steps_and_finishes_with_its_reward(spec):
    with EnvironmentPool(spec, {"prefix": "got"}, processes=1, step_timeout_s=30) as pool:
        pool.send("reset", 0, {"prompt": "hi"})
        [reset] = collect(pool, 1)
        assert (reset.op, reset.episode, reset.error) == ("reset", 0, None)
        assert reset.value == ([{"role": "user", "content": "hi"}], [])
        pool.send("step", 0, "stop")
        [step] = collect(pool, 1)
        assert step.value == StepResult([{"role": "user", "content": "got stop"}], reward=0.5, done=True)
        pool.send("finish", 0)
        [finish] = collect(pool, 1)
        assert (finish.op, finish.value) == ("finish", 1.0)


def test_a_step_that_raises_fails_that_episode_alone(spec):
    with EnvironmentPool(spec, {}, processes=1, step_timeout_s=30) as pool:
        for episode in (0, 1):
            pool.send("reset", episode, {"prompt": "x"})
        collect(pool, 2)
        pool.send("step", 0, "raise")
        pool.send("step", 1, "fine")
        replies = {r.episode: r for r in collect(pool, 2)}
        # The error's line, with where the environment's own code raised it (its file, line and method).
        assert replies[0].error == "ValueError: bad move (envs.py:16 in step)" and replies[0].failure == "raised"
        assert replies[1].error is None
        assert pool.restarts == 0


def test_a_slow_step_does_not_hold_the_other_episodes_of_its_process(spec):
    with EnvironmentPool(spec, {}, processes=1, step_timeout_s=30) as pool:
        for episode in (0, 1):
            pool.send("reset", episode, {"prompt": "x"})
        collect(pool, 2)
        pool.send("step", 0, "sleep 2")
        pool.send("step", 1, "quick")
        order = [r.episode for r in collect(pool, 2)]
        assert order == [1, 0]


def test_a_hang_is_killed_at_the_timeout_and_its_process_replaced(spec):
    with EnvironmentPool(spec, {}, processes=2, step_timeout_s=1.0) as pool:
        before = pool.pids
        for episode in (0, 1, 2):  # 0 and 2 share a process, 1 has its own
            pool.send("reset", episode, {"prompt": "x"})
        collect(pool, 3)
        pool.send("step", 0, "hang")
        pool.send("step", 1, "fine")
        started = time.monotonic()
        replies = {r.episode: r for r in collect(pool, 3, timeout=20)}
        assert time.monotonic() - started < 10
        assert (replies[0].failure, replies[0].error) == ("timed_out", "timed out after 1 s")
        assert replies[1].error is None
        assert replies[2].failure == "lost"
        assert (
            replies[2].error
            == "lost with its environment process, killed when another episode's step timed out after 1 s"
        )
        assert pool.restarts == 1 and pool.pids[0] != before[0] and pool.pids[1] == before[1]
        assert not psutil.pid_exists(before[0]) or psutil.Process(before[0]).status() == psutil.STATUS_ZOMBIE
        pool.send("reset", 4, {"prompt": "again"})  # the new process serves
        assert collect(pool, 1)[0].error is None


def test_a_process_that_dies_fails_its_episodes_in_one_line(spec):
    with EnvironmentPool(spec, {}, processes=1, step_timeout_s=30) as pool:
        pool.send("reset", 0, {"prompt": "x"})
        collect(pool, 1)
        pool.send("step", 0, "exit")
        [reply] = collect(pool, 1)
        assert (reply.failure, reply.error) == ("died", "its environment process died (exit code 3)")
        assert pool.restarts == 1


@pytest.mark.parametrize(
    "make, expected",
    [
        (
            lambda tmp: f"{tmp}/nowhere.py:Echo",
            "environment.spec '{tmp}/nowhere.py:Echo': file '{tmp}/nowhere.py' not found",
        ),
        (
            lambda tmp: f"{tmp}/envs.py:Missing",
            "environment.spec '{tmp}/envs.py:Missing': '{tmp}/envs.py' has no attribute",
        ),
        (lambda tmp: f"{tmp}/envs.py:time", "environment.spec '{tmp}/envs.py:time': 'time' is a module, not a class"),
    ],
)
def test_a_spec_that_does_not_name_a_class_is_one_line(spec, tmp_path, make, expected):
    with pytest.raises(EnvironmentSpecError) as err:
        EnvironmentPool(make(tmp_path), {}, processes=1, step_timeout_s=5)
    assert str(err.value).startswith(expected.format(tmp=tmp_path)) and "\n" not in str(err.value)


def test_options_the_class_does_not_take_are_named(spec):
    with pytest.raises(EnvironmentSpecError, match=r"Echo\(\*\*environment.options\) failed \(TypeError: "):
        EnvironmentPool(spec, {"colour": "red"}, processes=1, step_timeout_s=5)
