"""TRL's GRPOTrainer on the tiny task: the other side of benchmarks/side_by_side.py.

Runs in benchmarks/.venv-trl (bash benchmarks/setup_trl.sh), never in grpo-ray's environment.
side_by_side.py writes the prompts (chat template applied, the very token ids grpo-ray samples
from) and passes the model folder and the settings grpo-ray runs with; the reward is grpo-ray's
exact_match, loaded from its file so that this environment needs nothing of grpo-ray's.

    benchmarks/.venv-trl/bin/python benchmarks/trl_grpo.py --model DIR --prompts FILE.jsonl --json OUT.json

On a GPU (benchmarks/gpu_e2e.py): `--gpu` trains in bf16 with vLLM colocated in the trainer's
process (`use_vllm=True, vllm_mode="colocate"`, TRL's one-GPU setup), and `--reward length` scores
with TRL's tl;dr length reward (-|characters - target|), which a random model's completions
differ on, where exact match scores them all 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

EXACT_MATCH = Path(__file__).resolve().parents[1] / "grpo_ray" / "rewards" / "exact_match.py"


def load_exact_match():
    spec = importlib.util.spec_from_file_location("grpo_ray_exact_match", EXACT_MATCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.exact_match


class StepClock(TrainerCallback):
    """Wall seconds of every optimizer step (generation, scoring and update: TRL does all three
    inside the step)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._started = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the tiny model's folder (model and tokenizer)")
    parser.add_argument("--prompts", required=True, help="JSONL rows {prompt, answer}: prompt is chat-templated text")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=5, help="steps left out of the rate")
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=5)
    parser.add_argument("--micro-batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="/tmp/trl-grpo-bench")
    parser.add_argument("--json", required=True)
    parser.add_argument("--gpu", action="store_true", help="bf16 on the GPU, vLLM colocated")
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--reward", choices=["exact_match", "length"], default="exact_match")
    parser.add_argument("--target-chars", type=int, default=100)
    args = parser.parse_args()

    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines()]
    dataset = Dataset.from_list(rows)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if args.gpu else torch.float32)
    exact_match = load_exact_match()

    def reward(prompts, completions, answer, **_):
        if args.reward == "length":
            return [-abs(len(c) - args.target_chars) for c in completions]
        return exact_match(completions, prompts, answer)

    completions_per_step = args.prompts_per_step * args.generations
    accumulation = completions_per_step // args.micro_batch
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.steps,
        # One generation batch of prompts_per_step x G completions per optimizer step, trained in
        # micro-batches, as grpo-ray does.
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        num_generations=args.generations,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        # grpo-ray's tiny recipe: no KL (no reference model), token-mean loss, std-normalised
        # group advantages, symmetric clip 0.2, one pass per batch.
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        num_iterations=1,
        use_cpu=not args.gpu,
        bf16=args.gpu,
        **(
            dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization)
            if args.gpu
            else {}
        ),
        seed=args.seed,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    steady = clock.seconds[args.warmup_steps :] or clock.seconds
    seconds_per_step = sum(steady) / len(steady)
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    result = {
        "trl_version": __import__("trl").__version__,
        "device": torch.cuda.get_device_name() if args.gpu else "cpu",
        "phases_note": "TRL generates, scores and updates inside one step: no per-phase split",
        "torch_threads": torch.get_num_threads(),
        "steps": len(clock.seconds),
        "seconds_per_step": seconds_per_step,
        "samples_per_s": completions_per_step / seconds_per_step,
        "wall_seconds": wall,
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
    }
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
