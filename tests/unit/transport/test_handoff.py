"""The same-device hand-off (shared memory on a CPU) and the sender that feeds it and the broadcast
at once: real processes, real /dev/shm files, real gloo signal groups."""

import multiprocessing as mp
from dataclasses import replace
import os
import time

import pytest
import torch

from grpo_ray.transport.broadcast import ReceiveTally, device_identity, free_port, plan_buckets
from grpo_ray.transport.handoff import HandoffRefused, HandoffRing, check_ring, open_ring
from grpo_ray.transport.routes import Seat, SendRoutes, join_seat, receive_buckets, receive_into, send_routed
from grpo_ray.types import WeightSpec

HERE = torch.device("cpu")


def _weights(seed=0):
    """Nine tensors of two dtypes in more buckets than the ring's two slots."""
    torch.manual_seed(seed)
    tensors = [torch.randn(n) for n in (40, 17, 3, 64, 9, 33, 1, 48)] + [torch.randn(6).to(torch.bfloat16)]
    specs = [WeightSpec(f"w{i}", tuple(t.shape), str(t.dtype).removeprefix("torch.")) for i, t in enumerate(tensors)]
    return tensors, specs, plan_buckets(specs, 256)


def _slot_bytes(specs, buckets):
    return max(sum(specs[i].numel * getattr(torch, specs[i].dtype).itemsize for i in bucket) for bucket in buckets)


def _receive(seat, specs, buckets, queue, fetched, slow):
    source = join_seat(seat, device_identity())
    tally, received = ReceiveTally(), {}
    for name, tensor in receive_buckets(source, specs, buckets, tally):
        if slow:
            time.sleep(0.05)  # a slow reader: the sender must not refill its slot before it is read
        received[name] = tensor.cpu().clone()
    queue.put((received, tally.checksum, tally.num_bytes))
    fetched.wait(60)


def _receive_into(seat, specs, buckets, queue, fetched, slow):
    source = join_seat(seat, device_identity())
    # The receiver's weights on its GPU where it has one (whatever memory the ring is in), as an engine's.
    device = "cuda" if torch.cuda.is_available() else source.device
    storage = [
        torch.zeros(sum(specs[i].numel for i in b), dtype=getattr(torch, specs[b[0]].dtype), device=device)
        for b in buckets
    ]
    tally = ReceiveTally()
    receive_into(source, storage, tally)
    queue.put(({f"bucket{i}": flat.cpu() for i, flat in enumerate(storage)}, tally.checksum, tally.num_bytes))
    fetched.wait(60)


def _run(
    tensors,
    specs,
    buckets,
    handoff_receivers,
    broadcast_receivers,
    slow=False,
    target=_receive,
    device=HERE,
    host_ring=False,
):
    """Send from here (weights and ring on `device`) to spawned receivers; returns (checksum, bytes
    sent, each receiver's report, received tensors on the CPU)."""
    ctx = mp.get_context("spawn")
    queue, fetched = ctx.Queue(), ctx.Event()
    tensors = [t.to(device) for t in tensors]
    ring = (
        HandoffRing.create(_slot_bytes(specs, buckets), device, device_identity(), host_ring)
        if handoff_receivers
        else None
    )
    handoff_seat = Seat("127.0.0.1", free_port(), 0, handoff_receivers + 1, "gloo", 60, ring.handle) if ring else None
    broadcast_seat = (
        Seat("127.0.0.1", free_port(), 0, broadcast_receivers + 1, "gloo", 60) if broadcast_receivers else None
    )
    seats = [Seat(**{**handoff_seat.__dict__, "rank": r}) for r in range(1, handoff_receivers + 1)]
    seats += [Seat(**{**broadcast_seat.__dict__, "rank": r}) for r in range(1, broadcast_receivers + 1)]
    children = [ctx.Process(target=target, args=(seat, specs, buckets, queue, fetched, slow)) for seat in seats]
    for child in children:
        child.start()
    try:
        routes = SendRoutes.host(broadcast_seat, handoff_seat, ring)
        if ring is not None:  # every receiver has mapped the ring: its files are gone from /dev/shm
            assert not any(os.path.exists(path) for path in ring.handle.handles)
        checksum, sent = send_routed(routes, tensors, specs, buckets)
        reports = [queue.get(timeout=60) for _ in children]
    finally:
        fetched.set()
        for child in children:
            child.join(timeout=30)
    return checksum, sent, reports


@pytest.mark.parametrize("slow", [False, True])
def test_handoff_delivers_every_bucket_through_the_two_slots_with_the_senders_digest(slow):
    tensors, specs, buckets = _weights()
    assert len(buckets) >= 4  # every slot is refilled at least once
    checksum, sent, [(received, their_checksum, their_bytes)] = _run(tensors, specs, buckets, 1, 0, slow=slow)
    assert (their_checksum, their_bytes) == (checksum, sent)
    assert sent == sum(t.numel() * t.element_size() for t in tensors)
    for i, tensor in enumerate(tensors):
        torch.testing.assert_close(received[f"w{i}"], tensor, rtol=0, atol=0)


def test_a_layout_mixes_handoff_and_broadcast_receivers_from_one_packing():
    tensors, specs, buckets = _weights(seed=1)
    checksum, sent, reports = _run(tensors, specs, buckets, 2, 1, slow=True)
    assert len(reports) == 3
    for received, their_checksum, their_bytes in reports:
        assert (their_checksum, their_bytes) == (checksum, sent)
        for i, tensor in enumerate(tensors):
            torch.testing.assert_close(received[f"w{i}"], tensor, rtol=0, atol=0)


def test_handoff_copies_each_bucket_into_the_receivers_own_storage():
    tensors, specs, buckets = _weights(seed=2)
    checksum, _, [(storage, their_checksum, _)] = _run(tensors, specs, buckets, 1, 0, target=_receive_into)
    assert their_checksum == checksum
    for index, bucket in enumerate(buckets):
        expected = torch.cat([tensors[i].reshape(-1) for i in bucket])
        torch.testing.assert_close(storage[f"bucket{index}"], expected, rtol=0, atol=0)


def test_a_receiver_that_cannot_map_the_ring_says_why():
    ring = HandoffRing.create(1 << 16, HERE, device_identity())
    try:
        assert check_ring(ring.handle, device_identity()) is None
        # A shared-memory ring serves the processes of its host (a GPU one too, when CUDA IPC is refused).
        assert check_ring(ring.handle, "GPU-on-this-host") is None
        elsewhere = replace(ring.handle, device="cpu:another-host")
        assert (
            check_ring(elsewhere, device_identity())
            == f"this process is on {device_identity()}, the ring on cpu:another-host"
        )
        # Memory that maps but is not the sender's (its check pattern differs) is refused too.
        ring.slots[1][:8] += 1
        assert "check pattern differs" in check_ring(ring.handle, device_identity())
        ring.unlink()
        why = check_ring(ring.handle, device_identity())
        assert why.startswith("cannot map the ring") and "\n" not in why
        with pytest.raises(HandoffRefused):
            open_ring(ring.handle, device_identity())
    finally:
        ring.close()
    assert not any(os.path.exists(path) for path in ring.handle.handles)


def test_a_seat_travels_as_plain_fields():
    ring = HandoffRing.create(4096, HERE, device_identity())
    try:
        seat = Seat("127.0.0.1", 1234, 2, 3, "gloo", 60.0, ring.handle)
        assert Seat.from_dict(seat.as_dict()) == seat
        assert Seat.from_dict(Seat("h", 1, 1, 2, "nccl", 5.0).as_dict()).ring is None
    finally:
        ring.close()
