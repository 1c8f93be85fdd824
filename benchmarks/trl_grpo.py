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

For the real model's race (benchmarks/real_model_race.py): `--reward gsm8k` (grpo-ray's file again),
`--eval-prompts FILE --eval-every K` evaluates greedy held-out accuracy before the first step and
after every K-th, as grpo-ray's runs do (batched generate of `--eval-new-tokens`), each with the
wall seconds since `--clock-start` (the launch of this process, start-up included, as grpo-ray's
run is timed from its launch), and `--lora R` trains a LoRA adapter of rank R (alpha 2R, on the attention and MLP
projections, as grpo-ray's model.lora) instead of every weight.
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

STARTED = time.time()  # the race's clock (start-up included): this process's start, or --clock-start
REWARDS = Path(__file__).resolve().parents[1] / "grpo_ray" / "rewards"


# grpo-ray's reward functions this script can score with, and the file of grpo_ray/rewards/ each is in.
REWARD_FILES = {"exact_match": "exact_match", "gsm8k": "gsm8k", "first_number": "gsm8k"}


def load_reward(name: str):
    """grpo-ray's reward function `name` from its own file (exact_match.py, gsm8k.py)."""
    spec = importlib.util.spec_from_file_location(f"grpo_ray_{name}", REWARDS / f"{REWARD_FILES[name]}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


class HeldOut(TrainerCallback):
    """Greedy held-out accuracy at the start and every `every` steps: [(seconds since the process
    started, step, accuracy)], in batches of `batch` prompts of `new_tokens` new tokens."""

    def __init__(self, rows, tokenizer, score, every: int, new_tokens: int, clock_start: float, batch: int = 50):
        self.rows, self.tokenizer, self.score, self.clock_start = rows, tokenizer, score, clock_start
        self.every, self.new_tokens, self.batch = every, new_tokens, batch
        self.curve: list[tuple[float, int, float]] = []
        self.seconds = 0.0  # spent evaluating

    def evaluate(self, model, step: int) -> None:
        started = time.perf_counter()
        was_training = model.training
        model.eval()
        texts = []
        with torch.no_grad():
            for i in range(0, len(self.rows), self.batch):
                prompts = [row["prompt"] for row in self.rows[i : i + self.batch]]
                # The tokenizer's defaults, as GRPOTrainer tokenises a text prompt for its rollouts.
                encoded = self.tokenizer(prompts, return_tensors="pt", padding=True)
                encoded = encoded.to(model.device)
                out = model.generate(**encoded, max_new_tokens=self.new_tokens, do_sample=False)
                texts += self.tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
        model.train(was_training)
        scores = self.score(texts, [r["prompt"] for r in self.rows], [r["answer"] for r in self.rows])
        accuracy = sum(s or 0.0 for s in scores) / len(scores)
        self.seconds += time.perf_counter() - started
        self.curve.append((time.time() - self.clock_start, step, accuracy))
        print(f"trl step {step}: held-out accuracy {accuracy:.3f} at {self.curve[-1][0]:.0f} s", flush=True)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.evaluate(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.evaluate(model, state.global_step)


def grpo_config(
    output_dir: str, steps: int, micro_batch: int, accumulation: int, generations: int, max_new_tokens: int,
    lr: float, temperature: float = 1.0, seed: int = 0, gpu: bool = False, **extra,
) -> GRPOConfig:  # fmt: skip
    """TRL's settings for grpo-ray's recipes: one generation batch of micro_batch x accumulation
    completions per optimizer step, trained in micro-batches, as grpo-ray does; no KL (no reference
    model), token-mean loss, std-normalised group advantages, symmetric clip 0.2, one pass per batch,
    a constant learning rate, gradient norm clip 1. `extra`: more GRPOConfig fields."""
    return GRPOConfig(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        num_generations=generations,
        max_completion_length=max_new_tokens,
        temperature=temperature,
        top_p=1.0,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        num_iterations=1,
        use_cpu=not gpu,
        bf16=gpu,
        seed=seed,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **extra,
    )


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
    parser.add_argument("--reward", choices=[*REWARD_FILES, "length"], default="exact_match")
    parser.add_argument("--target-chars", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--eval-prompts", default=None, help="JSONL rows {prompt, answer}, chat-templated")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-new-tokens", type=int, default=16)
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--clock-start", type=float, default=STARTED, help="the curve's time 0 (unix seconds)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines()]
    dataset = Dataset.from_list(rows)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if args.gpu else torch.float32)
    score = load_reward(args.reward) if args.reward != "length" else None
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=args.lora,
            lora_alpha=2 * args.lora,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            task_type="CAUSAL_LM",
        )

    def reward(prompts, completions, answer, **_):
        if args.reward == "length":
            return [-abs(len(c) - args.target_chars) for c in completions]
        return score(completions, prompts, answer)

    completions_per_step = args.prompts_per_step * args.generations
    accumulation = completions_per_step // args.micro_batch
    config = grpo_config(
        args.output_dir, args.steps, args.micro_batch, accumulation, args.generations, args.max_new_tokens,
        args.lr, args.temperature, args.seed, args.gpu,
        **(
            dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization)
            if args.gpu
            else {}
        ),
    )  # fmt: skip
    clock = StepClock()
    callbacks = [clock]
    held_out = None
    if args.eval_prompts:
        eval_rows = [json.loads(line) for line in Path(args.eval_prompts).read_text().splitlines()]
        held_out = HeldOut(eval_rows, tokenizer, score, args.eval_every, args.eval_new_tokens, args.clock_start)
        callbacks.append(held_out)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=peft_config,
    )
    # The token ids TRL's own rollout path makes of the first prompt (GRPOTrainer._tokenize_prompts,
    # private in TRL 1.16): what its model is sampled from, for the race to compare with grpo-ray's.
    first_prompt_ids = [int(i) for i in trainer._tokenize_prompts([rows[0]["prompt"]])[0][0]]
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    steady = clock.seconds[args.warmup_steps :] or clock.seconds
    # The step's clock stops before the held-out evaluation (callbacks run in order): not in the rate.
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
        "rewards": rewards,
        "curve": held_out.curve if held_out else None,
        "lora": args.lora,
        "first_prompt_ids": first_prompt_ids,
    }
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
