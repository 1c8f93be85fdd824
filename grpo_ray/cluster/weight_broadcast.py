"""Orchestrate the weight sync: learner rank 0 -> every rollout rank, then prove it.

Next hop: inside the actors, transport/routes.py (each rank's seat: the hand-off or the broadcast).

The ranks: learner rank 0 sends; each rollout worker takes one rank per entry of its
`device_identity()`: one per vLLM tensor-parallel shard when the engine's own workers receive the
weights, else one. A rank on learner rank 0's device takes the hand-off (handles to memory on that
device, transport/handoff.py), the others the broadcast group (transport/routes.py). Proof after
every sync: each rank's digest (broadcast.bucket_checksum) of the buckets it received and loaded
must equal the one learner rank 0 computed over what it sent; a vLLM shard that missed a bucket is
named with its engine ("rollout-1 (tp rank 1)"). Every `probe_every` syncs, each rollout engine
scores a fixed probe, and transport/probe.py tells from its log-probs whether it holds the new weights or
those of the last version it was shown to hold, when the updates since moved the probe past the
kernels' noise (measured per engine at start-up), and says "undecided" otherwise. A checksum of
the engine's own parameters would not do, since vLLM repacks some weight matrices.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import ray

from grpo_ray.cluster.placement import error_line, node_address_and_port, telling_error
from grpo_ray.transport.broadcast import CPU_DEVICE, choose_backend, spec_bytes
from grpo_ray.transport.routes import Seat
from grpo_ray.transport.probe import ProbeBaseline, read_probe, start_baseline
from grpo_ray.types import Probe, SyncReport


T = TypeVar("T")
# The rollout workers' concurrency group a sync's receive runs in when it may land during generation.
SYNC_GROUP = "sync"


class WeightSyncError(RuntimeError):
    """A rollout worker does not hold the weights the learner sent; names the worker. `cause`: the
    Ray error a failed call raised, where one did (recovery reads which worker died of what)."""

    def __init__(self, message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class ProbeSummary:
    """One probe over every rollout worker (transport/probe.py); none of them "not loaded"."""

    max_abs_diff: float  # largest |engine - learner| log-prob over the completion tokens, all workers
    undecided: int  # workers whose probe could not tell (the updates moved it less than the kernels' noise)
    moved: float  # the least mean movement of the learner's log-probs since a worker's baseline
    kernel_gap: float  # the largest engine-learner kernel gap a verdict allowed for
    notice: str | None = None  # the first undecided worker's one-line explanation


@dataclass(frozen=True)
class SyncResult:
    version: int
    seconds: float
    num_bytes: int
    probe: ProbeSummary | None  # None when no probe was due
    during_generation: int = 0  # rollout workers whose engine was generating when the weights landed
    wake_seconds: float = 0.0  # sleeping engines taking back their weights' and KV cache's memory

    @property
    def probe_max_abs_diff(self) -> float | None:
        return None if self.probe is None else self.probe.max_abs_diff


class WeightBroadcaster:
    def __init__(
        self,
        learners: list[Any],
        rollouts: list[Any],
        bucket_mb: float,
        timeout_s: float,
        adapter_only: bool = False,
        keep_versions: int = 0,
        during_generation: bool = False,
        same_device: str = "handoff",
        sleeps: bool = False,
        probe: Probe | None = None,
    ):
        """adapter_only: send only the LoRA matrices (the rollout engines apply the adapter themselves).
        keep_versions: learner rank 0 keeps a copy of the newest this many versions sent (a batch
        started ahead, up to rollout.max_staleness updates old, is finished after the next version
        was sent: max_staleness + 1), for with_kept_weights.
        during_generation: the rollout workers receive in their SYNC_GROUP, so that a sync lands
        while they generate (config.syncs_during_generation) instead of after.
        same_device: "handoff" (ranks on learner rank 0's device take the hand-off) or "broadcast".
        sleeps: the rollout engines sleep during the update (rollout.vllm.sleep_level): a sync wakes
        their weights first (a sleeping engine cannot load), then, once loaded, their KV cache.
        probe: the probe later syncs will check (weight_sync.probe_every); scored here by the learner
        and every engine, which must all still hold the starting weights, as its baseline."""
        self.learners, self.rollouts, self.timeout_s, self.adapter_only = learners, rollouts, timeout_s, adapter_only
        self.keep_versions = keep_versions
        self.during_generation = during_generation
        self.same_device = same_device
        self.sleeps = sleeps
        self.notes: list[str] = []  # lines on the routes chosen, e.g. a hand-off refused (form_group)
        self.backend, self.backend_reason = "gloo", ""
        self.specs, self.buckets = ray.get(learners[0].weight_plan.remote(int(bucket_mb * 2**20), adapter_only))
        self.form_group()
        self.syncs = 0
        self.version = 0  # the weights version the rollout workers hold
        self.target = 0  # the version the last sync was asked for: a re-send after a failure sends it
        self.last: SyncResult | None = None
        self._baselines: dict[int, ProbeBaseline] = {}  # per rollout worker (transport/probe.py)
        self.start_gaps: list[float] = []  # each engine's probe gap to the learner at the start: the kernels' alone
        if probe is not None:
            self._calibrate(probe)

    def form_group(self) -> None:
        """Learner rank 0 and every rollout rank take a seat in new groups (on fresh ports): at the
        start, and after a rollout worker was replaced, since a group's members are fixed. A rank on
        learner rank 0's device takes the hand-off (transport/handoff.py) unless it cannot map it;
        the others the broadcast, over NCCL when each has a GPU of its own, else gloo."""
        # Chosen from where the members are, not where the driver is: a replacement may land elsewhere.
        learner_device = ray.get(self.learners[0].device_identity.remote(), timeout=self.timeout_s)
        self._on_gpu = not learner_device.startswith(CPU_DEVICE)
        rollout_devices = ray.get([worker.device_identity.remote() for worker in self.rollouts], timeout=self.timeout_s)
        ranks = [(w, r) for w, devices in enumerate(rollout_devices) for r in range(len(devices))]
        local = {(w, r) for w, r in ranks if self.same_device == "handoff" and rollout_devices[w][r] == learner_device}
        self.notes, ring = [], None
        if local:
            ring, refused = self._open_ring(local)
            if refused and ring is not None and ring.kind == "cuda":
                # CUDA IPC refused (a container's ptrace rules, expandable segments): the ring in shared
                # host memory instead, still no socket (pinned on the learner's side).
                self.notes.append(
                    f"weight sync: CUDA IPC refused ({next(iter(refused.values()))}); the hand-off "
                    "goes through shared host memory"
                )
                ring, refused = self._open_ring(local, host=True)
            for (w, r), why in refused.items():
                local.discard((w, r))
                self.notes.append(
                    f"weight sync: {self._rank_name(w, r, rollout_devices)} shares learner rank 0's device "
                    f"but cannot take the hand-off ({why}); it takes the broadcast"
                )
        remote = [rank for rank in ranks if rank not in local]
        self.backend, self.backend_reason = choose_backend(
            [learner_device] + [rollout_devices[w][r] for w, r in remote]
        )
        self.handoff_ranks, self.broadcast_ranks = len(local), len(remote)
        self.handoff_kind = ring.kind if local else None
        broadcast_seat = self._seat(len(remote) + 1, self.backend) if remote else None
        handoff_seat = self._seat(len(local) + 1, "gloo", ring) if local else None
        seats: list[list] = [[None] * len(devices) for devices in rollout_devices]
        for number, (w, r) in enumerate(remote, start=1):
            seats[w][r] = replace(broadcast_seat, rank=number, ring=None)
        for number, (w, r) in enumerate(sorted(local), start=1):
            seats[w][r] = replace(handoff_seat, rank=number)
        self.world_size = len(ranks) + 1
        # All ranks must be constructing the groups at once: submit every call, then wait.
        ray.get(
            [self.learners[0].host_weight_sync.remote(broadcast_seat, handoff_seat)]
            + [
                worker.join_weight_sync.remote(worker_seats, self.specs, self.buckets)
                for worker, worker_seats in zip(self.rollouts, seats)
            ],
            timeout=self.timeout_s,
        )

    def _open_ring(self, local: set[tuple[int, int]], host: bool = False) -> tuple[Any, dict[tuple[int, int], str]]:
        """Learner rank 0's hand-off ring (with `host`, in shared host memory even on a GPU) and the
        `local` ranks (worker, rank) that cannot map it: (ring, {(worker, rank): why}); every one
        refused when the learner cannot make one."""
        slot_bytes = max(sum(spec_bytes(self.specs[i]) for i in bucket) for bucket in self.buckets)
        try:
            ring = ray.get(self.learners[0].open_handoff_ring.remote(slot_bytes, host), timeout=self.timeout_s)
        except ray.exceptions.RayTaskError as err:
            return None, {rank: error_line(err) for rank in local}
        workers = sorted({w for w, _ in local})
        answers = ray.get([self.rollouts[w].check_handoff.remote(ring) for w in workers], timeout=self.timeout_s)
        return ring, {
            (w, r): why
            for w, whys in zip(workers, answers)
            for r, why in enumerate(whys)
            if why is not None and (w, r) in local
        }

    def _seat(self, world_size: int, backend: str, ring: Any = None) -> Seat:
        """Rank 0's seat in a new group hosted by learner rank 0."""
        host, port = node_address_and_port(self.learners[0])
        return Seat(host, port, 0, world_size, backend, self.timeout_s, ring)

    def _rank_name(self, worker: int, rank: int, devices: list[list[str]]) -> str:
        return f"rollout-{worker}" + (f" (tp rank {rank})" if len(devices[worker]) > 1 else "")

    @property
    def route_line(self) -> str:
        """How the weights travel, for the run's log."""
        parts = []
        if self.handoff_ranks:
            where = (
                "through shared host memory"
                if self.handoff_kind == "shm" and self._on_gpu
                else "on learner rank 0's device"
            )
            parts.append(
                f"{self.handoff_ranks} rank{'s' if self.handoff_ranks > 1 else ''} by hand-off {where} "
                "(no bytes through a socket)"
            )
        if self.broadcast_ranks:
            parts.append(
                f"{self.broadcast_ranks} rank{'s' if self.broadcast_ranks > 1 else ''} over "
                f"{self.backend}: {self.backend_reason}"
            )
        return "; ".join(parts)

    def resend(self, probe: Probe | None, probe_tolerance: float) -> SyncResult:
        """A new group and the learners' weights again (for a replaced rollout worker), proven as every
        sync; labelled with the version of the last sync asked for, which a failed one did not reach."""
        self.form_group()
        return self.sync(self.target, probe, probe_tolerance)

    def sync(self, version: int, probe: Probe | None, probe_tolerance: float) -> SyncResult:
        self.target = version
        woken = self._wake(["weights"])
        sent, received = self._broadcast(version, in_flight=self.during_generation)
        woken += self._wake(["kv_cache"])  # before the probe: scoring it needs the cache
        self.syncs += 1
        self.version = version
        checked = self.check_probe(probe, probe_tolerance) if probe is not None else None
        seconds = max([sent.seconds] + [r.seconds for r in received])
        landed = len({r.who.split(" ")[0] for r in received if r.during_generation})
        self.last = SyncResult(
            version=version,
            seconds=seconds,
            num_bytes=sent.num_bytes,
            probe=checked,
            during_generation=landed,
            wake_seconds=woken,
        )
        return self.last

    def _wake(self, tags: list[str]) -> float:
        """Sleeping rollout engines take back the memory of `tags` (rollout.vllm.sleep_level); the
        seconds it took (0 when they never sleep)."""
        if not self.sleeps:
            return 0.0
        started = time.perf_counter()
        try:
            ray.get([worker.wake.remote(tags) for worker in self.rollouts], timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise WeightSyncError(
                f"waking the rollout engines' {' and '.join(tags)} made no progress for "
                f"{self.timeout_s:g} s (weight_sync.timeout_s)"
            ) from None
        except ray.exceptions.RayError as err:
            raise WeightSyncError(
                f"waking the rollout engines' {' and '.join(tags)} failed: {error_line(err)}"
            ) from None
        return time.perf_counter() - started

    def with_kept_weights(self, version: int, issue: Callable[[], T]) -> T:
        """`issue()` while every rollout worker holds the weights of `version`, which learner rank 0
        kept (keep_versions > 0): a pipelined batch's lost share is sampled by the weights that
        sampled the rest of it. Then the current weights again. An actor runs its calls in order, so
        the calls `issue` queued run on `version`, before the current weights arrive."""
        if version == self.version:
            return issue()
        self._broadcast(version, kept=True)
        current, self.version = self.version, version
        try:
            return issue()
        finally:
            self._broadcast(current)
            self.version = current

    def _broadcast(
        self, version: int, kept: bool = False, in_flight: bool = False
    ) -> tuple[SyncReport, list[SyncReport]]:
        """Learner rank 0 sends (the weights it holds, or with `kept` its copy of `version`), every
        rollout rank receives and reports; the digests must all agree. in_flight: the receive runs
        beside a generate call in flight (SYNC_GROUP) rather than after it."""
        if kept:
            sends = [self.learners[0].send_weights.remote(version, self.buckets, self.adapter_only, kept=True)]
        else:
            sends = [
                learner.send_weights.remote(version, self.buckets, self.adapter_only, keep=self.keep_versions)
                for learner in self.learners
            ]
        receives = [
            (
                worker.receive_weights.options(concurrency_group=SYNC_GROUP) if in_flight else worker.receive_weights
            ).remote(version)
            for worker in self.rollouts
        ]
        try:
            reports: list = ray.get(sends + receives, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            names = [f"learner-{i} (sending)" for i in range(len(sends))] + [
                f"rollout-{i} (receiving)" for i in range(len(receives))
            ]
            _, pending = ray.wait(sends + receives, num_returns=len(names), timeout=0)
            stuck = [name for name, ref in zip(names, sends + receives) if ref in pending]
            raise WeightSyncError(
                f"weight sync {version} made no progress for {self.timeout_s:g} s (weight_sync.timeout_s): "
                f"{', '.join(stuck)} did not finish"
            ) from None
        except ray.exceptions.RayError as err:
            cause = telling_error(sends + receives, err, self.timeout_s)
            raise WeightSyncError(f"weight sync {version} failed: {error_line(cause)}", cause) from None
        sent = reports[0]
        received: list[SyncReport] = [r for worker in reports[len(sends) :] for r in worker]
        for report in received:
            if report.checksum != sent.checksum or report.num_bytes != sent.num_bytes:
                raise WeightSyncError(
                    f"{report.who} received weights with checksum {report.checksum:#010x} "
                    f"({report.num_bytes} bytes), learner sent {sent.checksum:#010x} ({sent.num_bytes} bytes)"
                )
        return sent, received

    @property
    def num_bytes(self) -> int:
        """Bytes one sync sends."""
        return sum(spec_bytes(spec) for spec in self.specs if spec.alias_of is None)  # an alias travels as its tensor

    def raw_broadcast_gbps(self, num_bytes: int) -> float:
        """GB/s of the sync's yardstick for num_bytes: a plain broadcast from learner rank 0 to the
        rollout ranks that take the broadcast, in the sync's own group, and for the hand-off a plain
        copy on learner rank 0's device (the slower of the two): the most a sync could reach."""
        calls = [self.learners[0].raw_broadcast.remote(num_bytes)] + [
            w.raw_broadcast.remote(num_bytes) for w in self.rollouts
        ]
        seconds = [s for s in ray.get(calls, timeout=self.timeout_s) if s is not None]
        return num_bytes / max(seconds) / 1e9

    def _score_probe(self, probe: Probe) -> tuple[np.ndarray, list[np.ndarray]]:
        """The learner's probe log-probs and every rollout engine's."""
        args = (probe.input_ids, probe.attention_mask, 1.0)
        learner_refs = [learner.score.remote(*args) for learner in self.learners]
        worker_refs = [worker.score.remote(*args) for worker in self.rollouts]
        return ray.get(learner_refs, timeout=self.timeout_s)[0], ray.get(worker_refs, timeout=self.timeout_s)

    def _calibrate(self, probe: Probe) -> None:
        """Each engine's baseline: the starting weights, which it and the learner hold now, and the
        kernels' gap between them there."""
        expected, engines = self._score_probe(probe)
        self._baselines = {
            index: start_baseline(got, expected, probe.completion_mask, self.version)
            for index, got in enumerate(engines)
        }
        self.start_gaps = [baseline.kernel_gap for baseline in self._baselines.values()]

    def check_probe(self, probe: Probe, tolerance: float) -> ProbeSummary:
        """Every worker's probe verdict (transport/probe.py); a worker whose engine did not load the
        sent weights fails the sync, named. The probe must have been given at construction."""
        if not self._baselines:
            raise RuntimeError("WeightBroadcaster.check_probe: construct it with the probe, before any update")
        expected, engines = self._score_probe(probe)
        readings = []
        for index, got in enumerate(engines):
            baseline = self._baselines[index]
            reading = read_probe(got, expected, baseline, probe.completion_mask, tolerance)
            if reading.verdict == "not loaded":
                raise WeightSyncError(reading.explain(f"rollout-{index}", baseline.version))
            readings.append((index, baseline, reading))
            self._baselines[index] = reading.next_baseline(baseline, self.version, expected)
        undecided = [(index, baseline, r) for index, baseline, r in readings if r.verdict == "undecided"]
        notice = undecided[0][2].explain(f"rollout-{undecided[0][0]}", undecided[0][1].version) if undecided else None
        return ProbeSummary(
            max_abs_diff=max(r.max_gap for _, _, r in readings),
            undecided=len(undecided),
            moved=min(r.moved for _, _, r in readings),
            kernel_gap=max(r.noise for _, _, r in readings),
            notice=notice,
        )
