"""Learner update seconds on a long-tailed length mix: row-count micro-batches against packing and
token-budget micro-batches, with the updates compared.

    python benchmarks/learner_long_tail.py [--json benchmarks/results/learner_long_tail.json]
    python benchmarks/learner_long_tail.py --shape qwen2.5-0.5b --tokenizer DIR   # on a GPU: tokens/s, MFU

Each variant runs in its own process (a LearnerWorker: DeepSpeed, ZeRO 0, one rank, no Ray) from
the same random weights on the same batch: `--rows` rows of `--prompt-tokens` prompt tokens whose
completions are long-tailed (a `--long-fraction` of rows draw 3/4 to all of `--long-tokens`, the
rest 1/4 to all of `--short-tokens`). It times `--steps` train_steps after a first one, and saves the
parameters after that first step, which are then compared with the first variant's (same update
to float rounding, or the speed is not worth having).

The CPU shape is a Qwen2 with Qwen2's 151,936-token vocabulary, 128 wide and 4 layers deep, float32:
small enough for 2 cores, with the LM head that makes padding expensive. `--shape qwen2.5-0.5b`
takes Qwen2.5-0.5B's config (bf16 on a GPU) and also reports tokens/s (real tokens, forward and
backward) and MFU by PaLM's count over the real tokens (benchmarks/gpu_throughput.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_throughput import QWEN25_05B, device_name, matmul_parameters, peak_flops, synchronize  # noqa: E402

from grpo_ray.actors.learner import LearnerSettings, LearnerWorker  # noqa: E402
from grpo_ray.models.loading import load_tokenizer  # noqa: E402
from grpo_ray.transport.broadcast import free_port  # noqa: E402
from grpo_ray.types import LearnerShard, RolloutSlice  # noqa: E402

QWEN2_TOKENIZER = "/work/shared/tokenizers/qwen2"
CPU_SHAPE = dict(
    vocab_size=151936,
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    hidden_act="silu",
)
# name -> learner settings; the first is today's default (the reference for the comparison).
VARIANTS = {
    "rows (today)": {},
    "token budget": {"max_tokens_per_micro_batch": None},
    "packing": {"packing": True},
    "packing + token budget": {"packing": True, "max_tokens_per_micro_batch": None},
    # liger-kernel's fused LM head (GPU only: on a CPU the learner says so and takes the torch path).
    "packing + token budget + liger": {"packing": True, "max_tokens_per_micro_batch": None, "logprob_kernel": "liger"},
}


def build_model(shape: str, out_dir: Path, tokenizer_path: str, dtype: torch.dtype) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = load_tokenizer(tokenizer_path)
    fields = QWEN25_05B if shape == "qwen2.5-0.5b" else CPU_SHAPE
    config = Qwen2Config(**fields, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(dtype).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def long_tail_batch(args, vocab: int, pad_id: int) -> tuple[RolloutSlice, np.ndarray]:
    rng = np.random.default_rng(0)
    rows = args.rows
    long = rng.random(rows) < args.long_fraction
    lengths = np.where(
        long,
        rng.integers(args.long_tokens * 3 // 4, args.long_tokens + 1, rows),
        rng.integers(max(1, args.short_tokens // 4), args.short_tokens + 1, rows),
    )
    width = args.prompt_tokens + int(lengths.max())
    ids = np.full((rows, width), pad_id, np.int64)
    attention = np.zeros((rows, width), np.int64)
    completion = np.zeros((rows, width), np.float32)
    prompts = rng.integers(0, vocab, (rows // args.samples, args.prompt_tokens))
    for row, length in enumerate(lengths):
        end = args.prompt_tokens + int(length)
        ids[row, : args.prompt_tokens] = prompts[row // args.samples]
        ids[row, args.prompt_tokens : end] = rng.integers(0, vocab, int(length))
        attention[row, :end] = 1
        completion[row, args.prompt_tokens : end] = 1
    batch = RolloutSlice(
        group_ids=np.arange(rows) // args.samples,
        prompt_uids=np.arange(rows) // args.samples,
        input_ids=ids,
        attention_mask=attention,
        completion_mask=completion,
        rollout_logprobs=(-rng.random((rows, width)) * completion).astype(np.float32),
        prompts=[""] * rows,
        completions=[""] * rows,
        answers=[""] * rows,
        finish_reasons=["stop"] * rows,
        row_fields={},
        policy_versions=np.zeros(rows, np.int64),
        group_diversity=np.full(rows, np.nan),
    )
    return batch, rng.standard_normal(rows).astype(np.float32)


def lora_settings(rank: int) -> dict:
    """LoRA r`rank` on q/k/v/o (alpha 2r), the base frozen; 0: full fine-tuning."""
    if not rank:
        return {}
    return {
        "lora_enabled": True,
        "lora_rank": rank,
        "lora_alpha": 2.0 * rank,
        "lora_target_modules": ("q_proj", "k_proj", "v_proj", "o_proj"),
    }


def run_variant(args, name: str, model_dir: Path, dtype: str, out: Path) -> dict:
    """In this process: one warm step (its parameters saved), then `--steps` timed ones."""
    overrides = {k: (args.max_tokens if v is None else v) for k, v in VARIANTS[name].items()}
    settings = LearnerSettings(
        model_path=str(model_dir),
        tokenizer_path=str(model_dir),
        dtype=dtype,
        seed=0,
        zero_stage=0,
        micro_batch_size=args.micro_batch,
        grad_accum_steps=args.rows // args.micro_batch,
        lr=1e-5,
        weight_decay=0.0,
        betas=(0.9, 0.999),
        grad_clip=1.0,
        torch_threads=args.threads,
        clip_low=0.2,
        clip_high=0.28,
        kl_coef=0.0,
        kl_estimator="k3",
        entropy_coef=0.0,
        loss_aggregation="token-mean",
        logprob_chunk_tokens=512,
        **lora_settings(args.lora),
        **overrides,
    )
    learner = LearnerWorker(settings, rank=0, world_size=1)
    learner.setup("127.0.0.1", free_port())
    batch, advantages = long_tail_batch(args, learner.module.config.vocab_size, learner.tokenizer.pad_token_id)
    shard = LearnerShard(
        step=1,
        advantages=[advantages],
        row_weights=[np.ones(args.rows, np.float32)],
        global_tokens=float(batch.completion_mask.sum()),
        global_sequences=args.rows,
        temperature=1.0,
        norm_length=float(args.long_tokens),
    )
    started = time.perf_counter()
    learner.train_step(shard, batch)
    synchronize()
    first = time.perf_counter() - started
    np.savez(out, **learner.parameters_snapshot())
    seconds = []
    for _ in range(args.steps):
        started = time.perf_counter()
        stats = learner.train_step(shard, batch)
        synchronize()
        seconds.append(time.perf_counter() - started)
    real = int(batch.attention_mask.sum())
    result = {
        "first_step_s": first,
        "update_s": float(np.median(seconds)),
        "steps_s": seconds,
        "real_tokens": real,
        "tokens_counted": stats.num_tokens,
        "trainable": trainable_dtypes(learner.module),
    }
    if args.profile:
        result["profile_top"] = profile_step(lambda: learner.train_step(shard, batch), args.profile)
    peak = peak_flops()
    if peak:
        config = learner.module.config
        mean_len = real / args.rows
        flops = 6 * matmul_parameters(learner.module) + 12 * config.num_hidden_layers * config.hidden_size * mean_len
        result["tokens_per_s"] = real / result["update_s"]
        result["mfu"] = flops * result["tokens_per_s"] / peak
    return result


def trainable_dtypes(module: torch.nn.Module) -> dict[str, int]:
    """Trainable parameters (elements) by dtype: an adapter left in float32 under bf16 compute shows here."""
    counts: dict[str, int] = {}
    for param in module.parameters():
        if param.requires_grad:
            counts[str(param.dtype)] = counts.get(str(param.dtype), 0) + param.numel()
    return counts


def profile_step(step, top: int) -> list[dict]:
    """One more step under torch.profiler: the `top` operators by their own time on the device (the
    CPU without a GPU), to see where a variant's time goes (issue 35: why LoRA's update is slower)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        step()
        synchronize()
    key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
    return [{"op": e.key, "self_ms": getattr(e, key) / 1e3, "calls": e.count} for e in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["cpu-small", "qwen2.5-0.5b"], default="cpu-small")
    parser.add_argument("--tokenizer", default=QWEN2_TOKENIZER, help="a Qwen2 tokenizer folder")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8, help="rows per prompt")
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per micro-batch (today's batching)")
    parser.add_argument("--max-tokens", type=int, default=2048, help="learner.max_tokens_per_micro_batch")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--short-tokens", type=int, default=48)
    parser.add_argument("--long-tokens", type=int, default=256)
    parser.add_argument("--long-fraction", type=float, default=0.125)
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the first")
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank on q/k/v/o; 0: full fine-tuning")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", type=int, default=0, help="profile one more step: its N costliest operators")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, first is the reference")
    parser.add_argument("--json", default=None)
    parser.add_argument("--run-one", default=None, help=argparse.SUPPRESS)  # internal: one variant here
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    if args.run_one:
        result = run_variant(args, args.run_one, Path(args.model_dir), dtype, Path(args.out))
        Path(args.out).with_suffix(".json").write_text(json.dumps(result))
        return
    names = args.variants.split(",")
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "device": device_name(),
        "shape": args.shape,
        "dtype": dtype,
        "torch": torch.__version__,
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("json", "run_one", "model_dir", "out", "variants")
        },
        "variants": {},
    }
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / "model"
        build_model(args.shape, model_dir, args.tokenizer, getattr(torch, dtype))
        forwarded = [a for a in sys.argv[1:] if not a.startswith("--json")]
        if "--json" in sys.argv:
            at = sys.argv.index("--json")
            forwarded = sys.argv[1:at] + sys.argv[at + 2 :]
        for index, name in enumerate(names):
            out = Path(scratch) / f"params{index}.npz"
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    *forwarded,
                    "--run-one",
                    name,
                    "--model-dir",
                    str(model_dir),
                    "--out",
                    str(out),
                ],
                check=True,
            )
            result = json.loads(out.with_suffix(".json").read_text())
            params, reference = np.load(out), np.load(Path(scratch) / "params0.npz")
            result["max_abs_param_diff_vs_first"] = max(
                float(np.abs(params[k] - reference[k]).max()) for k in params.files
            )
            result["speedup_vs_first"] = (
                results["variants"][names[0]]["update_s"] / result["update_s"] if index else 1.0
            )
            results["variants"][name] = result
            print(name, json.dumps(result), flush=True)
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
