"""What a run records and says as it starts: its MLflow run, its data, where it runs, where each
actor landed and how the weights will travel. Lines for the console, tags and params for MLflow."""

from __future__ import annotations

from pathlib import Path

from grpo_ray.config import Config, config_to_dict, flatten
from grpo_ray.tracking import ConsoleReporter, MlflowTracker, default_tracking_uri, redact_config
from grpo_ray.training.checkpoint import TrainerState
from grpo_ray.training.inputs import RunInputs
from grpo_ray.training.startup import StartupClock
from grpo_ray.transport.probe import SEPARATION


def open_tracker(cfg: Config, state: TrainerState | None, console: ConsoleReporter) -> MlflowTracker:
    """The run's MLflow run: a new one with the recipe as params, or a resumed run's own."""
    output_dir = Path(cfg.output_dir)
    tracker = MlflowTracker(
        cfg.tracking.tracking_uri or default_tracking_uri(output_dir),
        cfg.tracking.experiment,
        cfg.tracking.run_name,
        artifact_root=output_dir / "mlartifacts" if cfg.tracking.tracking_uri is None else None,
        resume_run_id=state.run_id if state else None,
    )
    if state is None:  # a resumed run has its params already
        shown = redact_config(config_to_dict(cfg))
        tracker.log_config(flatten(shown), shown)
    console.info(f"MLflow run {tracker.run_id} in {tracker.tracking_uri}")
    return tracker


def report_inputs(inputs: RunInputs, resume_from: Path | None, state: TrainerState | None, console) -> None:
    if resume_from and state is not None:
        console.info(f"resuming from {resume_from} (step {state.step})")
    console.info(
        f"data: {len(inputs.train_prompts)} training and {len(inputs.eval_prompts)} evaluation prompts; skipped "
        f"{inputs.skipped_rows} unusable rows, {inputs.dropped_too_long} over data.max_prompt_tokens, "
        f"{inputs.dropped_by_difficulty} outside data.difficulty_band"
    )


def report_session(session, console: ConsoleReporter) -> None:
    """Which Ray the run is on, and where to watch it."""
    where = "a local Ray started for this run" if session.started_local else f"the Ray cluster at {session.address}"
    console.info(
        f"running on {where}"
        + (f"; Ray dashboard {session.dashboard_url}" if session.dashboard_url else "")
        + (f"; metrics {session.metrics_url}" if session.metrics_url else "")
    )


def report_placement(workers, tracker: MlflowTracker, console: ConsoleReporter) -> None:
    """Where each actor landed: a line in the log, and a `placement.<actor>` tag (the node id)."""
    placed = workers.nodes()
    tracker.set_tags({f"placement.{name}": node for name, node in placed.items()})
    by_node: dict[str, list[str]] = {}
    for name, node in placed.items():
        by_node.setdefault(node, []).append(name)
    console.info("placement: " + "; ".join(f"{', '.join(names)} on node {node[:8]}" for node, names in by_node.items()))


def report_sync(sync, console: ConsoleReporter) -> None:
    """How the weights will travel: what, how much, to how many ranks, which way (and any hand-off
    refused), and what the weight probe can tell on these kernels."""
    for note in sync.notes:
        console.info(note)
    what = "the LoRA adapter" if sync.adapter_only else "the weights"
    receivers = sync.world_size - 1  # one per rollout worker, or per vLLM shard receiving itself
    console.info(
        f"weight sync: {what} ({sync.num_bytes / 1e6:.2f} MB) to {receivers} "
        f"rank{'s' if receivers > 1 else ''}: {sync.route_line}"
    )
    if sync.start_gaps:
        console.info(
            f"weight probe: engine-learner kernel gap at the start {max(sync.start_gaps):.1e} (mean |log-prob "
            f"difference|); a probe tells loaded from stale once the updates moved it {SEPARATION:g}x past that "
            "or weight_sync.probe_tolerance, whichever is larger"
        )


def report_yardstick(run, step: int) -> None:
    """weight_sync.measure_raw_broadcast: a plain broadcast (or copy) of the model's bytes, logged
    as sync/raw_broadcast_gbps, the most a sync could reach."""
    sync = run.sync
    raw = sync.raw_broadcast_gbps(sync.num_bytes)
    run.tracker.log_metrics(step, {"sync/raw_broadcast_gbps": raw})
    ways = (("broadcast", sync.broadcast_ranks), ("copy on the device", sync.handoff_ranks))
    plain = " and ".join(way for way, ranks in ways if ranks)
    run.console.info(
        f"weight sync yardstick: a plain {plain} of the model's {sync.num_bytes / 1e6:.1f} MB runs at {raw:.2f} GB/s"
    )


def report_startup(clock: StartupClock, step: int, tracker: MlflowTracker, console: ConsoleReporter) -> None:
    """The start-up's phases: one console line, startup/* metrics at the step the run starts from,
    and the table (startup.json; a resumed run's startup-step-<N>.json beside the first's)."""
    console.info(clock.line())
    tracker.log_metrics(step, clock.metrics())
    tracker.log_table(clock.rows(), "startup.json" if step == 0 else f"startup-step-{step}.json")
