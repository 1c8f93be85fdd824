"""Stop a run whose reward functions fail too often, instead of training on silence.

Pure bookkeeping: the driver records each step's failure counts per function; `check` returns a
one-line message naming the function and its first error once a function's failure rate over the
last `window_steps` steps exceeds `max_rate`.

    >>> monitor = FailureMonitor(window_steps=2, max_rate=0.5)
    >>> monitor.record({"math": 3}, completions=4, first_errors={"math": "TimeoutError: ..."})
    >>> monitor.check()
    "reward function 'math' failed on 75% of completions over the last 1 step (first error: TimeoutError: ...); "
    "fix it or raise reward.max_failure_rate"
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class _Step:
    failures: dict[str, int]
    completions: int


class FailureMonitor:
    def __init__(self, window_steps: int, max_rate: float):
        self.max_rate = max_rate
        self._steps: deque[_Step] = deque(maxlen=window_steps)
        self._first_errors: dict[str, str] = {}

    def record(self, failures: dict[str, int], completions: int, first_errors: dict[str, str]) -> None:
        self._steps.append(_Step(dict(failures), completions))
        for name, error in first_errors.items():
            self._first_errors.setdefault(name, error)

    def state_dict(self) -> dict:
        return {
            "steps": [[step.failures, step.completions] for step in self._steps],
            "first_errors": dict(self._first_errors),
        }

    def load_state_dict(self, state: dict) -> None:
        self._steps.clear()
        for failures, completions in state["steps"]:
            self._steps.append(_Step(dict(failures), int(completions)))
        self._first_errors = dict(state["first_errors"])

    def rates(self) -> dict[str, float]:
        total = sum(step.completions for step in self._steps)
        names = {name for step in self._steps for name in step.failures}
        return {name: sum(s.failures.get(name, 0) for s in self._steps) / max(total, 1) for name in sorted(names)}

    def check(self) -> str | None:
        for name, rate in self.rates().items():
            if rate > self.max_rate:
                steps = len(self._steps)
                error = self._first_errors.get(name, "no error message")
                return (
                    f"reward function '{name}' failed on {rate:.0%} of completions over the last {steps} "
                    f"step{'s' if steps > 1 else ''} (first error: {error}); fix it or raise reward.max_failure_rate"
                )
        return None
