"""Bucket planning and the standalone broadcast group (two real processes, gloo)."""

import multiprocessing as mp

import torch

from grpo_ray.cluster.weight_sync import (
    BroadcastGroup,
    ReceiveTally,
    choose_backend,
    device_identity,
    free_port,
    plan_buckets,
    receive_buckets,
    send_buckets,
)
from grpo_ray.types import WeightSpec


def spec(name, numel, dtype="float32"):
    return WeightSpec(name, (numel,), dtype)


def test_buckets_respect_size_and_dtype_and_keep_order():
    specs = [spec("a", 10), spec("b", 10), spec("c", 30), spec("d", 5, "bfloat16"), spec("e", 100)]
    # 80-byte buckets: a+b (80 B) fill one; c (120 B) is alone (too big); d changes dtype; e alone.
    assert plan_buckets(specs, 80) == [[0, 1], [2], [3], [4]]
    assert plan_buckets(specs, 10**6) == [[0, 1, 2], [3], [4]]


def _receiver(port, specs, buckets, queue):
    group = BroadcastGroup.join("127.0.0.1", port, 1, 2, "gloo", 60)
    tally = ReceiveTally()
    received = {name: tensor.clone() for name, tensor in receive_buckets(group, specs, buckets, tally)}
    queue.put((received, tally.checksum, tally.num_bytes))


def test_send_and_receive_round_trip_with_matching_checksums():
    torch.manual_seed(0)
    tensors = [torch.randn(3, 4), torch.randn(7), torch.randn(2, 2, 2)]
    specs = [WeightSpec(f"w{i}", tuple(t.shape), "float32") for i, t in enumerate(tensors)]
    buckets = plan_buckets(specs, 64)  # 48 B, 28 B, 32 B -> [[0], [1, 2]]
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_receiver, args=(port, specs, buckets, queue))
    child.start()
    group = BroadcastGroup.join("127.0.0.1", port, 0, 2, "gloo", 60)
    checksum, sent = send_buckets(group, tensors, specs, buckets)
    received, their_checksum, their_bytes = queue.get(timeout=60)
    child.join(timeout=30)
    assert buckets == [[0], [1, 2]]
    assert (their_checksum, their_bytes) == (checksum, sent) and sent == 4 * (12 + 7 + 8)
    for i, tensor in enumerate(tensors):
        torch.testing.assert_close(received[f"w{i}"], tensor, rtol=0, atol=0)


def test_many_buckets_in_flight_arrive_in_order_with_matching_checksums():
    # Up to two buckets travel at once on each side: ordering and checksums must survive that.
    torch.manual_seed(1)
    tensors = [torch.randn(n) for n in (5, 17, 3, 64, 9, 33, 1, 48, 12, 20)] + [torch.randn(6).to(torch.bfloat16)]
    specs = [WeightSpec(f"w{i}", tuple(t.shape), str(t.dtype).removeprefix("torch.")) for i, t in enumerate(tensors)]
    buckets = plan_buckets(specs, 100)
    assert len(buckets) >= 8
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_receiver, args=(port, specs, buckets, queue))
    child.start()
    group = BroadcastGroup.join("127.0.0.1", port, 0, 2, "gloo", 60)
    checksum, sent = send_buckets(group, tensors, specs, buckets)
    received, their_checksum, their_bytes = queue.get(timeout=60)
    child.join(timeout=30)
    assert (their_checksum, their_bytes) == (checksum, sent)
    for i, tensor in enumerate(tensors):
        torch.testing.assert_close(received[f"w{i}"], tensor, rtol=0, atol=0)


def test_backend_is_nccl_only_with_a_gpu_of_its_own_for_every_rank():
    assert choose_backend(["GPU-a", "GPU-b", "GPU-c"]) == ("nccl", "3 processes on 3 GPUs")
    backend, why = choose_backend(["GPU-a", "GPU-b", "GPU-a"])
    assert backend == "gloo" and "share GPU GPU-a" in why
    assert choose_backend(["GPU-a", None]) == ("gloo", "a process of the group has no GPU")
    assert choose_backend([None, None])[0] == "gloo"


def test_device_identity_is_none_without_a_gpu():
    if torch.cuda.is_available():
        assert device_identity() == device_identity() and device_identity()
    else:
        assert device_identity() is None
