"""Which way each receiver's weights go, and the one sender that feeds both ways.

A receiving rank on learner rank 0's device takes the hand-off (transport/handoff.py: handles, the
bytes stay on the device); any other takes the broadcast (transport/broadcast.py: NCCL or gloo).
A layout can mix them: learner rank 0 packs each bucket once, into a hand-off slot, and broadcasts
that same slot to the other ranks. The driver (cluster/weight_broadcast.py) chooses the seats;
the learner and rollout actors call these functions. Nothing here imports Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import torch

from grpo_ray.transport import broadcast
from grpo_ray.transport.broadcast import (
    BroadcastGroup,
    ReceiveTally,
    bucket_checksum,
    bucket_layout,
    bucket_tensors,
    send_buckets,
)
from grpo_ray.transport.handoff import HandoffReceiver, HandoffRing, HandoffSender, RingHandle, open_ring
from grpo_ray.types import WeightSpec


@dataclass(frozen=True)
class Seat:
    """One rank's place in a weight sync: a group to join, and with `ring` the hand-off, whose
    group only signals (the bytes come through the ring)."""

    host: str
    port: int
    rank: int
    world_size: int
    backend: str  # "gloo" | "nccl"
    timeout_s: float
    ring: RingHandle | None = None

    def as_dict(self) -> dict:
        """Plain fields, for a vLLM worker's init info (from_dict makes it a Seat again)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> "Seat":
        ring = fields.get("ring")
        return cls(**{**fields, "ring": RingHandle.from_dict(ring) if ring else None})


BucketSource = BroadcastGroup | HandoffReceiver


def join_seat(seat: Seat, identity: str) -> BucketSource:
    """A receiving rank's end of the sync. A hand-off seat maps the ring before joining the signal
    group, so once the group stands the sender may unlink the ring's files."""
    if seat.ring is None:
        return BroadcastGroup.join(seat.host, seat.port, seat.rank, seat.world_size, seat.backend, seat.timeout_s)
    slots = open_ring(seat.ring, identity)
    return HandoffReceiver(
        slots, BroadcastGroup.join(seat.host, seat.port, seat.rank, seat.world_size, "gloo", seat.timeout_s)
    )


@dataclass
class SendRoutes:
    """Learner rank 0's ends of the sync: the broadcast group (ranks elsewhere) and the hand-off
    (ranks on its device); either may be absent."""

    broadcast: BroadcastGroup | None = None
    handoff: HandoffSender | None = None

    @classmethod
    def host(cls, broadcast_seat: Seat | None, handoff_seat: Seat | None, ring: HandoffRing | None) -> "SendRoutes":
        routes = cls()
        if broadcast_seat is not None:
            routes.broadcast = join_seat(broadcast_seat, "")
        if handoff_seat is not None:
            assert ring is not None, "a hand-off seat needs the ring its receivers opened"
            signals = BroadcastGroup.join(
                handoff_seat.host, handoff_seat.port, 0, handoff_seat.world_size, "gloo", handoff_seat.timeout_s
            )
            ring.unlink()  # every receiver has mapped it (join_seat): nothing to leave behind if we are killed
            routes.handoff = HandoffSender(ring, signals)
        return routes

    def raw_seconds(self, num_bytes: int) -> float:
        """The sync's yardstick: seconds of a plain broadcast of num_bytes to the broadcast ranks
        (each of them times its side too), or of a plain copy on the device for the hand-off; the
        slower where a layout has both."""
        seconds = []
        if self.broadcast is not None:
            seconds.append(broadcast.timed_raw_broadcast(self.broadcast, num_bytes))
        if self.handoff is not None:
            seconds.append(timed_copy(num_bytes, self.handoff.ring.slots[0].device))
        return max(seconds)


def timed_copy(num_bytes: int, device: torch.device, repeats: int = 3) -> float:
    """Seconds of one plain copy of num_bytes within `device` (the best of `repeats`): the most a
    hand-off of those bytes could reach (it packs and copies each bucket once, the two overlapped)."""
    source = torch.zeros(num_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return broadcast.best_seconds(lambda: target.copy_(source), device, repeats)


def timed_receive(source: BucketSource, num_bytes: int) -> float | None:
    """A receiving rank's side of the yardstick (SendRoutes.raw_seconds): its part in the plain
    broadcast, or None for a hand-off rank (the sender times that copy alone)."""
    return broadcast.timed_raw_broadcast(source, num_bytes) if isinstance(source, BroadcastGroup) else None


def send_routed(
    routes: SendRoutes, tensors: Iterable[torch.Tensor], specs: list[WeightSpec], buckets: list[list[int]]
) -> tuple[int, int]:
    """Send tensors (bucket by bucket, in each bucket's order) every way; (checksum, bytes sent).

    Without hand-off receivers, the broadcast's own sender (broadcast.send_buckets). With them,
    each bucket is packed once into its hand-off slot, posted, and broadcast from the slot to the
    other ranks; the slot is refilled two buckets later, once every local receiver has read it and
    its broadcast has gone."""
    if routes.handoff is None:
        assert routes.broadcast is not None, "no receivers"
        return send_buckets(routes.broadcast, tensors, specs, buckets)
    iterator = iter(tensors)
    checksum, sent, works = 0, 0, []
    for index, bucket in enumerate(buckets):
        dtype, numel = bucket_layout(specs, bucket)
        parts = [next(iterator).detach() for _ in bucket]
        flat = routes.handoff.place(index, dtype, numel)
        if index >= 2 and works[index - 2] is not None:
            works[index - 2].wait()
        offset = 0
        for part in parts:  # copy_ casts and crosses devices (kept weights are host copies)
            flat[offset : offset + part.numel()].copy_(part.reshape(-1))
            offset += part.numel()
        routes.handoff.post(index, flat)
        works.append(_broadcast_from(routes.broadcast, flat, index))
        checksum = bucket_checksum(flat, checksum)
        sent += flat.numel() * flat.element_size()
    routes.handoff.finish(len(buckets))
    for work in works:
        if work is not None:
            work.wait()
    return checksum, sent


def _broadcast_from(group: BroadcastGroup | None, flat: torch.Tensor, index: int):
    if group is None:
        return None
    if flat.device != group.device:  # a GPU slot through a gloo group: a host copy of its own
        host = group.scratch(flat.dtype, flat.numel(), index % 2)
        host.copy_(flat)
        flat = host
    return group.broadcast_async(flat)


def arriving(
    source: BucketSource, specs: list[WeightSpec], buckets: list[list[int]], fresh: bool = False
) -> Iterator[tuple[int, torch.Tensor]]:
    """(index, flat) of each bucket as it arrives, either way (broadcast.arriving_buckets' contract)."""
    if isinstance(source, HandoffReceiver):
        return source.arriving(specs, buckets, fresh)
    return broadcast.arriving_buckets(source, specs, buckets, fresh)


def receive_buckets(
    source: BucketSource, specs: list[WeightSpec], buckets: list[list[int]], tally: ReceiveTally
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) as buckets arrive, for an engine that loads weights itself; the consumer
    copies each (broadcast.receive_buckets' contract)."""
    for index, flat in arriving(source, specs, buckets):
        tally.add(flat)
        yield from bucket_tensors(flat, specs, buckets[index])


def receive_into(source: BucketSource, storage: list[torch.Tensor], tally: ReceiveTally) -> None:
    """Every bucket into its tensor of `storage` (broadcast.bucket_storage): received there, or
    copied there from its hand-off slot."""
    if isinstance(source, BroadcastGroup):
        broadcast.receive_into(source, storage, tally)
        return
    for index, flat in source.arriving_shapes([(t.dtype, t.numel()) for t in storage]):
        storage[index].copy_(flat)
        tally.add(storage[index])
