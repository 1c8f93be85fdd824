"""Rollout, reward and teacher workers that die mid-step come back; the step goes on.

Ray restarts a dead rollout, reward or teacher actor in its own placement-group bundle (they are
started with `max_restarts = ray.max_actor_restarts` and no task retries: a retried `generate`
would run on a fresh engine holding the initial weights). This module tells which worker died from
the error, waits until Ray has it back, and brings a rollout worker to the current weights; what to
re-issue is the caller's (the rollout service, cluster/rollout_service.py, since only it knows who
held what; Workers.teacher_logprobs for a teacher, which holds nothing between calls). A learner
rank and the reference are not restarted: their death ends the run.

A worker Ray's memory monitor killed is told by one line (what it held, the node against Ray's
threshold, cluster/memory_kills.py) and replaced once per role: a second kill of a worker of the
same role ends the run. The first may be a neighbour's spike (a second job on the machine), which a
replacement rides out; a second says the role does not fit beside what else runs, and each
replacement costs a model load and the step's work again (65 s for a rollout worker on a 2-core
machine) while the node stays at Ray's limit, where the next kill may be the learner's. Per role,
not per worker: Ray kills the most recently started work first, so steady pressure can take the
pool's workers in turn, each only once.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray

from grpo_ray.actors.worker_errors import EngineDiedError, StaleWeightsError
from grpo_ray.cluster.memory_kills import advice
from grpo_ray.cluster.placement import (
    ClusterError,
    KilledForMemory,
    error_line,
    memory_kill,
    memory_kill_of_process,
)


class WorkerRecovery:
    def __init__(
        self,
        rollouts: list[Any],
        rewards: list[Any],
        resync: Callable[[], None],
        max_restarts: int,
        log: Callable[[str], None],
        timeout_s: float = 900.0,
        with_weights: Callable[[int, Callable[[], Any]], Any] | None = None,
        teachers: dict[str, Any] | None = None,
    ):
        """teachers: each teacher's actor by its name (teacher-<name>: Workers.named_teachers())."""
        teachers = teachers or {}
        self._actors = {"rollout": rollouts, "reward": rewards, "teacher": list(teachers.values())}
        self._who = {
            actor._actor_id.hex(): (role, i) for role, actors in self._actors.items() for i, actor in enumerate(actors)
        }
        self._names = {(role, i): f"{role}-{i}" for role, actors in self._actors.items() for i in range(len(actors))}
        self._names.update({("teacher", i): name for i, name in enumerate(teachers)})
        self._resync = resync  # re-forms the weight-broadcast group and sends the current weights
        # Calls issued while the rollout workers hold an earlier version (WeightBroadcaster.with_kept_weights).
        self._with_weights = with_weights
        self.max_restarts = max_restarts
        self.log = log
        self.timeout_s = timeout_s
        self.replaced: Counter[str] = Counter()  # role -> replacements so far in this run
        self.seconds = 0.0  # time spent bringing workers back, in this run
        self.reissued_prompts = 0  # prompts generated again for a replaced rollout worker (the batch builder counts)
        self._restarts: Counter[tuple[str, int]] = Counter()
        self._memory_kills: Counter[str] = Counter()  # role -> its workers Ray's memory monitor killed
        self._engine_deaths: dict[tuple[str, int], str] = {}  # the last root cause a worker's engine died of
        # Process ids now, so the log names the process that died and a worker that was only
        # unreachable for a moment (same process) is not taken for a replacement.
        self._pids = dict(zip(self._names, ray.get([_pid_call(self._actors[role][i]) for role, i in self._names])))

    def recover(self, err: BaseException) -> tuple[str, int]:
        """(role, index) of the worker whose death `err` reports, once it is back and, for a rollout
        worker, holds the current weights. Re-raises `err` when it is not a worker's death.

        A death shows as the actor's error when a call was in flight, or, for a rollout worker Ray
        restarted while it was idle, as StaleWeightsError from its next generate call."""
        killed = memory_kill(err)  # Ray's OutOfMemoryError names its victim in its report alone
        who = self._who.get(getattr(err, "actor_id", None) or (killed.actor_id if killed else None) or "")
        stale, died = _cause_of(err, StaleWeightsError), _cause_of(err, EngineDiedError)
        if stale is not None or died is not None:
            who = ("rollout", (stale or died).index)
        elif who is None or not isinstance(err, (*_DEATHS, ray.exceptions.ActorUnavailableError)):
            raise err
        role, index = who
        name, old_pid = self._names[who], self._pids[who]
        self._check_memory_kill(who, killed)
        self._check_curable(who, died)
        self._check_restarts_left(who, f"{name} (process {old_pid})", f": {died or error_line(err)}")
        started = time.monotonic()
        # A worker whose engine died answers first and exits a moment later: wait for the new process.
        pid = self._wait_until_back(self._actors[role][index], name, gone=old_pid if died else None)
        if killed is None and pid != old_pid:  # a call on an actor Ray restarts says only "restarted"
            killed = memory_kill_of_process(old_pid, name)
            self._check_memory_kill(who, killed)
        if role == "rollout":
            # Also when the process is the same: it may have left the broadcast group mid-call.
            self._resync()
        seconds = time.monotonic() - started
        self.seconds += seconds
        if pid == old_pid:
            self.log(f"{name} (process {pid}) was unreachable for a moment; its calls are issued again")
            return role, index
        self._record_replacement(who, pid)
        weights = "; it was given the current weights" if role == "rollout" else ""
        if killed is not None:
            self.log(_replaced_after_memory_kill(killed, pid, seconds, weights))
            return role, index
        self.log(
            f"{name} died and was replaced by process {pid} in {seconds:.1f} s (it was process {old_pid})"
            + (f"; its vLLM engine had died: {died.reason}" if died else "")
            + weights
        )
        return role, index

    def reissue(self, version: int, current: int, issue: Callable[[], Any]) -> Any:
        """`issue()` a replaced rollout worker's share of a batch sampled by weights `version`: a batch
        started ahead (rollout.max_staleness) was sampled by an earlier version than the `current`
        one, and its lost share is sampled by that version again, so that the batch is the one an
        unhurt run draws."""
        if version == current or self._with_weights is None:
            return issue()
        self.log(f"the lost share was sampled by weights version {version} (now {current}): sampled by them again")
        return self._with_weights(version, issue)

    def counters(self) -> dict[str, float]:
        """Running totals, as faults/* metrics: a step logs how much they grew since the last step."""
        return {
            "faults/rollout_replaced": float(self.replaced["rollout"]),
            "faults/reward_replaced": float(self.replaced["reward"]),
            **({"faults/teacher_replaced": float(self.replaced["teacher"])} if self._actors["teacher"] else {}),
            "faults/reissued_prompts": float(self.reissued_prompts),
            "faults/recovery_seconds": self.seconds,
        }

    def replace_dead_rollouts(self, err: BaseException | None = None) -> int:
        """After a call every rollout worker took part in failed (a weight sync) with `err`: wait until
        Ray has each one back; those whose process changed are counted and logged, and all get one new
        broadcast group and the current weights. Returns how many were replaced (0: the failure was
        not a death, and the caller's error stands)."""
        started = time.monotonic()
        replaced, told = [], []
        died, killed = _cause_of(err, EngineDiedError), memory_kill(err)
        killed_who = self._who.get(killed.actor_id or "") if killed else None
        for index, actor in enumerate(self._actors["rollout"]):
            who, name = ("rollout", index), f"rollout-{index}"
            dying = died is not None and died.index == index
            if dying:
                self._check_curable(who, died)
            if who == killed_who:
                self._check_memory_kill(who, killed)
            pid = self._wait_until_back(actor, name, gone=self._pids[who] if dying else None)
            if pid != self._pids[who]:
                self._check_restarts_left(who, name)
                if killed is None and (killed := memory_kill_of_process(self._pids[who], name)) is not None:
                    killed_who = who
                    self._check_memory_kill(who, killed)
                if who == killed_who:
                    told.append(pid)
                else:
                    replaced.append(f"{name} (process {self._pids[who]} -> {pid})")
                self._record_replacement(who, pid)
        if not replaced and not told:
            return 0
        self._resync()
        seconds = time.monotonic() - started
        self.seconds += seconds
        sent = "; the weights were sent again"
        if told:  # the memory monitor's victim has a line of its own, which says why and what to lower
            self.log(_replaced_after_memory_kill(killed, told[0], seconds, sent))
        if replaced:
            self.log(
                f"{', '.join(replaced)} died and {'was' if len(replaced) == 1 else 'were'} replaced in "
                f"{seconds:.1f} s{sent}"
            )
        return len(replaced) + len(told)

    def _check_curable(self, who: tuple[str, int], died: EngineDiedError | None) -> None:
        """Stop at once when a worker's fresh engine died of the cause its last one died of, before
        it sampled anything: the same crash at the same place, which no restart cures (three
        restarts of ~4 minutes each, before)."""
        if died is None:
            return
        if died.sampled == 0 and self._engine_deaths.get(who) == died.reason:
            where = f"; the engine's log: {died.log_file}" if died.log_file else ""
            raise ClusterError(
                f"{who[0]}-{who[1]}: its vLLM engine died of the same cause again after a restart, before "
                f"sampling anything, so a restart cannot cure it: {died.reason}{where}"
            ) from None
        self._engine_deaths[who] = died.reason

    def _check_memory_kill(self, who: tuple[str, int], killed: KilledForMemory | None) -> None:
        """Count a memory-monitor kill of the worker `who`; stop at the second of its role (module
        docstring: why)."""
        if killed is None:
            return
        self._memory_kills[who[0]] += 1
        if self._memory_kills[who[0]] > 1:
            raise ClusterError(
                f"{killed.text}; the second {who[0]} worker Ray's memory monitor killed in this run, so the "
                f"run stops rather than replace it again: {advice(killed.kind)}"
            ) from None

    def _check_restarts_left(self, who: tuple[str, int], name: str, detail: str = "") -> None:
        if self._restarts[who] >= self.max_restarts:
            raise ClusterError(
                f"{name} died after {self._restarts[who]} restarts, the most "
                f"ray.max_actor_restarts={self.max_restarts} allows{detail}"
            ) from None

    def _record_replacement(self, who: tuple[str, int], pid: int) -> None:
        self._restarts[who] += 1
        self._pids[who] = pid
        self.replaced[who[0]] += 1

    def _wait_until_back(self, actor: Any, name: str, gone: int | None = None) -> int:
        """Ray restarts the actor by itself; calls fail as unavailable until its constructor ran.
        `gone`: a process that is ending: wait for another one."""
        deadline = time.monotonic() + self.timeout_s
        announced = False
        while True:
            try:
                pid = ray.get(_pid_call(actor), timeout=max(1.0, deadline - time.monotonic()))
                if pid != gone:
                    return pid
                if time.monotonic() > deadline:
                    raise ClusterError(f"{name}'s process {gone} did not end within {self.timeout_s:g} s") from None
                time.sleep(0.2)
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                if not announced:  # a restart can take minutes (a vLLM engine's start): never silently
                    self.log(f"{name} is not reachable: waiting up to {self.timeout_s:g} s for Ray to restart it")
                    announced = True
                if time.monotonic() > deadline:
                    raise ClusterError(f"{name} died and Ray did not restart it within {self.timeout_s:g} s") from None
                time.sleep(0.5)
            except _DEATHS as err:  # restarts spent, its constructor failed or was killed for memory
                raise ClusterError(f"{name} died and could not be restarted: {error_line(err)}") from None


# What a call of a worker that died raises: a memory-monitor kill is Ray's OutOfMemoryError, no actor error.
_DEATHS = (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError)


def _replaced_after_memory_kill(killed: KilledForMemory, pid: int, seconds: float, weights: str) -> str:
    """The one line of a worker the memory monitor killed and Ray replaced by process `pid`."""
    return (
        f"{killed.text}; it was replaced by process {pid} in {seconds:.1f} s{weights}. A second kill of a "
        f"{killed.kind or 'worker'} worker stops the run: {advice(killed.kind)}"
    )


def _own_pid(_self: Any) -> int:
    return os.getpid()


def _pid_call(actor: Any) -> Any:
    """The call of the actor's process id (a restarted worker answers with a new one), asked of any
    actor class through Ray's __ray_call__, so that a class need not define it."""
    return actor.__ray_call__.remote(_own_pid)


def _cause_of(err: BaseException | None, kind: type[Exception]) -> Any:
    """The `kind` error behind a Ray task error (Ray makes the error an instance of its cause), or
    behind a CallFailed; None when there is none."""
    for candidate in (err, getattr(err, "cause", None), getattr(getattr(err, "cause", None), "cause", None)):
        if isinstance(candidate, kind):
            return candidate
    return None
