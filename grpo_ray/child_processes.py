"""The child processes that run user code (reward functions: rewards/sandbox.py; environments:
envs/runner.py), both sides of their life: how the parent starts one, kills it and tells how it
died; how the child sets itself up to die with its parent.

Why spawn: rewards/sandbox_child.py. A child gets a process group of its own, so that killing it
kills whatever the user's code started; Ctrl-C is left to the parent; and a watchdog thread exits
the child (with its group) once its parent is gone, for when the child is busy and does not see its
pipe close.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

from grpo_ray.quiet import quiet_driver

# How often a busy child checks that its parent is still alive.
_ORPHAN_POLL_S = 1.0
# How long to wait for a killed or crashed child to be reaped before giving up on its exit code.
_REAP_TIMEOUT_S = 5.0


# ---- the parent ----------------------------------------------------------------------------------

_Pool = TypeVar("_Pool", bound="ChildPool")


class ChildPool:
    """What a pool of children does whatever they run: replace a child (a record with `.process` and
    `.conn`) by a fresh one of the pool's own `_spawn`, and kill them all on close or at the end of
    a `with`. A subclass sets `_children` and `restarts` and defines `_spawn`."""

    _children: list
    restarts: int  # children replaced after a timeout, a crash, or found dead

    def _spawn(self) -> Any:
        raise NotImplementedError

    def _replace(self, child: Any) -> None:
        kill(child.process)
        child.conn.close()
        self._children[self._children.index(child)] = self._spawn()
        self.restarts += 1

    def _kill_children(self) -> None:
        for child in self._children:
            kill(child.process)
            child.conn.close()
        self._children = []

    def close(self) -> None:
        """Kill and reap every child."""
        self._kill_children()

    def __enter__(self: _Pool) -> _Pool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def start_child(context: BaseContext, target: Callable, args: tuple, name: str) -> tuple[BaseProcess, Connection]:
    """(the started daemonic child running target(its end of a pipe, *args), the parent's end). The
    child holds the only other end of the pipe: its death is EOF here."""
    parent_conn, child_conn = context.Pipe()
    process = context.Process(target=target, args=(child_conn, *args), daemon=True, name=name)
    with main_not_reimported():
        process.start()
    child_conn.close()
    return process, parent_conn


@contextmanager
def main_not_reimported() -> Iterator[None]:
    """While a child starts: `spawn` would run the parent's main script again in the child (its
    preparation imports __main__ by path or name), so a script that calls grpo_ray.validate or
    train at its top level, with no `if __name__ == "__main__":`, would start itself again. The
    child needs only its target and its specs, all importable by name: it is told there is
    no main module to prepare."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def kill(process: BaseProcess) -> None:
    """SIGKILL the child and, where it leads its own group, whatever it started; then reap it."""
    if process.exitcode is None:
        try:
            if os.getpgid(process.pid) == process.pid:
                os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.kill()
    process.join(_REAP_TIMEOUT_S)


def death_reason(process: BaseProcess) -> str:
    """How a child that closed its pipe ended: 'worker process died (exit code -9, SIGKILL)'."""
    process.join(_REAP_TIMEOUT_S)
    code = process.exitcode
    if code is None:
        return "worker process closed its pipe"
    if code < 0:
        try:
            return f"worker process died (exit code {code}, {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"worker process died (exit code {code})"


# ---- the child -----------------------------------------------------------------------------------


def become_child(parent_pid: int) -> None:
    """A child's first act: a process group of its own, Ctrl-C ignored, a watchdog that ends it
    when `parent_pid` is gone, and the driver's quiet logging (a spawned child starts with Python's
    default log levels: the routine notices again)."""
    try:
        os.setpgid(0, 0)  # a group of our own: the parent's kill takes whatever the user's code started
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    threading.Thread(target=exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    quiet_driver()


def exit_when_orphaned(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_ORPHAN_POLL_S)
    if os.getpgrp() == os.getpid():
        os.killpg(0, signal.SIGKILL)  # our own group: this child and whatever it started
    os._exit(1)
