"""Lay the roles out on the cluster: one placement group reserves every actor's resources before
anything starts, then each plain class becomes a Ray actor in its bundle.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grpo_ray.errors import EXCEPTION_LINE, ClusterError, first_line
from grpo_ray.cluster.fit import NodeView, plan_bundles, shortfalls
from grpo_ray.cluster.memory_kills import (
    MemoryKill,
    Victim,
    killed_text,
    memory_kill_line,
    parse_memory_kill,
    victim_kind,
)
from grpo_ray.config import RoleResources


@dataclass
class Placement:
    group: PlacementGroup
    # role -> bundle index of each of its actors
    bundles: dict[str, list[int]]

    def strategy(self, role: str, index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.bundles[role][index]
        )

    def remove(self) -> None:
        remove_placement_group(self.group)


def reserve(
    roles: list[RoleResources], timeout_s: float, colocate: tuple[str, ...] = (), strategy: str = "PACK"
) -> Placement:
    """Reserve one bundle per worker (colocated roles share theirs); fail with what is missing when
    the cluster cannot hold the plan."""
    bundles, index = plan_bundles(roles, colocate)
    missing = shortfalls(roles, bundles, cluster_nodes())
    if missing:
        raise ClusterError(
            f"{missing[0]}; lower num_workers, num_cpus or num_gpus of that role, or add nodes "
            "(`grpo-ray validate CONFIG --address ...` lists every shortfall)"
        )
    selectors = [dict(bundle.labels) for bundle in bundles]
    group = placement_group(
        [bundle.resources for bundle in bundles],
        strategy=strategy,
        bundle_label_selector=selectors if any(selectors) else None,
    )
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise ClusterError(
            f"the cluster could not place every role within {timeout_s:g} s "
            f"(ray.placement_timeout_s); check `ray status` for resources held by other jobs"
        ) from None
    return Placement(group=group, bundles=index)


def cluster_nodes() -> list[NodeView]:
    """The connected cluster's live nodes: their total resources and labels."""
    return [
        NodeView(dict(node["Resources"]), dict(node.get("Labels") or {})) for node in ray.nodes() if node.get("Alive")
    ]


def nodes_at(address: str) -> list[NodeView]:
    """The live nodes of the cluster at `address`, read by a short-lived connection."""
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ClusterError(f"--address {address}: cannot connect ({first_line(err)})") from None
    try:
        return cluster_nodes()
    finally:
        ray.shutdown()


def spawn(
    cls: type,
    placement: Placement,
    role: str,
    index: int,
    resources: RoleResources,
    *args: Any,
    name: str,
    max_restarts: int = 0,
    concurrency_groups: dict[str, int] | None = None,
) -> Any:
    """`ray.remote(...)(cls)` here, at spawn time, so every actor class stays a plain class.

    With max_restarts, Ray brings a dead actor back in the same bundle; its tasks are never retried
    (the caller decides what to re-issue: see cluster/recovery.py). concurrency_groups: named
    groups of calls that run beside the default group's (one at a time), e.g. a weight sync that
    lands while the worker generates."""
    remote_cls = ray.remote(
        num_cpus=resources.num_cpus,
        num_gpus=resources.num_gpus or None,
        max_restarts=max_restarts,
        max_task_retries=0,
        **({"concurrency_groups": concurrency_groups} if concurrency_groups else {}),
    )(cls)
    actor = remote_cls.options(scheduling_strategy=placement.strategy(role, index), name=None).remote(*args)
    _NAMES[actor._actor_id.hex()] = name
    return actor


# Each actor's name in the run (learner-0, rollout-1, ...) by its Ray actor id, as spawn gave it:
# Ray's memory monitor names the workers it killed by actor id alone.
_NAMES: dict[str, str] = {}


@dataclass(frozen=True)
class KilledForMemory:
    """A memory-monitor kill of one of the run's actors: Ray's figures, the victim, its name."""

    kill: MemoryKill
    victim: Victim | None  # None when Ray's report lists several and none is the run's
    name: str | None  # None when the victim is not known by actor id (killed in its constructor)

    @property
    def actor_id(self) -> str | None:
        return self.victim.actor_id if self.victim else None

    @property
    def kind(self) -> str | None:
        """The victim's role ("rollout", "learner", ...), None when unknown."""
        return victim_kind(self.name, self.victim)

    @property
    def text(self) -> str:
        """What happened, without the advice (memory_kills.killed_text)."""
        return killed_text(self.kill, self.name, self.victim)

    @property
    def line(self) -> str:
        """What happened and what to change."""
        return memory_kill_line(self.kill, self.name, self.victim)


def memory_kill(err: BaseException | None, name: str | None = None) -> KilledForMemory | None:
    """The memory-monitor kill behind `err` (Ray's OutOfMemoryError, or an error that carries one as
    its `cause`), its victim the run's actor where Ray's report names one; None for any other error.
    name: the caller's name for the actor it called, for a victim Ray names by its class alone (one
    killed in its constructor)."""
    for candidate in (err, getattr(err, "cause", None), getattr(getattr(err, "cause", None), "cause", None)):
        kill = parse_memory_kill(str(candidate)) if isinstance(candidate, ray.exceptions.RayError) else None
        if kill is not None:
            ours = [victim for victim in kill.victims if victim.actor_id in _NAMES]
            victim = ours[0] if ours else kill.victim()
            return KilledForMemory(kill, victim, _NAMES.get(victim.actor_id) if victim and victim.actor_id else name)
    return None


def memory_kill_of_process(pid: int, name: str) -> KilledForMemory | None:
    """Ray's memory-monitor report on the dead worker process `pid` (the actor `name`), from the
    GCS's worker table, where Ray keeps each dead worker's exit type and detail; None when it died
    of something else. A call in flight on an actor Ray restarts raises ActorUnavailableError ("The
    actor was restarted"), which says nothing of why; the table has the whole report."""
    from ray._private.state import state  # Ray's own client of the GCS tables (ray.util.state needs the dashboard)
    from ray.core.generated import common_pb2, gcs_pb2

    for raw in state._connect_and_get_accessor().get_worker_table():
        worker = gcs_pb2.WorkerTableData.FromString(raw)
        if worker.pid == pid and worker.exit_type == common_pb2.NODE_OUT_OF_MEMORY:
            kill = parse_memory_kill(worker.exit_detail)
            if kill is not None:
                mine = [victim for victim in kill.victims if victim.pid == pid]
                return KilledForMemory(kill, mine[0] if mine else None, name)
    return None


def wait_ready(actors: dict[str, Any], timeout_s: float = 600.0) -> None:
    """Block until every actor's constructor ran; the first failure becomes a one-line ClusterError."""
    pending = {actor.ready.remote(): name for name, actor in actors.items()}
    deadline = time.monotonic() + timeout_s
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not done:
            raise ClusterError(f"{', '.join(sorted(pending.values()))} did not start within {timeout_s:g} s")
        ref = done[0]
        name = pending.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.RayError as err:
            raise ClusterError(f"{name} failed to start: {error_line(err, name)}") from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_line(err: BaseException, name: str | None = None) -> str:
    """The user-facing line of an exception raised inside an actor: the original exception's.

    Ray wraps it: a task error keeps it as `.cause`; an actor whose constructor raised only keeps
    the remote traceback as text, whose last line is "SomeError: message". A memory-monitor kill is
    its own line (memory_kill; `name`: the actor's, as memory_kill takes it): Ray's report ends with a
    paragraph of generic advice.
    """
    killed = memory_kill(err, name)
    if killed is not None:
        return killed.line
    cause = getattr(err, "cause", None)
    while cause is not None and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    target = cause if cause is not None else err
    lines = [line.strip() for line in _ANSI.sub("", str(target)).splitlines() if line.strip()]
    if not lines:
        return type(target).__name__
    if cause is not None:
        return lines[0]
    if lines[0] == ray.exceptions.ActorDiedError.BASE_ERROR_MSG:
        # A system-level death: Ray's own reason sits between the actor's "key: value" lines and
        # the closing note ("The actor never ran ..."); the note alone does not say why.
        reasons = [line for line in lines[1:] if not _ACTOR_FIELD.match(line)]
        return " ".join(reasons) if reasons else lines[0]
    return _raised(lines)


def telling_error(refs: list, first: ray.exceptions.RayError, timeout_s: float) -> ray.exceptions.RayError:
    """The error that says why a call of `refs` failed, once every call has ended (at most timeout_s
    from now): a memory-monitor kill, else an actor's death, else `first`, the one ray.get raised.

    Each failed call's error is fetched here. ray.get of a list raises the first error to arrive,
    and Ray prints an error that nobody fetched, traceback and all, when its ref is dropped: a
    rollout worker killed mid-broadcast put the learner's gloo "Connection closed by peer" traceback
    and Ray's whole memory report on the console while the run recovered."""
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s, fetch_local=False)
    errors = [first]
    for ref in refs:
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.GetTimeoutError:  # still running: its outcome is not this failure's
            continue
        except ray.exceptions.RayError as err:
            errors.append(err)
    return min(errors, key=_how_telling)


def _how_telling(err: ray.exceptions.RayError) -> int:
    """0 for a memory-monitor kill, 1 for another death of an actor, 2 for an error a death caused."""
    if memory_kill(err) is not None:
        return 0
    return 1 if isinstance(err, ray.exceptions.RayActorError) else 2


_ACTOR_FIELD = re.compile(r"^(class_name|actor_id|pid|name|namespace|ip): ")


def _raised(lines: list[str]) -> str:
    """The exception at the end of a traceback's lines, with its message's further lines: a message of
    several lines (pydantic's: the model, the field, what is wrong, then a link to its docs) would
    otherwise be told by its last line alone, the link."""
    starts = [i for i, line in enumerate(lines) if EXCEPTION_LINE.match(line)]
    if not starts:
        return lines[-1]
    message = [line for line in lines[starts[-1] :] if not line.startswith("For further information visit")]
    return "; ".join(message[:4])


def call_on_actor(actor: Any, fn, *args: Any) -> Any:
    """Run fn(actor_instance, *args) inside the actor's process (node IP, free port)."""
    return ray.get(actor.__ray_call__.remote(fn, *args))


def node_address_and_port(actor: Any) -> tuple[str, int]:
    def probe(_self) -> tuple[str, int]:
        import ray as ray_in_actor

        from grpo_ray.transport.broadcast import free_port

        host = ray_in_actor.util.get_node_ip_address()
        return host, free_port(host)

    return call_on_actor(actor, probe)
