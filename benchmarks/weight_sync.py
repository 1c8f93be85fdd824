"""Weight-sync GB/s of grpo-ray's bucketed broadcast against a plain broadcast of the same bytes.

    .venv/bin/python benchmarks/weight_sync.py [--sizes-mb 2 256 1024] [--bucket-mb 64] [--json OUT]

Two processes on this machine, a gloo group between them, as learner rank 0 and one rollout
worker have. For each model size: `send_buckets` on one side and, on the other,
`receive_into` the model's own weights, laid out as the hf engine lays them (`bucket_storage`),
timed from a common start (a one-byte broadcast first) to the last bucket received and checked; beside it,
`timed_raw_broadcast` of the same number of bytes in the same group. The model is 24 equal
float32 tensors, like a transformer's layers. Ray's dispatch of the two actor calls, which a
training step also pays, is not in these figures (see sync/seconds of a run for that).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_ray.transport.broadcast import (  # noqa: E402
    BroadcastGroup,
    ReceiveTally,
    free_port,
    plan_buckets,
    bucket_storage,
    receive_into,
    send_buckets,
    timed_raw_broadcast,
)
from grpo_ray.types import WeightSpec  # noqa: E402

LAYERS = 24


def model_specs(size_mb: float) -> list[WeightSpec]:
    numel = int(size_mb * 2**20 / 4 / LAYERS)
    return [WeightSpec(f"layer{i}.weight", (numel,), "float32") for i in range(LAYERS)]


def start_together(group: BroadcastGroup) -> None:
    group.broadcast(torch.zeros(1, dtype=torch.uint8))


def receiver(port: int, sizes: list[float], bucket_mb: float, repeats: int) -> None:
    torch.set_num_threads(1)
    group = BroadcastGroup.join("127.0.0.1", port, 1, 2, "gloo", 600)
    for size in sizes:
        specs = model_specs(size)
        buckets = plan_buckets(specs, int(bucket_mb * 2**20))
        model = {spec.name: torch.nn.Parameter(torch.empty(spec.shape), requires_grad=False) for spec in specs}
        storage = bucket_storage(model, specs, buckets)
        for _ in range(repeats + 1):
            start_together(group)
            receive_into(group, storage, ReceiveTally())
            start_together(group)  # the sender stops its clock when the last tensor is loaded
        timed_raw_broadcast(group, sum(s.numel * 4 for s in specs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[2.0, 256.0, 1024.0])
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="weight_sync.bucket_mb")
    parser.add_argument("--repeats", type=int, default=3, help="timed syncs per size (the best is kept)")
    parser.add_argument(
        "--sender-layout",
        choices=["buckets", "separate"],
        default="buckets",
        help="sender's weights back to back per bucket (sent as they lie) or separate tensors (packed)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    port = free_port()
    child = mp.get_context("spawn").Process(target=receiver, args=(port, args.sizes_mb, args.bucket_mb, args.repeats))
    child.start()
    group = BroadcastGroup.join("127.0.0.1", port, 0, 2, "gloo", 600)
    rows = []
    for size in args.sizes_mb:
        specs = model_specs(size)
        buckets = plan_buckets(specs, int(args.bucket_mb * 2**20))
        params = {spec.name: torch.nn.Parameter(torch.randn(spec.shape), requires_grad=False) for spec in specs}
        if args.sender_layout == "buckets":  # as the learner lays out its weights (stage 0/1/2): sent as they lie
            bucket_storage(params, specs, buckets)
        tensors = list(params.values())
        best = float("inf")
        for attempt in range(args.repeats + 1):  # the first connects and warms up: not kept
            start_together(group)
            started = time.perf_counter()
            _, sent = send_buckets(group, tensors, specs, buckets)
            start_together(group)
            if attempt:
                best = min(best, time.perf_counter() - started)
        raw = timed_raw_broadcast(group, sent)
        row = {
            "model_mb": size,
            "buckets": len(buckets),
            "sync_gbps": sent / best / 1e9,
            "raw_broadcast_gbps": sent / raw / 1e9,
            "sync_seconds": best,
            "raw_seconds": raw,
        }
        row["fraction_of_raw"] = row["sync_gbps"] / row["raw_broadcast_gbps"]
        rows.append(row)
        print(
            f"{size:8.0f} MB in {len(buckets):3d} buckets: sync {row['sync_gbps']:.2f} GB/s, plain broadcast "
            f"{row['raw_broadcast_gbps']:.2f} GB/s ({row['fraction_of_raw']:.0%})",
            flush=True,
        )
    child.join(timeout=60)
    if args.json:
        Path(args.json).write_text(json.dumps({"bucket_mb": args.bucket_mb, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
