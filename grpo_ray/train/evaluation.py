"""The held-out evaluation a run does at step 0, every train.eval_every steps and at stage ends."""

from __future__ import annotations

import numpy as np

from grpo_ray.cluster.dispatch import evaluation_refs, score_slices
from grpo_ray.config import StagePlan
from grpo_ray.rewards.accuracy import mean_accuracy
from grpo_ray.train.run import Run
from grpo_ray.types import SamplingSettings


def heldout_accuracy(run: Run, stage: StagePlan, step: int) -> float:
    """Held-out accuracy (avg@k): the first reward function's mean score over all samples, a sample it
    could not score counting as wrong (rewards/accuracy.py, as `grpo-ray eval` counts it)."""
    cfg, workers, prompts = run.cfg, run.workers, run.inputs.eval_prompts
    if not prompts:
        return float("nan")
    sampling = SamplingSettings(
        samples_per_prompt=cfg.train.eval_samples, max_new_tokens=stage.max_new_tokens,
        temperature=stage.eval_temperature, top_p=stage.top_p, seed=cfg.seed + step,
    )
    refs, rows = evaluation_refs(workers.rollouts, prompts, sampling)
    scored = score_slices(workers, cfg, refs, rows)
    first = cfg.reward.functions[0].name if cfg.reward.functions else "reward_model"
    scores = np.concatenate([s.per_function[first] for s in scored])
    accuracy = mean_accuracy(scores)
    run.tracker.log_metrics(step, {"eval/accuracy": accuracy, "eval/reward_mean": float(np.nanmean(np.concatenate([s.rewards for s in scored])))})
    return accuracy
