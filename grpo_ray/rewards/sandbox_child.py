"""The sandbox's child processes (rewards/sandbox.py is the parent): each loads every reward function,
says "ready", then scores requests until its pipe closes, capped in memory and dying with its parent
(grpo_ray/child_processes.py: how a child is started, set up, killed and told dead, for environments too).

Why spawn. The scorer lives in processes that already run threads (Ray's core worker, gRPC,
torch's intra-op pool). ``fork`` copies only the calling thread; a lock another thread held at
that moment stays locked in the child forever, so forked children deadlock at random. ``spawn``
starts a fresh interpreter that imports ``grpo_ray.rewards`` (pure Python, no torch) and the
parent's main module (see Limits): 0.5 to 1 s per child, the children starting in parallel, paid in
``__init__`` and after each replacement, never on a normal call (about 0.1 ms of overhead).
"""

from __future__ import annotations

import resource
from multiprocessing.connection import Connection

from grpo_ray.child_processes import become_child
from grpo_ray.errors import first_line
from grpo_ray.rewards.registry import (
    RewardSpecError,
    load_reward_function,
    score_completions,
    takes_completion_ids,
)


def _limit_memory(memory_limit_mb: int) -> None:
    limit = memory_limit_mb * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def child_main(
    conn: Connection,
    functions: list[tuple[str, dict]],
    memory_limit_mb: int | None,
    parent_pid: int,
) -> None:
    """Load every function, say "ready", then answer requests until the pipe closes."""
    become_child(parent_pid)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an aborting function writes no core files
    if memory_limit_mb is not None:
        _limit_memory(memory_limit_mb)
    try:
        loaded = [load_reward_function(spec, options) for spec, options in functions]
    except Exception as error:  # noqa: BLE001 - reported to the constructor, which raises
        conn.send(("error", str(error) if isinstance(error, RewardSpecError) else first_line(error, with_type=True)))
        return
    # Which functions take token ids (TRL's completion_ids): the parent sends them only then.
    conn.send(("ready", [takes_completion_ids(fn) for fn in loaded]))
    while True:
        try:
            index, completions, prompts, answers, row_fields = conn.recv()
        except EOFError:
            return
        try:
            scores = score_completions(loaded[index], completions, prompts, answers, row_fields)
            response = ("ok", scores)
        except Exception as error:  # noqa: BLE001 - any failure of the function fails the request
            response = ("error", first_line(error, with_type=True))
        conn.send(response)
