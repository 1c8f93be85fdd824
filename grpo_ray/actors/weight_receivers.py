"""Who takes a rollout worker's seats in the weight sync: chosen once, when the worker starts.

    InProcess     this process takes one seat (transport/routes.py: the broadcast group or the
                  hand-off) and loads what arrives into the engine, in place where it can (hf;
                  vLLM with LoRA, whose adapter matrices come here)
    EngineShards  a vLLM engine's own worker processes take a seat each, one per tensor-parallel
                  shard, and load what arrives themselves (vllm_engine.py: joins_weight_sync)

Both answer the same calls; the worker wraps each in its dead-engine check.
"""

from __future__ import annotations

import time

from grpo_ray.transport.broadcast import ReceiveTally, device_identity
from grpo_ray.transport.handoff import HandoffReceiver, RingHandle, check_ring
from grpo_ray.transport.routes import BucketSource, Seat, join_seat, receive_buckets, receive_into, timed_receive
from grpo_ray.types import SyncReport, WeightSpec


def choose_receiver(engine, name: str) -> InProcess | EngineShards:
    """The engine's shards where they join the sync themselves, else this process."""
    return EngineShards(engine, name) if getattr(engine, "joins_weight_sync", False) else InProcess(engine, name)


class EngineShards:
    def __init__(self, engine, name: str):
        self.engine, self.name = engine, name

    def device_identities(self) -> list[str]:
        return self.engine.device_identities()

    def check_handoff(self, ring: RingHandle) -> list[str | None]:
        return self.engine.check_handoff(ring)

    def join(self, seats: list[Seat], specs: list[WeightSpec], buckets: list[list[int]]) -> None:
        self.engine.join_weight_sync(seats, specs, buckets)

    def raw_broadcast(self, num_bytes: int) -> float | None:
        return self.engine.raw_broadcast(num_bytes)

    def receive(self, version: int, drop: dict[int, int] | None, keep_old: list[int]) -> list[SyncReport]:
        """Each shard's report of what it loaded. drop / keep_old: the fault drills (RolloutWorker)."""
        return [
            SyncReport(
                who=f"{self.name} (tp rank {s['shard']})",
                version=version,
                checksum=s["checksum"],
                num_bytes=s["num_bytes"],
                seconds=s["seconds"],
                during_generation=s["during_generation"],
            )
            for s in self.engine.receive_weights(version, drop, keep_old)
        ]


class InProcess:
    def __init__(self, engine, name: str):
        self.engine, self.name = engine, name
        self._group: BucketSource | None = None
        self._specs: list[WeightSpec] = []
        self._buckets: list[list[int]] = []
        self._in_place: list | None = None  # the engine's weights as one tensor per bucket (hf engine)

    def device_identities(self) -> list[str]:
        return [device_identity()]

    def check_handoff(self, ring: RingHandle) -> list[str | None]:
        return [check_ring(ring, device_identity())]

    def join(self, seats: list[Seat], specs: list[WeightSpec], buckets: list[list[int]]) -> None:
        self._specs, self._buckets = specs, buckets
        self._group = join_seat(seats[0], device_identity())
        # Where the engine can, its weights become the buckets' storage, no load copy: a broadcast lands
        # in them (on the group's device only), a hand-off is copied into them from wherever its ring is.
        handed = isinstance(self._group, HandoffReceiver)
        self._in_place = self.engine.bucket_storage(
            specs, buckets, getattr(self.engine, "device", None) if handed else self._group.device
        )

    def raw_broadcast(self, num_bytes: int) -> float | None:
        return timed_receive(self._group, num_bytes)

    def receive(self, version: int, drop: dict[int, int] | None, keep_old: list[int]) -> list[SyncReport]:
        """Every bucket received and loaded. keep_old (the probe's drill): received and counted, not
        loaded; drop is a vLLM shard's drill and means nothing here."""
        assert self._group is not None, "join_weight_sync first"
        started, tally = time.perf_counter(), ReceiveTally()
        try:
            if keep_old and self._in_place is not None:  # the drill: received and counted, then put back
                kept = [tensor.clone() for tensor in self._in_place]
                receive_into(self._group, self._in_place, tally)
                for tensor, old in zip(self._in_place, kept):
                    tensor.copy_(old)
            elif keep_old:
                for _ in receive_buckets(self._group, self._specs, self._buckets, tally):
                    pass
            elif self._in_place is not None:
                receive_into(self._group, self._in_place, tally)
            else:
                self.engine.load_weights(receive_buckets(self._group, self._specs, self._buckets, tally))
        except Exception:
            self._group = None  # broken (the sender or a peer died): the driver forms a new one
            raise
        seconds = time.perf_counter() - started
        return [
            SyncReport(
                who=self.name, version=version, checksum=tally.checksum, num_bytes=tally.num_bytes, seconds=seconds
            )
        ]
