"""Checkpoints of a run: written every train.checkpoint_every steps and at the end of each stage,
read back by a run started on the same output_dir (training/checkpoint.py holds the folder format).

A checkpoint holds the learners' DeepSpeed state, the reference when it was refreshed, and the
driver's Progress and batch-builder state; resuming loads them into fresh actors and syncs the
rollout engines to the checkpoint's weights, so the run goes on as if never interrupted.
"""

from __future__ import annotations

import time
from pathlib import Path

from grpo_ray.config import Config
from grpo_ray.tracking import default_tracking_uri
from grpo_ray.training.checkpoint import HASH_VERSION, TrainerState, latest_checkpoint, write_checkpoint
from grpo_ray.training.run import Progress, Run, TrainResult, in_phase


def checkpoint(run: Run, progress: Progress, finished: bool = False) -> None:
    run.tracker.flush()  # the metrics up to this step are in the store before the checkpoint says so
    workers = run.workers
    reference_saved = workers.reference is not None and run.cfg.reference.refresh_every > 0
    state = TrainerState(
        step=progress.step,
        stage_index=progress.stage_index,
        run_id=run.tracker.run_id,
        stage_run_id=run.tracker.stage_run_id,
        recipe_hash=run.recipe_hash,
        builder=run.builder.state_dict(),
        accuracy={str(step): value for step, value in progress.accuracy.items()},
        skipped_in_a_row=progress.skipped_in_a_row,
        nonfinite_in_a_row=progress.nonfinite_in_a_row,
        last_metrics=progress.metrics,
        finished=finished,
        reference_saved=reference_saved,
        kl_controller=run.kl.state_dict(),
        hash_version=HASH_VERSION,
    )

    run.console.phase(f"step {progress.step}: writing checkpoint")  # the bar says what the pause is
    started = time.perf_counter()
    with in_phase("checkpoint"):
        path = write_checkpoint(
            run.output_dir / "checkpoints",
            state,
            lambda folder: workers.save_checkpoint(folder, with_reference=reference_saved),
            run.cfg.train.keep_checkpoints,
        )
    run.tracker.log_metrics(progress.step, {"timing/checkpoint": time.perf_counter() - started})
    run.last_checkpoint = time.monotonic()
    run.console.phase(None)
    run.console.info(f"step {progress.step}: checkpoint {path}")


def restore(run: Run, folder: Path, state: TrainerState) -> Progress:
    """Load the checkpoint into the fresh actors; the rollout engines get its weights by a sync."""
    run.workers.load_checkpoint(folder, with_reference=state.reference_saved)
    run.builder.load_state_dict(state.builder, run.inputs.train_prompts)
    if state.kl_controller is not None:  # absent in checkpoints from before algorithm.kl_controller
        run.kl.load_state_dict(state.kl_controller)
    run.sync.sync(state.step, run.sync_probe, run.cfg.weight_sync.probe_tolerance)
    return Progress(
        step=state.step,
        stage_index=state.stage_index,
        accuracy={int(step): value for step, value in state.accuracy.items()},
        skipped_in_a_row=state.skipped_in_a_row,
        nonfinite_in_a_row=state.nonfinite_in_a_row,
        metrics=dict(state.last_metrics),
        open_stage_run=state.stage_run_id,
    )


def already_finished(cfg: Config, state: TrainerState, folder: Path, console) -> TrainResult:
    model_dir = Path(cfg.output_dir) / "model"
    tracking_uri = cfg.tracking.tracking_uri or default_tracking_uri(Path(cfg.output_dir))
    console.info(
        f"{cfg.output_dir} holds a run that finished at step {state.step} ({folder}); nothing to train. "
        "Set output_dir to a new folder, or pass --no-resume to train again from the start"
    )
    accuracy = {int(step): value for step, value in state.accuracy.items()}
    return TrainResult(
        state.run_id,
        tracking_uri,
        state.step,
        accuracy,
        str(model_dir) if model_dir.is_dir() else None,
        dict(state.last_metrics),
    )


def resume_hint(checkpoints: Path) -> str:
    latest = latest_checkpoint(checkpoints)
    if latest is None:
        return "no checkpoint was written yet (train.checkpoint_every), so a new run starts from the beginning"
    return f"run the same command again to resume from {latest}"
