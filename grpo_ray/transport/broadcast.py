"""Weight broadcast from learner rank 0 to the rollout workers, in flat buckets.

The learners' own torch.distributed world belongs to DeepSpeed, so the broadcast uses a process
group of its own: a TCPStore hosted by learner rank 0 and a gloo (CPU) or NCCL (GPU) group made
directly from it, with learner rank 0 as rank 0 and rollout worker i as rank i + 1. Nothing here
imports Ray: the actors call these functions, the driver only tells them where to meet.

Each bucket is one contiguous tensor of one dtype, so a sync is a few large broadcasts rather than
one per parameter. Both sides compute a digest of every bucket in send order; the driver compares
them after each sync.

No copy the transfer does not need: an engine that can (the hf engine) keeps its weights in one
flat tensor per bucket (`bucket_storage`), so buckets are received straight into the live weights
with no load copy; a sender whose bucket already lies back to back in memory sends it as it is.
"""

from __future__ import annotations

import datetime
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from grpo_ray.transport.bind import gloo_options, tcp_store
from grpo_ray.types import WeightSpec


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def plan_buckets(specs: list[WeightSpec], bucket_bytes: int) -> list[list[int]]:
    """Group spec indices into buckets of one dtype and at most `bucket_bytes` each, in order.

    A tensor larger than the bucket size travels alone in its own bucket. A tied alias (lm_head =
    the embedding, `alias_of`) travels in none: its bytes are its tensor's, which receivers load under
    both names (bucket_tensors); sent twice they were 113 of SmolLM2-135M's 651 MB a sync.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    current_dtype = None
    for index, spec in enumerate(specs):
        if spec.alias_of is not None:
            continue
        size = spec_bytes(spec)
        if current and (spec.dtype != current_dtype or current_bytes + size > bucket_bytes):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(index)
        current_bytes += size
        current_dtype = spec.dtype
    if current:
        buckets.append(current)
    return buckets


def spec_bytes(spec: WeightSpec) -> int:
    return spec.numel * _dtype(spec.dtype).itemsize


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def bucket_layout(specs: list[WeightSpec], bucket: list[int]) -> tuple[torch.dtype, int]:
    """(dtype, elements) of one bucket's flat tensor."""
    return _dtype(specs[bucket[0]].dtype), sum(specs[i].numel for i in bucket)


CPU_DEVICE = "cpu:"


def host_identity() -> str:
    """This host as a cluster-wide name, "cpu:<host>": processes with the same one can share memory
    (transport/handoff.py)."""
    return CPU_DEVICE + socket.gethostname()


def device_identity() -> str:
    """Where this process's weights live, as a cluster-wide name: its GPU's UUID, or without a GPU
    its host (host_identity)."""
    if not torch.cuda.is_available():
        return host_identity()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuid = getattr(props, "uuid", None)
    return str(uuid) if uuid is not None else f"{socket.gethostname()}/pci-{props.pci_bus_id}"


def choose_backend(identities: list[str]) -> tuple[str, str]:
    """(backend, why) for a broadcast group whose ranks sit on these devices (device_identity).

    NCCL needs a GPU in every rank and a different GPU in each (it refuses two ranks on one
    device), which a colocated or fractional-GPU layout breaks: then gloo, through host memory.
    """
    if any(identity.startswith(CPU_DEVICE) for identity in identities):
        return "gloo", "a process of the group has no GPU"
    if len(set(identities)) < len(identities):
        shared = next(i for i in identities if identities.count(i) > 1)
        return (
            "gloo",
            f"two processes of the group share GPU {shared}, which NCCL refuses; the weights go through host memory",
        )
    return "nccl", f"{len(identities)} processes on {len(identities)} GPUs"


_MASK64 = (1 << 64) - 1
_FOLD = 0x100000001B3  # FNV-1a's 64-bit prime: chains bucket digests so that their order counts
_PAGE_WORDS = 512  # 4 KB of 8-byte words
_SAMPLE_EVERY_PAGES = 16
_FULL_DIGEST_BYTES = 1 << 20


def bucket_checksum(flat: torch.Tensor, previous: int = 0) -> int:
    """A digest of one bucket's bytes, chained onto the digest of the buckets before it.

    The wrapping sum of the bucket's 8-byte words, computed where the bucket lies (CPU or GPU);
    a bucket over 1 MB contributes every 16th 4 KB page and its last page, the rest of it not.
    What it proves, after every sync: that a rollout worker holds the bucket the learner sent,
    in the same order and plan, not the weights before the update (an optimizer step changes
    almost every page), nor a partial receive. What it leaves to others: the link's bit errors to
    TCP (gloo) and NCCL, and whether the engine uses the bytes to the log-prob probe.

    Why sampled: every byte, on both sides, cost a quarter of the sync on two cores (1 GB: 3.3
    GB/s with it, 4.5 without, against a plain broadcast's 4.6); crc32 over every byte, before,
    ran at ~3.6 GB/s per core and cost more than the broadcast it checked.
    """
    data = flat.detach().reshape(-1).view(torch.uint8)
    if data.storage_offset() % 8:  # an int64 view needs 8-byte alignment
        data = data.clone()
    words = data[: data.numel() // 8 * 8].view(torch.int64)
    if data.numel() > _FULL_DIGEST_BYTES:
        pages = words[: words.numel() // _PAGE_WORDS * _PAGE_WORDS].view(-1, _PAGE_WORDS)
        total = int(pages[::_SAMPLE_EVERY_PAGES].sum()) + int(words[-_PAGE_WORDS:].sum())
    else:
        total = int(words.sum()) if words.numel() else 0
    tail = data[words.numel() * 8 :].tolist()
    total += sum((position + 1) * byte for position, byte in enumerate(tail))
    return ((previous * _FOLD) ^ (total & _MASK64)) & _MASK64


@dataclass
class BroadcastGroup:
    """A process group of its own for the weight broadcast; rank 0 is the sender."""

    rank: int
    world_size: int
    group: dist.ProcessGroup
    device: torch.device

    @classmethod
    def join(
        cls, host: str, port: int, rank: int, world_size: int, backend: str = "gloo", timeout_s: float = 600.0
    ) -> "BroadcastGroup":
        timeout = datetime.timedelta(seconds=timeout_s)
        # Listening on `host` only, not every interface (transport/bind.py).
        store = tcp_store(host, port, world_size, is_master=rank == 0, timeout=timeout)
        prefixed = dist.PrefixStore("grpo_ray/weights", store)
        if backend == "nccl":
            group = dist.ProcessGroupNCCL(prefixed, rank, world_size)
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            group = dist.ProcessGroupGloo(prefixed, rank, world_size, gloo_options(host, timeout))
            device = torch.device("cpu")
        # Keep the store alive as long as the group: the group does not own it.
        instance = cls(rank=rank, world_size=world_size, group=group, device=device)
        instance._store = store  # type: ignore[attr-defined]
        instance._scratch = {}  # type: ignore[attr-defined]
        return instance

    def scratch(self, dtype: torch.dtype, numel: int, slot: int) -> torch.Tensor:
        """A bucket buffer kept for the group's life: two slots per dtype, reused sync after sync.

        Fresh memory for every bucket cost more than the transfer: on this machine a receiver
        writing into new pages moved ~1 GB/s where the same broadcast into reused ones moved 1.5-3.
        """
        key = (dtype, slot)
        buffer = self._scratch.get(key)  # type: ignore[attr-defined]
        if buffer is None or buffer.numel() < numel:
            buffer = self._scratch[key] = torch.empty(numel, dtype=dtype, device=self.device)  # type: ignore[attr-defined]
        return buffer[:numel]

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast([tensor]).wait()

    def broadcast_async(self, tensor: torch.Tensor):
        """Start a broadcast; the returned work's wait() ends it (keep `tensor` alive until then)."""
        return self.group.broadcast([tensor])


def best_seconds(run: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    """Seconds of `run()` on `device`, the best of `repeats`, after one untimed call (the first
    connects a group's pairs, or touches a buffer's pages)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return best


def timed_raw_broadcast(group: BroadcastGroup, num_bytes: int, repeats: int = 3) -> float:
    """Seconds of one plain broadcast of `num_bytes` in this group (the best of `repeats`), every
    rank calling it at once: the yardstick a weight sync of the same bytes is measured against."""
    buffer = torch.zeros(num_bytes, dtype=torch.uint8, device=group.device)
    return best_seconds(lambda: group.broadcast(buffer), group.device, repeats)


def send_buckets(
    group: BroadcastGroup, tensors: Iterable[torch.Tensor], specs: list[WeightSpec], buckets: list[list[int]]
) -> tuple[int, int]:
    """Broadcast tensors (bucket by bucket, in each bucket's order); returns (checksum, bytes sent).

    A bucket whose tensors already lie back to back in one storage, of the bucket's dtype and on
    the group's device, is sent as it lies; any other is packed into one of the group's two
    scratch buffers. Pipelined: while a bucket travels, its digest is taken and the next bucket
    is packed (gloo and NCCL move data on their own threads). At most two are in flight.
    """
    iterator = iter(tensors)
    checksum, sent = 0, 0
    in_flight = []  # every posted broadcast; the group runs them in order
    scratch_work = [None, None]  # the broadcast that last used each scratch buffer
    for index, bucket in enumerate(buckets):
        dtype = _dtype(specs[bucket[0]].dtype)
        parts = [next(iterator).detach() for _ in bucket]
        flat = adjacent_view(parts, dtype, group.device)
        slot = None
        if flat is None:
            slot = index % 2
            if scratch_work[slot] is not None:
                scratch_work[slot].wait()  # its last bucket has gone: the buffer may be refilled
            parts = [part.reshape(-1).to(dtype) for part in parts]
            flat = group.scratch(dtype, sum(p.numel() for p in parts), slot)
            if parts[0].device == flat.device:
                torch.cat(parts, out=flat)
            else:  # e.g. CUDA weights through a gloo group
                flat.copy_(torch.cat(parts))
        work = group.broadcast_async(flat)
        in_flight.append(work)
        if slot is not None:
            scratch_work[slot] = work
        checksum = bucket_checksum(flat, checksum)
        sent += flat.numel() * flat.element_size()
    for work in in_flight:
        work.wait()
    return checksum, sent


def adjacent_view(parts: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """The tensors as one flat tensor without a copy, when each starts where the one before ends
    in the same storage (DeepSpeed's flat parameter groups, an engine's `bucket_storage`); else None."""
    first = parts[0]
    if first.device != device or any(p.dtype != dtype or not p.is_contiguous() for p in parts):
        return None
    storage = first.untyped_storage().data_ptr()
    end = first.data_ptr() + first.numel() * first.element_size()
    for part in parts[1:]:
        if part.untyped_storage().data_ptr() != storage or part.data_ptr() != end:
            return None
        end += part.numel() * part.element_size()
    return first.as_strided((sum(p.numel() for p in parts),), (1,), first.storage_offset())


def tied_aliases(parameters: list[torch.Tensor]) -> list[int]:
    """Indices of the tensors that are a tensor listed before them (a tied lm_head)."""
    seen: set[int] = set()
    aliases = []
    for index, param in enumerate(parameters):
        if id(param) in seen:
            aliases.append(index)
        seen.add(id(param))
    return aliases


def bucket_storage(
    parameters: dict[str, torch.Tensor], specs: list[WeightSpec], buckets: list[list[int]]
) -> list[torch.Tensor]:
    """One flat tensor per bucket that becomes the storage of these parameters (name -> Parameter):
    each parameter's data is moved into its place in its bucket's tensor, so a bucket received
    there is loaded with no further copy. A tied alias is in no bucket (plan_buckets): a receiver whose
    model ties them has the one parameter under both names, and it follows its first name's place.
    Should a plan still name one parameter twice in its buckets, it lives at its first place in
    spec order (tied_aliases), and its later places receive bytes that nothing reads."""
    storage = []
    later_places = set(tied_aliases([parameters[spec.name] for spec in specs]))
    for bucket in buckets:
        first = parameters[specs[bucket[0]].name]
        flat = torch.empty(
            sum(specs[i].numel for i in bucket), dtype=_dtype(specs[bucket[0]].dtype), device=first.device
        )
        offset = 0
        for i in bucket:
            spec, param = specs[i], parameters[specs[i].name]
            region = flat[offset : offset + spec.numel].view(spec.shape)
            region.copy_(param.data.reshape(spec.shape))
            if i not in later_places:
                param.data = region
            offset += spec.numel
        storage.append(flat)
    return storage


@dataclass
class ReceiveTally:
    checksum: int = 0
    num_bytes: int = 0

    def add(self, flat: torch.Tensor) -> None:
        """Count one received bucket, in order: its digest chained on, its bytes."""
        self.checksum = bucket_checksum(flat, self.checksum)
        self.num_bytes += flat.numel() * flat.element_size()


def receive_into(group: BroadcastGroup, storage: list[torch.Tensor], tally: ReceiveTally) -> None:
    """Receive every bucket straight into its tensor of `storage` (see bucket_storage).

    Every receive is posted at once (the group runs them in order), so each bucket's digest is
    taken while the next ones arrive."""
    works = [group.broadcast_async(flat) for flat in storage]
    for work, flat in zip(works, storage):
        work.wait()
        tally.add(flat)


def receive_buckets(
    group: BroadcastGroup, specs: list[WeightSpec], buckets: list[list[int]], tally: ReceiveTally
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) as buckets arrive, for an engine that loads weights itself (vLLM's
    adapter path); `tally` holds the checksum once exhausted.

    A generator, so an engine's load loop pulls one bucket at a time and never holds a second
    full copy of the model. Buckets land in the group's two scratch buffers, in turn: a yielded
    tensor is valid until the item after the next is asked for, so the consumer must copy it
    (every engine's load does) rather than keep it.
    """
    for index, flat in arriving_buckets(group, specs, buckets):
        tally.add(flat)
        yield from bucket_tensors(flat, specs, buckets[index])


def arriving_buckets(
    group: BroadcastGroup, specs: list[WeightSpec], buckets: list[list[int]], fresh: bool = False
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (index, flat tensor) of each bucket as it arrives. The next bucket's receive is posted
    before this one is yielded, so it arrives while this one is checksummed and loaded.

    fresh: each bucket in memory of its own, kept as long as the consumer holds it (vLLM's
    layerwise reload keeps what it was handed until its layer is complete); else the group's two
    scratch buffers in turn, a bucket valid until the one after the next is asked for.
    """

    def post(index: int):
        bucket = buckets[index]
        dtype, numel = bucket_layout(specs, bucket)
        flat = torch.empty(numel, dtype=dtype, device=group.device) if fresh else group.scratch(dtype, numel, index % 2)
        return group.broadcast_async(flat), flat

    upcoming = post(0) if buckets else None
    for index in range(len(buckets)):
        work, flat = upcoming
        work.wait()
        upcoming = post(index + 1) if index + 1 < len(buckets) else None
        yield index, flat


def bucket_tensors(flat: torch.Tensor, specs: list[WeightSpec], bucket: list[int]) -> list[tuple[str, torch.Tensor]]:
    """(name, view) of each tensor of one received bucket, in the bucket's order, then each tied
    alias of one of them (lm_head of the embedding) under its own name, over the same bytes."""
    views, offset = [], 0
    for i in bucket:
        spec = specs[i]
        views.append((spec.name, flat[offset : offset + spec.numel].view(spec.shape)))
        offset += spec.numel
    here = dict(views)
    views += [(spec.name, here[spec.alias_of]) for spec in specs if spec.alias_of in here]
    return views
