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
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import ray
import torch

from grpo_ray import interrupts
from grpo_ray.algo.polaris import drop_easy
from grpo_ray.cluster.ray_metrics import StepGauges
from grpo_ray.cluster.roles import Workers, start_workers
from grpo_ray.cluster.session import ray_session
from grpo_ray.cluster.weights import WeightBroadcaster
from grpo_ray.config import Config, StagePlan, config_to_dict, flatten, plan_batches, plan_stages, total_steps
from grpo_ray.data.prompts import PromptStream
from grpo_ray.run_setup import RunInputs, prepare_inputs
from grpo_ray.step_batch import BatchBuilder, NothingToLearnError, RewardFailureError, sample_rows, score_slices
from grpo_ray.step_metrics import step_metrics
from grpo_ray.tracking import ConsoleReporter, MlflowTracker, default_tracking_uri
from grpo_ray.types import SamplingSettings
from grpo_ray.update import group_advantages, kl_reward_penalty, learner_payloads, run_update

__all__ = ["NothingToLearnError", "RewardFailureError", "TrainResult", "train"]


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


def train(cfg: Config, console: ConsoleReporter | None = None) -> TrainResult:
    plan_batches(cfg)
    inputs = prepare_inputs(cfg)  # checks paths, tokenises prompts: fails before any actor starts
    output_dir = Path(cfg.output_dir)
    console = console or ConsoleReporter(total_steps(cfg))
    tracker = MlflowTracker(
        cfg.tracking.tracking_uri or default_tracking_uri(output_dir),
        cfg.tracking.experiment,
        cfg.tracking.run_name,
        artifact_root=output_dir / "mlartifacts" if cfg.tracking.tracking_uri is None else None,
    )
    tracker.log_config(flatten(config_to_dict(cfg)), config_to_dict(cfg))
    console.info(f"MLflow run {tracker.run_id} in {tracker.tracking_uri}")
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
            return _loop(Run(cfg, inputs, workers, tracker, console))
    finally:
        console.close()


@dataclass
class Run:
    """What every phase of a run reaches for."""

    cfg: Config
    inputs: RunInputs
    workers: Workers
    tracker: MlflowTracker
    console: ConsoleReporter

    def __post_init__(self) -> None:
        backend = "nccl" if torch.cuda.is_available() and self.cfg.rollout.num_gpus > 0 else "gloo"
        self.sync = WeightBroadcaster(self.workers.learners, self.workers.rollouts, self.cfg.weight_sync.bucket_mb,
                                      self.cfg.weight_sync.timeout_s, backend)
        self.builder = BatchBuilder(self.cfg, self.workers, PromptStream(self.inputs.train_prompts, seed=self.cfg.seed))
        self.output_dir = Path(self.cfg.output_dir)
        self.ray_metrics = StepGauges(self.tracker.run_id)  # for Prometheus: dashboards/grpo-ray.json


def _loop(run: Run) -> TrainResult:
    cfg = run.cfg
    stages = plan_stages(cfg)
    accuracy = {0: _evaluate(run, stages[0], step=0)}
    run.console.info(f"step 0: held-out accuracy {accuracy[0]:.3f}")
    step, metrics = 0, {}
    for stage in stages:
        run.tracker.start_stage(stage.name, asdict(stage))
        run.console.info(f"stage {stage.name}: steps {stage.first_step}-{stage.last_step}, temperature "
                         f"{stage.temperature:g}, max_new_tokens {stage.max_new_tokens}")
        skipped_in_a_row = 0
        while step < stage.last_step:
            interrupts.raise_if_requested()
            metrics = _train_step(run, stage, step + 1)
            if metrics is None:  # nothing to learn from in this batch: the step does not count
                skipped_in_a_row += 1
                if skipped_in_a_row >= cfg.train.max_skipped_batches:
                    raise NothingToLearnError(_skip_message(cfg, skipped_in_a_row))
                continue
            metrics["batch/skipped_before"] = float(skipped_in_a_row)
            step, skipped_in_a_row = step + 1, 0
            run.tracker.log_metrics(step, metrics)
            run.ray_metrics.record(step, metrics, completions=len(run.builder.last_batch.generated))
            if cfg.tracking.samples_every and step % cfg.tracking.samples_every == 0:
                _log_samples(run, step)
            if step == stage.last_step or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
                accuracy[step] = metrics["eval/accuracy"] = _evaluate(run, stage, step)  # logs itself
            run.console.step(step, metrics)
            if cfg.reference.refresh_every and step % cfg.reference.refresh_every == 0:
                _refresh_reference(run.workers)
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                _save_model(run.workers, run.output_dir / "checkpoints" / f"step_{step:06d}")
        _finish_stage(run, stage, is_last=stage is stages[-1])

    model_dir = _save_model(run.workers, run.output_dir / "model")
    run.tracker.set_tags({"grpo_ray.model_dir": model_dir or ""})
    run.console.info(f"done: held-out accuracy {accuracy[0]:.3f} -> {accuracy[step]:.3f}; model in {model_dir}")
    return TrainResult(run.tracker.run_id, run.tracker.tracking_uri, step, accuracy, model_dir, metrics)


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
        stats = run_update(workers, payloads, sizes, train, advantages, ref_refs, step, stage.temperature, float(stage.max_new_tokens))
    # Weight sync: learner rank 0 broadcasts; every worker proves what it loaded.
    with timer("sync"):
        probe_due = cfg.weight_sync.probe_every and step % cfg.weight_sync.probe_every == 0
        synced = run.sync.sync(step, run.inputs.probe if probe_due else None, cfg.weight_sync.probe_tolerance)
    metrics = step_metrics(batch.generated, stats, synced, timer.seconds, time.perf_counter() - started)
    return {**metrics, **batch.metrics, **extra}


def _finish_stage(run: Run, stage: StagePlan, is_last: bool) -> None:
    """Save the stage's weights and ledger; drop the easy prompts for the next stage."""
    cfg, builder = run.cfg, run.builder
    folder = run.output_dir / "stages" / stage.name
    folder.mkdir(parents=True, exist_ok=True)
    builder.ledger.save(folder / "ledger.jsonl")
    run.tracker.log_stage_artifact(folder / "ledger.jsonl")
    model_dir = _save_model(run.workers, folder / "model")
    run.tracker.client.set_tag(run.tracker.stage_run_id, "grpo_ray.model_dir", model_dir or "")
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
    run.tracker.log_metrics(step, {"eval/accuracy": accuracy, "eval/reward_mean": float(np.nanmean(np.concatenate([s.rewards for s in scored])))})
    return accuracy


def _save_model(workers: Workers, path: Path) -> str | None:
    saved = ray.get([learner.save_model.remote(str(path)) for learner in workers.learners])
    return saved[0]
