"""A checkpoint written before the layout change resumes after it, with its weights and optimizer.

The code of commit 74293a5 (the last before grpo_ray/ was regrouped into train/, commands/,
transport/) is taken from git and runs two stages of the tiny recipe: 2 steps that learn, then 2
steps sampled at temperature 1e-4. Its final checkpoint is moved aside and today's code resumes
from the step-2 one.

Today's hf engine draws tokens by another exact method than 74293a5's (same distribution, other
draws), so the steps cannot be compared while sampling at temperature 1. At temperature 1e-4 both
draw the argmax, so every group's G completions agree and the advantages are 0. The weights still
move in steps 3-4, by Adam's momentum from steps 1-2. So the final weights equal the old run's only
if the step-2 checkpoint's model and optimizer state were both loaded. The steps' prompts and
rewards must equal too.
"""

import os
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from grpo_ray.config import load_config
from grpo_ray.training.loop import train

from .conftest import ROOT, run_cli, set_args

BEFORE_LAYOUT = "74293a50088c0a4433accf31277137f85113f37a"
STAGES = """
stages:
  - {name: learn, steps: 2}
  - {name: argmax, steps: 2, temperature: 0.0001}
"""
SETTINGS = ["train.checkpoint_every=2", "data.eval_limit=20", "learner.lr=0.001"]


def old_code(into: Path) -> Path:
    """grpo_ray/ and configs/ as they were at BEFORE_LAYOUT."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", BEFORE_LAYOUT, "grpo_ray", "configs"], capture_output=True
    )
    if archive.returncode != 0:
        pytest.skip(
            f"commit {BEFORE_LAYOUT[:7]} is not in this clone's history (a shallow clone): "
            + archive.stderr.decode().strip()[:200]
        )
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def history(output_dir: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of the training run in logging order: the old run's steps, then the resumed ones."""
    client = MlflowClient(f"sqlite:///{output_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("grpo-ray").experiment_id
    (run,) = [r for r in client.search_runs([experiment]) if "mlflow.parentRunId" not in r.data.tags]
    return [
        (m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.timestamp)
    ]


def test_a_checkpoint_written_before_the_layout_change_resumes_with_its_weights_and_optimizer(tmp_path):
    old = old_code(tmp_path / "old")
    # 74293a5's own tiny recipe (today's names fields it did not know), its steps given by the stages.
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((old / "configs" / "tiny.yaml").read_text().replace("  steps: 800\n", "") + STAGES)
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(old), PYTHONUNBUFFERED="1")
    before = run_cli(
        "train", str(recipe), *set_args(f"output_dir={out}", *SETTINGS), timeout=600, cwd=old, PYTHONPATH=str(old)
    )
    assert before.returncode == 0, before.stdout[-2000:] + before.stderr[-2000:]
    assert (
        str(old / "grpo_ray")
        in subprocess.run(
            [sys.executable, "-c", "import grpo_ray; print(grpo_ray.__file__)"],
            cwd=old,
            env=env,
            capture_output=True,
            text=True,
        ).stdout
    ), "the old run must have run the old code"
    shutil.move(out / "checkpoints" / "step_000004", tmp_path / "final-checkpoint-of-the-old-run")
    shutil.move(out / "model", tmp_path / "model-of-the-old-run")

    resumed = train(load_config(recipe, [f"output_dir={out}", *SETTINGS]), resume="require")

    assert resumed.steps == 4
    for key in ("batch/prompt_digest", "reward/mean"):
        logged = history(out, key)
        assert [step for step, _ in logged] == [1, 2, 3, 4, 3, 4], key
        for (step, want), (_, got) in zip(logged[2:4], logged[4:]):
            assert abs(got - want) <= 1e-6, f"{key} at step {step}: {got} after the move, {want} before"
    assert all(value == 0.0 for _, value in history(out, "loss/total")[2:]), "argmax steps have no advantage"
    want = load_file(tmp_path / "model-of-the-old-run" / "model.safetensors")
    got = load_file(out / "model" / "model.safetensors")
    assert want.keys() == got.keys()
    worst = max(float((got[name] - want[name]).abs().max()) for name in want)
    assert worst <= 1e-6, f"final weights differ by {worst}: the checkpoint's model or optimizer state was not loaded"
    moved = max(float((want[name] - load_file_initial(name)).abs().max()) for name in list(want)[:3])
    assert moved > 0, "the old run's weights never moved: the comparison would prove nothing"


def load_file_initial(name: str) -> torch.Tensor:
    """The tiny model's initial weights (what a resume that loaded nothing would start from)."""
    from grpo_ray.models.tiny import ensure_tiny_artifacts

    return load_file(ensure_tiny_artifacts().model_dir / "model.safetensors")[name]
