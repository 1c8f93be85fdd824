"""The user's environment code, run isolated as reward functions are: in processes of its own
(envs/runner_child.py), each hosting many episodes, with a hard timeout on every request.

    pool = EnvironmentPool("envs/calc.py:Calculator", {}, processes=2, step_timeout_s=10)
    pool.send("reset", episode=0, payload=row)
    for reply in pool.poll(timeout=1.0): ...        # EnvReply: op, episode, value or error
    pool.close()

Requests of one episode go one at a time (its caller waits for each reply); those of different
episodes run side by side, across processes and, inside one, in threads. A request past the
timeout kills its process (a hang may hold the GIL or a lock): that episode fails as timed out,
and the others the process hosted fail as lost with it; a new process takes its place. A process
that dies (a crash, an os._exit) fails its episodes the same way. Every failure is a reply with a
one-line `error` and how it failed (`failure`: envs/failures.py's kinds): the episode loop names
and counts it, and the run's environment failure policy applies.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any

from grpo_ray.child_processes import ChildPool, death_reason, kill, start_child
from grpo_ray.envs.failures import DIED, LOST, METHODS, RAISED, TIMED_OUT
from grpo_ray.envs.runner_child import EnvironmentSpecError, child_main

__all__ = ["EnvReply", "EnvironmentPool", "EnvironmentSpecError"]


@dataclass(frozen=True)
class EnvReply:
    op: str  # "reset" | "step" | "finish"
    episode: int
    value: Any = None  # reset: (messages, tools); step: StepResult; finish: the episode's reward or None
    error: str | None = None  # one line when the request failed
    failure: str | None = None  # how: "raised" | "died" | "timed_out" | "lost" (envs/failures.py)


@dataclass
class _Process:
    process: Any
    conn: Connection
    pending: dict[int, tuple[str, float]]  # episode -> (op, deadline) of its request in flight
    hosted: set[int]  # episodes whose instance lives here


class EnvironmentPool(ChildPool):
    def __init__(
        self,
        spec: str,
        options: dict[str, Any],
        processes: int,
        step_timeout_s: float,
        start_timeout_s: float = 120.0,
    ):
        self.spec, self.options, self.step_timeout_s = spec, dict(options), step_timeout_s
        self.start_timeout_s = start_timeout_s
        self.restarts = 0
        self._context = get_context("spawn")
        self._children: list[_Process] = []
        try:
            self._children = [self._spawn() for _ in range(processes)]
        except BaseException:
            self.close()
            raise

    def send(self, op: str, episode: int, payload: Any = None) -> None:
        child = self._children[episode % len(self._children)]
        if op == "reset":
            child.hosted.add(episode)
        child.pending[episode] = (op, time.monotonic() + self.step_timeout_s)
        child.conn.send((op, episode, payload))

    def poll(self, timeout: float) -> list[EnvReply]:
        """The replies that arrive within `timeout` seconds (at least one if any does), and the
        failures of requests past their deadline."""
        replies: list[EnvReply] = []
        deadline = min([d for c in self._children for _, d in c.pending.values()], default=time.monotonic() + timeout)
        ready = wait([c.conn for c in self._children if c.pending], max(0.0, min(timeout, deadline - time.monotonic())))
        for child in list(self._children):
            if child.conn in ready:
                replies += self._receive(child)
        now = time.monotonic()
        for child in list(self._children):
            late = [episode for episode, (_, d) in child.pending.items() if d <= now]
            if late:
                replies += self._fail(child, late[0], f"timed out after {self.step_timeout_s:g} s", TIMED_OUT)
        return replies

    @property
    def pids(self) -> list[int]:
        return [c.process.pid for c in self._children]

    def _spawn(self) -> _Process:
        args = (self.spec, self.options, os.getpid())
        process, parent_conn = start_child(self._context, child_main, args, "grpo-ray-environment")
        if not parent_conn.poll(self.start_timeout_s):
            kill(process)
            raise EnvironmentSpecError(
                f"environment.spec {self.spec!r}: its process did not start within "
                f"{self.start_timeout_s:g} s (importing the file hangs?)"
            )
        try:
            kind, message = parent_conn.recv()
        except (EOFError, OSError):
            raise EnvironmentSpecError(
                f"environment.spec {self.spec!r}: its process {death_reason(process)} while loading the class"
            ) from None
        if kind == "error":
            kill(process)
            raise EnvironmentSpecError(message)
        return _Process(process, parent_conn, {}, set())

    def _receive(self, child: _Process) -> list[EnvReply]:
        replies = []
        try:
            while child.conn.poll():
                op, episode, value, error = child.conn.recv()
                child.pending.pop(episode, None)
                if op == "finish":
                    child.hosted.discard(episode)
                replies.append(EnvReply(op, episode, value, error, None if error is None else RAISED))
        except (EOFError, OSError):
            if child.pending or child.hosted:
                culprit = next(iter(child.pending), next(iter(child.hosted)))
                why = death_reason(child.process).replace("worker process", "its environment process")
                replies += self._fail(child, culprit, why, DIED)
            else:
                self._replace(child)
        return replies

    def _fail(self, child: _Process, culprit: int, why: str, failure: str) -> list[EnvReply]:
        """The process is killed and replaced; every episode it held fails."""
        op = child.pending.get(culprit, ("step", 0))[0]
        failed = [EnvReply(op, culprit, error=why, failure=failure)]
        if failure == TIMED_OUT:
            lost = f"lost with its environment process, killed when another episode's {METHODS[op]} {why}"
        else:
            how = why.removeprefix("its environment process ")
            lost = f"lost with its environment process, which {how} during another episode's {METHODS[op]}"
        failed += [
            EnvReply(child.pending.get(e, ("step", 0))[0], e, error=lost, failure=LOST)
            for e in sorted((child.hosted | set(child.pending)) - {culprit})
        ]
        self._replace(child)
        return failed
