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


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and each of its child processes, by name
    (vLLM names its engine core and worker processes), to tell where a run's time goes."""
    import psutil

    me = psutil.Process()
    seconds = {}
    for index, process in enumerate([me, *me.children(recursive=True)]):
        try:
            times, name = process.cpu_times(), ("frontend" if index == 0 else process.name())
        except psutil.NoSuchProcess:
            continue
        seconds[name] = seconds.get(name, 0.0) + times.user + times.system
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=["hf", "vllm"])
    parser.add_argument("--max-new-tokens", default="5", help="one or more, comma-separated: a sweep in one process")
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
    for max_new_tokens in [int(n) for n in args.max_new_tokens.split(",")]:
        measure(engine, prompts, max_new_tokens, args)
    if hasattr(engine, "shutdown"):
        engine.shutdown()


def measure(engine, prompts, max_new_tokens: int, args) -> None:
    engine.generate(prompts[:32], SamplingSettings(8, max_new_tokens, 1.0, seed=0))  # warm-up
    cpu_before = cpu_seconds()
    tokens, seconds, per_call, digest = 0, 0.0, [], hashlib.sha256()
    for call in range(args.calls):
        batch = prompts[(32 * call) % len(prompts) :][:32]
        started = time.perf_counter()
        groups = engine.generate(batch, SamplingSettings(8, max_new_tokens, 1.0, seed=call + 1))
        elapsed = time.perf_counter() - started
        seconds += elapsed
        n = sum(len(c.token_ids) for group in groups for c in group)
        tokens += n
        per_call.append(round(n / elapsed))
        for group in groups:
            for c in group:
                digest.update(repr(c.token_ids).encode())
    cpu = {name: round(t - cpu_before.get(name, 0.0), 2) for name, t in cpu_seconds().items()}
    figure = dict(
        engine=args.engine,
        max_new_tokens=max_new_tokens,
        calls=args.calls,
        tokens=tokens,
        seconds=round(seconds, 3),
        tokens_per_s=round(tokens / seconds),
        tokens_digest=digest.hexdigest()[:16],
        cpu_seconds=cpu,
    )
    print(
        f"{args.engine} {max_new_tokens}: {tokens / seconds:.0f} tokens/s ({tokens} tokens in {seconds:.2f} s, "
        f"digest {figure['tokens_digest']}; CPU s by process: {cpu})"
    )
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(dict(figure, per_call_tokens_per_s=per_call)) + "\n")


if __name__ == "__main__":
    main()
