"""Where an update's time goes on Gemma 3 270M (a 262,144-token vocabulary), grpo-ray beside TRL, on
the same batch: body, LM head, the input embedding's gradient, the optimizer.

    bash scripts/setup.sh --gemma3 && bash benchmarks/setup_trl.sh
    .venv/bin/python benchmarks/update_split.py --json benchmarks/results/update_split_gemma3.json
    .venv/bin/python benchmarks/update_split.py --rows 4 --micro-batch 2 --warmup 0 --repeats 1   # a smoke check

The batch is one step of configs/gemma3-arithmetic.yaml: the first `--rows / --samples` training
prompts (tokenised as grpo-ray samples from them: <bos> and the text, 51 tokens), each with
`--samples` completions of the recipe's max_new_tokens (8) seeded random tokens (the base model
rarely stops sooner: its answer runs on into the next "Question:"), and seeded standard-normal
advantages. It is written once to a file that both sides read, so both train on the same token
ids, masks and advantages, in micro-batches of `--micro-batch` rows (the recipe's 16), then one
optimizer step.

Each side runs alone, in its own process, one after the other, on `--threads` torch threads:

- grpo-ray (.venv): its LearnerWorker without Ray, the recipe's learner settings (DeepSpeed's
  engine, ZeRO 0, one rank), doing `train_step` as a run does;
- TRL (benchmarks/.venv-trl): a GRPOTrainer with benchmarks/trl_grpo.py's settings for the recipe
  (dapo = token-mean, clip 0.2, no KL, one pass), its own `training_step` per micro-batch (its
  rollout buffer bypassed: the micro-batches are the inputs `_generate_and_score_completions` would
  have made), then what its Trainer does at the accumulation boundary: clip, optimizer.step(),
  the scheduler's step, zero_grad.

Hooks on both models split each update the same way (benchmarks/update_phases.py); the medians of
`--repeats` updates after `--warmup` are reported, with each process's peak resident memory, as
JSON (`--json`) and a table beside it (.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from update_phases import PHASES, PhaseClock, measure, medians, peak_rss_mb

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRL_PYTHON = HERE / ".venv-trl" / "bin" / "python"
RECIPE = ROOT / "configs" / "gemma3-arithmetic.yaml"
MODEL = "gemma3-270m"


def build_batch(args, path: Path) -> None:
    """The shared batch (grpo-ray's venv: its data loader and tokenizer make the prompts)."""
    import numpy as np

    from grpo_ray.config import load_config
    from grpo_ray.data.loaders import load_rows
    from grpo_ray.data.prompts import tokenize_prompts
    from grpo_ray.models.loading import load_tokenizer, resolve_model_path

    cfg = load_config(RECIPE)
    tokenizer = load_tokenizer(MODEL)
    prompts = args.rows // args.samples
    rows, _ = load_rows(cfg.data.train_files[0])
    found = tokenize_prompts(rows[:prompts], tokenizer, cfg.data.max_prompt_tokens, cfg.data.apply_chat_template)
    rng = np.random.default_rng(0)
    width = cfg.rollout.max_new_tokens
    # Ordinary text tokens (Gemma's ids below ~1000 are special and unused ones).
    completions = rng.integers(1000, len(tokenizer), (args.rows, width))
    advantages = rng.standard_normal(args.rows).astype(np.float32)
    batch = {
        "model_dir": resolve_model_path(MODEL),
        "samples": args.samples,
        "max_new_tokens": width,
        "lr": cfg.learner.lr,
        "rows": [
            {
                "prompt_ids": list(found.prompts[row // args.samples].token_ids),
                "completion_ids": [int(t) for t in completions[row]],
                "advantage": float(advantages[row]),
            }
            for row in range(args.rows)
        ],
    }
    path.write_text(json.dumps(batch))


def grpo_ray_side(batch: dict, args) -> dict:
    """grpo-ray's LearnerWorker (no Ray) doing train_step on the batch, split by hooks."""
    import deepspeed
    import numpy as np
    import transformers

    from grpo_ray.actors.learner import LearnerWorker
    from grpo_ray.cluster.settings import learner_settings
    from grpo_ray.config import load_config, plan_batches
    from grpo_ray.models.lm_head import plain_lm_head
    from grpo_ray.transport.broadcast import free_port
    from grpo_ray.types import LearnerShard, RolloutSlice

    rows, samples = batch["rows"], batch["samples"]
    sets = [
        f"train.prompts_per_step={len(rows) // samples}",
        f"rollout.samples_per_prompt={samples}",
        f"learner.micro_batch_size={args.micro_batch}",
        f"learner.torch_threads={args.threads}",
    ]
    cfg = load_config(RECIPE, sets)
    settings = learner_settings(cfg, plan_batches(cfg))
    learner = LearnerWorker(settings, rank=0, world_size=1)
    learner.setup("127.0.0.1", free_port())
    pad = learner.tokenizer.pad_token_id
    width = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    ids = np.full((len(rows), width), pad, np.int64)
    attention = np.zeros((len(rows), width), np.int64)
    completion = np.zeros((len(rows), width), np.float32)
    for i, r in enumerate(rows):  # right-padded, as the rollout packs rows
        p, c = len(r["prompt_ids"]), len(r["completion_ids"])
        ids[i, : p + c] = r["prompt_ids"] + r["completion_ids"]
        attention[i, : p + c] = 1
        completion[i, p : p + c] = 1
    n = len(rows)
    rollout = RolloutSlice(
        group_ids=np.arange(n) // samples,
        prompt_uids=np.arange(n) // samples,
        input_ids=ids,
        attention_mask=attention,
        completion_mask=completion,
        rollout_logprobs=np.zeros((n, width), np.float32),
        prompts=[""] * n,
        completions=[""] * n,
        answers=[""] * n,
        finish_reasons=["length"] * n,
        row_fields={},
        policy_versions=np.zeros(n, np.int64),
        group_diversity=np.full(n, np.nan),
    )
    shard = LearnerShard(
        step=1,  # the learner holds version 0: every row on-policy
        advantages=[np.array([r["advantage"] for r in rows], np.float32)],
        row_weights=[np.ones(n, np.float32)],
        global_tokens=float(completion.sum()),
        global_sequences=n,
        temperature=cfg.rollout.temperature,
        norm_length=float(cfg.rollout.max_new_tokens),
    )
    model = learner.module
    clock = PhaseClock(model, model.model.norm, model.get_input_embeddings())
    clock.wrap(learner.engine, "backward", "backward")
    clock.wrap(learner.engine, "step", "step")
    updates = measure(clock, lambda: learner.train_step(shard, rollout), args.warmup, args.repeats)
    optimizer = learner.engine.optimizer
    d = optimizer.defaults
    head = plain_lm_head(learner.engine)
    return {
        "updates": updates,
        "median_s": medians(updates),
        "peak_rss_mb": peak_rss_mb(),
        "optimizer": (
            f"{type(optimizer).__name__} (a torch.optim.AdamW: grpo_ray/actors/deepspeed_setup.py build_optimizer; "
            f"foreach={d['foreach']}, fused={d['fused']}: torch's single-tensor loop on CPU), lr {d['lr']}, "
            f"betas {tuple(d['betas'])}, eps {d['eps']}, weight decay {d['weight_decay']}; stepped by DeepSpeed "
            f"{deepspeed.__version__}'s engine.step (ZeRO {settings.zero_stage}, one rank: gradient clipping at "
            f"{settings.grad_clip}, step, zero_grad) after engine.backward's gradient all-reduce"
        ),
        "head": (
            "grpo_ray/models/chunked_logprobs.py head_logprobs -> chunked_token_stats (_ChunkedHead, "
            f"{settings.logprob_chunk_tokens} positions a chunk) on the completion positions only "
            "(models/loading.py sequence_logprobs' logits_to_keep from the first completion column), "
            "float32 log-probs and entropy"
            if head is not None and settings.logprob_chunk_tokens > 0
            else "the full logits (models/chunked_logprobs.py _logits_stats)"
        ),
        "head_positions_per_update": int(completion.sum()),
        "share_prompts": settings.share_prompts,
        "attention": model.config._attn_implementation,
        "tied_embedding": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
        "threads": torch.get_num_threads(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "deepspeed": deepspeed.__version__,
        },
    }


def trl_inputs(batch: dict, micro: int, pad: int) -> list[dict]:
    """The micro-batches as GRPOTrainer._generate_and_score_completions makes them: prompts
    left-padded, completions right-padded, both to the whole batch's widest, and the batch's
    completion-token count (num_items_in_batch, the dapo loss's normaliser)."""
    rows = batch["rows"]
    prompt_width = max(len(r["prompt_ids"]) for r in rows)
    completion_width = max(len(r["completion_ids"]) for r in rows)
    prompt_ids = torch.full((len(rows), prompt_width), pad, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    completion_ids = torch.full((len(rows), completion_width), pad, dtype=torch.long)
    completion_mask = torch.zeros_like(completion_ids)
    for i, r in enumerate(rows):
        p, c = len(r["prompt_ids"]), len(r["completion_ids"])
        prompt_ids[i, prompt_width - p :] = torch.tensor(r["prompt_ids"])
        prompt_mask[i, prompt_width - p :] = 1
        completion_ids[i, :c] = torch.tensor(r["completion_ids"])
        completion_mask[i, :c] = 1
    advantages = torch.tensor([r["advantage"] for r in rows], dtype=torch.float32)
    items = completion_mask.sum()
    return [
        {
            "prompt_ids": prompt_ids[start : start + micro],
            "prompt_mask": prompt_mask[start : start + micro],
            "completion_ids": completion_ids[start : start + micro],
            "completion_mask": completion_mask[start : start + micro],
            "advantages": advantages[start : start + micro],
            "num_items_in_batch": items,
        }
        for start in range(0, len(rows), micro)
    ]


def trl_side(batch: dict, args) -> dict:
    """TRL's GRPOTrainer: its training_step per micro-batch, then its Trainer's boundary step."""
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    from trl_grpo import grpo_config
    from trl.kernels.chunked_logprob import _use_triton
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    torch.set_num_threads(args.threads)
    rows, samples = batch["rows"], batch["samples"]
    tokenizer = AutoTokenizer.from_pretrained(batch["model_dir"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(batch["model_dir"], dtype=torch.float32)
    accumulation = len(rows) // args.micro_batch
    config = grpo_config(  # benchmarks/trl_grpo.py's settings, for the recipe
        tempfile.mkdtemp(prefix="update-split-trl-"), args.warmup + args.repeats, args.micro_batch, accumulation,
        samples, batch["max_new_tokens"], batch["lr"],
    )  # fmt: skip

    def reward(completions, **_):  # never called: no generation here
        return [0.0] * len(completions)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": "unused"}] * len(rows)),
        processing_class=tokenizer,
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=args.warmup + args.repeats)
    # The micro-batches are given: GRPOTrainer._prepare_inputs would generate them (and buffer them).
    trainer._prepare_inputs = lambda inputs: inputs
    trainer.current_gradient_accumulation_steps = accumulation  # as Trainer's loop sets it
    model = trainer.model
    model.train()
    micro_batches = trl_inputs(batch, args.micro_batch, tokenizer.pad_token_id)
    clock = PhaseClock(model, model.model.norm, model.get_input_embeddings())
    clock.wrap(trainer.accelerator, "backward", "backward")

    def update() -> None:
        for inputs in micro_batches:
            trainer.training_step(model, inputs, None)
        # transformers' Trainer._run_epoch at the accumulation boundary.
        clock.mark("step")
        grad_norm = trainer._clip_grad_norm(model)
        trainer._get_grad_norm(model, grad_norm=grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()
        clock.mark("step_done")

    updates = measure(clock, update, args.warmup, args.repeats)
    optimizer = trainer.optimizer
    d = optimizer.defaults
    # Trainer's parameter groups carry args.weight_decay (0 for norms, biases): the defaults' 0.01 is unused.
    decay = sorted({group["weight_decay"] for group in optimizer.param_groups})
    width = max(len(r["prompt_ids"]) for r in rows) + max(len(r["completion_ids"]) for r in rows)
    compact = _use_triton(torch.device("cpu"))
    return {
        "updates": updates,
        "median_s": medians(updates),
        "peak_rss_mb": peak_rss_mb(),
        "optimizer": (
            f"{type(optimizer).__name__} (TrainingArguments.optim {config.optim}: "
            "transformers' Trainer.create_optimizer; "
            f"fused={d.get('fused')}, foreach={d.get('foreach')}), lr {d['lr']}, betas {tuple(d['betas'])}, "
            f"eps {d['eps']}, weight decay {decay}; with Trainer._clip_grad_norm at "
            f"{config.max_grad_norm}, the scheduler's step and model.zero_grad()"
        ),
        "head": (
            "trl/trainer/utils.py add_fused_lm_head -> trl/kernels/chunked_logprob.py ChunkedLogProbFunction "
            f"(vocabulary tiles of {_CHUNKED_LOGPROB_CHUNK_SIZE}, torch ops on CPU: no Triton), called from "
            "GRPOTrainer._get_per_token_logps_and_entropies; "
            + (
                "the completion positions only"
                if compact
                else "every position of each row (it scores only the labelled ones on CUDA/XPU alone)"
            )
            + ", float32 log-probs and entropy"
        ),
        "head_positions_per_update": sum(len(r["completion_ids"]) for r in rows)
        if compact
        else len(rows) * (width - 1),
        "attention": model.config._attn_implementation,
        "tied_embedding": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
        "threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
    }


def run_side(python: Path, side: str, batch_file: Path, args, work: Path) -> dict:
    """One side in its own process (its own venv), alone on the machine."""
    out = work / f"{side}.json"
    command = [str(python), __file__, "--side", side, "--batch", str(batch_file), "--side-json", str(out)]
    command += ["--micro-batch", str(args.micro_batch), "--threads", str(args.threads)]
    command += ["--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    found = json.loads(out.read_text())
    found["process_s"] = time.perf_counter() - started
    return found


def forwards(side: dict) -> str:
    """The model forwards with gradients of each micro-batch (a shared-prompt pass is a second one)."""
    return "/".join(str(n) for n in side["updates"][-1]["forwards"])


def markdown(found: dict) -> str:
    ours, theirs = found["sides"]["grpo-ray"]["median_s"], found["sides"]["TRL"]["median_s"]
    s = found["settings"]
    lines = [
        f"# Where an update's time goes: {found['model']}, grpo-ray beside TRL ({found['date']}, {found['machine']})",
        "",
        f"One update of {s['rows']} completions ({s['rows'] // s['samples']} prompts x {s['samples']}), micro-batches "
        f"of {s['micro_batch']}, {s['threads']} torch threads; median of {s['repeats']} updates after {s['warmup']}.",
        "",
        "| phase | grpo-ray s | TRL s | TRL / grpo-ray |",
        "| --- | --- | --- | --- |",
    ]
    for phase in PHASES:
        a, b = ours[phase], theirs[phase]
        ratio = f"{b / a:.2f}" if abs(a) > 1e-9 else "n/a"
        lines.append(f"| {phase} | {a:.3f} | {b:.3f} | {ratio} |")
    sides = found["sides"]
    lines += [
        f"| peak RSS (MiB) | {sides['grpo-ray']['peak_rss_mb']:.0f} | {sides['TRL']['peak_rss_mb']:.0f} | |",
        f"| LM-head positions scored | {sides['grpo-ray']['head_positions_per_update']} | "
        f"{sides['TRL']['head_positions_per_update']} | |",
        f"| model forwards with gradients, per micro-batch | {forwards(sides['grpo-ray'])} | "
        f"{forwards(sides['TRL'])} | |",
        "",
    ]
    for name, side in sides.items():
        versions = ", ".join(f"{k} {v}" for k, v in side["versions"].items())
        lines += [f"- {name} ({versions}): optimizer {side['optimizer']}; head {side['head']}."]
    lines += ["", found["note"]]
    return "\n".join(lines) + "\n"


NOTE = (
    "Phases (benchmarks/update_phases.py): body = the decoder layers up to the final norm, forward and "
    "backward; head = from the final norm's output to the loss and back (with the head's weight gradient); "
    "embedding gradient = from the gradient's arrival at the input embedding's output to the end of autograd "
    "(the dense vocabulary x hidden gradient, summed into the tied weight); backward epilogue = the framework's "
    "backward call after autograd (grpo-ray: DeepSpeed's gradient all-reduce at the boundary, on one rank too); "
    "optimizer = the step with clipping and zero_grad; other = the rest of the update (grpo-ray: batch assembly, "
    "the no-grad re-scoring of 8 rows for update/moved, metrics; TRL: its metrics' gathers)."
)


def side_main(args) -> None:
    batch = json.loads(Path(args.batch).read_text())
    found = grpo_ray_side(batch, args) if args.side == "grpo-ray" else trl_side(batch, args)
    Path(args.side_json).write_text(json.dumps(found, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="completions in the update (the recipe's 8 x 8)")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt (at most --rows)")
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per micro-batch (the recipe's 16)")
    parser.add_argument("--warmup", type=int, default=1, help="updates left out of the medians")
    parser.add_argument("--repeats", type=int, default=3, help="updates measured")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON)
    parser.add_argument("--json", type=Path, default=None, help="write the result here (and a .md table beside)")
    parser.add_argument("--work", type=Path, default=None, help="keep the batch and sides' files here")
    # One side, in its own venv (run_side's child process).
    parser.add_argument("--side", choices=["grpo-ray", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--batch", help=argparse.SUPPRESS)
    parser.add_argument("--side-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return side_main(args)
    args.samples = min(args.samples, args.rows)
    if args.rows % args.samples or args.rows % args.micro_batch:
        sys.exit("error: --rows must be a multiple of --samples and of --micro-batch")
    if not args.trl_python.is_file():
        sys.exit("error: TRL's environment is missing; run bash benchmarks/setup_trl.sh first")
    work = args.work or Path(tempfile.mkdtemp(prefix="update-split-"))
    work.mkdir(parents=True, exist_ok=True)
    batch_file = work / "batch.json"
    build_batch(args, batch_file)
    sides = {
        "grpo-ray": run_side(Path(sys.executable), "grpo-ray", batch_file, args, work),
        "TRL": run_side(args.trl_python, "trl", batch_file, args, work),
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    found = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU cores, no GPU",
        "model": f"{MODEL} (Gemma 3 270M, float32, tied 262,144 x 640 embedding)",
        "grpo_ray_commit": commit.stdout.strip(),
        "settings": {k: getattr(args, k) for k in ("rows", "samples", "micro_batch", "warmup", "repeats", "threads")},
        "note": NOTE,
        "sides": sides,
    }
    table = markdown(found)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")
        args.json.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
