"""No run without a checkpoint: train.checkpoint_every_minutes saves one by wall time, also in a
pipelined run (where it waits until no batch started ahead is in flight), and a run resumed from
such a checkpoint trains the steps the interrupted run trained."""

import shutil
from pathlib import Path

from mlflow.tracking import MlflowClient

from grpo_ray.config import load_config
from grpo_ray.training.checkpoint import complete_checkpoints, read_state
from grpo_ray.training.loop import train

ROOT = Path(__file__).resolve().parents[2]
# A checkpoint is due after every step (0.0001 minutes), none by step count.
SETTINGS = [
    "train.steps=4",
    "train.checkpoint_every=0",
    "train.checkpoint_every_minutes=0.0001",
    "train.keep_checkpoints=10",
    "data.eval_limit=20",
    "rollout.max_staleness=1",
    # No weight probe: the resume's sync asked a broadcaster built without one for it and crashed
    # ("construct it with the probe"), as a recovery's resend did.
    "weight_sync.probe_every=0",
]


def history(result, key: str) -> list[tuple[int, float]]:
    client = MlflowClient(result.tracking_uri)
    return [(m.step, m.value) for m in sorted(client.get_metric_history(result.run_id, key), key=lambda m: m.timestamp)]


def test_time_checkpoints_are_written_and_a_resume_from_one_trains_the_same_steps(tmp_path):
    out = tmp_path / "run"
    first = train(load_config(ROOT / "configs" / "tiny.yaml", [f"output_dir={out}", *SETTINGS]))
    steps = [read_state(folder).step for folder in complete_checkpoints(out / "checkpoints")]
    assert steps == [1, 2, 3, 4], steps  # by time after steps 1-3, and the final one
    # With a checkpoint due at every step, nothing was started ahead: no stale batch.
    assert [v for _, v in history(first, "batch/staleness")] == [0.0] * 4

    for later in ("step_000003", "step_000004"):
        shutil.move(out / "checkpoints" / later, tmp_path / later)
    resumed = train(load_config(ROOT / "configs" / "tiny.yaml", [f"output_dir={out}", *SETTINGS]), resume="require")
    assert resumed.steps == 4 and resumed.run_id == first.run_id
    for key in ("batch/prompt_digest", "loss/total", "reward/mean"):
        logged = history(resumed, key)
        assert [step for step, _ in logged] == [1, 2, 3, 4, 3, 4], key
        for (step, before), (_, after) in zip(logged[2:4], logged[4:]):
            assert abs(after - before) <= 1e-6, f"{key} at step {step}: {after} resumed, {before} straight"
