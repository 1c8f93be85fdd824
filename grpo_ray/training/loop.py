r"""The GRPO training loop: stages of steps, each step rollout -> rewards -> update -> weight sync.

The whole algorithm on one screen, without Ray, actors or checkpoints, is
benchmarks/plain_grpo_loop.py: read it first. This module is the same loop spread over actors.

Variant: GRPO (Shao et al., 2024) with the recipe's choices of advantage, loss aggregation, KL
placement and clipping (see algorithm in the config). Per prompt, G completions; advantage per
group, for every token of the completion; per-token clipped-ratio loss. With one pass over a
batch pi_old = pi_theta (ratio 1 in value); with mu passes pi_old is the rollout's log-probs
(algo/off_policy.py).

Data flow per step (large arrays never pass through this process):

    prompts -> RolloutWorker x R --RolloutSlice refs--> RewardWorker x K -> small ScoredSlices
            (issued, waited for and recovered by cluster/rollout_service.py: one ScoredBatch)
    driver: dynamic sampling, rescue, substitution on the small arrays (training/batch.py),
            the learners' slices assembled where the data is when rows changed (training/update.py)
    ReferenceWorker (KL) <- the learners' slice refs
    LearnerWorker x L <- its slice refs + advantages;  learner 0 --weights--> every RolloutWorker
                                                       (cluster/weight_broadcast.py, transport/routes.py)

Next hop from `_train_step`: training/batch.py (the step's batch), then training/update.py (the update).

Stages (POLARIS) run one after the other on the same actors: the next stage starts from the
weights the last one ended with; each is a nested MLflow run with its own model and ledger.
Checkpoints and resume: training/resume.py; held-out evaluation: training/evaluation.py.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import ray

from grpo_ray.algo.polaris import drop_easy
from grpo_ray.cluster.dispatch import fetch
from grpo_ray.cluster.placement import ClusterError, error_line
from grpo_ray.cluster.session import cluster_tags
from grpo_ray.cluster.tasks import beside_data
from grpo_ray.cluster.weight_broadcast import SyncResult, WeightSyncError
from grpo_ray.config import Config, StagePlan, plan_batches, plan_stages, prefetch_room, total_steps
from grpo_ray.data.prompts import PromptStream
from grpo_ray.tracking import ConsoleReporter
from grpo_ray.training import interrupts
from grpo_ray.training.distill import rewards_signal, teach
from grpo_ray.training.checkpoint import read_state, resume_point, run_hashes, set_aside
from grpo_ray.training.errors import (
    NonFiniteUpdateError,
    NothingToLearnError,
    RewardFailureError,
    RunStoppedError,
    skip_message,
)
from grpo_ray.training.evaluation import heldout_accuracy, unmeasured_reason
from grpo_ray.training.metrics import accuracy_change, accuracy_text, step_metrics
from grpo_ray.training.launch import started
from grpo_ray.training.preflight import checks_beside_ray
from grpo_ray.training.opening import (
    report_placement,
    report_startup,
    report_sync,
    report_yardstick,
)
from grpo_ray.training.resume import already_finished, checkpoint, restore, resume_hint
from grpo_ray.training.run import PhaseTimer, Progress, Run, TrainResult
from grpo_ray.training.sample_table import sample_rows
from grpo_ray.training.startup import StartupClock
from grpo_ray.training.update import group_advantages, reference_signal, learner_payloads, run_update, turn_slopes
from grpo_ray.types import SamplingSettings

__all__ = ["NonFiniteUpdateError", "NothingToLearnError", "RewardFailureError", "TrainResult", "train"]


def train(
    cfg: Config, console: ConsoleReporter | None = None, resume: str = "auto", launched: float | None = None
) -> TrainResult:
    """Run the recipe; resume: "auto" (from the newest checkpoint in output_dir if any), "require"
    (--resume) or "never" (--no-resume: start over, the old checkpoints moved aside); launched: when
    the run was asked for (the CLI's process start; None: now), where its start-up table begins."""
    clock = StartupClock.started(launched)  # training/startup.py: each phase until the first step
    plan_batches(cfg)
    slow_checks = checks_beside_ray(cfg)  # what the run needs: the quick checks, before any Ray
    clock.mark("checks")
    console = console or ConsoleReporter(total_steps(cfg), pipelined=cfg.rollout.max_staleness > 0)
    checkpoints = Path(cfg.output_dir) / "checkpoints"
    if resume == "never" and (moved := set_aside(checkpoints, time.strftime("%Y%m%d-%H%M%S"))):
        console.info(f"--no-resume: the earlier checkpoints were moved to {moved}")
    hashes = run_hashes(cfg)
    resume_from = resume_point(checkpoints, resume, hashes)
    state = read_state(resume_from) if resume_from else None
    try:
        if state is not None and state.finished:
            return already_finished(cfg, state, resume_from, console)
        with started(cfg, slow_checks, state, resume_from, console, clock) as (inputs, tracker, workers):
            tracker.set_tags(cluster_tags())
            report_placement(workers, tracker, console)
            run = Run(cfg, inputs, workers, tracker, console, hashes.current)
            report_sync(run.sync, console)
            if cfg.weight_sync.measure_raw_broadcast:
                report_yardstick(run, state.step if state else 0)
            clock.mark("weight_sync")
            progress = restore(run, resume_from, state) if state else _start(run)
            clock.mark("restore" if state else "eval")
            report_startup(clock, progress.step, tracker, console)
            return _loop_saying_how_to_go_on(run, progress, checkpoints)
    finally:
        console.close()


def _loop_saying_how_to_go_on(run: Run, progress: Progress, checkpoints: Path) -> TrainResult:
    """The run's steps; an actor's death or a failed sync ends it with how to resume."""
    try:
        return _loop(run, progress)
    except (ClusterError, WeightSyncError) as err:  # an actor died: say how to go on
        raise type(err)(f"{err}; {resume_hint(checkpoints)}") from None
    except RunStoppedError as stop:  # the step it stopped: its figures reach MLflow and the console first
        run.log_stopped_step(progress.step + 1, stop.metrics)
        raise
    except ray.exceptions.RayError as err:
        raise ClusterError(f"an actor failed: {error_line(err)}; {resume_hint(checkpoints)}") from None


def _start(run: Run) -> Progress:
    if run.cfg.rollout.max_staleness:  # learner rank 0 keeps what it sends: the first batches' weights too
        run.sync.sync(0, None, run.cfg.weight_sync.probe_tolerance)
    stages = plan_stages(run.cfg)
    accuracy = heldout_accuracy(run, stages[0], step=0)
    run.console.info(f"step 0: held-out accuracy {accuracy_text(accuracy, unmeasured_reason(run.cfg))}")
    return Progress(accuracy={0: accuracy})


def _loop(run: Run, progress: Progress) -> TrainResult:
    cfg = run.cfg
    stages = plan_stages(cfg)
    for stage in stages[progress.stage_index :]:
        _open_stage(run, stage, progress)
        reached = False  # train.stop_at_accuracy
        while progress.step < stage.last_step:
            interrupts.raise_if_requested()
            metrics = _train_step(run, stage, progress.step + 1)
            if metrics is None:  # nothing to learn from in this batch: the step does not count
                progress.skipped_in_a_row += 1
                if progress.skipped_in_a_row >= cfg.train.max_skipped_batches:
                    raise NothingToLearnError(
                        skip_message(cfg.polaris.substitution, cfg.train.prompts_per_step, progress.skipped_in_a_row)
                    )
                continue
            reached = _record_step(run, stage, progress, metrics)
            if reached:
                break
            if cfg.reference.refresh_every and progress.step % cfg.reference.refresh_every == 0:
                run.workers.refresh_reference()
            if _checkpoint_due(run, stage, progress.step):
                checkpoint(run, progress)
        _finish_stage(run, stage, is_last=stage is stages[-1] or reached)
        progress.stage_index += 1
        if reached:
            run.console.info(
                f"step {progress.step}: held-out accuracy {progress.accuracy[progress.step]:.3f} reached "
                f"train.stop_at_accuracy {cfg.train.stop_at_accuracy:g}; the run ends here"
            )
            break
        if stage is not stages[-1]:
            checkpoint(run, progress)

    step = progress.step
    run.ray_metrics.flush()  # the last steps' values, held back between its hand-overs (every 5 s)
    model_dir = run.workers.save_model(run.output_dir / "model")
    run.tracker.set_tags({"grpo_ray.model_dir": model_dir or ""})
    checkpoint(run, progress, finished=True)
    change = accuracy_change(progress.accuracy[0], progress.accuracy[step], unmeasured_reason(run.cfg))
    run.console.info(f"done: held-out accuracy {change}; model in {model_dir}")
    return TrainResult(
        run.tracker.run_id, run.tracker.tracking_uri, step, progress.accuracy, model_dir, progress.metrics
    )


def _record_step(run: Run, stage: StagePlan, progress: Progress, metrics: dict[str, float]) -> bool:
    """Count the step, log it, evaluate when due; whether train.stop_at_accuracy was reached."""
    cfg = run.cfg
    metrics["batch/skipped_before"] = float(progress.skipped_in_a_row)
    progress.step, progress.skipped_in_a_row, progress.metrics = progress.step + 1, 0, metrics
    step = progress.step
    run.tracker.log_metrics(step, metrics)
    run.ray_metrics.record(step, metrics, completions=len(run.builder.last_batch.generated))
    _count_skipped_update(progress, cfg.train.max_nonfinite_updates, run.console)
    if far := run.far_moves.line(step, metrics):  # an update far past the clip: learner.lr, said once (far_moves.py)
        run.console.info(far)
    if cfg.tracking.samples_every and step % cfg.tracking.samples_every == 0:
        _log_samples(run, step)
    reached = False
    if step == stage.last_step or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
        progress.accuracy[step] = metrics["eval/accuracy"] = heldout_accuracy(run, stage, step)  # logs itself
        reached = cfg.train.stop_at_accuracy is not None and metrics["eval/accuracy"] >= cfg.train.stop_at_accuracy
    run.console.step(step, metrics)
    return reached


def _checkpoint_due(run: Run, stage: StagePlan, step: int) -> bool:
    """Every train.checkpoint_every steps, and once train.checkpoint_every_minutes have passed, as soon
    as no batch started ahead is in flight (a resumed run must draw what this one draws). The end of a
    stage has its own checkpoint, after drop-easy changed the prompts."""
    every = run.cfg.train.checkpoint_every
    if step >= stage.last_step:
        return False
    return bool(every and step % every == 0) or (run.checkpoint_time_due() and not run.builder.pending)


def _open_stage(run: Run, stage: StagePlan, progress: Progress) -> None:
    if progress.open_stage_run is not None:
        run.tracker.resume_stage(progress.open_stage_run)
        progress.open_stage_run = None
        return
    # A recipe of one implicit stage (no `stages:`) is the run itself: no nested MLflow run, whose
    # curves and model would repeat the run's.
    if run.cfg.stages:
        run.tracker.start_stage(stage.name, asdict(stage))
    run.console.info(
        f"stage {stage.name}: steps {stage.first_step}-{stage.last_step}, temperature "
        f"{stage.temperature:g}, max_new_tokens {stage.max_new_tokens}"
    )


def _count_skipped_update(progress: Progress, limit: int, console: ConsoleReporter) -> None:
    """A NaN or infinite loss or gradient skipped the update (the learners left the weights as they
    were); `limit` in a row means the run has diverged."""
    if not progress.metrics.get("update/skipped"):
        progress.nonfinite_in_a_row = 0
        return
    progress.nonfinite_in_a_row += 1
    console.info(
        f"step {progress.step}: update skipped, the loss or a gradient was NaN or infinite "
        f"({progress.nonfinite_in_a_row} in a row, the run stops at {limit})"
    )
    if progress.nonfinite_in_a_row >= limit:
        raise NonFiniteUpdateError(
            f"the update was skipped {limit} steps in a row for a NaN or infinite loss or gradient "
            "(train.max_nonfinite_updates); "
            f"lower learner.lr or check the rewards, and resume from the last checkpoint"
        )


def _train_step(run: Run, stage: StagePlan, step: int) -> dict[str, float] | None:
    """Rollout, scoring, update and weight sync of one step; None when the batch was skipped."""
    cfg, workers = run.cfg, run.workers
    timer = PhaseTimer()
    started = time.perf_counter()
    sampling = _sampling(cfg, stage, step)
    # Rollout and scoring (more batches with dynamic sampling), then rescue and substitution.
    batch = run.builder.next_batch(sampling, timer)
    if batch.train is None:  # the loop counts it; the step's metrics say how many came before it
        return None
    if cfg.rollout.vllm.sleep_level:  # one GPU in turns: the engines' memory goes to the update until the sync
        with timer("sleep"):
            workers.sleep_rollouts()
    # Each learner rank's rows, as slice refs; the reference reads the same refs.
    payloads, sizes = learner_payloads(batch, len(workers.learners), run.inputs.pad_id)
    a, extra, kl_coef = cfg.algorithm, {}, run.kl.coef  # algorithm.kl_controller: this step's coefficient
    with timer("reference"):
        train, ref_refs = reference_signal(
            workers, payloads, batch.train, stage.temperature, a.kl_estimator, kl_coef, a.kl_in_loss, extra
        )
    distilled = cfg.use_distillation  # the teachers score the learners' slices (training/distill.py)
    with timer("teacher"):
        taught = teach(workers, payloads, stage.temperature, run.recovery, cfg.distillation, extra)
    with timer("advantages"):
        advantages = group_advantages(train, a.advantage, a.normalize_by_std)
        advantages = rewards_signal(advantages, cfg.distillation.with_rewards)
        slopes = turn_slopes(train, a.advantage, a.normalize_by_std, cfg.environment.reward_per_turn)
    with timer("update"):
        # Pipelined rollout: the next steps' batches are queued once the learners have their work,
        # and generate while this one trains.
        # Nothing more is started ahead once a time-based checkpoint is due: it waits for none in flight.
        room = 0 if run.checkpoint_time_due() else prefetch_room(cfg, stage, step, len(run.builder.pending))
        stats = run_update(
            workers,
            payloads,
            sizes,
            train,
            advantages,
            ref_refs,
            step,
            stage.temperature,
            float(stage.max_new_tokens),
            while_running=lambda: run.builder.prefetch(lambda ahead: _sampling(cfg, stage, step + ahead), room),
            kl_coef=kl_coef if a.kl_in_loss else None,
            slopes=slopes,
            taught=taught,
            distill_coef=cfg.distillation.coef if distilled else None,
        )
    if cfg.rollout.max_staleness:  # what overlapped the update: batches generating beside it, and how many ended first
        extra["pipeline/ahead_during_update"], extra["pipeline/ahead_generated_by_update_end"] = run.builder.ahead()
    # Weight sync: learner rank 0 broadcasts; every worker proves what it loaded.
    with timer("sync"):
        probe_due = cfg.weight_sync.probe_every and step % cfg.weight_sync.probe_every == 0
        synced = _sync_weights(run, step, run.inputs.probe if probe_due else None)
    metrics = step_metrics(batch.generated, stats, synced, timer.seconds, time.perf_counter() - started)
    metrics.update(_recoveries_since_last_step(run))
    if workers.reference is not None:  # the KL the penalty used moves the next step's coefficient
        extra["kl/coef"] = kl_coef
        observed = extra.get("kl/reward_penalty_kl", metrics.get("actor/kl", float("nan")))
        run.kl.update(observed, int((train.row_weights > 0).sum()))
    return {**metrics, **batch.metrics, **extra}


def _sampling(cfg: Config, stage: StagePlan, step: int) -> SamplingSettings:
    """How this stage samples the G completions of a prompt for `step`; episodes keep their
    conversations for the steps that log a sample table (tracking.samples_every)."""
    every = cfg.tracking.samples_every
    return SamplingSettings(
        samples_per_prompt=cfg.rollout.samples_per_prompt,
        max_new_tokens=stage.max_new_tokens,
        temperature=stage.temperature,
        top_p=stage.top_p,
        top_k=cfg.rollout.top_k,
        keep_messages=bool(every) and step % every == 0,
    )


def _recoveries_since_last_step(run: Run) -> dict[str, float]:
    """Every recovery since the last step (in this step's phases, or in an evaluation or checkpoint between)."""
    counters = run.recovery.counters()
    since = {key: value - run.faults_logged.get(key, 0.0) for key, value in counters.items()}
    run.faults_logged = counters
    return since


def _sync_weights(run: Run, step: int, probe) -> SyncResult:
    """Learner rank 0 broadcasts; every worker proves what it loaded. A rollout worker that died since
    it last generated (idle during the update, or in the sync itself) breaks the sync: Ray restarts it,
    and the learners' weights are sent again to a new group with it. Any other failure ends the run."""
    try:
        synced = run.sync.sync(step, probe, run.cfg.weight_sync.probe_tolerance)
    except (WeightSyncError, ray.exceptions.RayError) as err:
        if not run.recovery.replace_dead_rollouts(err):
            raise
        synced = run.sync.last
    if synced.probe is not None and synced.probe.notice and not run.probe_notice_given:
        run.console.info(f"step {step}: {synced.probe.notice}")
        run.probe_notice_given = True
    return synced


def _finish_stage(run: Run, stage: StagePlan, is_last: bool) -> None:
    """Save the stage's weights and ledger; drop the easy prompts for the next stage."""
    cfg, builder = run.cfg, run.builder
    builder.discard_pending()  # none normally (config.prefetch_room): the next stage draws from other prompts
    folder = run.output_dir / "stages" / stage.name
    folder.mkdir(parents=True, exist_ok=True)
    builder.ledger.save(folder / "ledger.jsonl")
    if cfg.stages:  # one implicit stage: its model is the run's, saved once at the end (_loop)
        run.tracker.log_stage_artifact(folder / "ledger.jsonl")
        model_dir = run.workers.save_model(folder / "model")
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
        run.tracker.log_metrics(
            stage.last_step,
            {"polaris/dropped_easy_prompts": float(dropped), "polaris/training_prompts": float(len(kept))},
        )
        run.console.info(
            f"stage {stage.name}: dropped {dropped} prompts averaging above {threshold}; {len(kept)} remain"
        )
    run.tracker.end_stage("FINISHED")


def _log_samples(run: Run, step: int) -> None:
    """Sample completions of the slice holding the step's first row, read where the slice is."""
    batch = run.builder.last_batch
    source = int(batch.generated.sources[0])
    mine = batch.generated.sources == source
    # By the slice's own row order: a streamed batch lists its rows in group order, not the slice's.
    rewards = [float("nan")] * batch.slice_rows[source]
    for row, reward in zip(batch.generated.rows[mine], batch.generated.rewards[mine]):
        rewards[int(row)] = float(reward)
    rows = fetch(beside_data(sample_rows, batch.refs[source], run.cfg.tracking.samples_per_table, rewards))
    run.tracker.log_table([{"step": step, **row} for row in rows], f"samples/step_{step:06d}.json")
