"""On-policy distillation beside GRPO alone: held-out accuracy against steps and wall-clock time.

    bash scripts/setup.sh
    .venv/bin/python benchmarks/distill_race.py --json benchmarks/results/distill_race.json
    bash scripts/make_smollm2_teacher.sh   # once, ~10 minutes
    .venv/bin/python benchmarks/distill_race.py --real --steps 20 --eval-every 5 \
        --json benchmarks/results/distill_race_smollm2.json

The student is the built-in tiny model; the teacher is `tiny-teacher`, the same model trained by
GRPO (scripts/make_tiny_teacher.sh). With --real, the student is the real SmolLM2-135M-Instruct
and its teacher the same model after 40 GRPO steps (configs/smollm2-distill.yaml). Each side
trains the recipe's student with the same seed, prompts, batch, learning rate and evaluation (the
held-out prompts, greedy, before the first step and every --eval-every steps); the sides differ
only in their signal:

    grpo            the rewards' GRPO advantage alone (no distillation section)
    distill         the teacher's per-token reverse KL alone (distillation.with_rewards: false)
    distill+grpo    the teacher's term added to the GRPO advantage

Each side runs alone on the machine, one after another, each timed from its launch, start-up
included. Writes each side's curve, seconds per step, and the steps and seconds each took to reach
the accuracy GRPO alone ends with (and --target), as JSON and a table beside it (distill_race.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from recorded import history, training_run, write_results

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# recipe, its teacher (as `grpo-ray eval --set model.path=` takes it), the model's name in the
# table, and what the GRPO side sets beside leaving the teacher out: smollm2-distill.yaml's learning
# rate is distillation's, twice GRPO's (each side at the rate tuned for it).
RACES = {
    "tiny": ("configs/tiny-distill.yaml", "tiny-teacher", "tiny model", []),
    "real": (
        "configs/smollm2-distill.yaml",
        "runs/smollm2-teacher/model",
        "SmolLM2-135M-Instruct",
        ["learner.lr=1e-5"],
    ),
}
SIDES = {
    "grpo": ["distillation.teachers=[]", "distillation.with_rewards=true"],
    "distill": ["distillation.with_rewards=false"],
    "distill+grpo": ["distillation.with_rewards=true"],
}


def train(recipe: str, name: str, work: Path, sets: list[str], steps: int, eval_every: int) -> dict:
    """Train the recipe with these overrides; the held-out curve from MLflow, timed from the launch."""
    out = work / name
    args = [f"output_dir={out}", f"train.steps={steps}", f"train.eval_every={eval_every}", *sets]
    command = [sys.executable, "-m", "grpo_ray.cli", "train", recipe] + [a for s in args for a in ("--set", s)]
    launched = time.time()
    with (work / f"{name}.log").open("w") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - launched
    if done.returncode != 0:
        sys.exit(f"error: {name} failed (exit {done.returncode}); its output is in {work / f'{name}.log'}")
    client, run = training_run(f"sqlite:///{out / 'mlflow.db'}")
    step_seconds = [m.value for m in history(client, run, "timing/step")]
    teacher_seconds = [m.value for m in history(client, run, "timing/teacher")]
    return {
        "curve": [(m.timestamp / 1000 - launched, m.step, m.value) for m in history(client, run, "eval/accuracy")],
        "reverse_kl": [(m.step, m.value) for m in history(client, run, "distill/reverse_kl")],
        "seconds_per_step": sum(step_seconds) / len(step_seconds),
        "teacher_seconds_per_step": sum(teacher_seconds) / len(teacher_seconds) if teacher_seconds else 0.0,
        "wall_seconds": wall,
        "overrides": sets,
    }


def reached(curve: list, target: float) -> tuple[int | None, float | None]:
    """(step, seconds since launch) of the first evaluation at or above `target`; (None, None) if none."""
    return next(((step, seconds) for seconds, step, accuracy in curve if accuracy >= target - 1e-9), (None, None))


def summarize(sides: dict, target: float) -> dict:
    grpo_final = sides["grpo"]["curve"][-1][2]
    for side in sides.values():
        side["start_accuracy"], side["final_accuracy"] = side["curve"][0][2], side["curve"][-1][2]
        side["best_accuracy"] = max(a for _, _, a in side["curve"])
        side["to_grpo_final"] = reached(side["curve"], grpo_final)
        side["to_target"] = reached(side["curve"], target)
    return {"grpo_final_accuracy": grpo_final, "target": target}


def markdown(found: dict) -> str:
    fmt = lambda pair: "not reached" if pair[0] is None else f"step {pair[0]}, {pair[1]:.0f} s"  # noqa: E731
    lines = [
        f"# Distillation beside GRPO alone, {found['model']} ({found['date']}, {found['machine']})",
        "",
        f"{found['steps']} steps of {found['recipe']}, held-out accuracy every {found['eval_every']} steps; "
        f"the teacher ({found['teacher']}) alone scores {found['teacher_accuracy']}.",
        "",
        f"| side | held-out: start -> final (best) | to GRPO's final {found['grpo_final_accuracy']:.3f} | "
        f"to {found['target']:.2f} | s/step (teacher) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, side in found["sides"].items():
        lines.append(
            f"| {name} | {side['start_accuracy']:.3f} -> {side['final_accuracy']:.3f} ({side['best_accuracy']:.3f}) | "
            f"{fmt(side['to_grpo_final'])} | {fmt(side['to_target'])} | {side['seconds_per_step']:.2f} "
            f"({side['teacher_seconds_per_step']:.2f}) |"
        )
    overrides = "; ".join(f"{name}: {', '.join(side['overrides'])}" for name, side in found["sides"].items())
    lines += ["", f"Each side's overrides of the recipe: {overrides}."]
    return "\n".join(lines) + "\n"


def resolved(teacher: str) -> str:
    """A built-in model's name as it is; a folder of the repository as an absolute path (a recipe
    resolves relative paths against its own folder)."""
    return str(ROOT / teacher) if "/" in teacher else teacher


def teacher_accuracy(recipe: str, teacher: str) -> str:
    """The teacher's own held-out accuracy, as the recipe's evaluation measures it (greedy)."""
    with tempfile.TemporaryDirectory() as work:
        command = [
            sys.executable, "-m", "grpo_ray.cli", "eval", "--config", recipe,
            "--set", f"model.path={resolved(teacher)}", "--set", f"output_dir={work}",
        ]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    line = next((line for line in done.stdout.splitlines() if "accuracy" in line), done.stdout.strip()[-200:])
    return line.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.4, help="a second accuracy to time each side to")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated, of " + ", ".join(SIDES))
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct and its GRPO-trained teacher")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "distill_race.json")
    args = parser.parse_args()
    recipe, teacher, model, grpo_sets = RACES["real" if args.real else "tiny"]
    if args.real and not (ROOT / teacher).is_dir():
        sys.exit(f"error: no teacher at {ROOT / teacher}: make it first with bash scripts/make_smollm2_teacher.sh")
    sides = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.sides.split(","):
            print(f"{name}: training {args.steps} steps", flush=True)
            sets = SIDES[name] + (grpo_sets if name == "grpo" else [])
            sides[name] = train(recipe, name, work, sets, args.steps, args.eval_every)
            print(f"{name}: {sides[name]['curve'][0][2]:.3f} -> {sides[name]['curve'][-1][2]:.3f}", flush=True)
    found = {
        "date": date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU",
        "model": model,
        "recipe": recipe,
        "teacher": teacher,
        "teacher_accuracy": teacher_accuracy(recipe, teacher),
        "steps": args.steps,
        "eval_every": args.eval_every,
        **summarize(sides, args.target),
        "sides": sides,
    }
    write_results(args.json, found, markdown(found))


if __name__ == "__main__":
    main()
