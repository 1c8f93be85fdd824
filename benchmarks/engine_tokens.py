"""Rollout tokens/s of one rollout engine alone (no Ray), on the tiny recipe's workload.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/engine_tokens.py hf|vllm [--max-new-tokens 5]
        [--calls 24] [--json FILE]
    benchmarks/engine_tokens_ab.sh   # old and new vllm engines interleaved, medians (see there)

32 prompts of tiny:train x 8 samples per call, `--calls` timed calls after one warm-up, seeds
fixed, so two engines (or two versions of one) produce the same tokens and their tokens/s compare
directly; the script prints a digest of every sampled token id to check that they did.
The vllm engine is the backend's own (AsyncLLM, its engine core and workers in processes of
their own); the figure in the README's Performance table set it beside the former in-process
engine, run the same way from the commit before it (482fb90).
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
    parser.add_argument("--calls", type=int, default=24, help="timed calls of 32 prompts each (256 rows cycle)")
    parser.add_argument("--json", help="append one JSON line with this run's figures to FILE")
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
    tokens, seconds, per_call, digest = 0, 0.0, [], hashlib.sha256()
    for call in range(args.calls):
        batch = prompts[(32 * call) % len(prompts) :][:32]
        started = time.perf_counter()
        groups = engine.generate(batch, SamplingSettings(8, args.max_new_tokens, 1.0, seed=call + 1))
        elapsed = time.perf_counter() - started
        seconds += elapsed
        n = sum(len(c.token_ids) for group in groups for c in group)
        tokens += n
        per_call.append(round(n / elapsed))
        for group in groups:
            for c in group:
                digest.update(repr(c.token_ids).encode())
    figure = dict(engine=args.engine, max_new_tokens=args.max_new_tokens, calls=args.calls, tokens=tokens,
                  seconds=round(seconds, 3), tokens_per_s=round(tokens / seconds), tokens_digest=digest.hexdigest()[:16])
    print(f"{args.engine}: {tokens / seconds:.0f} tokens/s ({tokens} tokens in {seconds:.2f} s, "
          f"digest {figure['tokens_digest']})")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(dict(figure, per_call_tokens_per_s=per_call)) + "\n")
    if hasattr(engine, "shutdown"):
        engine.shutdown()


if __name__ == "__main__":
    main()
