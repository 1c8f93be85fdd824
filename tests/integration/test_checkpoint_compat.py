"""A checkpoint written before the layout change resumes after it, and trains the same steps.

The code of commit 74293a5 (the last before grpo_ray/ was regrouped into train/, commands/,
transport/) is taken from git, runs the tiny recipe for 4 steps with checkpoints at steps 2 and 4,
and its final checkpoint is moved aside. Today's code then resumes from its step-2 checkpoint: the
steps it trains (3 and 4) must equal those the old code trained, to 1e-6.
"""

import os
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_ray.config import load_config
from grpo_ray.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
BEFORE_LAYOUT = "74293a50088c0a4433accf31277137f85113f37a"
SHORT = ["train.steps=4", "train.checkpoint_every=2", "data.eval_limit=20"]


def old_code(into: Path) -> Path:
    """grpo_ray/ and configs/ as they were at BEFORE_LAYOUT."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE_LAYOUT, "grpo_ray", "configs"],
                             capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {BEFORE_LAYOUT[:7]} is not in this clone's history (a shallow clone): "
                    + archive.stderr.decode().strip()[:200])
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def history(output_dir: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of the training run in logging order: the old run's steps, then the resumed ones."""
    client = MlflowClient(f"sqlite:///{output_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("grpo-ray").experiment_id
    (run,) = [r for r in client.search_runs([experiment]) if "mlflow.parentRunId" not in r.data.tags]
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.timestamp)]


def test_a_checkpoint_written_before_the_layout_change_resumes_and_trains_the_same_steps(tmp_path):
    old = old_code(tmp_path / "old")
    out = tmp_path / "run"
    sets = [arg for item in [f"output_dir={out}", *SHORT] for arg in ("--set", item)]
    env = dict(os.environ, PYTHONPATH=str(old), PYTHONUNBUFFERED="1")
    before = subprocess.run([sys.executable, "-m", "grpo_ray.cli", "train", str(old / "configs" / "tiny.yaml"), *sets],
                            cwd=old, env=env, capture_output=True, text=True, timeout=600)
    assert before.returncode == 0, before.stdout[-2000:] + before.stderr[-2000:]
    assert str(old / "grpo_ray") in subprocess.run(
        [sys.executable, "-c", "import grpo_ray; print(grpo_ray.__file__)"], cwd=old, env=env,
        capture_output=True, text=True).stdout, "the old run must have run the old code"
    shutil.move(out / "checkpoints" / "step_000004", tmp_path / "final-of-the-old-run")

    resumed = train(load_config(ROOT / "configs" / "tiny.yaml", [f"output_dir={out}", *SHORT]), resume="require")

    assert resumed.steps == 4
    for key in ("batch/prompt_digest", "loss/total", "reward/mean", "actor/entropy"):
        logged = history(out, key)
        assert [step for step, _ in logged] == [1, 2, 3, 4, 3, 4], key
        old_steps, new_steps = logged[2:4], logged[4:]
        for (step, want), (_, got) in zip(old_steps, new_steps):
            assert abs(got - want) <= 1e-6, f"{key} at step {step}: {got} after the move, {want} before"
