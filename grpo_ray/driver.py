r"""The GRPO training loop.

Variant: GRPO (Shao et al., 2024) with one policy update per rollout batch. Per prompt, G
completions; advantage A_i = (r_i - mean r) / (std r + eps) for every token of completion i; loss
per token -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A) + beta * KL_k3, token-mean over the
step. Departures from the paper: with a single update per batch pi_old = pi_theta (rho = 1 in
value), and the KL term is the k3 estimator against a frozen reference, added to the loss.

Data flow per step (large arrays never pass through this process):

    prompts -> RolloutWorker x R --RolloutSlice refs--> RewardWorker x K -> small ScoredSlices
                                 \--------------------> ReferenceWorker  -> ref log-prob refs
    driver: group advantages from the scores
    LearnerWorker x L <- its own slice refs + advantages;  learner 0 --weights--> every RolloutWorker
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray
import torch

from grpo_ray.algo import compute_advantages
from grpo_ray.algo.overlong import shape_overlong_rewards
from grpo_ray.cluster.actors import ClusterError, error_line
from grpo_ray.cluster.roles import Workers, start_workers
from grpo_ray.cluster.session import ray_session
from grpo_ray.cluster.weights import WeightBroadcaster
from grpo_ray.config import Config, config_to_dict, flatten, plan_batches
from grpo_ray.data.prompts import PromptStream
from grpo_ray.rewards.monitor import FailureMonitor
from grpo_ray.run_setup import RunInputs, prepare_inputs
from grpo_ray.tracking import ConsoleReporter, MlflowTracker, default_tracking_uri
from grpo_ray.types import LearnerShard, Prompt, SamplingSettings, ScoredSlice


@dataclass(frozen=True)
class TrainResult:
    run_id: str
    tracking_uri: str
    steps: int
    eval_accuracy: dict[int, float]  # step -> held-out accuracy
    model_dir: str | None
    last_metrics: dict[str, float]


class RewardFailureError(RuntimeError):
    """A reward function failed on too many completions; the message names it and its first error."""


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
    plan = plan_batches(cfg)
    inputs = prepare_inputs(cfg)  # checks paths, tokenises prompts: fails before any actor starts
    output_dir = Path(cfg.output_dir)
    console = console or ConsoleReporter(cfg.train.steps)
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
    status = "FAILED"
    try:
        with ray_session(cfg.ray) as session:
            where = "a local Ray started for this run" if session.started_local else f"the Ray cluster at {session.address}"
            console.info(f"running on {where}" + (f"; Ray dashboard {session.dashboard_url}" if session.dashboard_url else ""))
            workers = start_workers(cfg, plan)
            tracker.set_tags({"cluster.nodes": str(len(ray.nodes())), "cluster.cpus": f"{ray.cluster_resources().get('CPU', 0):g}"})
            result = _loop(cfg, inputs, workers, tracker, console)
        status = "FINISHED"
        return result
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.finish(status)
        console.close()


def _loop(cfg: Config, inputs: RunInputs, workers: Workers, tracker: MlflowTracker, console: ConsoleReporter) -> TrainResult:
    plan = plan_batches(cfg)
    backend = "nccl" if torch.cuda.is_available() and cfg.rollout.num_gpus > 0 else "gloo"
    sync = WeightBroadcaster(workers.learners, workers.rollouts, cfg.weight_sync.bucket_mb, cfg.weight_sync.timeout_s, backend)
    stream = PromptStream(inputs.train_prompts, seed=cfg.seed)
    num_learners = len(workers.learners)
    failures = FailureMonitor(cfg.reward.failure_window_steps, cfg.reward.max_failure_rate)
    accuracy: dict[int, float] = {}

    accuracy[0] = _evaluate(cfg, inputs, workers, tracker, step=0)
    console.info(f"step 0: held-out accuracy {accuracy[0]:.3f}")
    metrics: dict[str, float] = {}
    for step in range(1, cfg.train.steps + 1):
        timer = PhaseTimer()
        step_started = time.perf_counter()
        sampling = SamplingSettings(
            samples_per_prompt=cfg.rollout.samples_per_prompt,
            max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            seed=cfg.seed * 1_000_003 + step,
        )

        # Rollout: each worker samples its share of the prompts and returns one slice per learner
        # rank, as object references. We wait for them without fetching them.
        with timer("rollout"):
            slice_refs = rollout_refs(workers.rollouts, stream.take(plan.prompts_per_step), sampling, num_learners)
            flat_refs = [ref for per_worker in slice_refs for ref in per_worker]
            ray.wait(flat_refs, num_returns=len(flat_refs), fetch_local=False)

        # Reference log-probs start now and run beside the scoring; learners receive the refs.
        ref_refs = [workers.reference.logprobs.remote(ref, cfg.rollout.temperature) for ref in flat_refs] if workers.reference else None

        # Rewards: the pool reads the slices where they are; the driver pulls only the scores.
        with timer("reward"):
            scored = score_slices(workers, cfg, flat_refs, [plan.completions_per_step // len(flat_refs)] * len(flat_refs))
            failures.record(*failure_counts(scored))
            if (stop := failures.check()) is not None:
                raise RewardFailureError(stop)

        # Advantages: group-relative, over the whole step, in this process (small arrays).
        # Truncated completions are first treated as algorithm.overlong says.
        with timer("advantages"):
            rewards, row_weights = _shape_rewards(cfg, scored)
            advantages = _group_advantages(cfg, scored, rewards, row_weights)

        # Update: learner rank j trains on slice j of every rollout worker.
        with timer("update"):
            if ref_refs is not None:
                ray.wait(ref_refs, num_returns=len(ref_refs), fetch_local=False)
            stats = _update(cfg, workers, slice_refs, ref_refs, advantages, row_weights, scored, step)

        # Weight sync: learner rank 0 broadcasts; every worker proves what it loaded.
        with timer("sync"):
            probe_due = cfg.weight_sync.probe_every and step % cfg.weight_sync.probe_every == 0
            synced = sync.sync(step, inputs.probe if probe_due else None, cfg.weight_sync.probe_tolerance)

        metrics = _step_metrics(scored, stats, synced, timer.seconds, time.perf_counter() - step_started)
        if step == cfg.train.steps or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
            accuracy[step] = metrics["eval/accuracy"] = _evaluate(cfg, inputs, workers, tracker, step)
        tracker.log_metrics(step, metrics)
        console.step(step, metrics)
        if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
            _save_model(workers, Path(cfg.output_dir) / "checkpoints" / f"step_{step:06d}")

    model_dir = _save_model(workers, Path(cfg.output_dir) / "model")
    tracker.set_tags({"grpo_ray.model_dir": model_dir or ""})
    console.info(f"done: held-out accuracy {accuracy[0]:.3f} -> {accuracy[cfg.train.steps]:.3f}; model in {model_dir}")
    return TrainResult(tracker.run_id, tracker.tracking_uri, cfg.train.steps, accuracy, model_dir, metrics)


# ---------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------


def rollout_refs(rollouts: list, prompts: list[Prompt], sampling: SamplingSettings, num_slices: int) -> list[list]:
    """Split prompts evenly across workers; per worker, `num_slices` RolloutSlice refs."""
    per_worker = len(prompts) // len(rollouts)
    refs = []
    for i, worker in enumerate(rollouts):
        share = prompts[i * per_worker : (i + 1) * per_worker]
        out = worker.generate.options(num_returns=num_slices).remote(share, i * per_worker, sampling, num_slices)
        refs.append(out if num_slices > 1 else [out])
    return refs



def score_slices(workers: Workers, cfg: Config, slice_refs: list, rows: list[int]) -> list[ScoredSlice]:
    """Every slice's rows split evenly across the reward workers, plus the reward model's score."""
    scored = pool_scores(workers.rewards, slice_refs, rows)
    if workers.reward_model is None:
        return scored
    model_scores = ray.get([workers.reward_model.score.remote(ref) for ref in slice_refs])
    return [part.with_function("reward_model", values, cfg.reward.model.weight) for part, values in zip(scored, model_scores)]


def pool_scores(rewards: list, slice_refs: list, rows: list[int]) -> list[ScoredSlice]:
    """Every slice's rows split evenly across the reward workers; one ScoredSlice per slice."""
    k = len(rewards)
    parts = []
    for ref, n in zip(slice_refs, rows):
        bounds = [n * j // k for j in range(k + 1)]
        parts.append([rewards[j].score.remote(ref, bounds[j], bounds[j + 1]) for j in range(k) if bounds[j] < bounds[j + 1]])
    return [ScoredSlice.concat(ray.get(per_slice)) for per_slice in parts]


def failure_counts(scored: list[ScoredSlice]) -> tuple[dict[str, int], int, dict[str, str]]:
    failures: dict[str, int] = {}
    first_errors: dict[str, str] = {}
    for part in scored:
        for name, count in part.failures.items():
            failures[name] = failures.get(name, 0) + count
        for name, error in part.first_errors.items():
            first_errors.setdefault(name, error)
    return failures, int(sum(len(s.rewards) for s in scored)), first_errors


def _shape_rewards(cfg: Config, scored: list[ScoredSlice]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per slice: rewards after the overlong treatment, and row loss weights (0 = out of the loss)."""
    a = cfg.algorithm
    shaped = [
        shape_overlong_rewards(s.rewards, s.completion_lengths, s.truncated, a.overlong,
                               cfg.rollout.max_new_tokens, a.overlong_buffer, a.overlong_penalty)
        for s in scored
    ]
    return [r for r, _ in shaped], [w for _, w in shaped]


def _group_advantages(
    cfg: Config, scored: list[ScoredSlice], rewards: list[np.ndarray], row_weights: list[np.ndarray]
) -> list[np.ndarray]:
    """Advantages per slice. Failed or masked rows get 0 and do not enter their group's stats."""
    all_rewards = np.concatenate(rewards)
    group_ids = np.concatenate([s.group_ids for s in scored])
    valid = np.isfinite(all_rewards) & (np.concatenate(row_weights) > 0)
    advantages = np.zeros(len(all_rewards), dtype=np.float32)
    if valid.any():
        advantages[valid] = compute_advantages(
            cfg.algorithm.advantage,
            torch.from_numpy(all_rewards[valid]).float(),
            torch.from_numpy(group_ids[valid]),
            normalize_by_std=cfg.algorithm.normalize_by_std,
        ).numpy()
    bounds = np.cumsum([0] + [len(r) for r in rewards])
    return [advantages[bounds[i] : bounds[i + 1]] for i in range(len(rewards))]


def _update(cfg: Config, workers: Workers, slice_refs, ref_refs, advantages, row_weights, scored: list[ScoredSlice], step: int):
    num_learners = len(workers.learners)
    flat_index = lambda worker, rank: worker * num_learners + rank  # noqa: E731 - the order of flat_refs
    # Normalisers count what is in the loss: weighted tokens, and sequences that have any token
    # (aggregation skips empty rows too).
    global_tokens = float(sum((s.completion_lengths * w).sum() for s, w in zip(scored, row_weights)))
    global_sequences = int(sum(((s.completion_lengths > 0) & (w > 0)).sum() for s, w in zip(scored, row_weights)))
    calls = []
    for rank, learner in enumerate(workers.learners):
        mine = [flat_index(w, rank) for w in range(len(slice_refs))]
        shard = LearnerShard(
            step=step,
            advantages=[advantages[i] for i in mine],
            row_weights=[row_weights[i] for i in mine],
            global_tokens=max(global_tokens, 1.0),
            global_sequences=global_sequences,
            temperature=cfg.rollout.temperature,
        )
        payload = [slice_refs[w][rank] for w in range(len(slice_refs))]
        if ref_refs is not None:
            payload += [ref_refs[i] for i in mine]
        calls.append(learner.train_step.remote(shard, *payload))
    try:
        return ray.get(calls)
    except ray.exceptions.RayError as err:
        raise ClusterError(f"learner update failed at step {step}: {error_line(err)}") from None


def _evaluate(cfg: Config, inputs: RunInputs, workers: Workers, tracker: MlflowTracker, step: int) -> float:
    """Greedy held-out accuracy: the mean score of the first reward function."""
    if not inputs.eval_prompts:
        return float("nan")
    greedy = SamplingSettings(samples_per_prompt=1, max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0)
    prompts = inputs.eval_prompts
    # Uneven shares are fine here: evaluation slices do not go to the learners.
    shares = np.array_split(np.arange(len(prompts)), len(workers.rollouts))
    shares = [share for share in shares if len(share)]
    refs = [
        worker.generate.remote([prompts[i] for i in share], int(share[0]), greedy, 1)
        for worker, share in zip(workers.rollouts, shares)
    ]
    scored = score_slices(workers, cfg, refs, [len(share) for share in shares])
    first = cfg.reward.functions[0].name if cfg.reward.functions else "reward_model"
    scores = np.concatenate([s.per_function[first] for s in scored])
    accuracy = float(np.nanmean(scores)) if np.isfinite(scores).any() else 0.0
    tracker.log_metrics(step, {"eval/accuracy": accuracy, "eval/reward_mean": float(np.nanmean(np.concatenate([s.rewards for s in scored])))})
    return accuracy


def _save_model(workers: Workers, path: Path) -> str | None:
    saved = ray.get([learner.save_model.remote(str(path)) for learner in workers.learners])
    return saved[0]


def _step_metrics(scored: list[ScoredSlice], stats, synced, timings: dict[str, float], step_seconds: float) -> dict[str, float]:
    rewards = np.concatenate([s.rewards for s in scored])
    lengths = np.concatenate([s.completion_lengths for s in scored])
    metrics: dict[str, float] = {
        "reward/mean": float(np.nanmean(rewards)) if np.isfinite(rewards).any() else float("nan"),
        "reward/std": float(np.nanstd(rewards)) if np.isfinite(rewards).any() else float("nan"),
        "reward/failed": float((~np.isfinite(rewards)).sum()),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_fraction": float(np.concatenate([s.truncated for s in scored]).mean()),
    }
    for name in scored[0].per_function:
        values = np.concatenate([s.per_function[name] for s in scored])
        metrics[f"reward/{name}/mean"] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
        metrics[f"reward/{name}/std"] = float(np.nanstd(values)) if np.isfinite(values).any() else float("nan")
        metrics[f"reward/{name}/failures"] = float(sum(s.failures.get(name, 0) for s in scored))
    for name in stats[0].metrics:
        metrics[name] = float(np.mean([s.metrics[name] for s in stats]))
    metrics.update(timings)
    metrics["timing/step"] = step_seconds
    metrics["throughput/completion_tokens_per_s"] = float(lengths.sum()) / step_seconds
    metrics["throughput/learner_tokens_per_s"] = sum(s.num_tokens for s in stats) / max(timings.get("timing/update", 0.0), 1e-9)
    metrics["sync/seconds"] = synced.seconds
    metrics["sync/gbytes_per_s"] = synced.num_bytes / max(synced.seconds, 1e-9) / 1e9
    if synced.probe_max_abs_diff is not None:
        metrics["sync/probe_max_abs_diff"] = synced.probe_max_abs_diff
    return metrics
