r"""The GRPO training loop: stages of steps, each step rollout -> rewards -> update -> weight sync.

Variant: GRPO (Shao et al., 2024) with the recipe's choices of advantage, loss aggregation, KL
placement and clipping (see algorithm in the config). Per prompt, G completions; advantage per
group, for every token of the completion; per-token clipped-ratio loss. With one pass over a
batch pi_old = pi_theta (ratio 1 in value); with mu passes pi_old is the rollout's log-probs.

Data flow per step (large arrays never pass through this process):

    prompts -> RolloutWorker x R --RolloutSlice refs--> RewardWorker x K -> small ScoredSlices
    driver: dynamic sampling, rescue, substitution on the small arrays (step_batch.py),
            the learners' slices assembled where the data is when rows changed (update.py)
    ReferenceWorker (KL) <- the learners' slice refs
    LearnerWorker x L <- its slice refs + advantages;  learner 0 --weights--> every RolloutWorker

Stages (POLARIS) run one after the other on the same actors: the next stage starts from the
weights the last one ended with; each is a nested MLflow run with its own model and ledger.

Checkpoints (every train.checkpoint_every steps and at the end of each stage) hold the learners'
DeepSpeed state, the reference when it was refreshed, and the driver's Progress and batch-builder
state; a run started on an output_dir with a checkpoint continues from it, in the same MLflow run.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import ray

from grpo_ray import interrupts
from grpo_ray.algo.polaris import drop_easy
from grpo_ray.checkpoint import TrainerState, latest_checkpoint, read_state, recipe_hash, resume_point, set_aside, write_checkpoint
from grpo_ray.cluster.actors import ClusterError, error_line
from grpo_ray.cluster.ray_metrics import StepGauges
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.roles import Workers, start_workers
from grpo_ray.cluster.session import ray_session
from grpo_ray.cluster.weights import WeightBroadcaster, WeightSyncError
from grpo_ray.config import Config, StagePlan, config_to_dict, flatten, plan_batches, plan_stages, prefetch_room, syncs_lora_adapter, total_steps
from grpo_ray.data.prompts import PromptStream
from grpo_ray.run_setup import RunInputs, prepare_inputs
from grpo_ray.step_batch import BatchBuilder, NothingToLearnError, RewardFailureError, RunStoppedError, sample_rows, score_slices
from grpo_ray.step_metrics import step_metrics
from grpo_ray.tracking import ConsoleReporter, MlflowTracker, default_tracking_uri, redact_config
from grpo_ray.types import SamplingSettings
from grpo_ray.update import group_advantages, kl_reward_penalty, learner_payloads, run_update

__all__ = ["NonFiniteUpdateError", "NothingToLearnError", "RewardFailureError", "TrainResult", "train"]


class NonFiniteUpdateError(RunStoppedError):
    """Too many updates in a row were skipped for a NaN or infinite loss or gradient."""


@dataclass(frozen=True)
class TrainResult:
    run_id: str
    tracking_uri: str
    steps: int
    eval_accuracy: dict[int, float]  # step -> held-out accuracy
    model_dir: str | None
    last_metrics: dict[str, float]


class PhaseTimer:
    """`with timer("rollout"):` adds the block's wall seconds under timing/rollout."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        started = time.perf_counter()
        yield
        self.seconds[f"timing/{phase}"] = self.seconds.get(f"timing/{phase}", 0.0) + time.perf_counter() - started


def train(cfg: Config, console: ConsoleReporter | None = None, resume: str = "auto") -> TrainResult:
    """Run the recipe; resume: "auto" (from the newest checkpoint in output_dir if any), "require"
    (--resume) or "never" (--no-resume: start over, the old checkpoints moved aside)."""
    plan_batches(cfg)
    inputs = prepare_inputs(cfg)  # checks paths, tokenises prompts: fails before any actor starts
    output_dir = Path(cfg.output_dir)
    console = console or ConsoleReporter(total_steps(cfg), pipelined=cfg.rollout.max_staleness > 0)
    checkpoints = output_dir / "checkpoints"
    if resume == "never" and (moved := set_aside(checkpoints, time.strftime("%Y%m%d-%H%M%S"))):
        console.info(f"--no-resume: the earlier checkpoints were moved to {moved}")
    fingerprint = recipe_hash(config_to_dict(cfg))
    resume_from = resume_point(checkpoints, resume, fingerprint)
    state = read_state(resume_from) if resume_from else None
    tracking_uri = cfg.tracking.tracking_uri or default_tracking_uri(output_dir)
    if state is not None and state.finished:
        result = _already_finished(cfg, state, resume_from, tracking_uri, console)
        console.close()
        return result
    tracker = MlflowTracker(
        tracking_uri, cfg.tracking.experiment, cfg.tracking.run_name,
        artifact_root=output_dir / "mlartifacts" if cfg.tracking.tracking_uri is None else None,
        resume_run_id=state.run_id if state else None,
    )
    if state is None:  # a resumed run has its params already
        shown = redact_config(config_to_dict(cfg))
        tracker.log_config(flatten(shown), shown)
    console.info(f"MLflow run {tracker.run_id} in {tracker.tracking_uri}")
    if resume_from:
        console.info(f"resuming from {resume_from} (step {state.step})")
    console.info(
        f"data: {len(inputs.train_prompts)} training and {len(inputs.eval_prompts)} evaluation prompts; skipped "
        f"{inputs.skipped_rows} unusable rows, {inputs.dropped_too_long} over data.max_prompt_tokens, "
        f"{inputs.dropped_by_difficulty} outside data.difficulty_band"
    )
    try:
        with tracker.ending(), ray_session(cfg.ray) as session:
            where = "a local Ray started for this run" if session.started_local else f"the Ray cluster at {session.address}"
            console.info(f"running on {where}" + (f"; Ray dashboard {session.dashboard_url}" if session.dashboard_url else "")
                         + (f"; metrics {session.metrics_url}" if session.metrics_url else ""))
            workers = start_workers(cfg, plan_batches(cfg))
            tracker.set_tags({"cluster.nodes": str(len(ray.nodes())), "cluster.cpus": f"{ray.cluster_resources().get('CPU', 0):g}"})
            _report_placement(workers, tracker, console)
            run = Run(cfg, inputs, workers, tracker, console, fingerprint)
            if cfg.weight_sync.measure_raw_broadcast:
                raw = run.sync.raw_broadcast_gbps(run.sync.num_bytes)
                tracker.log_metrics(state.step if state else 0, {"sync/raw_broadcast_gbps": raw})
                console.info(f"weight sync yardstick: a plain broadcast of the model's {run.sync.num_bytes / 1e6:.1f} MB runs at {raw:.2f} GB/s")
            progress = _restore(run, resume_from, state) if state else _start(run)
            try:
                return _loop(run, progress)
            except (ClusterError, WeightSyncError) as err:  # an actor died: say how to go on
                raise type(err)(f"{err}; {_resume_hint(checkpoints)}") from None
            except ray.exceptions.RayError as err:
                raise ClusterError(f"an actor failed: {error_line(err)}; {_resume_hint(checkpoints)}") from None
    finally:
        console.close()


def _report_placement(workers, tracker: MlflowTracker, console: ConsoleReporter) -> None:
    """Where each actor landed: a line in the log, and a `placement.<actor>` tag (the node id)."""
    placed = workers.nodes()
    tracker.set_tags({f"placement.{name}": node for name, node in placed.items()})
    by_node: dict[str, list[str]] = {}
    for name, node in placed.items():
        by_node.setdefault(node, []).append(name)
    console.info("placement: " + "; ".join(f"{', '.join(names)} on node {node[:8]}" for node, names in by_node.items()))


@dataclass
class Run:
    """What every phase of a run reaches for."""

    cfg: Config
    inputs: RunInputs
    workers: Workers
    tracker: MlflowTracker
    console: ConsoleReporter
    recipe_hash: str = ""

    def __post_init__(self) -> None:
        self.sync = WeightBroadcaster(self.workers.learners, self.workers.rollouts, self.cfg.weight_sync.bucket_mb,
                                      self.cfg.weight_sync.timeout_s, adapter_only=syncs_lora_adapter(self.cfg))
        what = "the LoRA adapter" if self.sync.adapter_only else "the weights"
        self.console.info(f"weight sync: {what} ({self.sync.num_bytes / 1e6:.2f} MB) over {self.sync.backend}: {self.sync.backend_reason}")
        recovery = WorkerRecovery(
            self.workers.rollouts, self.workers.rewards, max_restarts=self.cfg.ray.max_actor_restarts, log=self.console.info,
            resync=lambda: self.sync.resend(self.inputs.probe, self.cfg.weight_sync.probe_tolerance),
        )
        self.builder = BatchBuilder(self.cfg, self.workers, PromptStream(self.inputs.train_prompts, seed=self.cfg.seed), recovery,
                                    policy_version=lambda: self.sync.version)
        self.output_dir = Path(self.cfg.output_dir)
        self.ray_metrics = StepGauges(self.tracker.run_id)  # for Prometheus: dashboards/grpo-ray.json


@dataclass
class Progress:
    """Where the run is; a checkpoint stores it (TrainerState) and a resume starts from it."""

    step: int = 0
    stage_index: int = 0  # the stage the next step belongs to
    accuracy: dict[int, float] = field(default_factory=dict)
    skipped_in_a_row: int = 0
    nonfinite_in_a_row: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    open_stage_run: str | None = None  # a resumed run goes on logging into its stage's run


def _start(run: Run) -> Progress:
    stages = plan_stages(run.cfg)
    accuracy = _evaluate(run, stages[0], step=0)
    run.console.info(f"step 0: held-out accuracy {accuracy:.3f}")
    return Progress(accuracy={0: accuracy})


def _loop(run: Run, progress: Progress) -> TrainResult:
    cfg = run.cfg
    stages = plan_stages(cfg)
    for stage in stages[progress.stage_index:]:
        _open_stage(run, stage, progress)
        reached = False  # train.stop_at_accuracy
        while progress.step < stage.last_step:
            interrupts.raise_if_requested()
            metrics = _train_step(run, stage, progress.step + 1)
            if metrics is None:  # nothing to learn from in this batch: the step does not count
                progress.skipped_in_a_row += 1
                if progress.skipped_in_a_row >= cfg.train.max_skipped_batches:
                    raise NothingToLearnError(_skip_message(cfg, progress.skipped_in_a_row))
                continue
            metrics["batch/skipped_before"] = float(progress.skipped_in_a_row)
            progress.step, progress.skipped_in_a_row, progress.metrics = progress.step + 1, 0, metrics
            step = progress.step
            run.tracker.log_metrics(step, metrics)
            run.ray_metrics.record(step, metrics, completions=len(run.builder.last_batch.generated))
            _count_skipped_update(progress, cfg.train.max_nonfinite_updates, run.console)
            if cfg.tracking.samples_every and step % cfg.tracking.samples_every == 0:
                _log_samples(run, step)
            if step == stage.last_step or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
                progress.accuracy[step] = metrics["eval/accuracy"] = _evaluate(run, stage, step)  # logs itself
                reached = cfg.train.stop_at_accuracy is not None and metrics["eval/accuracy"] >= cfg.train.stop_at_accuracy
            run.console.step(step, metrics)
            if reached:
                break
            if cfg.reference.refresh_every and step % cfg.reference.refresh_every == 0:
                _refresh_reference(run.workers)
            # The end of a stage has its own checkpoint, after drop-easy changed the prompts.
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0 and step < stage.last_step:
                _checkpoint(run, progress)
        _finish_stage(run, stage, is_last=stage is stages[-1] or reached)
        progress.stage_index += 1
        if reached:
            run.console.info(f"step {progress.step}: held-out accuracy {progress.accuracy[progress.step]:.3f} reached "
                             f"train.stop_at_accuracy {cfg.train.stop_at_accuracy:g}; the run ends here")
            break
        if stage is not stages[-1]:
            _checkpoint(run, progress)

    step = progress.step
    run.ray_metrics.flush()  # the last steps' values, held back between its hand-overs (every 5 s)
    model_dir = _save_model(run.workers, run.output_dir / "model")
    run.tracker.set_tags({"grpo_ray.model_dir": model_dir or ""})
    _checkpoint(run, progress, finished=True)
    run.console.info(f"done: held-out accuracy {progress.accuracy[0]:.3f} -> {progress.accuracy[step]:.3f}; model in {model_dir}")
    return TrainResult(run.tracker.run_id, run.tracker.tracking_uri, step, progress.accuracy, model_dir, progress.metrics)


def _open_stage(run: Run, stage: StagePlan, progress: Progress) -> None:
    if progress.open_stage_run is not None:
        run.tracker.resume_stage(progress.open_stage_run)
        progress.open_stage_run = None
        return
    run.tracker.start_stage(stage.name, asdict(stage))
    run.console.info(f"stage {stage.name}: steps {stage.first_step}-{stage.last_step}, temperature "
                     f"{stage.temperature:g}, max_new_tokens {stage.max_new_tokens}")


def _count_skipped_update(progress: Progress, limit: int, console: ConsoleReporter) -> None:
    """A NaN or infinite loss or gradient skipped the update (the learners left the weights as they
    were); `limit` in a row means the run has diverged."""
    if not progress.metrics.get("update/skipped"):
        progress.nonfinite_in_a_row = 0
        return
    progress.nonfinite_in_a_row += 1
    console.info(f"step {progress.step}: update skipped, the loss or a gradient was NaN or infinite "
                     f"({progress.nonfinite_in_a_row} in a row, the run stops at {limit})")
    if progress.nonfinite_in_a_row >= limit:
        raise NonFiniteUpdateError(
            f"the update was skipped {limit} steps in a row for a NaN or infinite loss or gradient (train.max_nonfinite_updates); "
            f"lower learner.lr or check the rewards, and resume from the last checkpoint"
        )


# ---------------------------------------------------------------------------------------------
# Checkpoints: written every train.checkpoint_every steps and at the end of each stage
# ---------------------------------------------------------------------------------------------


def _checkpoint(run: Run, progress: Progress, finished: bool = False) -> None:
    run.console.phase(f"step {progress.step}: writing checkpoint")
    run.tracker.flush()  # the metrics up to this step are in the store before the checkpoint says so
    workers = run.workers
    reference_saved = workers.reference is not None and run.cfg.reference.refresh_every > 0
    state = TrainerState(
        step=progress.step, stage_index=progress.stage_index, run_id=run.tracker.run_id,
        stage_run_id=run.tracker.stage_run_id, recipe_hash=run.recipe_hash, builder=run.builder.state_dict(),
        accuracy={str(step): value for step, value in progress.accuracy.items()},
        skipped_in_a_row=progress.skipped_in_a_row, nonfinite_in_a_row=progress.nonfinite_in_a_row,
        last_metrics=progress.metrics, finished=finished, reference_saved=reference_saved,
    )

    def write_parts(folder: Path) -> None:
        calls = [learner.save_checkpoint.remote(str(folder / "learner")) for learner in workers.learners]
        if reference_saved:  # refreshed from the policy: no longer the model the recipe names
            calls.append(workers.reference.save_weights.remote(str(folder / "reference")))
        ray.get(calls)

    started = time.perf_counter()
    path = write_checkpoint(run.output_dir / "checkpoints", state, write_parts, run.cfg.train.keep_checkpoints)
    run.tracker.log_metrics(progress.step, {"timing/checkpoint": time.perf_counter() - started})
    run.console.phase(None)
    run.console.info(f"step {progress.step}: checkpoint {path}")


def _restore(run: Run, folder: Path, state: TrainerState) -> Progress:
    """Load the checkpoint into the fresh actors; the rollout engines get its weights by a sync."""
    workers = run.workers
    calls = [learner.load_checkpoint.remote(str(folder / "learner")) for learner in workers.learners]
    if state.reference_saved:
        calls.append(workers.reference.load_saved_weights.remote(str(folder / "reference")))
    ray.get(calls)
    run.builder.load_state_dict(state.builder, run.inputs.train_prompts)
    run.sync.sync(state.step, run.inputs.probe, run.cfg.weight_sync.probe_tolerance)
    return Progress(
        step=state.step, stage_index=state.stage_index,
        accuracy={int(step): value for step, value in state.accuracy.items()},
        skipped_in_a_row=state.skipped_in_a_row, nonfinite_in_a_row=state.nonfinite_in_a_row,
        metrics=dict(state.last_metrics), open_stage_run=state.stage_run_id,
    )


def _already_finished(cfg: Config, state: TrainerState, folder: Path, tracking_uri: str, console) -> TrainResult:
    model_dir = Path(cfg.output_dir) / "model"
    console.info(f"{cfg.output_dir} holds a run that finished at step {state.step} ({folder}); nothing to train. "
                 "Set output_dir to a new folder, or pass --no-resume to train again from the start")
    accuracy = {int(step): value for step, value in state.accuracy.items()}
    return TrainResult(state.run_id, tracking_uri, state.step, accuracy,
                       str(model_dir) if model_dir.is_dir() else None, dict(state.last_metrics))


def _resume_hint(checkpoints: Path) -> str:
    latest = latest_checkpoint(checkpoints)
    if latest is None:
        return "no checkpoint was written yet (train.checkpoint_every), so a new run starts from the beginning"
    return f"run the same command again to resume from {latest}"


def _train_step(run: Run, stage: StagePlan, step: int) -> dict[str, float] | None:
    """Rollout, scoring, update and weight sync of one step; None when the batch was skipped."""
    cfg, workers = run.cfg, run.workers
    timer = PhaseTimer()
    started = time.perf_counter()
    sampling = SamplingSettings(
        samples_per_prompt=cfg.rollout.samples_per_prompt,
        max_new_tokens=stage.max_new_tokens,
        temperature=stage.temperature,
        top_p=stage.top_p,
        top_k=cfg.rollout.top_k,
    )
    # Rollout and scoring (more batches with dynamic sampling), then rescue and substitution.
    batch = run.builder.next_batch(sampling, timer)
    if batch.train is None:  # the loop counts it; the step's metrics say how many came before it
        return None
    # Each learner rank's rows, as slice refs; the reference reads the same refs.
    payloads, sizes = learner_payloads(batch, len(workers.learners), run.inputs.pad_id)
    train, ref_refs, extra = batch.train, None, {}
    with timer("reference"):
        if workers.reference is not None and cfg.algorithm.kl_placement == "reward":
            train, extra["kl/reward_penalty_kl"] = kl_reward_penalty(cfg, workers, payloads, train, stage.temperature)
        elif workers.reference is not None:
            ref_refs = [[workers.reference.logprobs.remote(ref, stage.temperature) for ref in refs] for refs in payloads]
            ray.wait([r for refs in ref_refs for r in refs], num_returns=sum(map(len, ref_refs)), fetch_local=False)
    with timer("advantages"):
        advantages = group_advantages(cfg, train)
    with timer("update"):
        # Pipelined rollout: the next steps' batches are queued once the learners have their work,
        # and generate while this one trains.
        room = prefetch_room(cfg, stage, step, len(run.builder.pending))
        stats = run_update(workers, payloads, sizes, train, advantages, ref_refs, step, stage.temperature,
                           float(stage.max_new_tokens), while_running=lambda: run.builder.prefetch(sampling, room))
    # Weight sync: learner rank 0 broadcasts; every worker proves what it loaded.
    with timer("sync"):
        probe_due = cfg.weight_sync.probe_every and step % cfg.weight_sync.probe_every == 0
        synced = run.sync.sync(step, run.inputs.probe if probe_due else None, cfg.weight_sync.probe_tolerance)
    metrics = step_metrics(batch.generated, stats, synced, timer.seconds, time.perf_counter() - started)
    return {**metrics, **batch.metrics, **extra}


def _finish_stage(run: Run, stage: StagePlan, is_last: bool) -> None:
    """Save the stage's weights and ledger; drop the easy prompts for the next stage."""
    cfg, builder = run.cfg, run.builder
    builder.discard_pending()  # none normally (_prefetch_room): the next stage draws from other prompts
    folder = run.output_dir / "stages" / stage.name
    folder.mkdir(parents=True, exist_ok=True)
    builder.ledger.save(folder / "ledger.jsonl")
    run.tracker.log_stage_artifact(folder / "ledger.jsonl")
    model_dir = _save_model(run.workers, folder / "model")
    run.tracker.set_stage_tag("grpo_ray.model_dir", model_dir or "")
    threshold = cfg.polaris.drop_easy_threshold
    if threshold is not None and not is_last:
        prompts = builder.stream.prompts
        kept, dropped = drop_easy([p.uid for p in prompts], builder.ledger, threshold)
        if not kept:
            raise NothingToLearnError(
                f"polaris.drop_easy_threshold: every one of the {len(prompts)} training prompts averaged above "
                f"{threshold} by the end of stage {stage.name}; raise the threshold or add harder data"
            )
        keep = set(kept)
        builder.stream = PromptStream([p for p in prompts if p.uid in keep], seed=cfg.seed)
        run.tracker.log_metrics(stage.last_step, {"polaris/dropped_easy_prompts": float(dropped),
                                                  "polaris/training_prompts": float(len(kept))})
        run.console.info(f"stage {stage.name}: dropped {dropped} prompts averaging above {threshold}; {len(kept)} remain")
    run.tracker.end_stage("FINISHED")


def _log_samples(run: Run, step: int) -> None:
    """Sample completions of the step's first generated slice, read where the slice is."""
    batch = run.builder.last_batch
    first = batch.generated.sources == 0
    rewards = [float(r) for r in batch.generated.rewards[first]]
    rows = ray.get(sample_rows.remote(batch.refs[0], run.cfg.tracking.samples_per_table, rewards))
    run.tracker.log_table([{"step": step, **row} for row in rows], f"samples/step_{step:06d}.json")


def _skip_message(cfg: Config, count: int) -> str:
    if cfg.polaris.substitution:
        why = (f"polaris.substitution: {count} batches in a row had at most {cfg.train.prompts_per_step // 3} "
               "informative groups (mean reward strictly between 0 and 1)")
    else:
        why = f"algorithm.dynamic_sampling: {count} batches in a row had no group with a reward spread"
    return why + "; the data is too easy or too hard for this model: filter it (data.difficulty_band) or raise train.max_skipped_batches"


def _refresh_reference(workers: Workers) -> None:
    """Copy the policy into the reference model (every rank gathers; rank 0's copy is sent)."""
    snapshots = [learner.policy_weights.remote() for learner in workers.learners]
    ray.get(workers.reference.load_weights.remote(snapshots[0]))
    ray.get(snapshots[1:])


def _evaluate(run: Run, stage: StagePlan, step: int) -> float:
    """Held-out accuracy (avg@k): the mean score of the first reward function over all samples."""
    cfg, workers, prompts = run.cfg, run.workers, run.inputs.eval_prompts
    if not prompts:
        return float("nan")
    run.console.phase(f"step {step}: evaluating {len(prompts)} held-out prompts, {cfg.train.eval_samples} sample{'s' if cfg.train.eval_samples > 1 else ''} each")
    sampling = SamplingSettings(
        samples_per_prompt=cfg.train.eval_samples, max_new_tokens=stage.max_new_tokens,
        temperature=stage.eval_temperature, top_p=stage.top_p, seed=cfg.seed + step,
    )
    # Uneven shares are fine here: evaluation slices do not go to the learners.
    shares = np.array_split(np.arange(len(prompts)), len(workers.rollouts))
    shares = [share for share in shares if len(share)]
    refs = [
        worker.generate.remote([prompts[i] for i in share], int(share[0]), sampling, 1)
        for worker, share in zip(workers.rollouts, shares)
    ]
    scored = score_slices(workers, cfg, refs, [len(share) * cfg.train.eval_samples for share in shares])
    first = cfg.reward.functions[0].name if cfg.reward.functions else "reward_model"
    scores = np.concatenate([s.per_function[first] for s in scored])
    accuracy = float(np.nanmean(scores)) if np.isfinite(scores).any() else 0.0
    run.console.phase(None)
    run.tracker.log_metrics(step, {"eval/accuracy": accuracy, "eval/reward_mean": float(np.nanmean(np.concatenate([s.rewards for s in scored])))})
    return accuracy


def _save_model(workers: Workers, path: Path) -> str | None:
    saved = ray.get([learner.save_model.remote(str(path)) for learner in workers.learners])
    return saved[0]
