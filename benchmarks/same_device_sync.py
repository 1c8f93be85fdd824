"""Weight-sync seconds with learner and rollout worker on one device: the hand-off against gloo's
broadcast, in the same run, through the real actors.

    .venv/bin/python benchmarks/same_device_sync.py [--models tiny qwen270] [--syncs 3] [--json OUT]
    python benchmarks/same_device_sync.py --gpu --models qwen0.5b --tokenizer QWEN2_TOKENIZER --json OUT   # on one GPU

A local Ray; learner rank 0 (DeepSpeed, float32) and one hf rollout worker on this machine, as the
tiny recipe places them. For each model, in two rounds, each way in turn (`weight_sync.same_device`:
"broadcast" = gloo through a socket, as before; "handoff" = shared memory), the groups are formed
again and `--syncs` syncs are timed: sync/seconds as a run logs it (the slowest side's send or
receive) and the driver's wall time of the whole call (Ray's dispatch of both actor calls and the
digest check included). Models: "tiny" (the project's 2-layer model, ~2 MB) and "qwen270" (a random
Qwen2 with Qwen2's vocabulary, hidden 384, 4 layers: ~270 MB in float32; built once). With --gpu
the learner and the rollout worker take 0.4 of the one GPU each (CUDA IPC against gloo through
host memory), the model in bfloat16; "qwen0.5b" is Qwen2.5-0.5B's shape with random weights
(1.26 GB a sync: the tied head travels as its own bucket; benchmarks/gpu_throughput.py builds it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = {"tiny": None, "qwen270": dict(hidden=384, layers=4), "qwen0.5b": "qwen2.5-0.5b"}


def model_path(name: str, work: Path, tokenizer: str | None) -> str:
    if MODELS[name] is None:
        return name
    if isinstance(MODELS[name], str):
        from benchmarks.gpu_throughput import build_model as build_shape

        if not (work / name / "config.json").exists():
            build_shape(MODELS[name], work / name, tokenizer)
        return str(work / name)
    from benchmarks.qwen_vocab import build_model

    return str(build_model(work / name, **MODELS[name]))


def measure(
    name: str, work: Path, syncs: int, bucket_mb: float, gpu: bool = False, tokenizer: str | None = None
) -> dict:
    import ray

    from grpo_ray.cluster.placement import reserve, wait_ready
    from grpo_ray.cluster.roles import setup_learners, start_learners, start_rollouts
    from grpo_ray.cluster.weight_broadcast import WeightBroadcaster
    from grpo_ray.config import RoleResources, config_from_dict, plan_batches

    path = model_path(name, work, tokenizer)
    share = 0.4 if gpu else 0
    cfg = config_from_dict(
        {
            "model": {"path": path, "dtype": "bfloat16" if gpu else "float32"},
            "data": {"max_prompt_tokens": 32},
            "rollout": {"samples_per_prompt": 2, "max_new_tokens": 4, "num_cpus": 0.5, "num_gpus": share},
            "learner": {"micro_batch_size": 2, "num_cpus": 0.5, "num_gpus": share},
            "train": {"prompts_per_step": 2},
        }
    )
    learner_res, rollout_res = RoleResources("learner", 1, 0.5, share), RoleResources("rollout", 1, 0.5, share)
    placement = reserve([learner_res, rollout_res], 120)
    learners = start_learners(cfg, plan_batches(cfg), placement, learner_res)
    rollouts = start_rollouts(cfg, placement, rollout_res)
    wait_ready({"learner-0": learners[0], "rollout-0": rollouts[0]})
    setup_learners(learners)
    sync = WeightBroadcaster(learners, rollouts, bucket_mb=bucket_mb, timeout_s=600, same_device="broadcast")
    runs: dict[str, dict[str, list[float]]] = {
        mode: {"sync_seconds": [], "wall_seconds": []} for mode in ("broadcast", "handoff")
    }
    version = 0
    try:
        for _ in range(2):
            for mode in ("broadcast", "handoff"):
                sync.same_device = mode
                sync.form_group()
                assert (sync.handoff_ranks == 1) == (mode == "handoff"), sync.notes
                for attempt in range(syncs + 1):  # the first after forming the groups warms up: not kept
                    version += 1
                    started = time.perf_counter()
                    result = sync.sync(version, probe=None, probe_tolerance=1e-3)
                    wall = time.perf_counter() - started
                    if attempt:
                        runs[mode]["sync_seconds"].append(result.seconds)
                        runs[mode]["wall_seconds"].append(wall)
    finally:
        for actor in learners + rollouts:
            ray.kill(actor)
        placement.remove()
    row = {"model": name, "model_mb": sync.num_bytes / 2**20, "buckets": len(sync.buckets), "bucket_mb": bucket_mb}
    for mode, figures in runs.items():
        for key, values in figures.items():
            row[f"{mode}_{key}_median"] = statistics.median(values)
            row[f"{mode}_{key}_best"] = min(values)
    row["speedup_sync_seconds"] = row["broadcast_sync_seconds_median"] / row["handoff_sync_seconds_median"]
    row["speedup_wall_seconds"] = row["broadcast_wall_seconds_median"] / row["handoff_wall_seconds_median"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["tiny", "qwen270"])
    parser.add_argument("--syncs", type=int, default=3, help="timed syncs per way and round")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="weight_sync.bucket_mb")
    parser.add_argument("--work", default="/tmp/grpo-ray-same-device", help="where built models are kept")
    parser.add_argument("--gpu", action="store_true", help="learner and rollout worker on fractions of the one GPU")
    parser.add_argument("--tokenizer", default=None, help="a Qwen2 tokenizer folder (the qwen0.5b model)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import platform

    from grpo_ray.cluster.session import ray_session
    from grpo_ray.config.schema import RayConfig

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    with ray_session(RayConfig(num_cpus=4, dashboard=False)):
        for name in args.models:
            row = measure(name, work, args.syncs, args.bucket_mb, args.gpu, args.tokenizer)
            rows.append(row)
            print(
                f"{name}: {row['model_mb']:.1f} MiB in {row['buckets']} buckets: sync/seconds gloo broadcast "
                f"{row['broadcast_sync_seconds_median']:.4f} s, hand-off {row['handoff_sync_seconds_median']:.4f} s "
                f"({row['speedup_sync_seconds']:.2f}x); driver wall {row['broadcast_wall_seconds_median']:.4f} s vs "
                f"{row['handoff_wall_seconds_median']:.4f} s ({row['speedup_wall_seconds']:.2f}x)",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "machine": f"{platform.processor() or platform.machine()}, "
                    f"{__import__('os').cpu_count()} cores, " + (_gpu_name() if args.gpu else "CPU only"),
                    "median_of": f"{2 * args.syncs} syncs per way",
                    "rows": rows,
                },
                indent=1,
            )
            + "\n"
        )


def _gpu_name() -> str:
    import torch

    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"


if __name__ == "__main__":
    main()
