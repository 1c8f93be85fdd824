"""A real pretrained model learning, grpo-ray beside TRL: held-out accuracy against wall-clock time.

    bash scripts/setup.sh && bash benchmarks/setup_trl.sh
    .venv/bin/python benchmarks/real_model_race.py --json benchmarks/results/real_model_race.json
    bash scripts/setup.sh --gemma3
    .venv/bin/python benchmarks/real_model_race.py --model gemma3-270m --steps 12 --eval-every 2 --lr 2e-6 \
        --target 0.35 --sides "grpo-ray hf,TRL" --json benchmarks/results/real_model_race_gemma3.json

SmolLM2-135M-Instruct (the built-in smollm2-135m) on its task (two-digit sums asked in words, 200
held out, greedy 8% at the start), trained by configs/smollm2-arithmetic.yaml with grpo-ray's hf
engine and its vllm engine, and by TRL's GRPOTrainer with the same model, prompts (the chat-templated
token ids grpo-ray samples from), reward (grpo-ray's gsm8k file), batch (8 prompts x 8 samples of at
most 16 tokens, temperature 1), learning rate, loss (token-mean, clip 0.2, no KL, one pass) and
evaluation (greedy, 16 tokens, the 200 held-out problems before the first step and every
--eval-every steps). Each side runs alone on the machine, one after another, each timed from its
launch, start-up included. With --lora, the same with a LoRA adapter (rank 16 on q, k, v, o) on
grpo-ray's hf engine and on TRL.

With --model gemma3-270m, Gemma 3 270M (a base model) on its recipe, configs/gemma3-arithmetic.yaml:
few-shot sums as plain text after the <bos> its tokenizer adds (no chat template), 100 held out,
reward first_number, batch 8 x 8 of at most 8 tokens, micro-batches of 16 on both sides. TRL is given
the prompt's text and tokenises it itself, as a user's TRL run does: the JSON records the token ids
of the first prompt on each side (`first_prompt_ids`), so a <bos> one side lacks is seen.

With --gpu (one GPU, benchmarks/gpu_session.sh's `realmodel` part): bfloat16, grpo-ray's vllm engine
beside its learner on the GPU (half each, vLLM at 30% of the memory, CUDA graphs) against TRL with
vLLM colocated in its trainer, the MLflow store in files.

Writes the curves, each side's seconds per step and samples/s, and the seconds each took to reach
--target held-out accuracy (and to the best accuracy TRL reached) as JSON, and a chart and a
table beside it (the JSON's name with .png, .md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from recorded import history, training_run

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRL_PYTHON = HERE / ".venv-trl" / "bin" / "python"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class RaceModel:
    """A built-in real model and its recipe, as both sides train it."""

    title: str  # the chart's and table's name of the model
    recipe: Path
    reward: str  # grpo-ray's reward function, the accuracy (TRL loads it from grpo-ray's file)
    max_new_tokens: int
    micro_batch: int  # completions per forward and backward, both sides
    heldout: int  # held-out problems
    task: str
    results: str  # the stem of the files written beside --json when it is not given


MODELS = {
    "smollm2-135m": RaceModel(
        "SmolLM2-135M-Instruct", ROOT / "configs" / "smollm2-arithmetic.yaml", "gsm8k", 16, 64, 200,
        "two-digit sums", "real_model_race",
    ),
    "gemma3-270m": RaceModel(
        "Gemma 3 270M (base)", ROOT / "configs" / "gemma3-arithmetic.yaml", "first_number", 8, 16, 100,
        "few-shot sums", "real_model_race_gemma3",
    ),
}  # fmt: skip


def prepare_prompts(work: Path, name: str) -> tuple[str, Path, Path, list[int]]:
    """The model's folder, its training and held-out prompts as the text that the tokenizer (its
    defaults, as TRL's GRPOTrainer calls it on a text prompt) turns into exactly the token ids
    grpo-ray samples from (the chat template applied, or a plain text without the <bos> the tokenizer
    adds itself), and grpo-ray's token ids of the first training prompt. TRL's side reads the files."""
    from grpo_ray.config import load_config
    from grpo_ray.data.loaders import load_rows
    from grpo_ray.data.prompts import leading_special_tokens, tokenize_prompts
    from grpo_ray.models.loading import load_tokenizer, resolve_model_path

    data = load_config(MODELS[name].recipe).data
    tokenizer = load_tokenizer(name)
    added = len(leading_special_tokens(tokenizer))
    paths = []
    for split in ("train", "heldout"):
        rows = load_rows(f"{name}:{split}")[0]
        prompts = tokenize_prompts(rows, tokenizer, data.max_prompt_tokens, data.apply_chat_template).prompts
        path = work / f"{split}.jsonl"
        with path.open("w") as f:
            for prompt in prompts:
                text = tokenizer.decode(prompt.token_ids[added:])
                if list(tokenizer(text).input_ids) != list(prompt.token_ids):
                    sys.exit(
                        f"error: prompt {prompt.uid} does not re-tokenise to the same ids; the race would be unfair"
                    )
                f.write(json.dumps({"prompt": text, "answer": prompt.answer}) + "\n")
        paths.append(path)
        if split == "train":
            first_prompt_ids = list(prompts[0].token_ids)
    return resolve_model_path(name), paths[0], paths[1], first_prompt_ids


# One GPU shared by grpo-ray's learner and its vLLM engine (as benchmarks/gpu_e2e.py lays it out).
GPU_SETS = [
    "model.dtype=bfloat16",
    "rollout.backend=vllm",
    "rollout.num_gpus=0.5",
    "learner.num_gpus=0.5",
    "rollout.vllm.gpu_memory_utilization=0.3",
    "rollout.vllm.enforce_eager=false",
    "rollout.vllm.max_model_len=128",
]


def grpo_ray_side(
    name: str, recipe: Path, work: Path, sets: list[str], steps: int, eval_every: int, gpu: bool = False
) -> dict:
    """Train the recipe with these overrides; the held-out curve from MLflow, timed from the launch."""
    out = work / name
    args = [f"output_dir={out}", f"train.steps={steps}", f"train.eval_every={eval_every}", *sets]
    # The recipe's sqlite store; the GPU machine's MLflow has none: its files there.
    tracking = f"file://{out / 'mlruns'}" if gpu else f"sqlite:///{out / 'mlflow.db'}"
    args.append(f"tracking.tracking_uri={tracking}")
    command = [sys.executable, "-m", "grpo_ray.cli", "train", str(recipe)] + [a for s in args for a in ("--set", s)]
    launched = time.time()
    with (work / f"{name}.log").open("w") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - launched
    if done.returncode != 0:
        sys.exit(f"error: {name} failed (exit {done.returncode}); its output is in {work / f'{name}.log'}")
    client, run = training_run(tracking)
    curve = [(m.timestamp / 1000 - launched, m.step, m.value) for m in history(client, run, "eval/accuracy")]
    step_seconds = [m.value for m in history(client, run, "timing/step")]
    steady = step_seconds[2:] or step_seconds
    per_step = sum(steady) / len(steady)
    return {"curve": curve, "seconds_per_step": per_step, "samples_per_s": 64 / per_step, "wall_seconds": wall}


def trl_side(
    name: str, race: RaceModel, work: Path, model: str, train: Path, heldout: Path, steps: int, eval_every: int,
    lr: float, lora: int, gpu: bool = False, python: Path = TRL_PYTHON,
) -> dict:  # fmt: skip
    result = work / f"{name}.json"
    new_tokens = str(race.max_new_tokens)
    command = [
        str(python), str(HERE / "trl_grpo.py"), "--model", model, "--prompts", str(train),
        "--eval-prompts", str(heldout), "--eval-every", str(eval_every), "--eval-new-tokens", new_tokens,
        "--reward", race.reward, "--steps", str(steps), "--warmup-steps", "2", "--prompts-per-step", "8",
        "--generations", "8", "--max-new-tokens", new_tokens, "--micro-batch", str(race.micro_batch), "--lr", str(lr),
        "--lora", str(lora), "--output-dir", str(work / f"{name}-out"), "--json", str(result),
        "--clock-start", str(time.time()),
    ] + (["--gpu"] if gpu else [])  # fmt: skip
    launched = time.time()
    with (work / f"{name}.log").open("w") as log:
        done = subprocess.run(
            command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1")
        )
    if done.returncode != 0:
        sys.exit(f"error: {name} failed (exit {done.returncode}); its output is in {work / f'{name}.log'}")
    found = json.loads(result.read_text())
    return {
        "curve": [tuple(point) for point in found["curve"]],
        "seconds_per_step": found["seconds_per_step"],
        "samples_per_s": found["samples_per_s"],
        "wall_seconds": time.time() - launched,
        "trl_version": found["trl_version"],
        "first_prompt_ids": found["first_prompt_ids"],
    }


def gpu_name() -> str:
    import torch

    return f"one {torch.cuda.get_device_name()}"


def seconds_to(curve: list, target: float) -> float | None:
    """Seconds since the launch at the first evaluation that reached `target`; None if none did."""
    return next((seconds for seconds, _, accuracy in curve if accuracy >= target - 1e-9), None)


def summarize(sides: dict, target: float, pairs: list[tuple[str, str]]) -> dict:
    """Each side's time to `target`, and for each (grpo-ray side, TRL side) pair the ratio of their
    times to the target and to the best accuracy the TRL side reached."""
    for side in sides.values():
        side["start_accuracy"] = side["curve"][0][2]
        side["best_accuracy"] = max(a for _, _, a in side["curve"])
        side["seconds_to_target"] = seconds_to(side["curve"], target)
    races = {}
    for ours, theirs in pairs:
        best = sides[theirs]["best_accuracy"]
        to_best = (seconds_to(sides[ours]["curve"], best), seconds_to(sides[theirs]["curve"], best))
        to_target = (sides[ours]["seconds_to_target"], sides[theirs]["seconds_to_target"])
        races[f"{ours} vs {theirs}"] = {
            "target": target,
            "seconds_to_target": to_target,
            "sooner_to_target": to_target[1] / to_target[0] if None not in to_target else None,
            "trl_best": best,
            "seconds_to_trl_best": to_best,
            "sooner_to_trl_best": to_best[1] / to_best[0] if None not in to_best else None,
            "samples_per_s_ratio": sides[ours]["samples_per_s"] / sides[theirs]["samples_per_s"],
        }
    return races


def race_model(found: dict) -> RaceModel:
    """The model a result is of (results written before Gemma's race name none: SmolLM2's)."""
    return MODELS[found.get("model_name", "smollm2-135m")]


def markdown(found: dict) -> str:
    lines = [
        f"# {race_model(found).title} learning, grpo-ray beside TRL ({found['date']}, {found['machine']})",
        "",
        "| side | held-out accuracy: start -> best | seconds to {:.0%} | s/step | samples/s | run on |".format(
            found["target"]
        ),
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, side in found["sides"].items():
        reached = side["seconds_to_target"]
        lines.append(
            f"| {name} | {side['start_accuracy']:.3f} -> {side['best_accuracy']:.3f} | "
            f"{'%.0f' % reached if reached is not None else 'not reached'} | {side['seconds_per_step']:.1f} | "
            f"{side['samples_per_s']:.2f} | {side.get('date', found['date'])} |"
        )
    lines += [
        "",
        "| race | to the target, sooner by | to TRL's best, sooner by | samples/s ratio |",
        "| --- | --- | --- | --- |",
    ]
    for name, race in found["races"].items():
        fmt = lambda x: f"{x:.2f}x" if x is not None else "n/a"  # noqa: E731
        lines.append(
            f"| {name} | {fmt(race['sooner_to_target'])} | {fmt(race['sooner_to_trl_best'])} "
            f"({race['trl_best']:.3f}) | {race['samples_per_s_ratio']:.2f}x |"
        )
    if "prompt_tokens" in found:
        lines += ["", found["prompt_tokens"]]
    return "\n".join(lines) + "\n"


def chart(found: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, side in found["sides"].items():
        seconds, _, accuracy = zip(*side["curve"])
        ax.plot([s / 60 for s in seconds], accuracy, marker="o", label=name, linestyle="--" if "TRL" in name else "-")
    ax.axhline(found["target"], color="grey", linewidth=0.8)
    ax.set_xlabel("minutes since launch (start-up included)")
    race = race_model(found)
    ax.set_ylabel(f"held-out accuracy (greedy, {race.heldout} problems)")
    ax.set_title(f"{race.title} on {race.task}, {found['machine']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def render(files: list[Path], out: Path | None, target: float) -> None:
    """One JSON, table and chart from several runs of this script (their sides merged, races recomputed)."""
    runs = [json.loads(path.read_text()) for path in files]
    # A later file's side replaces an earlier one's of the same name; each keeps the date it ran.
    sides = {name: {"date": run["date"]} | side for run in runs for name, side in run["sides"].items()}
    pairs = [
        (ours, theirs)
        for ours, theirs in (("grpo-ray hf", "TRL"), ("grpo-ray vllm", "TRL"), ("grpo-ray hf LoRA", "TRL LoRA"))
    ]
    pairs = [pair for pair in pairs if set(pair) <= set(sides)]
    found = runs[-1] | {"sides": sides, "races": summarize(sides, target, pairs), "target": target}
    found["settings"] = {k: v for run in runs for k, v in run["settings"].items()}
    write(found, out)


def write(found: dict, json_file: Path | None) -> None:
    table = markdown(found)
    print(table)
    stem = json_file.with_suffix("") if json_file else HERE / "results" / race_model(found).results
    stem.with_suffix(".md").write_text(table)
    chart(found, stem.with_suffix(".png"))
    if json_file:
        json_file.write_text(json.dumps(found, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.5, help="held-out accuracy whose time is compared")
    parser.add_argument("--lr", type=float, default=1e-5, help="full fine-tuning's learning rate (the recipe's)")
    parser.add_argument("--lora", action="store_true", help="also the LoRA sides (rank 16), at --lora-lr")
    parser.add_argument("--lora-lr", type=float, default=1e-4)
    parser.add_argument("--sides", default="grpo-ray hf,grpo-ray vllm,TRL", help="comma-separated, in run order")
    parser.add_argument(
        "--gpu", action="store_true", help="one GPU: grpo-ray's vllm engine beside TRL's colocated vLLM"
    )
    parser.add_argument("--trl-python", default=str(TRL_PYTHON), help="TRL's Python (a GPU machine: python3)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true", help="keep the sides --work already holds a result of")
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        default=None,
        help="merge these results' sides into --json, table and chart (a later file's side replaces an earlier's "
        "of the same name; the last file's date and machine); run nothing",
    )
    parser.add_argument("--work", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    if args.render:
        return render(args.render, args.json, args.target)
    trl_python = Path(args.trl_python) if os.sep in args.trl_python else Path(shutil.which(args.trl_python) or "")
    if not trl_python.is_file():
        sys.exit("error: TRL's environment is missing; run bash benchmarks/setup_trl.sh first")
    work = args.work or Path(tempfile.mkdtemp(prefix="real-model-race-"))
    work.mkdir(parents=True, exist_ok=True)
    race = MODELS[args.model]
    model, train, heldout, first_prompt_ids = prepare_prompts(work, args.model)
    lr = f"learner.lr={args.lr}"  # both sides' (SmolLM2's recipe's own: 1e-5)
    lora_sets = ["model.lora.enabled=true", "model.lora.rank=16", "model.lora.alpha=32", f"learner.lr={args.lora_lr}"]
    plans = {
        "grpo-ray hf": lambda: grpo_ray_side(
            "grpo-hf", race.recipe, work, ["rollout.backend=hf", lr], args.steps, args.eval_every
        ),
        "grpo-ray vllm": lambda: grpo_ray_side(
            "grpo-vllm",
            race.recipe,
            work,
            [*(GPU_SETS if args.gpu else ["rollout.backend=vllm"]), lr],
            args.steps,
            args.eval_every,
            args.gpu,
        ),
        "TRL": lambda: trl_side(
            "trl", race, work, model, train, heldout, args.steps, args.eval_every, args.lr, 0, args.gpu, trl_python
        ),
        "grpo-ray hf LoRA": lambda: grpo_ray_side(
            "grpo-hf-lora", race.recipe, work, ["rollout.backend=hf", *lora_sets], args.steps, args.eval_every
        ),
        "TRL LoRA": lambda: trl_side(
            "trl-lora",
            race,
            work,
            model,
            train,
            heldout,
            args.steps,
            args.eval_every,
            args.lora_lr,
            16,
            args.gpu,
            trl_python,
        ),  # fmt: skip
    }
    names = [n.strip() for n in args.sides.split(",")] + (["grpo-ray hf LoRA", "TRL LoRA"] if args.lora else [])
    sides = {}
    for name in names:
        started = time.perf_counter()
        kept = work / f"{name.replace(' ', '-')}.side.json"  # each side's result as it ends: --reuse takes it
        sides[name] = json.loads(kept.read_text()) if args.reuse and kept.exists() else plans[name]()
        sides[name].setdefault("date", time.strftime("%Y-%m-%d"))
        kept.write_text(json.dumps(sides[name]))
        best = max(a for _, _, a in sides[name]["curve"])
        print(f"{name}: {time.perf_counter() - started:.0f} s, held-out best {best:.3f}", flush=True)
    pairs = [(ours, "TRL") for ours in ("grpo-ray hf", "grpo-ray vllm") if ours in sides and "TRL" in sides]
    if "grpo-ray hf LoRA" in sides and "TRL LoRA" in sides:
        pairs.append(("grpo-ray hf LoRA", "TRL LoRA"))
    found = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": gpu_name() if args.gpu else f"{os.cpu_count()} CPU cores, no GPU",
        "model": f"{args.model} ({race.title}, float32)",
        "model_name": args.model,
        "settings": {
            "steps": args.steps,
            "eval_every": args.eval_every,
            "lr": args.lr,
            "lora_lr": args.lora_lr,
            "prompts_per_step": 8,
            "samples_per_prompt": 8,
            "max_new_tokens": race.max_new_tokens,
            "micro_batch": race.micro_batch,
            "lora": "rank 16, alpha 32, q/k/v/o",
        },  # fmt: skip
        "target": args.target,
        "sides": sides,
        "races": summarize(sides, args.target, pairs),
        "grpo_ray_first_prompt_ids": first_prompt_ids,
    }
    trl_ids = [side["first_prompt_ids"] for name, side in sides.items() if "TRL" in name]
    if trl_ids:
        same = all(ids == first_prompt_ids for ids in trl_ids)
        trl_version = next(side["trl_version"] for name, side in sides.items() if "TRL" in name)
        found["prompt_tokens"] = (
            f"The first training prompt: {len(first_prompt_ids)} tokens on grpo-ray's side, starting "
            f"{first_prompt_ids[:3]}; TRL {trl_version}'s GRPOTrainer makes "
            + ("the same ids of its text." if same else f"{trl_ids[0][:3]}... ({len(trl_ids[0])} tokens) of its text.")
        )
    write(found, args.json)


if __name__ == "__main__":
    main()
