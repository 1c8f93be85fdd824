r"""Reward functions in worker subprocesses: hard per-call timeout, memory limit, crash isolation.

Example:
    >>> with SandboxedScorer([("math", {})], num_processes=2, timeout_s=10) as scorer:
    ...     scorer.score("math", ["\\boxed{42}", "\\boxed{41}"], ["", ""], ["42", "42"], {})
    SandboxResult(scores=[1.0, 0.0], error=None)

Why subprocesses. A reward function is arbitrary code: math-verify on a pathological expression,
a user's regex that backtracks for hours, a C extension that aborts. Inside the reward worker none
of that can be stopped: a Python thread cannot be killed, and math-verify's own timeout uses
``signal.alarm``, which works only on the main thread of the main interpreter (Ray may run actor
methods on other threads). A child process can be SIGKILLed at the deadline, can have its address space
capped (``RLIMIT_AS``), and when it aborts or segfaults only the child dies.

Why spawn: see sandbox_child.py, which holds the children's side.

What "failed" means. Every row gets a float or None, and None is a failure, never a 0: the
caller counts Nones per function. A row fails when the function returned None for it (then
``error`` stays None: the function said it could not score that row), or when the request its
chunk belonged to failed. A request fails when the function raised, returned something
``score_completions`` rejects (wrong length, NaN, a string: checked in the child), ran past
``timeout_s``, or its process died (``os.abort``, a segfault, the memory limit, the OOM killer).
Then every row of that chunk is None and ``error`` holds a one-line reason.

Life cycle. Each child loads every function once, before it reports ready, so a bad spec raises
RewardSpecError from the constructor with the registry's own message. A child that timed out is
SIGKILLed together with its process group (so a subprocess the function started dies too); a dead
or killed child is replaced at once (``restarts`` counts replacements) and the run goes on.
Children die with the parent: daemonic (normal exit), EOF on their pipe (when idle), and a watchdog
thread polling ``os.getppid()`` (when busy).

Limits: a function stuck in C code that holds the GIL also blocks the watchdog, so after a hard
kill of the parent such a child lingers until that code returns; daemonic children may not start
multiprocessing pools (``subprocess`` is fine). Unlike plain spawn-based multiprocessing, a child
never runs the parent's main script (child_processes.main_not_reimported), so a script may build a scorer, or call
grpo_ray.train, at its top level.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from grpo_ray.child_processes import ChildPool, death_reason, kill, start_child
from grpo_ray.rewards.registry import RewardScores, RewardSpecError
from grpo_ray.rewards.sandbox_child import child_main


@dataclass(frozen=True)
class SandboxResult:
    """Scores of one function over one batch, in input order, and the first failure's reason."""

    scores: RewardScores  # [N] float, or None where the row failed
    error: str | None  # one line; None when no request failed (rows may still be None)


# ---- the parent --------------------------------------------------------------------------------


@dataclass
class _Child:
    process: BaseProcess
    conn: Connection
    state: str  # "starting" | "idle" | "busy" | "broken" (could not start; retried next call)
    deadline: float  # time.monotonic() by which it must say ready or answer its request
    task: int | None = None  # index of the request it is working on, when busy
    error: str | None = None  # why it is broken
    spec_error: bool = False  # broken because a function failed to load (vs died or hung)


@dataclass(frozen=True)
class _Task:
    function: int
    start: int  # rows [start, stop) of the batch
    stop: int


@dataclass
class _Outcomes:
    scores: list[RewardScores | None] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)


def _receive(conn: Connection) -> Any:
    """The next message, or None when the child is gone."""
    try:
        return conn.recv() if conn.poll() else None
    except (EOFError, OSError):
        return None


class SandboxedScorer(ChildPool):
    """A pool of child processes that score completions with reward functions named by spec.

    Args:
        functions: (spec, options) pairs as for ``load_reward_function``. Specs travel to the
            children, never function objects: a function loaded from a file cannot be pickled.
        num_processes: children; a batch is split into this many chunks scored in parallel.
        timeout_s: limit for one request (one chunk of one function), from when it is sent.
        memory_limit_mb: address-space limit of each child (``RLIMIT_AS``, set before loading the
            functions); an allocation beyond it raises MemoryError in the function.
        start_method: multiprocessing start method; keep "spawn" (see the module docstring).
        start_timeout_s: limit for a child to import and load the functions.

    Not for concurrent use from several threads: calls are serialised by a lock.
    """

    def __init__(
        self,
        functions: list[tuple[str, dict]],
        num_processes: int = 1,
        timeout_s: float = 30.0,
        memory_limit_mb: int | None = None,
        start_method: str = "spawn",
        start_timeout_s: float = 120.0,
    ):
        if not functions:
            raise ValueError("SandboxedScorer needs at least one reward function")
        if num_processes < 1 or timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError(
                f"num_processes ({num_processes}), timeout_s ({timeout_s}) and start_timeout_s "
                f"({start_timeout_s}) must be positive"
            )
        if memory_limit_mb is not None and memory_limit_mb <= 0:
            raise ValueError(f"memory_limit_mb must be positive or None, got {memory_limit_mb}")
        self.names = [spec for spec, _ in functions]
        self.timeout_s = timeout_s
        self.restarts = 0  # children replaced after a timeout, a crash, or found dead
        # Whether any function takes TRL's completion_ids (known once the children are ready).
        self.wants_completion_ids = False
        self._functions = [(spec, dict(options or {})) for spec, options in functions]
        self._memory_limit_mb = memory_limit_mb
        self._start_timeout_s = start_timeout_s
        self._context = get_context(start_method)
        self._lock = threading.Lock()
        self._closed = False
        self._children: list[_Child] = []
        try:
            self._children = [self._spawn() for _ in range(num_processes)]
            self._wait_until_started()
        except BaseException:
            self.close()
            raise

    # ---- public ----

    @property
    def pids(self) -> list[int]:
        """Process ids of the current children (they change as children are replaced)."""
        return [child.process.pid for child in self._children if child.process.pid is not None]

    def score(
        self,
        function: int | str,
        completions: list[str],
        prompts: list[str],
        answers: list[str],
        row_fields: dict[str, list],
    ) -> SandboxResult:
        """Scores of one function (index or spec), its batch split across the children."""
        return self.score_many(completions, prompts, answers, row_fields, [function])[0]

    def score_many(
        self,
        completions: list[str],
        prompts: list[str],
        answers: list[str],
        row_fields: dict[str, list],
        functions: list[int | str] | None = None,
    ) -> list[SandboxResult]:
        """Scores of several functions (default: all, in constructor order), chunks in parallel.

        Raises ValueError when the batch's lists differ in length (a caller bug, not a failure).
        """
        n = len(completions)
        lengths = [len(prompts), len(answers), *(len(values) for values in row_fields.values())]
        if any(length != n for length in lengths):
            raise ValueError(f"{n} completions but prompts/answers/row_fields have lengths {lengths}")
        if functions is None:
            functions = list(range(len(self.names)))
        indices = [self._index(function) for function in functions]
        chunks = min(len(self._children), n)
        tasks = [_Task(function, n * k // chunks, n * (k + 1) // chunks) for function in indices for k in range(chunks)]
        with self._lock:
            if self._closed:
                raise RuntimeError("SandboxedScorer is closed")
            outcomes = self._run(tasks, (completions, prompts, answers, row_fields))
        return [self._assemble(function, tasks, outcomes, n) for function in indices]

    def close(self) -> None:
        """Kill and reap every child. Idempotent; waits for a call in progress to finish."""
        with self._lock:
            self._closed = True
            self._kill_children()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: daemonic children die anyway
            pass

    # ---- children ----

    def _spawn(self) -> _Child:
        args = (self._functions, self._memory_limit_mb, os.getpid())
        process, conn = start_child(self._context, child_main, args, "grpo-ray-reward-sandbox")
        return _Child(process, conn, "starting", time.monotonic() + self._start_timeout_s)

    def _wait_until_started(self) -> None:
        outcomes = _Outcomes()
        while any(child.state == "starting" for child in self._children):
            self._wait_and_collect(outcomes)
        for child in self._children:
            if child.state == "broken" and child.spec_error:
                raise RewardSpecError(child.error)
            if child.state == "broken":
                raise RuntimeError(f"reward sandbox did not start: {child.error} (see its stderr)")

    # ---- the request loop ----

    def _index(self, function: int | str) -> int:
        if isinstance(function, int):
            if not 0 <= function < len(self.names):
                raise IndexError(f"reward function index {function} out of range")
            return function
        matches = [i for i, name in enumerate(self.names) if name == function]
        if len(matches) != 1:
            raise KeyError(
                f"reward {function!r} is {'ambiguous' if matches else 'unknown'} here; "
                f"pass its index among {self.names}"
            )
        return matches[0]

    def _run(self, tasks: list[_Task], batch: tuple) -> _Outcomes:
        outcomes = _Outcomes([None] * len(tasks), [None] * len(tasks))
        pending = deque(range(len(tasks)))
        for child in list(self._children):
            if child.state == "broken":  # one new try per call
                self._replace(child)
        try:
            while pending or any(child.state == "busy" for child in self._children):
                self._dispatch(pending, tasks, batch)
                usable = [c for c in self._children if c.state in ("idle", "busy", "starting")]
                if pending and not usable:
                    error = next(c.error for c in self._children if c.state == "broken")
                    for task in pending:
                        outcomes.errors[task] = f"no worker process could start: {error}"
                    pending.clear()
                    continue
                self._wait_and_collect(outcomes)
        finally:
            # Interrupted (KeyboardInterrupt, a pickling error): never leave an answer in a pipe.
            for child in list(self._children):
                if child.state == "busy":
                    self._replace(child)
        return outcomes

    def _dispatch(self, pending: deque, tasks: list[_Task], batch: tuple) -> None:
        for child in list(self._children):
            if not pending:
                return
            if child.state != "idle":
                continue
            if child.process.exitcode is not None:  # died while idle: replace, lose nothing
                self._replace(child)
                continue
            task = tasks[pending[0]]
            rows = slice(task.start, task.stop)
            completions, prompts, answers, row_fields = batch
            request = (
                task.function,
                completions[rows],
                prompts[rows],
                answers[rows],
                {name: values[rows] for name, values in row_fields.items()},
            )
            try:
                child.conn.send(request)
            except (BrokenPipeError, ConnectionResetError):
                self._replace(child)
                continue
            child.state, child.task = "busy", pending.popleft()
            child.deadline = time.monotonic() + self.timeout_s

    def _wait_and_collect(self, outcomes: _Outcomes) -> None:
        """Wait for the first answer, start-up or deadline among busy and starting children."""
        active = [c for c in self._children if c.state in ("busy", "starting")]
        if not active:
            return
        timeout = max(0.0, min(c.deadline for c in active) - time.monotonic())
        ready = set(wait([o for c in active for o in (c.conn, c.process.sentinel)], timeout))
        now = time.monotonic()
        for child in active:
            if child.conn in ready or child.process.sentinel in ready:
                message = _receive(child.conn)
                if message is None:
                    self._fail(child, death_reason(child.process), outcomes)
                else:
                    self._accept(child, message, outcomes)
            elif now >= child.deadline:
                if child.state == "busy":
                    reason = f"timed out after {self.timeout_s:g} s"
                else:
                    reason = f"worker process did not start within {self._start_timeout_s:g} s"
                self._fail(child, reason, outcomes)

    def _accept(self, child: _Child, message: tuple[str, Any], outcomes: _Outcomes) -> None:
        kind, value = message
        if child.state == "starting":
            if kind == "ready":
                child.state = "idle"
                self.wants_completion_ids = any(value)
            else:
                kill(child.process)
                child.state, child.error, child.spec_error = "broken", value, True
            return
        if kind == "ok":
            outcomes.scores[child.task] = value
        else:
            outcomes.errors[child.task] = value
        child.state, child.task = "idle", None

    def _fail(self, child: _Child, reason: str, outcomes: _Outcomes) -> None:
        if child.state == "starting":  # not replaced at once: a spec that hangs would loop
            kill(child.process)
            child.state, child.error = "broken", reason
            return
        outcomes.errors[child.task] = reason
        self._replace(child)

    @staticmethod
    def _assemble(function: int, tasks: list[_Task], outcomes: _Outcomes, n: int) -> SandboxResult:
        scores: RewardScores = [None] * n
        error = None
        for task, task_scores, task_error in zip(tasks, outcomes.scores, outcomes.errors):
            if task.function != function:
                continue
            if task_scores is not None:
                scores[task.start : task.stop] = task_scores
            elif error is None:
                error = task_error
        return SandboxResult(scores, error)
