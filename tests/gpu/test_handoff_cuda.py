"""The same-device hand-off on a GPU: CUDA IPC handles to the sender's slots, opened by another
process on the same GPU (as a learner and a colocated vLLM engine are), every bucket delivered and
digested as on the CPU (tests/unit/transport/test_handoff.py runs the same code with shared memory).

Run on a GPU machine with `pytest -m gpu`. Skipped without CUDA.
"""

import pytest
import torch

from grpo_ray.transport.broadcast import device_identity
from grpo_ray.transport.handoff import HandoffRing, check_ring

from ..unit.transport.test_handoff import _receive_into, _run, _weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("slow", [False, True])
def test_cuda_ipc_handoff_delivers_every_bucket_with_the_senders_digest(slow):
    tensors, specs, buckets = _weights()
    checksum, sent, [(received, their_checksum, their_bytes)] = _run(
        tensors, specs, buckets, 1, 0, slow=slow, device=CUDA
    )
    assert (their_checksum, their_bytes) == (checksum, sent)
    for i, tensor in enumerate(tensors):
        torch.testing.assert_close(received[f"w{i}"], tensor, rtol=0, atol=0)


def test_cuda_ipc_handoff_into_gpu_storage_and_a_mixed_gloo_receiver():
    tensors, specs, buckets = _weights(seed=3)
    checksum, _, [(storage, their_checksum, _)] = _run(tensors, specs, buckets, 1, 0, target=_receive_into, device=CUDA)
    assert their_checksum == checksum
    for index, bucket in enumerate(buckets):
        torch.testing.assert_close(
            storage[f"bucket{index}"], torch.cat([tensors[i].reshape(-1) for i in bucket]), rtol=0, atol=0
        )
    # A receiver elsewhere takes gloo's broadcast of the same CUDA slot (copied to the host).
    checksum, sent, reports = _run(tensors, specs, buckets, 1, 1, device=CUDA)
    assert all((r[1], r[2]) == (checksum, sent) for r in reports)


def test_a_cuda_ring_is_refused_to_a_process_on_another_device():
    ring = HandoffRing.create(1 << 20, CUDA, device_identity())
    assert ring.handle.kind == "cuda"
    assert "the ring on" in check_ring(ring.handle, "cpu:elsewhere")
    ring.close()


def test_where_cuda_ipc_is_refused_a_gpu_sender_hands_off_through_pinned_host_memory():
    # The fallback form_group takes when a receiver cannot open the CUDA ring: the same protocol in
    # shared host memory, pinned on the sender's side; GPU weights in, GPU storage out.
    tensors, specs, buckets = _weights(seed=4)
    ring = HandoffRing.create(1 << 20, CUDA, device_identity(), host=True)
    assert ring.handle.kind == "shm" and ring.pinned and ring.slots[0].device.type == "cpu"
    ring.close()
    checksum, _, [(storage, their_checksum, _)] = _run(
        tensors, specs, buckets, 1, 0, target=_receive_into, device=CUDA, host_ring=True
    )
    assert their_checksum == checksum
    for index, bucket in enumerate(buckets):
        torch.testing.assert_close(
            storage[f"bucket{index}"], torch.cat([tensors[i].reshape(-1) for i in bucket]), rtol=0, atol=0
        )
