"""How long a run took to start, phase by phase: from the launch of its process to its first step.

Each phase is the wall seconds since the one before (training/loop.train marks them):

    launch       the interpreter, grpo-ray's imports and the recipe, until the run's code begins
                 (from the process's start with `grpo-ray train`; 0 when train() is called from Python)
    checks       preflight's quick checks: the models and teachers resolve, the data files
                 exist, the plan fits (training/preflight.py)
    ray          the local Ray started, or the cluster joined, while the slow checks ran beside
                 (the reward functions and environment imported, the data read and tokenized)
    data         the rest of those slow checks
    mlflow       the actors placed and started, and while they build in their own processes, the
                 MLflow run opened here (a new store creates its tables)
    actors       the rest of the actors' start: every constructor finished (models loaded, engines
                 built), the learners joined
    weight_sync  the learners' and engines' weight routes set up, the engines' first weights checked
    eval         the held-out evaluation before step 1 (restore, for a resumed run: its checkpoint read)

The console says it in one line; MLflow keeps each phase as startup/<phase> (at the step the run
starts from) and the table as an artefact (startup.json).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class StartupClock:
    launched: float  # wall-clock time the process started
    phases: list[tuple[str, float]] = field(default_factory=list)

    @classmethod
    def started(cls, launched: float | None) -> StartupClock:
        """A clock from `launched` (None: now), its first phase (launch) ending now."""
        clock = cls(time.time() if launched is None else launched)
        clock.mark("launch")
        return clock

    def mark(self, phase: str) -> None:
        """The phase `phase` ends now."""
        self.phases.append((phase, time.time() - self.launched - self.total))

    @property
    def total(self) -> float:
        return sum(seconds for _, seconds in self.phases)

    def line(self) -> str:
        """start-up: 31.4 s to step 1 (launch 6.1, checks 2.0, ...)"""
        parts = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in self.phases)
        return f"start-up: {self.total:.1f} s to the first step ({parts})"

    def rows(self) -> list[dict[str, float | str]]:
        """One row per phase: its seconds, and the seconds since launch at its end."""
        rows, since = [], 0.0
        for phase, seconds in self.phases:
            since += seconds
            rows.append({"phase": phase, "seconds": round(seconds, 3), "since_launch": round(since, 3)})
        return rows

    def metrics(self) -> dict[str, float]:
        return {f"startup/{phase}": seconds for phase, seconds in self.phases} | {"startup/total": self.total}


def process_start() -> float:
    """The wall-clock time this process started: the launch of `grpo-ray train`."""
    return psutil.Process(os.getpid()).create_time()
