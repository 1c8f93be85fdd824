"""Rollout tokens/s of one rollout engine alone (no Ray), on the tiny recipe's workload.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/engine_tokens.py hf|vllm [--max-new-tokens 5]

32 prompts of tiny:train x 8 samples per call, 6 calls after one warm-up, seeds fixed, so two
engines (or two versions of one) produce the same tokens and their tokens/s compare directly.
The vllm engine is the backend's own (AsyncLLM, its engine core and workers in processes of
their own); the figure in the README's Performance table set it beside the former in-process
engine, run the same way from the commit before it.
"""

from __future__ import annotations

import argparse
import time

import torch

from grpo_ray.data.loaders import load_rows
from grpo_ray.data.prompts import tokenize_prompts
from grpo_ray.models.loading import load_tokenizer, resolve_model_path
from grpo_ray.types import SamplingSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=["hf", "vllm"])
    parser.add_argument("--max-new-tokens", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tokenizer = load_tokenizer("tiny")
    rows, _ = load_rows("tiny:train")
    prompts = [p.token_ids for p in tokenize_prompts(rows[:256], tokenizer, 64, True).prompts]
    path = resolve_model_path("tiny")
    if args.engine == "hf":
        from grpo_ray.actors.hf_engine import HFEngine

        engine = HFEngine(path, tokenizer, dtype="float32")
    else:
        from grpo_ray.actors.vllm_engine import VllmEngine

        engine = VllmEngine(path, tokenizer, cpu_kv_cache_gb=0.25, max_model_len=128)
    engine.generate(prompts[:32], SamplingSettings(8, args.max_new_tokens, 1.0, seed=0))  # warm-up
    tokens, seconds = 0, 0.0
    for call in range(6):
        started = time.perf_counter()
        groups = engine.generate(prompts[32 * call : 32 * call + 32], SamplingSettings(8, args.max_new_tokens, 1.0, seed=call + 1))
        seconds += time.perf_counter() - started
        tokens += sum(len(c.token_ids) for group in groups for c in group)
    print(f"{args.engine}: {tokens / seconds:.0f} tokens/s ({tokens} tokens in {seconds:.2f} s)")
    if hasattr(engine, "shutdown"):
        engine.shutdown()


if __name__ == "__main__":
    main()
