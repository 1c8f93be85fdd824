"""A learner rank's rows as tensors, cut into the micro-batches its plan names.

Plain torch: the learner actor (actors/learner.py) feeds these to its DeepSpeed engine.
"""

from __future__ import annotations

import numpy as np
import torch

from grpo_ray.algo.distill import (
    StudentSums,
    behaviour_logprobs,
    distilled_advantages,
    merge_teachers,
    student_sums,
    teacher_of_rows,
)
from grpo_ray.types import RolloutSlice, pad_and_stack


def concat_rows(
    slices: list[RolloutSlice],
    advantages: list[np.ndarray],
    row_weights: list[np.ndarray],
    refs: list[np.ndarray] | None,
    pad_id: int,
    slopes: list[np.ndarray] | None = None,
    teachers: list[list[np.ndarray]] | None = None,
) -> dict[str, torch.Tensor]:
    """All rows of this rank's slices as tensors padded to one width (each array of a slice has the
    slice's width, so all come out equally wide).

    slopes (per-turn credit, LearnerShard.advantage_slopes): advantages become per token, each
    model token's row advantage less its slope x the reward earned before its turn.
    teachers (distillation): per teacher, its log-probs of each slice (NaN: rows it does not
    teach), merged into one [N, T] `teacher_logprobs` and `taught_by` (which teacher taught each
    row); the learner's first pass turns them into advantages (taught_advantages)."""
    batch = {
        "input_ids": torch.from_numpy(pad_and_stack([s.input_ids for s in slices], pad_id)),
        "attention_mask": torch.from_numpy(pad_and_stack([s.attention_mask for s in slices], 0)),
        "completion_mask": torch.from_numpy(pad_and_stack([s.completion_mask for s in slices], 0.0)),
        "rollout_logprobs": torch.from_numpy(pad_and_stack([s.rollout_logprobs for s in slices], 0.0)),
        "advantages": torch.from_numpy(np.concatenate(advantages).astype(np.float32)),
        "row_weights": torch.from_numpy(np.concatenate(row_weights).astype(np.float32)),
    }
    if refs is not None:
        batch["ref_logprobs"] = torch.from_numpy(pad_and_stack(refs, 0.0))
    if slopes is not None:
        before = torch.from_numpy(pad_and_stack([s.token_rewards_before() for s in slices], 0.0))
        slope = torch.from_numpy(np.concatenate(slopes).astype(np.float32))
        batch["turn_credit"] = slope[:, None] * before  # what each token's advantage leaves out (a metric)
        batch["advantages"] = batch["advantages"][:, None] - batch["turn_credit"]
    if teachers:
        merged = [merge_teachers([own[i] for own in teachers]) for i in range(len(slices))]
        batch["teacher_logprobs"] = torch.from_numpy(pad_and_stack(merged, float("nan")))
        by = [teacher_of_rows([own[i] for own in teachers]) for i in range(len(slices))]
        batch["taught_by"] = torch.from_numpy(np.concatenate(by))
    return batch


def taught_advantages(mb: dict[str, torch.Tensor], first_pass: torch.Tensor, coef: float) -> torch.Tensor:
    """The micro-batch's advantages, with the teachers' term where it has teachers' log-probs: each
    taught model token's less coef x (b_t - q_t), b_t from the learner's own first-pass log-probs
    (`first_pass`) or, on a stale row, the rollout's (algo/distill.behaviour_logprobs)."""
    if "teacher_logprobs" not in mb:
        return mb["advantages"]
    behaviour = behaviour_logprobs(first_pass, mb["rollout_logprobs"], mb["stale"])
    return distilled_advantages(mb["advantages"], behaviour, mb["teacher_logprobs"], mb["completion_mask"], coef)


def taught_sums(
    mb: dict[str, torch.Tensor], first_pass: torch.Tensor, names: tuple[str, ...]
) -> dict[str, StudentSums]:
    """Per teacher, the student's side of its gaps on this micro-batch (the distill/* metrics the
    learner reports): the same b_t as taught_advantages'."""
    behaviour = behaviour_logprobs(first_pass, mb["rollout_logprobs"], mb["stale"]).float().cpu()
    cpu = {key: mb[key].cpu() for key in ("teacher_logprobs", "completion_mask", "taught_by")}
    return student_sums(behaviour, cpu["teacher_logprobs"], cpu["completion_mask"], cpu["taught_by"], names)


def split_payload(
    payload: tuple, k: int, teachers: int
) -> tuple[list[RolloutSlice], list[np.ndarray] | None, list[list[np.ndarray]] | None]:
    """A train_step's payload as (its K slices, their reference log-probs or None, per teacher
    its K log-prob arrays or None): the slices first, the teachers' arrays last."""
    slices, rest = list(payload[:k]), list(payload[k:])
    taught = rest[len(rest) - teachers * k :] if teachers else []
    refs = rest[: len(rest) - len(taught)]
    return slices, refs or None, [taught[j * k : (j + 1) * k] for j in range(teachers)] or None


def turn_credit_moved(batch: dict[str, torch.Tensor]) -> float | None:
    """Mean |advantage change| per-turn credit made on the model's tokens in the loss (actor/turn_credit),
    taken out of the batch (it is not an input of the loss); None without per-turn credit."""
    credit = batch.pop("turn_credit", None)
    if credit is None:
        return None
    mask = batch["completion_mask"] * batch["row_weights"][:, None]
    return float((credit.abs() * mask).sum() / mask.sum().clamp(min=1.0))


def averaged(sums: dict[str, float], first_pass_micro_batches: int, micro_batches: int) -> dict[str, float]:
    """Per-micro-batch means; mismatch/* come from the first pass only."""
    return {
        name: total / (first_pass_micro_batches if name.startswith("mismatch/") else micro_batches)
        for name, total in sums.items()
    }


def trim_padding(mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop columns that are padding in every row of the micro-batch (less compute, same result)."""
    width = int(mb["attention_mask"].sum(dim=1).max())
    return {name: value if value.dim() == 1 else value[:, :width] for name, value in mb.items()}


def micro_batch(batch: dict[str, torch.Tensor], rows: np.ndarray, device) -> dict[str, torch.Tensor]:
    """The micro-batch of `rows`, padding columns trimmed, on `device`. No rows (this rank ran out
    before the others): its first row at weight 0, so that its backward still takes part in ZeRO's
    gradient reduction and adds nothing."""
    picked = {n: v[torch.from_numpy(rows if len(rows) else np.zeros(1, np.int64))] for n, v in batch.items()}
    if not len(rows):
        picked["row_weights"] = torch.zeros_like(picked["row_weights"])
    return {name: value.to(device) for name, value in trim_padding(picked).items()}
