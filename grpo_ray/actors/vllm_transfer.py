"""grpo-ray's bucketed weight broadcast as a vLLM weight-transfer engine, run by every vLLM worker.

vLLM runs its model in worker processes of its own (one per tensor-parallel shard). Each of them
builds a weight-transfer engine from the engine's `weight_transfer_config` (backend "grpo_ray"),
and through vLLM's weight-transfer API (init_weight_transfer_engine, start_weight_update,
update_weights, finish_weight_update) it joins the broadcast group of transport/broadcast.py
itself, in the seat the driver gave its shard (transport/routes.py: the broadcast group, gloo on
CPU and NCCL on GPU, or the hand-off when it shares learner rank 0's device), receives every
bucket learner rank 0 sends and loads it with the
model's own `load_weights`, which keeps this shard's slice. Loading goes through vLLM's layerwise
reload, as its own NCCL engine does, so weights vLLM repacks after loading are repacked again.

Every worker takes the per-bucket digest (bucket_checksum) of the buckets it loaded, in order;
the rollout worker collects them (`grpo_sync_report`, one per shard) and the driver compares each
with what the learner sent. A shard that did not load a bucket fails the sync, named.

Registration: vLLM imports `worker_extension_cls` in every worker process before it builds the
worker; that class lives here, so importing this module registers the engine wherever vLLM runs
a worker, forked or spawned, with no entry point to install.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from grpo_ray.actors.vllm_compat import (
    WeightTransferEngine,
    finish_layerwise_load,
    register_weight_transfer_engine,
    start_layerwise_load,
)
from grpo_ray.transport.broadcast import ReceiveTally, bucket_tensors, device_identity, send_buckets
from grpo_ray.transport.handoff import RingHandle, check_ring
from grpo_ray.transport.routes import BucketSource, Seat, arriving, join_seat, timed_receive
from grpo_ray.types import WeightSpec

BACKEND = "grpo_ray"


@dataclass
class BucketInitInfo:
    """Where each shard takes the sync and what a sync carries (sent once, at join)."""

    seats: list = field(default_factory=list)  # shard r's Seat (transport/routes.py) at r, as plain fields
    specs: list = field(default_factory=list)  # [(name, shape, dtype, alias_of)] (WeightSpec fields)
    buckets: list = field(default_factory=list)  # spec indices per bucket, in send order


@dataclass
class BucketUpdateInfo:
    version: int
    # Fault drill: {shard rank: bucket index} a shard receives but neither loads nor counts,
    # as a worker that dropped a bucket would (tests/integration/test_vllm_engine.py).
    drop: dict = field(default_factory=dict)
    # Fault drill: shards that receive and count every bucket, so their digests match, but load none
    # (an engine that keeps its old weights: only the weight probe can tell).
    keep_old: list = field(default_factory=list)


class BucketWeightTransferEngine(WeightTransferEngine):
    init_info_cls = BucketInitInfo
    update_info_cls = BucketUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.group: BucketSource | None = None
        self.specs: list[WeightSpec] = []
        self.buckets: list[list[int]] = []
        self.report: dict = {}

    @property
    def shard(self) -> int:
        return self.parallel_config.rank

    def init_transfer_engine(self, init_info: BucketInitInfo) -> None:
        self.specs = [
            WeightSpec(name, tuple(shape), dtype, alias_of) for name, shape, dtype, alias_of in init_info.specs
        ]
        self.buckets = [list(bucket) for bucket in init_info.buckets]
        self.group = join_seat(Seat.from_dict(init_info.seats[self.shard]), device_identity())

    def start_weight_update(self) -> None:
        start_layerwise_load(self.model)

    def finish_weight_update(self) -> None:
        finish_layerwise_load(self.model, self.model_config)

    def receive_weights(self, update_info: BucketUpdateInfo) -> None:
        """Every bucket, received in order (the next one is posted before this one is loaded)."""
        if self.group is None:
            raise RuntimeError(f"shard {self.shard}: init_weight_transfer_engine first")
        started = time.perf_counter()
        tally = ReceiveTally()
        dropped = update_info.drop.get(self.shard, update_info.drop.get(str(self.shard)))
        keeps_old = self.shard in update_info.keep_old
        try:
            for index, flat in arriving(self.group, self.specs, self.buckets, fresh=True):
                if index == dropped:
                    continue
                if not keeps_old:
                    self.model.load_weights(bucket_tensors(flat, self.specs, self.buckets[index]))
                tally.add(flat)
        except Exception:
            self.group = None  # broken (the sender or a peer died): the driver forms a new one
            raise
        self.report = dict(
            shard=self.shard,
            version=update_info.version,
            checksum=tally.checksum,
            num_bytes=tally.num_bytes,
            seconds=time.perf_counter() - started,
        )

    def shutdown(self) -> None:
        self.group = None

    @staticmethod
    def trainer_send_weights(iterator, trainer_args) -> tuple[int, int]:
        """The sending side (vLLM 0.26's engine interface asks every engine class for it): learner
        rank 0's send of the tensors `iterator` yields, as (name, tensor) or tensor, in the plan's
        bucket order, through `trainer_args` {group, specs, buckets}; returns (checksum, bytes).
        The learner calls transport.broadcast.send_buckets itself, which this is."""
        tensors = (item[1] if isinstance(item, tuple) else item for item in iterator)
        return send_buckets(trainer_args["group"], tensors, trainer_args["specs"], trainer_args["buckets"])


class GrpoWorkerExtension:
    """Methods vLLM adds to its worker class (`worker_extension_cls`), called by collective_rpc."""

    def grpo_sync_report(self) -> dict:
        """What this shard loaded in the last update: shard, version, checksum, num_bytes, seconds."""
        return dict(self.weight_transfer_engine.report)

    def grpo_raw_broadcast(self, num_bytes: int) -> float | None:
        """This shard's side of the learner's plain broadcast of num_bytes (the sync's yardstick);
        None for a shard that takes the hand-off."""
        return timed_receive(self.weight_transfer_engine.group, num_bytes)

    def grpo_device_identity(self) -> str:
        """This shard's device (for the sync's choice of routes and backend)."""
        return device_identity()

    def grpo_check_handoff(self, ring: dict) -> str | None:
        """None if this shard can receive through learner rank 0's hand-off ring, else why not."""
        return check_ring(RingHandle.from_dict(ring), device_identity())


register_weight_transfer_engine(BACKEND, BucketWeightTransferEngine)
