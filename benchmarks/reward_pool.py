"""Completions scored per second by the reward pool, K = 1 and K = 2 workers, on math answers.

The completions are built from the real benchmark answers in ../shared/data/math-eval (AIME 24/25,
AMC 23): each answer boxed at the end of a short solution, every other one changed so half are
wrong. Scoring runs through real RewardWorker actors with subprocess isolation, as in training.

    python benchmarks/reward_pool.py [--completions 1024] [--json OUT.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pyarrow.parquet as pq  # noqa: E402
import ray  # noqa: E402

from grpo_ray.actors.reward import RewardFunctionSetting, RewardIsolation, RewardWorker  # noqa: E402
from grpo_ray.actors.slices import pack_slice  # noqa: E402
from grpo_ray.cluster.dispatch import collect_scores, pool_tasks  # noqa: E402
from grpo_ray.types import Completion, Prompt  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "math-eval"


def math_batch(count: int):
    golds = []
    for name in ("aime24", "aime25", "amc23"):
        table = pq.read_table(SHARED / f"{name}.parquet").to_pylist()
        golds += [str(row["reward_model"]["ground_truth"]) for row in table]
    rows = []
    for i in range(count):
        gold = golds[i % len(golds)]
        answer = gold if i % 2 == 0 else gold + "1"
        text = f"We compute step by step. First, simplify. Then substitute. So the answer is \\boxed{{{answer}}}."
        prompt = Prompt(uid=i, text="problem", token_ids=(1,), answer=gold)
        rows.append((i, prompt, Completion((2,), (-0.1,), text, "stop")))
    return pack_slice(rows, pad_id=0, policy_version=0)


def measure(workers, batch_ref, count: int, repeats: int) -> float:
    # Warm-up: math-verify loads lazily in each child.
    collect_scores((pool_tasks(workers, batch_ref, count), None), 0.0)
    started = time.perf_counter()
    for _ in range(repeats):
        scored = collect_scores((pool_tasks(workers, batch_ref, count), None), 0.0)
    seconds = (time.perf_counter() - started) / repeats
    assert abs(float(scored.rewards.mean()) - 0.5) < 0.05, "half the answers are right"
    return count / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    try:
        batch_ref = ray.put(math_batch(args.completions))
        functions = [RewardFunctionSetting("math", 1.0, {})]
        remote = ray.remote(num_cpus=0.5)(RewardWorker)
        results = {}
        for k in (1, 2):
            workers = [remote.remote(functions, RewardIsolation("subprocess", 1, 30.0)) for _ in range(k)]
            ray.get([w.ready.remote() for w in workers])
            results[f"k{k}_completions_per_s"] = measure(workers, batch_ref, args.completions, args.repeats)
            for worker in workers:
                ray.kill(worker)
        results["completions"] = args.completions
        results["cpus"] = os.cpu_count()
        print(f"math reward, {args.completions} completions, {os.cpu_count()} CPUs:")
        print(f"  K=1: {results['k1_completions_per_s']:.0f} completions/s")
        print(f"  K=2: {results['k2_completions_per_s']:.0f} completions/s")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
