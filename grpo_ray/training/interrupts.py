"""Ctrl-C and SIGTERM (`ray job stop`, `kill`) that always stop a run.

Python turns a signal into KeyboardInterrupt wherever the main thread happens to be. When that
is a finalizer (Ray's ObjectRef.__del__ runs many times a step) or a callback from C++, the
exception is reported as "ignored" and lost, and the run would carry on. So the handler also
records the request, and the training loop checks it between steps: a stop is at most one step
late, never lost.
"""

from __future__ import annotations

import signal
import threading

_requested = threading.Event()


def _handler(signum, frame) -> None:
    _requested.set()
    raise KeyboardInterrupt


def install() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt (so `finally` blocks stop Ray) and are remembered."""
    _requested.clear()
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)


def raise_if_requested() -> None:
    """Raise KeyboardInterrupt if a stop was requested, even one whose first raise was swallowed."""
    if _requested.is_set():
        raise KeyboardInterrupt
