"""The numbers logged for one training step. Keys are "phase/name" (reward/mean, timing/rollout).

Rewards, lengths and diversity describe everything the policy generated in the step (what it
does), not only the rows that trained after filtering or substitution (what it learned from).
"""

from __future__ import annotations

import math

import numpy as np

from grpo_ray.algo.distill import student_metrics
from grpo_ray.envs.failures import FAILURE_KINDS
from grpo_ray.training.rows import StepRows
from grpo_ray.types import LearnerStats


def finite_mean(values: np.ndarray) -> float:
    """The mean of the finite values; NaN, without NumPy's "Mean of empty slice" warning, when none is."""
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def _std(values: np.ndarray) -> float:
    return float(np.nanstd(values)) if np.isfinite(values).any() else float("nan")


def generation_metrics(rows: StepRows) -> dict[str, float]:
    _, first_of_group = np.unique(rows.group_ids, return_index=True)
    metrics = {
        "reward/mean": finite_mean(rows.rewards),
        "reward/std": _std(rows.rewards),
        "reward/failed": float((~np.isfinite(rows.rewards)).sum()),
        "response/length_mean": float(rows.completion_lengths.mean()),
        "response/length_max": float(rows.completion_lengths.max()),
        "response/truncated_fraction": float(rows.truncated.mean()),
        # POLARIS watches this to pick and raise the sampling temperature: G samples collapsing
        # onto one answer show up here first. Groups without a 4-gram (NaN) are left out.
        "diversity/distinct_4": finite_mean(rows.group_diversity[first_of_group]),
    }
    for name, values in rows.episode_stats.items():  # episodes: per-episode means (actors/episodes.py)
        if name not in FAILURE_KINDS:
            metrics[f"episode/{name}"] = finite_mean(values)
    for kind in FAILURE_KINDS:  # failed episodes, counted by kind in a fixed order (envs/failures.py)
        if kind in rows.episode_stats:
            metrics[f"env_failures/{kind}"] = float(np.nansum(rows.episode_stats[kind]))
    for name, values in rows.per_function.items():
        label = function_label(name)
        metrics[f"reward/{label}/mean"] = finite_mean(values)
        metrics[f"reward/{label}/std"] = _std(values)
        failed = ~np.isfinite(values)
        if "accuracy" in rows.per_function:  # reward.by_source (rewards/by_source.py): a NaN score
            failed &= ~np.isfinite(rows.rewards)  # on a row with a finite total is another source's row
        metrics[f"reward/{label}/failures"] = float(failed.sum())
    return metrics


def function_label(name: str) -> str:
    """A reward function's name as a metric key part: a file spec keeps only its file name
    (/abs/path/rewards.py:fn -> rewards.py:fn), since MLflow refuses keys holding "//" or "/./"."""
    path, colon, function = name.rpartition(":")
    if colon and "/" in path:
        return f"{path.rsplit('/', 1)[-1]}:{function}"
    return name


def step_metrics(
    generated: StepRows, stats: list[LearnerStats], synced, timings: dict[str, float], step_seconds: float
) -> dict[str, float]:
    metrics = generation_metrics(generated)
    for name in stats[0].metrics:
        metrics[name] = float(np.mean([s.metrics[name] for s in stats]))
    names = dict.fromkeys(name for s in stats for name in s.student_sums)  # distillation's teachers
    if names:  # the student's side of their gaps, over every rank's tokens
        metrics.update(student_metrics({n: [s.student_sums[n] for s in stats if n in s.student_sums] for n in names}))
    metrics.update(timings)
    metrics["timing/step"] = step_seconds
    # What the step spent outside its timed phases: the driver's own orchestration.
    metrics["timing/overhead"] = max(step_seconds - sum(timings.values()), 0.0)
    metrics["throughput/samples_per_s"] = len(generated) / step_seconds
    metrics["throughput/completion_tokens_per_s"] = float(generated.completion_lengths.sum()) / step_seconds
    metrics["throughput/learner_tokens_per_s"] = sum(s.num_tokens for s in stats) / max(
        timings.get("timing/update", 0.0), 1e-9
    )
    metrics["sync/seconds"] = synced.seconds
    metrics["sync/gbytes_per_s"] = synced.num_bytes / max(synced.seconds, 1e-9) / 1e9
    metrics["sync/megabytes"] = synced.num_bytes / 1e6
    metrics["sync/during_generation"] = float(synced.during_generation)  # workers it reached mid-batch
    if synced.wake_seconds:  # rollout.vllm.sleep_level: the engines took their memory back (in sync/seconds' phase)
        metrics["sync/wake_seconds"] = synced.wake_seconds
    if synced.probe is not None:  # transport/probe.py: what the probe could tell
        metrics["sync/probe_max_abs_diff"] = synced.probe.max_abs_diff
        metrics["sync/probe_undecided"] = float(synced.probe.undecided)
        metrics["sync/probe_moved"] = synced.probe.moved
        metrics["sync/probe_kernel_gap"] = synced.probe.kernel_gap
    return metrics


# Why a run's held-out accuracy is NaN (training/evaluation.unmeasured_reason).
NO_HELDOUT_PROMPTS = "no held-out prompts: data.eval_files is empty and data.val_fraction 0"


def accuracy_text(accuracy: float, unmeasured: str = NO_HELDOUT_PROMPTS) -> str:
    """A held-out accuracy as the console says it; NaN: not measured, for the reason given."""
    if math.isnan(accuracy):
        return f"not measured ({unmeasured})"
    return f"{accuracy:.3f}"


def accuracy_change(first: float, last: float, unmeasured: str = NO_HELDOUT_PROMPTS) -> str:
    """ "0.080 -> 0.695", the done line's; said once when nothing was measured."""
    if math.isnan(first) and math.isnan(last):
        return accuracy_text(first, unmeasured)
    return f"{accuracy_text(first, unmeasured)} -> {accuracy_text(last, unmeasured)}"
