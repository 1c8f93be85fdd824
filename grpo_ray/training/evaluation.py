"""The held-out evaluation a run does at step 0, every train.eval_every steps and at stage ends."""

from __future__ import annotations

import numpy as np

from grpo_ray.cluster.dispatch import CallFailed, evaluation_refs, score_slices
from grpo_ray.config import Config, StagePlan
from grpo_ray.rewards.accuracy import mean_accuracy
from grpo_ray.rewards.by_source import eval_source_accuracies
from grpo_ray.training.metrics import NO_HELDOUT_PROMPTS, finite_mean
from grpo_ray.training.run import Run, in_phase
from grpo_ray.types import SamplingSettings, ScoredSlice


def heldout_accuracy(run: Run, stage: StagePlan, step: int) -> float:
    """Held-out accuracy (avg@k): the first reward function's mean score over all samples, a sample it
    could not score counting as wrong (rewards/accuracy.py, as `grpo-ray eval` counts it)."""
    cfg, prompts = run.cfg, run.inputs.eval_prompts
    if not prompts or not scores_accuracy(cfg):
        return float("nan")
    sampling = eval_sampling(cfg, stage, step)
    samples = f"{cfg.train.eval_samples} sample{'s' if cfg.train.eval_samples > 1 else ''} each"
    run.console.phase(f"step {step}: evaluating {len(prompts)} held-out prompts, {samples}")
    with in_phase("evaluation"):
        scored = _scored_samples(run, sampling)
    run.console.phase(None)
    metrics = heldout_metrics(cfg, scored)
    run.tracker.log_metrics(step, metrics)
    if failed := round(metrics["eval/failed"] * metrics["eval/samples"]):
        # An accuracy of 0.000 from samples that failed reads as a model that knows nothing: say so.
        run.console.info(
            f"step {step}: {failed} of {metrics['eval/samples']:.0f} held-out samples failed (an episode that "
            f"failed, or a reward that could not score) and count as wrong{_first_error(scored)}"
        )
    return metrics["eval/accuracy"]


def scores_accuracy(cfg: Config) -> bool:
    """Whether anything scores a held-out sample: a reward function or the reward model (a
    teacher's signal alone may train with neither: distillation.with_rewards false)."""
    return bool(cfg.reward.functions or cfg.reward.by_source or cfg.reward.model.path)


def unmeasured_reason(cfg: Config) -> str:
    """Why a run's held-out accuracy reads NaN (training/metrics.accuracy_text)."""
    if scores_accuracy(cfg):
        return NO_HELDOUT_PROMPTS
    return "no reward function scores the held-out samples: reward.functions is empty"


def _failed_samples(scored: list[ScoredSlice], scores: np.ndarray) -> int:
    """Samples the first function could not score, or whose episode failed (scored as it ended)."""
    failed = np.isnan(np.asarray(scores, dtype=np.float64))
    if "failed" in scored[0].episode_stats:
        failed |= np.concatenate([s.episode_stats["failed"] for s in scored]).astype(bool)
    return int(failed.sum())


def _first_error(scored: list[ScoredSlice]) -> str:
    """The first line of why: an episode's own failure, else a reward function's error."""
    lines = [line for s in scored for line in (*s.episode_errors.values(), *s.first_errors.values()) if line]
    return f"; the first: {lines[0]}" if lines else ""


def eval_sampling(cfg: Config, stage: StagePlan, step: int) -> SamplingSettings:
    """How the held-out prompts are sampled at `step` (here and by `grpo-ray eval --config`)."""
    return SamplingSettings(
        samples_per_prompt=cfg.train.eval_samples,
        max_new_tokens=stage.max_new_tokens,
        temperature=stage.eval_temperature,
        top_p=stage.top_p,
        seed=cfg.seed + step,
    )


def heldout_metrics(cfg: Config, scored: list[ScoredSlice]) -> dict[str, float]:
    """eval/accuracy, eval/reward_mean and each source's accuracy of the scored held-out samples
    (here and by `grpo-ray eval --config`)."""
    first = cfg.reward.functions[0].name if cfg.reward.functions else "reward_model"
    # With reward.by_source each row's accuracy is its own source's first function (rewards/by_source.py).
    first = "accuracy" if "accuracy" in scored[0].per_function else first
    if first not in scored[0].per_function:  # nothing scores an accuracy (scores_accuracy)
        return {"eval/accuracy": float("nan"), "eval/samples": float(sum(len(s.rewards) for s in scored))}
    scores = np.concatenate([s.per_function[first] for s in scored])
    return {
        "eval/accuracy": mean_accuracy(scores),
        "eval/samples": float(len(scores)),
        "eval/failed": _failed_samples(scored, scores) / len(scores) if len(scores) else 0.0,  # counted as wrong
        "eval/reward_mean": finite_mean(np.concatenate([s.rewards for s in scored])),
        **eval_source_accuracies([s.per_function for s in scored]),
    }


def _scored_samples(run: Run, sampling: SamplingSettings) -> list[ScoredSlice]:
    """Every held-out sample, scored. A rollout or reward worker that died (in this evaluation, or
    idle before it) is brought back and the evaluation runs again: with the same seed and weights it
    draws the same samples, so the accuracy is the one an unhurt run measures."""
    while True:
        refs, rows = evaluation_refs(run.workers.rollouts, run.inputs.eval_prompts, sampling, run.sync.version)
        try:
            return score_slices(run.workers, run.cfg.reward.model.weight, refs, rows)
        except CallFailed as failed:
            run.recovery.recover(failed.cause)  # re-raises what is not a worker's death; restarts are bounded
