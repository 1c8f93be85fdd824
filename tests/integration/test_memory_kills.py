"""Ray's memory monitor really kills an actor here, and the run says so in one line.

Each test starts a local Ray whose kill threshold (RAY_memory_usage_threshold) sits MARGIN_GB above
what this machine uses at that moment, with the monitor looking every 100 ms; an actor then
allocates until Ray kills it: about MARGIN_GB, at most CAP_GB, for at most a minute. Only this Ray's
workers are candidates for its monitor: nothing else on the shared machine is touched. The
machine's other jobs move its memory by gigabytes within a test (a 3.5 GB cap was once reached
without a kill), so the cap leaves room for their use to fall meanwhile; should it fall further,
the test fails saying that Ray killed nothing. Their use rising can as well make Ray kill the
actor before the call that allocates: the kill a test waits for then is not the one it drives, and
the test starts over on a fresh Ray (at most ATTEMPTS times).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import time

import numpy as np
import psutil
import pytest
import ray

from grpo_ray.cluster.dispatch import CallFailed, gather_fail_fast
from grpo_ray.cluster.placement import error_line, reserve, spawn, telling_error, wait_ready
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.config import RoleResources
from grpo_ray.errors import ClusterError

from .conftest import ray_started

MARGIN_GB = 1.0
CAP_GB = 4.0
CHUNK_MB = 64
ATTEMPTS = 3


class _Noise(Exception):
    """The machine's other jobs, not the test's actor, decided when Ray killed (or that it did not)."""


def _allocate_until_killed() -> int:
    """Touch CHUNK_MB at a time until the process is killed; the MiB held when it never was."""
    held, deadline = [], time.monotonic() + 60
    while len(held) * CHUNK_MB < CAP_GB * 1024 and time.monotonic() < deadline:
        held.append(np.ones(CHUNK_MB * 2**20, dtype=np.uint8))  # ones: every page really in memory
        time.sleep(0.02)
    return len(held) * CHUNK_MB


class _Hog:
    """An actor that allocates host memory until Ray's memory monitor kills it."""

    def __init__(self, grow_at_start: bool = False):
        if grow_at_start:
            _allocate_until_killed()

    def ready(self) -> bool:
        return True

    def grow(self) -> int:
        return _allocate_until_killed()


class _Peer:
    """The other end of a collective: fails once the hog's process is gone, as gloo does on a dead
    peer ("Connection closed by peer")."""

    def ready(self) -> bool:
        return True

    def wait_for_peer(self, pid: int) -> None:
        deadline = time.monotonic() + 60
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40151")


def with_a_kill(scenario) -> None:
    """Run scenario(threshold) on a tight Ray until it ends without _Noise (ATTEMPTS at most)."""
    for _ in range(ATTEMPTS - 1):
        with tight_ray() as threshold:
            try:
                return scenario(threshold)
            except _Noise:
                continue
    with tight_ray() as threshold:
        scenario(threshold)


def _started(*calls) -> list:
    """Their results; _Noise when Ray killed the actor before the test asked it to allocate."""
    try:
        return ray.get(list(calls), timeout=120)
    except ray.exceptions.OutOfMemoryError as err:
        raise _Noise("killed before it allocated") from err


@contextlib.contextmanager
def tight_ray():
    """A local Ray whose memory monitor kills above the node's use now plus MARGIN_GB."""
    memory = psutil.virtual_memory()
    threshold = (memory.total - memory.available + MARGIN_GB * 2**30) / memory.total
    settings = {"RAY_memory_usage_threshold": f"{threshold:.4f}", "RAY_memory_monitor_refresh_ms": "100"}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)  # read by the raylet as it starts
    try:
        with ray_started():
            _restore(saved)
            yield threshold
    finally:
        _restore(saved)


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _hog(role: str, name: str, max_restarts: int = 0, grow_at_start: bool = False):
    resources = RoleResources(role, 1, 0.5, 0)
    placement = reserve([resources], timeout_s=60)
    return spawn(_Hog, placement, role, 0, resources, grow_at_start, name=name, max_restarts=max_restarts)


def _killed(call) -> ray.exceptions.RayError:
    """What the call of an actor Ray's memory monitor killed raises: OutOfMemoryError, or for an
    actor Ray restarts ActorUnavailableError ("The actor was restarted"), which says nothing of why."""
    try:
        held = ray.get(call, timeout=120)
    except (ray.exceptions.OutOfMemoryError, ray.exceptions.ActorUnavailableError) as err:
        return err
    raise _Noise(f"Ray's memory monitor killed nothing: the actor held {held} MiB (the machine's use fell?)")


def test_a_rollout_worker_killed_for_memory_is_one_line_replaced_once_and_a_second_kill_stops_the_run():
    with_a_kill(_rollout_worker_killed_twice)


def _rollout_worker_killed_twice(threshold: float) -> None:
    hog = _hog("rollout", "rollout-0", max_restarts=3)
    (old_pid,) = _started(hog.__ray_call__.remote(lambda _self: os.getpid()))
    lines: list[str] = []
    recovery = WorkerRecovery([hog], [], resync=lambda: None, max_restarts=3, log=lines.append)

    first = _killed(hog.grow.remote())
    assert isinstance(first, ray.exceptions.ActorUnavailableError)  # restartable: Ray's error says no more
    assert recovery.recover(first) == ("rollout", 0)
    # Beside recovery's notice that it waits for the restart, one line tells the kill.
    told = [line for line in lines if "memory" in line]
    assert len(told) == 1, lines
    # Ray's report, read from its worker table, names the process, what it held, the node and the
    # threshold this test set.
    said = re.fullmatch(
        rf"rollout-0 \(process {old_pid}\) was killed by Ray's memory monitor holding (\d+\.\d\d) GB: the node "
        rf"used [\d.]+ of [\d.]+ GB \([\d.]+%\), over Ray's kill threshold of {threshold:.1%}; it was replaced "
        r"by process \d+ in [\d.]+ s; it was given the current weights\. A second kill of a rollout worker stops the "
        r"run: lower "
        r"rollout.samples_per_prompt, rollout.max_new_tokens or rollout.num_workers \(vllm: "
        r"rollout.vllm.cpu_kv_cache_gb\), or run fewer jobs on this machine \(raising RAY_memory_usage_threshold "
        r"is the last resort\)",
        told[0],
    )
    assert said is not None, told[0]
    assert float(said[1]) > 0

    second = _killed(hog.grow.remote())
    with pytest.raises(ClusterError) as stopped:
        recovery.recover(second)
    message = str(stopped.value)
    assert message.startswith("rollout-0 (process ") and "\n" not in message
    assert "; the second rollout worker Ray's memory monitor killed in this run, so the run stops" in message
    assert message.endswith("(raising RAY_memory_usage_threshold is the last resort)")
    assert len([line for line in lines if "memory" in line]) == 1  # the stop is the error's line alone


def test_a_learner_killed_in_its_update_or_at_its_start_is_named_with_its_own_settings():
    with_a_kill(_learner_killed_in_its_update)
    with_a_kill(_learner_killed_at_its_start)


def _learner_killed_in_its_update(threshold: float) -> None:
    learner = _hog("learner", "learner-0")
    _started(learner.ready.remote())
    with pytest.raises(CallFailed) as failed:  # as training/update.py waits on the learners
        held = gather_fail_fast([learner.grow.remote()])
        raise _Noise(f"Ray's memory monitor killed nothing: the learner held {held} MiB")
    line = error_line(failed.value.cause)
    assert line.startswith("learner-0 (process ") and " was killed by Ray's memory monitor holding " in line
    assert "; lower learner.micro_batch_size (or learner.max_tokens_per_micro_batch), or set " in line
    assert "Refer to the documentation" not in line and "\n" not in line


def _learner_killed_at_its_start(threshold: float) -> None:
    # Killed in its constructor: Ray's report has no actor id, only the class.
    starting = _hog("learner", "learner-0", grow_at_start=True)
    with pytest.raises(ClusterError) as stopped:
        wait_ready({"learner-0": starting}, timeout_s=120)
        raise _Noise("Ray's memory monitor killed nothing: the learner started")
    assert str(stopped.value).startswith("learner-0 failed to start: learner-0 (process "), str(stopped.value)
    assert "was killed by Ray's memory monitor holding " in str(stopped.value)
    assert "lower learner.micro_batch_size" in str(stopped.value)


def test_a_peer_failing_because_of_the_kill_is_fetched_and_the_kill_is_what_is_told(capfd):
    with_a_kill(_peer_fails_after_the_kill)
    printed = capfd.readouterr()
    assert "Unhandled error" not in printed.out + printed.err
    assert "Connection closed by peer" not in printed.out + printed.err


def _peer_fails_after_the_kill(threshold: float) -> None:
    hog = _hog("rollout", "rollout-0")
    peer = ray.remote(num_cpus=0)(_Peer).remote()
    _started(hog.ready.remote(), peer.ready.remote())
    pid = ray.get(hog.__ray_call__.remote(lambda _self: os.getpid()))
    # The learner's send first, as WeightBroadcaster._broadcast lists its calls.
    refs = [peer.wait_for_peer.remote(pid), hog.grow.remote()]
    with pytest.raises(ray.exceptions.RayError) as raised:
        ray.get(refs, timeout=120)
    told = telling_error(refs, raised.value, timeout_s=60)
    if not isinstance(told, ray.exceptions.OutOfMemoryError):  # the hog lived: the peer gave up waiting
        raise _Noise("Ray's memory monitor killed nothing")
    assert error_line(told).startswith("rollout-0 (process ")
    # Ray prints an error nobody fetched when its last ref goes: here, none is left unfetched.
    del refs, raised
    gc.collect()
    time.sleep(2)
