"""An environment's failures named as what they are, and the run's watch over them (pure).

A request to the environment (reset, step, or the episode's reward at its end) fails in one of
four ways, each counted per episode under its own kind (the run's env_failures/<kind> metrics):

    raised      the user's method raised (or returned the wrong type)   -> <method>_errors
    died        its process died while running it (a crash, os._exit)    -> <method>_errors
    timed_out   it ran past environment.step_timeout_s                   -> <method>_timeouts
    lost        another episode's request killed the process it lived in -> lost_with_process
and an episode as a whole may pass environment.episode_timeout_s (episode_timeouts). A failed
episode has no reward: it is out of the loss, and the run stops once more than
environment.max_failure_rate of the episodes failed over the last reward.failure_window_steps
steps (EnvironmentMonitor). Each failure is one line that names the method, the setting to change
or the code to fix, and where the user's code raised:

    >>> failure_line("Adder", "reset", TIMED_OUT, "timed out after 1 s")
    'Adder.reset timed out after 1 s: raise environment.step_timeout_s, or make reset return sooner'

Tool calls that fail are no episode failure (the model reads the error as the tool's reply, as in
TRL), but a run whose every call fails, or whose model calls none of the tools it is shown, hears
it once on the console after its first steps (EnvironmentMonitor.end_batch).
"""

from __future__ import annotations

import os
import traceback
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the environment's processes import this module: no NumPy for them (grpo_ray.types)
    from grpo_ray.types import ScoredSlice

# How a request failed (envs/runner.py's EnvReply.failure).
RAISED, DIED, TIMED_OUT, LOST = "raised", "died", "timed_out", "lost"
# The user's method behind each request of the environment pool.
METHODS = {"reset": "reset", "step": "step", "finish": "reward"}
FAILURE_KINDS = (
    "reset_errors",
    "reset_timeouts",
    "step_errors",
    "step_timeouts",
    "reward_errors",
    "reward_timeouts",
    "episode_timeouts",
    "lost_with_process",
)
# Batches (steps) after which the run hears once about tools never called or always failing.
TOOL_NOTICE_AFTER = 3


def failure_kind(op: str, failure: str) -> str:
    """The FAILURE_KINDS entry a request's failure counts under."""
    if failure == LOST:
        return "lost_with_process"
    return f"{METHODS[op]}_{'timeouts' if failure == TIMED_OUT else 'errors'}"


def failure_line(class_name: str, op: str, failure: str, error: str) -> str:
    """One line: which method failed, how, and what to change. error: the pool's reason
    ("timed out after 1 s", "ValueError: bad (env.py:12 in step)", "its environment process died ...")."""
    method = METHODS[op]
    if failure == TIMED_OUT:
        return f"{class_name}.{method} {error}: raise environment.step_timeout_s, or make {method} return sooner"
    if failure == LOST:
        return error
    return f"{class_name}.{method} failed: {error}; fix the environment's code"


def episode_timeout_line(seconds: float) -> str:
    return (
        f"the episode ran past environment.episode_timeout_s ({seconds:g} s): raise it, or lower environment.max_turns"
    )


def where(error: BaseException, source: str | None) -> str:
    """' (file.py:12 in name)': where the user's code raised, the innermost frame in `source` (the
    environment's file), else the innermost outside grpo_ray; '' when the traceback has neither."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mine = [f for f in frames if source and os.path.abspath(f.filename) == os.path.abspath(source)]
    mine = mine or [f for f in frames if not os.path.abspath(f.filename).startswith(ours + os.sep)]
    if not mine:
        return ""
    frame = mine[-1]
    return f" ({os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})"


def episode_counts(scored: list[ScoredSlice]) -> tuple[int, dict[str, float], dict[str, str]]:
    """(rows, each episode figure summed, the first line of each kind of trouble) over the slices or
    chunks a generation had scored: what EnvironmentMonitor.record takes."""
    counts: dict[str, float] = {}
    errors: dict[str, str] = {}
    for part in scored:
        for name, values in part.episode_stats.items():
            counts[name] = counts.get(name, 0.0) + sum(float(v) for v in values if not math.isnan(v))
        for kind, line in part.episode_errors.items():
            errors.setdefault(kind, line)
    return int(sum(len(s.rewards) for s in scored)), counts, errors


@dataclass
class _Batch:
    episodes: int
    counts: dict[str, float]  # summed episode figures: failed, the FAILURE_KINDS, tool_calls ...
    errors: dict[str, str] = field(default_factory=dict)  # "failure" | "lost" | "tool" -> first line


class EnvironmentMonitor:
    """What a run's episodes say about its environment, batch by batch (pure bookkeeping):

    monitor.record(episodes=128, counts={"failed": 128, "reset_timeouts": 1, ...}, errors={"failure": ...})
    monitor.check()       # the stop line once too many episodes failed over the window, else None
    monitor.end_batch()   # after the TOOL_NOTICE_AFTER-th batch, once: a warning about the tools, or None
    """

    def __init__(self, window_steps: int, max_rate: float, notice_after: int = TOOL_NOTICE_AFTER):
        self.max_rate, self.notice_after = max_rate, notice_after
        self._window: deque[_Batch] = deque(maxlen=window_steps)
        self._seen = _Batch(0, {})  # since this process started: what the tool notice reads
        self._batches = 0

    def record(self, episodes: int, counts: dict[str, float], errors: dict[str, str]) -> None:
        self._window.append(_Batch(episodes, dict(counts), dict(errors)))
        self._seen.episodes += episodes
        for name, value in counts.items():
            self._seen.counts[name] = self._seen.counts.get(name, 0.0) + value
        for key, line in errors.items():
            self._seen.errors.setdefault(key, line)

    def check(self) -> str | None:
        episodes = sum(b.episodes for b in self._window)
        failed = int(sum(b.counts.get("failed", 0) for b in self._window))
        if not episodes or failed / episodes <= self.max_rate:
            return None
        kinds = {k: int(sum(b.counts.get(k, 0) for b in self._window)) for k in FAILURE_KINDS}
        named = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in kinds.items() if n)
        steps = f"{len(self._window)} step{'s' if len(self._window) > 1 else ''}"
        first = self._first("failure") or self._first("lost") or "no error message"
        return (
            f"environment: {failed} of {episodes} episodes failed over the last {steps}, "
            f"more than environment.max_failure_rate {self.max_rate:g} ({named}); the first: {first}"
        )

    def end_batch(self) -> str | None:
        """Once, at the end of the notice_after-th batch: a warning when the environment shows the
        model tools and it called none, or every call failed; None otherwise."""
        self._batches += 1
        if self._batches != self.notice_after:
            return None
        counts, episodes = self._seen.counts, self._seen.episodes
        calls, errors = int(counts.get("tool_calls", 0)), int(counts.get("tool_errors", 0))
        steps = f"{self._batches} step{'s' if self._batches > 1 else ''}"
        if not counts.get("tools"):  # no tools shown (an environment that is not a tool set)
            return None
        if calls == 0:
            unparsable = int(counts.get("unparsable_calls", 0))
            tried = f"; {unparsable} calls it wrote could not be parsed" if unparsable else ""
            return (
                f"warning: the model called none of the environment's tools in {steps} ({episodes} episodes{tried}): "
                "it may not know them or their call format, and many chat templates (smollm2-135m's, tiny-tools') "
                "drop the tools they are given: show them in reset's messages (docs/agents.md: a tool the model "
                "does not know)"
            )
        if errors >= calls:
            first = self._seen.errors.get("tool", "no error message")
            return (
                f"warning: every one of the {calls} tool calls in {steps} failed; the first: {first}; the model "
                "reads each error as the tool's reply and cannot learn to use it: fix the tool"
            )
        return None

    def _first(self, key: str) -> str | None:
        return next((b.errors[key] for b in self._window if key in b.errors), None)

    def state_dict(self) -> dict:
        return {"window": [[b.episodes, b.counts, b.errors] for b in self._window]}

    def load_state_dict(self, state: dict | None) -> None:
        self._window.clear()
        for episodes, counts, errors in (state or {}).get("window", []):
            self._window.append(_Batch(int(episodes), dict(counts), dict(errors)))
