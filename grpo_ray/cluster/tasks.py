"""Run a pure function as a small Ray task next to the data it reads.

A rollout slice stays in the object store; a function that needs only part of it (a few rows for
the POLARIS rescue buffer or a sample table, one learner rank's rows re-cut) runs where the slice
is, and only what it returns travels. Object refs among the arguments are resolved by Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray


@ray.remote(num_cpus=0)
def _apply(fn: Callable, *args: Any) -> Any:
    return fn(*args)


def beside_data(fn: Callable, *args: Any):
    """ObjectRef of fn(*args) computed by a task; pass the slices' refs as top-level arguments."""
    return _apply.remote(fn, *args)


def task_cancelled() -> bool:
    """Inside an actor call: whether the caller cancelled it (ray.cancel); a long call asks between
    pieces of its work, since Ray does not interrupt a running actor call."""
    return ray.get_runtime_context().is_canceled()
