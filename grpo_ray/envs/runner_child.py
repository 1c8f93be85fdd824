"""One environment process (envs/runner.py starts them): it loads the user's environment class,
then hosts episodes' instances, each request run in a thread of its own so that one slow step
does not hold the other episodes it hosts. Requests and replies are tuples over a pipe:

    ("reset", episode, row)   -> ("reset", episode, (messages, tools), None)
    ("step", episode, text)   -> ("step", episode, StepResult, None)
    ("finish", episode, None) -> ("finish", episode, reward or None, None)     (the instance is dropped)
    any failure               -> (op, episode, None, "TypeError: ... (env.py:12 in step)")
                                 (one line, with where the environment's code raised: envs/failures.py)
"""

from __future__ import annotations

import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from grpo_ray.child_processes import become_child
from grpo_ray.envs.contract import Environment, StepResult, as_environment
from grpo_ray.envs.failures import where
from grpo_ray.errors import first_line
from grpo_ray.user_code import load_attribute

# Requests a process runs at once: environments that wait (on a service, a sandbox, a sleep) overlap.
THREADS = 32


class EnvironmentSpecError(ValueError):
    """The recipe's environment cannot be loaded or built; one line naming the spec."""


def load_environment_class(spec: str) -> type:
    cls = load_attribute(spec, f"environment.spec {spec!r}", EnvironmentSpecError, kind="ClassName")
    if not isinstance(cls, type):
        raise EnvironmentSpecError(
            f"environment.spec {spec!r}: {spec.rpartition(':')[2]!r} is a {type(cls).__name__}, not a class; "
            "name the environment class"
        )
    return cls


def build(cls: type, options: dict[str, Any], spec: str) -> Environment:
    try:
        return as_environment(cls(**options))
    except Exception as error:
        raise EnvironmentSpecError(
            f"environment.spec {spec!r}: {cls.__name__}(**environment.options) failed "
            f"({first_line(error, with_type=True)}); fix the class or environment.options"
        ) from error


def child_main(conn: Connection, spec: str, options: dict[str, Any], parent_pid: int) -> None:
    become_child(parent_pid)
    try:
        cls = load_environment_class(spec)
        build(cls, options, spec)  # once now: a constructor that fails says so before any episode
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(
            ("error", str(error) if isinstance(error, EnvironmentSpecError) else first_line(error, with_type=True))
        )
        return
    conn.send(("ready", None))
    hosted: dict[int, Environment] = {}
    sending = threading.Lock()
    source = _source_file(cls)

    def answer(op: str, episode: int, payload: Any) -> None:
        try:
            value = _run(op, episode, payload, hosted, cls, options, spec)
            reply = (op, episode, value, None)
        except Exception as error:  # noqa: BLE001 - the episode's failure, the process goes on
            reply = (op, episode, None, first_line(error, with_type=True, limit=300) + where(error, source))
        with sending:
            conn.send(reply)

    with ThreadPoolExecutor(THREADS) as pool:
        while True:
            try:
                op, episode, payload = conn.recv()
            except (EOFError, OSError):
                return
            pool.submit(answer, op, episode, payload)


def _source_file(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except TypeError:  # a class defined without a file (built in)
        return None


def _run(op: str, episode: int, payload: Any, hosted: dict, cls: type, options: dict, spec: str) -> Any:
    if op == "reset":
        env = hosted[episode] = build(cls, options, spec)
        messages = env.reset(payload)
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise TypeError(f"reset returned {type(messages).__name__}, not a list of messages")
        return messages, env.tools()
    if op == "step":
        result = hosted[episode].step(payload)
        if not isinstance(result, StepResult):
            raise TypeError(f"step returned {type(result).__name__}, not a StepResult")
        return result
    env = hosted.pop(episode, None)
    reward = env.reward() if env is not None else None
    close = getattr(getattr(env, "target", env), "close", None)
    if callable(close):
        close()
    return None if reward is None else float(reward)
