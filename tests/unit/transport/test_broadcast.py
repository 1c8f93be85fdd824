"""Bucket planning and the standalone broadcast group (two real processes, gloo)."""

import multiprocessing as mp

import torch

from grpo_ray.transport.broadcast import (
    BroadcastGroup,
    ReceiveTally,
    adjacent_view,
    bucket_checksum,
    bucket_storage,
    choose_backend,
    device_identity,
    free_port,
    plan_buckets,
    receive_buckets,
    receive_into,
    send_buckets,
    tied_aliases,
)
from grpo_ray.types import WeightSpec


def spec(name, numel, dtype="float32"):
    return WeightSpec(name, (numel,), dtype)


def test_buckets_respect_size_and_dtype_and_keep_order():
    specs = [spec("a", 10), spec("b", 10), spec("c", 30), spec("d", 5, "bfloat16"), spec("e", 100)]
    # 80-byte buckets: a+b (80 B) fill one; c (120 B) is alone (too big); d changes dtype; e alone.
    assert plan_buckets(specs, 80) == [[0, 1], [2], [3], [4]]
    assert plan_buckets(specs, 10**6) == [[0, 1, 2], [3], [4]]


def test_a_tied_alias_travels_in_no_bucket():
    embed, norm = torch.zeros(4), torch.zeros(2)
    assert tied_aliases([embed, norm, embed]) == [2]  # lm_head is the embedding itself
    specs = [spec("embed", 10), spec("norm", 10), WeightSpec("head", (10,), "float32", "embed"), spec("out", 10)]
    # Without the alias, embed, norm and out fill one bucket that a sender can send as it lies.
    assert plan_buckets(specs, 10**6) == [[0, 1, 3]]
    assert plan_buckets(specs, 80) == [[0, 1], [3]]


def _receiver(port, specs, buckets, queue):
    group = BroadcastGroup.join("127.0.0.1", port, 1, 2, "gloo", 60)
    tally = ReceiveTally()
    received = {name: tensor.clone() for name, tensor in receive_buckets(group, specs, buckets, tally)}
    queue.put((received, tally.checksum, tally.num_bytes))


def _child(receiver, port, specs, buckets, queue, fetched):
    receiver(port, specs, buckets, queue)
    # Tensors on a queue travel as file descriptors this process hands out: it must stay alive
    # until the parent has taken them (exiting first fails the parent's get with FileNotFoundError).
    fetched.wait(60)


def _send_to_child(receiver, specs, buckets, tensors):
    """Send `tensors` from here (rank 0) to a spawned child running `receiver` (rank 1); returns
    (checksum, bytes sent, what the child put on its queue)."""
    port = free_port()
    ctx = mp.get_context("spawn")
    queue, fetched = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_child, args=(receiver, port, specs, buckets, queue, fetched))
    child.start()
    group = BroadcastGroup.join("127.0.0.1", port, 0, 2, "gloo", 60)
    checksum, sent = send_buckets(group, tensors, specs, buckets)
    received = queue.get(timeout=60)
    fetched.set()
    child.join(timeout=30)
    return checksum, sent, received


def test_send_and_receive_round_trip_with_matching_checksums():
    torch.manual_seed(0)
    tensors = [torch.randn(3, 4), torch.randn(7), torch.randn(2, 2, 2)]
    specs = [WeightSpec(f"w{i}", tuple(t.shape), "float32") for i, t in enumerate(tensors)]
    buckets = plan_buckets(specs, 64)  # 48 B, 28 B, 32 B -> [[0], [1, 2]]
    checksum, sent, (received, their_checksum, their_bytes) = _send_to_child(_receiver, specs, buckets, tensors)
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
    checksum, sent, (received, their_checksum, their_bytes) = _send_to_child(_receiver, specs, buckets, tensors)
    assert (their_checksum, their_bytes) == (checksum, sent)
    for i, tensor in enumerate(tensors):
        torch.testing.assert_close(received[f"w{i}"], tensor, rtol=0, atol=0)


def test_backend_is_nccl_only_with_a_gpu_of_its_own_for_every_rank():
    assert choose_backend(["GPU-a", "GPU-b", "GPU-c"]) == ("nccl", "3 processes on 3 GPUs")
    backend, why = choose_backend(["GPU-a", "GPU-b", "GPU-a"])
    assert backend == "gloo" and "share GPU GPU-a" in why
    assert choose_backend(["GPU-a", "cpu:node-1"]) == ("gloo", "a process of the group has no GPU")
    assert choose_backend(["cpu:node-1", "cpu:node-1"])[0] == "gloo"


def test_device_identity_names_the_gpu_or_this_host():
    import socket

    assert device_identity() == device_identity()
    if not torch.cuda.is_available():
        assert device_identity() == f"cpu:{socket.gethostname()}"


def test_digest_is_the_wrapping_sum_of_words_chained_in_bucket_order():
    # Two 8-byte words 1 and 2 sum to 3; three tail bytes 1, 2, 3 add 1*1 + 2*2 + 3*3 = 14.
    flat = torch.cat(
        [torch.tensor([1, 2], dtype=torch.int64).view(torch.uint8), torch.tensor([1, 2, 3], dtype=torch.uint8)]
    )
    assert bucket_checksum(flat) == 3 + 14
    # Chained: previous * 0x100000001B3 XOR this bucket's sum, modulo 2**64, so order counts.
    a, b = torch.tensor([5], dtype=torch.int64), torch.tensor([7], dtype=torch.int64)
    assert bucket_checksum(b, bucket_checksum(a)) == (5 * 0x100000001B3) ^ 7
    assert bucket_checksum(b, bucket_checksum(a)) != bucket_checksum(a, bucket_checksum(b))
    # Words wrap: -1 + 1 is 0 in 64 bits, as on the other side of the broadcast.
    assert bucket_checksum(torch.tensor([-1, 1], dtype=torch.int64)) == 0


def test_digest_of_a_large_bucket_sees_a_changed_weight_a_stale_bucket_and_a_partial_receive():
    torch.manual_seed(2)
    sent = torch.randn(2**20)  # 4 MB: sampled pages
    digest = bucket_checksum(sent)
    updated = sent - 1e-3 * torch.randn_like(sent)  # what one optimizer step does to every page
    assert bucket_checksum(updated) != digest
    partial = sent.clone()
    partial[-1000:] = 0  # the end of the bucket never arrived
    assert bucket_checksum(partial) != digest
    sampled_page = sent.clone()
    sampled_page[16 * 1024 + 3] += 1.0  # a word of the 17th 4 KB page (every 16th page is read)
    assert bucket_checksum(sampled_page) != digest
    # Not a byte-level check: the word sum of pages it skips is not read (TCP and NCCL check the link).
    skipped_page = sent.clone()
    skipped_page[1024 + 3] += 1.0
    assert bucket_checksum(skipped_page) == digest


def test_bucket_storage_moves_parameters_into_one_tensor_per_bucket_keeping_values():
    torch.manual_seed(3)
    embed = torch.nn.Parameter(torch.randn(4, 2))
    params = {"embed": embed, "norm": torch.nn.Parameter(torch.randn(3)), "head": embed}  # head tied to embed
    specs = [
        WeightSpec("embed", (4, 2), "float32"),
        WeightSpec("norm", (3,), "float32"),
        WeightSpec("head", (4, 2), "float32"),
    ]
    before = {name: p.detach().clone() for name, p in params.items()}
    storage = bucket_storage(params, specs, [[0, 1], [2]])
    assert [t.numel() for t in storage] == [11, 8]
    for name in params:
        torch.testing.assert_close(params[name].data, before[name], rtol=0, atol=0)
    # embed and norm now live in bucket 0, back to back: a sender sends them with no copy.
    view = adjacent_view([params["embed"].data, params["norm"].data], torch.float32, torch.device("cpu"))
    assert view is not None and view.data_ptr() == storage[0].data_ptr() and view.numel() == 11
    storage[0][0] = 42.0  # a bucket received there is the weight itself
    assert params["embed"][0, 0].item() == 42.0 and params["head"][0, 0].item() == 42.0
    # The tied head lives at embed's place; its own place in bucket 1 is not the parameter.
    assert adjacent_view([params["head"].data], torch.float32, torch.device("cpu")).data_ptr() != storage[1].data_ptr()


def test_adjacent_view_refuses_tensors_that_are_not_back_to_back():
    a, b = torch.zeros(4), torch.zeros(4)
    assert adjacent_view([a, b], torch.float32, torch.device("cpu")) is None  # two storages
    whole = torch.zeros(10)
    assert adjacent_view([whole[:4], whole[5:]], torch.float32, torch.device("cpu")) is None  # a gap
    assert adjacent_view([whole[:4], whole[4:]], torch.bfloat16, torch.device("cpu")) is None  # other dtype
    assert adjacent_view([whole[:4], whole[4:]], torch.float32, torch.device("cpu")).numel() == 10


def _in_place_receiver(port, specs, buckets, queue):
    group = BroadcastGroup.join("127.0.0.1", port, 1, 2, "gloo", 60)
    model = {spec.name: torch.nn.Parameter(torch.zeros(spec.shape), requires_grad=False) for spec in specs}
    for alias in (spec for spec in specs if spec.alias_of):  # tied, as a Hugging Face model ties them
        model[alias.name] = model[alias.alias_of]
    storage = bucket_storage(model, specs, buckets)
    tally = ReceiveTally()
    receive_into(group, storage, tally)
    queue.put(({name: p.detach().clone() for name, p in model.items()}, tally.checksum, tally.num_bytes))


def test_buckets_received_in_place_are_the_weights_sent_as_they_lie_or_packed():
    # The sender's first bucket lies back to back (sent with no copy); the others are packed.
    torch.manual_seed(4)
    specs = [WeightSpec(f"w{i}", (n,), "float32") for i, n in enumerate((300, 200, 50_000, 7, 9))]
    buckets = plan_buckets(specs, 2000)  # [[0, 1], [2], [3, 4]]
    sender = {spec.name: torch.nn.Parameter(torch.randn(spec.shape), requires_grad=False) for spec in specs}
    laid_out = bucket_storage(sender, specs, buckets)
    sender["w3"].data = torch.randn(7)  # no longer in its bucket: that bucket must be packed
    tensors = [sender[spec.name].data for spec in specs]
    checksum, sent, (received, their_checksum, their_bytes) = _send_to_child(
        _in_place_receiver, specs, buckets, tensors
    )
    assert buckets == [[0, 1], [2], [3, 4]] and laid_out[0].numel() == 500
    assert (their_checksum, their_bytes) == (checksum, sent) and sent == 4 * 50_516
    for name, param in sender.items():
        torch.testing.assert_close(received[name], param.data, rtol=0, atol=0)


def test_a_tied_alias_travels_once_and_is_received_under_its_own_name():
    # The lm_head's bytes are the embedding's: sent once, in its bucket, and a receiver loads them
    # under both names, in place (its model ties them) and through an engine's loader alike.
    torch.manual_seed(5)
    embed = torch.nn.Parameter(torch.randn(6), requires_grad=False)
    model = {
        "embed": embed,
        "norm": torch.nn.Parameter(torch.randn(3), requires_grad=False),
        "head": embed,
        "out": torch.nn.Parameter(torch.randn(4), requires_grad=False),
    }
    specs = [
        WeightSpec(name, tuple(p.shape), "float32", "embed" if name == "head" else None) for name, p in model.items()
    ]
    buckets = plan_buckets(specs, 10**6)
    assert buckets == [[0, 1, 3]]
    bucket_storage(model, specs, buckets)
    assert (
        adjacent_view([model[specs[i].name].data for i in buckets[0]], torch.float32, torch.device("cpu")) is not None
    )
    tensors = [model[specs[i].name].data for bucket in buckets for i in bucket]
    for receiver in (_in_place_receiver, _receiver):
        checksum, sent, (received, their_checksum, their_bytes) = _send_to_child(receiver, specs, buckets, tensors)
        assert (their_checksum, their_bytes) == (checksum, sent) and sent == 4 * (6 + 3 + 4)
        for name, param in model.items():
            torch.testing.assert_close(received[name], param.data, rtol=0, atol=0)
