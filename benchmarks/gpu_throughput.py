"""Learner tokens/s and MFU, and hf-backend rollout tokens/s, of a Qwen2.5-0.5B-shaped model.

    python benchmarks/gpu_throughput.py --tokenizer PATH [--json OUT.json]

The model is built from Qwen2.5-0.5B's config with random weights (no hub download), saved as a
Hugging Face folder in bfloat16, and run through grpo-ray's own parts, without Ray:

- learner: `LearnerWorker` (a DeepSpeed engine, ZeRO stage 0 on one device) doing its GRPO
  `train_step` on `--rows` rows of `--prompt-tokens` + `--completion-tokens` random tokens, in
  micro-batches of `--micro-batch`. Timed over `--steps` steps after one warm-up step.
  tokens/s counts every token through forward and backward. MFU is the model FLOPs per second over
  the device's dense bf16 peak, with PaLM's count: 6 x (matmul parameters) + 12 x layers x hidden x
  sequence length FLOPs per token, the LM head counted and the embedding lookup not.
- rollout: `HFEngine.generate` (the `hf` backend) of `--samples` completions for each of
  `--rollout-prompts` prompts of `--prompt-tokens` tokens, up to `--new-tokens` new tokens,
  temperature 1. tokens/s counts generated tokens. Timed after a short warm-up generate.

`--shape tiny` runs the same on the project's tiny model (a quick check of the script on a CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_ray.actors.hf_engine import HFEngine  # noqa: E402
from grpo_ray.actors.learner import LearnerSettings, LearnerWorker  # noqa: E402
from grpo_ray.transport.broadcast import free_port  # noqa: E402
from grpo_ray.models.loading import load_tokenizer  # noqa: E402
from grpo_ray.types import LearnerShard, RolloutSlice, SamplingSettings  # noqa: E402

# Qwen/Qwen2.5-0.5B's config.json (the fields that shape the compute).
QWEN25_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
)
# Dense bf16 peak TFLOP/s by device name (NVIDIA's data sheets, SXM parts, no sparsity).
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.05, "A10G": 125.0}


def build_model(shape: str, out_dir: Path, tokenizer_path: str) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if shape == "tiny":
        from grpo_ray.models.tiny import ensure_tiny_artifacts

        return ensure_tiny_artifacts().model_dir
    tokenizer = load_tokenizer(tokenizer_path)
    config = Qwen2Config(**QWEN25_05B, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters that multiply activations: all but the embedding table, plus the LM head."""
    embed = model.get_input_embeddings().weight
    body = sum(p.numel() for p in model.parameters() if p is not embed)
    return body + model.get_output_embeddings().weight.numel()


def random_slice(rows: int, prompt_tokens: int, completion_tokens: int, vocab: int, rng) -> RolloutSlice:
    width = prompt_tokens + completion_tokens
    completion = np.zeros((rows, width), np.float32)
    completion[:, prompt_tokens:] = 1.0
    return RolloutSlice(
        group_ids=np.arange(rows) // 8,
        prompt_uids=np.arange(rows) // 8,
        input_ids=rng.integers(0, vocab, (rows, width)).astype(np.int64),
        attention_mask=np.ones((rows, width), np.int64),
        completion_mask=completion,
        rollout_logprobs=(-rng.random((rows, width)) * completion).astype(np.float32),
        prompts=[""] * rows,
        completions=[""] * rows,
        answers=[""] * rows,
        finish_reasons=["length"] * rows,
        row_fields={},
        policy_versions=np.zeros(rows, np.int64),
        group_diversity=np.full(rows, np.nan),
    )


def learner_throughput(args, model_dir: Path, dtype: str) -> dict:
    settings = LearnerSettings(
        model_path=str(model_dir),
        tokenizer_path=str(model_dir),
        dtype=dtype,
        seed=0,
        zero_stage=0,
        micro_batch_size=args.micro_batch,
        grad_accum_steps=args.rows // args.micro_batch,
        lr=1e-6,
        weight_decay=0.0,
        betas=(0.9, 0.999),
        grad_clip=1.0,
        torch_threads=4,
        clip_low=0.2,
        clip_high=0.28,
        kl_coef=0.0,
        kl_estimator="k3",
        entropy_coef=0.0,
        loss_aggregation="token-mean",
        gradient_checkpointing=args.gradient_checkpointing,
    )
    learner = LearnerWorker(settings, rank=0, world_size=1)
    learner.setup("127.0.0.1", free_port())
    vocab = learner.module.config.vocab_size
    rng = np.random.default_rng(0)
    batch = random_slice(args.rows, args.prompt_tokens, args.completion_tokens, vocab, rng)
    shard = LearnerShard(
        step=1,
        advantages=[rng.standard_normal(args.rows).astype(np.float32)],
        row_weights=[np.ones(args.rows, np.float32)],
        global_tokens=float(batch.completion_mask.sum()),
        global_sequences=args.rows,
        temperature=1.0,
        norm_length=float(args.completion_tokens),
    )
    learner.train_step(shard, batch)  # warm-up: kernels chosen, allocator grown
    synchronize()
    started = time.perf_counter()
    tokens = sum(learner.train_step(shard, batch).num_tokens for _ in range(args.steps))
    synchronize()
    seconds = (time.perf_counter() - started) / args.steps
    tokens_per_step = tokens / args.steps
    config = learner.module.config
    sequence = args.prompt_tokens + args.completion_tokens
    flops_per_token = (
        6 * matmul_parameters(learner.module) + 12 * config.num_hidden_layers * config.hidden_size * sequence
    )
    achieved = flops_per_token * tokens_per_step / seconds
    peak = peak_flops()
    return {
        "learner_seconds_per_step": seconds,
        "learner_tokens_per_s": tokens_per_step / seconds,
        "learner_tflops": achieved / 1e12,
        "learner_mfu": achieved / peak if peak else None,
        "learner_peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "parameters": sum(p.numel() for p in learner.module.parameters()),
    }


def rollout_throughput(args, model_dir: Path, dtype: str) -> dict:
    engine = HFEngine(str(model_dir), load_tokenizer(str(model_dir)), dtype=dtype)
    rng = np.random.default_rng(1)
    vocab = engine.model.config.vocab_size
    prompts = [tuple(int(t) for t in rng.integers(0, vocab, args.prompt_tokens)) for _ in range(args.rollout_prompts)]
    engine.generate(prompts[:2], SamplingSettings(samples_per_prompt=2, max_new_tokens=8, temperature=1.0))
    synchronize()
    sampling = SamplingSettings(
        samples_per_prompt=args.samples, max_new_tokens=args.new_tokens, temperature=1.0, seed=1
    )
    started = time.perf_counter()
    groups = engine.generate(prompts, sampling)
    synchronize()
    seconds = time.perf_counter() - started
    generated = sum(len(c.token_ids) for group in groups for c in group)
    return {
        "rollout_backend": "hf",
        "rollout_seconds": seconds,
        "rollout_generated_tokens": generated,
        "rollout_tokens_per_s": generated / seconds,
        "rollout_rows": args.rollout_prompts * args.samples,
    }


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def peak_flops() -> float | None:
    name = device_name()
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["qwen2.5-0.5b", "tiny"], default="qwen2.5-0.5b")
    parser.add_argument("--tokenizer", default=None, help="a Qwen2 tokenizer folder (for qwen2.5-0.5b)")
    parser.add_argument("--rows", type=int, default=64, help="learner rows per step")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--completion-tokens", type=int, default=768)
    parser.add_argument("--steps", type=int, default=5, help="timed learner steps")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--rollout-prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--skip-rollout", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.rows % args.micro_batch:
        parser.error("--rows must be a multiple of --micro-batch")
    if args.shape != "tiny" and not args.tokenizer:
        parser.error("--tokenizer is needed for --shape qwen2.5-0.5b (e.g. a Qwen2 tokenizer folder)")
    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_model(args.shape, Path(scratch) / "model", args.tokenizer)
        results = {
            "device": device_name(),
            "shape": args.shape,
            "dtype": dtype,
            "torch": torch.__version__,
            "settings": {k: v for k, v in vars(args).items() if k not in ("json", "tokenizer")},
        }
        results.update(learner_throughput(args, model_dir, dtype))
        print(json.dumps(results, indent=1), flush=True)
        if not args.skip_rollout:
            results.update(rollout_throughput(args, model_dir, dtype))
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
