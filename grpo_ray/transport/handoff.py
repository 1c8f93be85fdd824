"""Weights handed over in place to the receivers on the sender's own device: handles, not bytes.

Two ranks on one GPU cannot broadcast over NCCL (it refuses them), and gloo takes the bytes to
the host and back. Here learner rank 0 owns a ring of two slots, each as large as the largest
bucket, in memory its receivers on the same device can map: CUDA memory they open through CUDA
IPC handles (torch.multiprocessing's tensor reductions) on a GPU, a POSIX shared-memory file on a
CPU. One handle per slot, opened once at join; a sync packs each bucket into a slot (one
device-to-device copy), and every receiver copies it from there into its weights. The bytes never
leave the device; the signals do: a small gloo group of the sender and its local receivers says
"bucket i is in its slot" (a broadcast of i) and "every receiver has read bucket i" (an
all-reduce), so a slot is refilled only once all have read it. Two slots, so the receivers read
one bucket while the next is packed.

Both sides keep the per-bucket digest of the broadcast (broadcast.bucket_checksum) over what they
packed and what they copied. Mapping another process's memory can be refused (a container's
ptrace/seccomp rules, a small /dev/shm, CUDA's expandable segments): `check_ring` opens a ring
and reads a pattern written at its creation, and the driver falls back to the broadcast for a
receiver it fails, with one line naming why. Nothing here imports Ray.
"""

from __future__ import annotations

import base64
import mmap
import os
import pickle
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from grpo_ray.errors import first_line
from grpo_ray.transport.broadcast import BroadcastGroup, bucket_layout, host_identity
from grpo_ray.types import WeightSpec

# Where a CPU ring's files go; GRPO_RAY_SHM_DIR names another tmpfs (a container's /dev/shm may be 64 MB).
SHM_DIR = "/dev/shm"
_CHECK_BYTES = 4096  # a pattern at each slot's start proves the receiver maps the sender's memory


def shm_dir() -> str:
    return os.environ.get("GRPO_RAY_SHM_DIR", SHM_DIR)


class HandoffRefused(RuntimeError):
    """This process cannot map the ring, or the sender cannot make one; the message says why."""


@dataclass(frozen=True)
class RingHandle:
    """How a receiver opens the sender's two slots. Plain fields only (a vLLM worker receives it
    inside its weight-transfer engine's init info)."""

    kind: str  # "shm" (a file under /dev/shm per slot) | "cuda" (a CUDA IPC handle per slot)
    slot_bytes: int
    handles: tuple[str, str]  # shm: the two files; cuda: each slot's reduce_tensor arguments, pickled, base64
    device: (
        str  # cuda: the sender's GPU (device_identity), which a receiver opens on its own index of it; shm: its host
    )
    seed: int  # of the check pattern

    @classmethod
    def from_dict(cls, fields: dict) -> "RingHandle":
        """The handle again from its plain fields (dataclasses.asdict; the handles may come back a list)."""
        return cls(**{**fields, "handles": tuple(fields["handles"])})


def check_pattern(seed: int, num_bytes: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_bytes,), generator=generator, dtype=torch.uint8)


class HandoffRing:
    """The sender's two slots (learner rank 0). Close it to free them; shm files are also unlinked
    once every receiver has mapped them (`unlink`), so a killed sender leaves nothing behind."""

    def __init__(self, slots: list[torch.Tensor], handle: RingHandle):
        self.slots, self.handle = slots, handle
        self.pinned = False  # shm slots registered with CUDA (a GPU sender's host ring)

    @classmethod
    def create(cls, slot_bytes: int, device: torch.device, identity: str, host: bool = False) -> "HandoffRing":
        """Slots on `device` (whose device_identity() is `identity`), or with `host` (CUDA IPC refused)
        in shared host memory even for a GPU sender, pinned so that its copies into them run at DMA
        speed. Each starts with the check pattern of the handle's seed."""
        if device.type == "cuda" and not host:
            slots, handles = _cuda_slots(slot_bytes, device)
            kind = "cuda"
        else:
            slots, handles = _shm_slots(slot_bytes)
            kind, identity = "shm", host_identity()
        ring = cls(slots, RingHandle(kind, slot_bytes, handles, identity, int.from_bytes(os.urandom(4), "little")))
        ring.pinned = kind == "shm" and device.type == "cuda" and _pin(slots)
        pattern = check_pattern(ring.handle.seed, min(_CHECK_BYTES, slot_bytes)).to(slots[0].device)
        for slot in slots:
            slot[: pattern.numel()].copy_(pattern)
        _settle(slots[0].device)
        return ring

    def slot(self, index: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """Bucket `index`'s place: the first numel elements of slot index % 2, as `dtype`."""
        return self.slots[index % 2][: numel * dtype.itemsize].view(dtype)

    def unlink(self) -> None:
        """Remove the shm files' names (the mappings stay until the last process drops them)."""
        if self.handle.kind == "shm":
            for path in self.handle.handles:
                if os.path.exists(path):
                    os.unlink(path)

    def close(self) -> None:
        self.unlink()
        if self.pinned:  # before the mapping goes
            for slot in self.slots:
                torch.cuda.cudart().cudaHostUnregister(slot.data_ptr())
        self.slots = []


def _cuda_slots(slot_bytes: int, device: torch.device) -> tuple[list[torch.Tensor], tuple[str, str]]:
    """Two slots in this GPU's memory and each one's CUDA IPC handle (torch's reduction of it)."""
    from torch.multiprocessing.reductions import reduce_tensor

    slots = [torch.empty(slot_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
    return slots, tuple(base64.b64encode(pickle.dumps(reduce_tensor(slot)[1])).decode() for slot in slots)


def _shm_slots(slot_bytes: int) -> tuple[list[torch.Tensor], tuple[str, str]]:
    """Two slots in files of the shared-memory folder (shm_dir), mapped here, and the files' paths."""
    folder = shm_dir()
    if not os.path.isdir(folder):
        raise HandoffRefused(f"{folder} is not a directory (GRPO_RAY_SHM_DIR names the shared-memory folder)")
    free = shutil.disk_usage(folder).free
    if free < 2 * slot_bytes:
        raise HandoffRefused(
            f"{folder} has {free / 2**20:.0f} MiB free, the hand-off ring needs "
            f"{2 * slot_bytes / 2**20:.0f} MiB (weight_sync.bucket_mb x 2)"
        )
    paths = tuple(os.path.join(folder, f"grpo_ray-weights-{uuid.uuid4().hex}-{i}") for i in range(2))
    return [_map_shm(path, slot_bytes, create=True) for path in paths], paths


def _map_shm(path: str, num_bytes: int, create: bool = False) -> torch.Tensor:
    """The file at `path` mapped shared, as num_bytes uint8. Opening never creates it: a receiver
    that finds it gone is refused, rather than mapping a new empty file."""
    fd = os.open(path, (os.O_CREAT | os.O_EXCL if create else 0) | os.O_RDWR, 0o600)
    try:
        if create:
            try:
                # Reserve the pages now: a tmpfs that runs out while a sync writes raises SIGBUS, not an error.
                os.posix_fallocate(fd, 0, num_bytes)
            except OSError as err:
                os.unlink(path)
                raise HandoffRefused(
                    f"cannot reserve {num_bytes / 2**20:.0f} MiB in {os.path.dirname(path)}: {err.strerror}"
                ) from None
        mapped = mmap.mmap(fd, num_bytes)
    finally:
        os.close(fd)
    return torch.frombuffer(mapped, dtype=torch.uint8)  # keeps the mapping alive as long as the tensor


def _pin(slots: list[torch.Tensor]) -> bool:
    """Register shm slots with CUDA (page-locked), so that GPU copies into and out of them are DMA;
    False (they stay pageable, copies just slower) where CUDA refuses."""
    cudart = torch.cuda.cudart()
    done = []
    for slot in slots:
        if int(cudart.cudaHostRegister(slot.data_ptr(), slot.numel(), 0)) != 0:
            for other in done:
                cudart.cudaHostUnregister(other.data_ptr())
            return False
        done.append(slot)
    return True


def open_ring(handle: RingHandle, identity: str) -> list[torch.Tensor]:
    """The sender's two slots, mapped into this process (whose device_identity() is `identity`: a
    CUDA ring needs the same GPU, a shm ring the same host); HandoffRefused says why not."""
    here = identity if handle.kind == "cuda" else host_identity()
    if here != handle.device:
        raise HandoffRefused(f"this process is on {here}, the ring on {handle.device}")
    try:
        if handle.kind == "shm":
            slots = [_map_shm(path, handle.slot_bytes) for path in handle.handles]
        else:
            slots = [_open_cuda(encoded) for encoded in handle.handles]
    except HandoffRefused:
        raise
    except Exception as err:  # noqa: BLE001 - any refusal (missing file, IPC denied) means: broadcast instead
        raise HandoffRefused(f"cannot map the ring ({first_line(err, with_type=True)})") from None
    expected = check_pattern(handle.seed, min(_CHECK_BYTES, handle.slot_bytes))
    for slot in slots:
        if not torch.equal(slot[: expected.numel()].cpu(), expected):
            raise HandoffRefused("the ring maps, but not to the sender's memory (its check pattern differs)")
    return slots


def _open_cuda(encoded: str) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = list(pickle.loads(base64.b64decode(encoded)))
    # The handle names the sender's device by its index among the devices the sender sees; this
    # process may number the same GPU otherwise (Ray sets CUDA_VISIBLE_DEVICES per actor).
    args[6] = torch.cuda.current_device()
    return rebuild_cuda_tensor(*args)


def check_ring(handle: RingHandle, identity: str) -> str | None:
    """None when this process can receive through the ring; else one line saying why not."""
    try:
        open_ring(handle, identity)
    except HandoffRefused as err:
        return str(err)
    return None


def _settle(device: torch.device) -> None:
    """The copies this process queued on the device are done (a CUDA copy is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class HandoffSender:
    """Learner rank 0's side: bucket i goes into slot i % 2 once every receiver has read bucket i - 2."""

    def __init__(self, ring: HandoffRing, signals: BroadcastGroup):
        self.ring, self.signals = ring, signals

    def place(self, index: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """Bucket `index`'s slot, free to fill."""
        if index >= 2:
            _all_read(self.signals)
        return self.ring.slot(index, dtype, numel)

    def post(self, index: int, flat: torch.Tensor) -> None:
        """Bucket `index` is in its slot: the receivers may read it."""
        _settle(flat.device)
        self.signals.broadcast(torch.tensor([index], dtype=torch.int64))

    def finish(self, count: int) -> None:
        """Wait until every receiver has read the last buckets of a sync of `count`."""
        for _ in range(min(2, count)):
            _all_read(self.signals)


def _all_read(signals: BroadcastGroup) -> None:
    signals.group.allreduce([torch.zeros(1, dtype=torch.int64)]).wait()


class HandoffReceiver:
    """A receiver's side: its mapping of the ring and its seat in the signal group."""

    def __init__(self, slots: list[torch.Tensor], signals: BroadcastGroup):
        self.slots, self.signals = slots, signals
        self.device = slots[0].device

    def arriving(
        self, specs: list[WeightSpec], buckets: list[list[int]], fresh: bool = False
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (index, flat) of each bucket as the sender posts it: a view of its slot, valid until
        the bucket after the next is asked for (as the broadcast's scratch buffers), or with `fresh`
        a copy of its own. Run it to the end: its last steps tell the sender the ring is free."""
        return self.arriving_shapes([bucket_layout(specs, bucket) for bucket in buckets], fresh)

    def arriving_shapes(
        self, shapes: list[tuple[torch.dtype, int]], fresh: bool = False
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """arriving(), for buckets given as (dtype, numel)."""
        posted = torch.zeros(1, dtype=torch.int64)
        for index, (dtype, numel) in enumerate(shapes):
            if index >= 2:
                _settle(self.device)  # what the consumer copied out of bucket index - 2 has left the slot
                _all_read(self.signals)
            self.signals.broadcast(posted)
            if int(posted) != index:
                raise RuntimeError(f"hand-off out of step: bucket {int(posted)} posted, {index} expected")
            flat = self.slots[index % 2][: numel * dtype.itemsize].view(dtype)
            yield index, (flat.clone() if fresh else flat)
        _settle(self.device)
        for _ in range(min(2, len(shapes))):
            _all_read(self.signals)
