"""POLARIS techniques on the driver's small per-row arrays (An et al., 2025, "POLARIS: a
post-training recipe for scaling RL on advanced reasoning models").

Three pieces, each pure or a plain container with a JSON-serialisable `state_dict`:

- `informative_substitution`: within one batch, overwrite every non-informative group (mean reward
  0 or 1, so no signal) with a copy of a randomly chosen informative group, so that the step
  keeps its full batch size without generating more; skip the batch when too few groups are
  informative. Returns a row order for `RolloutSlice.select` and fresh group ids for the copies.
- Rollout rescue: `RescueBuffer` keeps, per prompt, the latest correct response; `rescue_plan`
  names, in each group where every completion failed, one row to overwrite with that response.
- Drop-easy between stages: `PromptLedger` keeps each prompt's running mean of its per-step mean
  reward; `drop_easy` removes prompts whose average is above a threshold from the next stage.

How this departs from, or pins down, the paper's description:
- Informative means: mean of the group's FINITE rewards strictly inside (min_reward, max_reward),
  (0, 1) by default; a group whose rewards all failed (NaN) is not informative.
- Copies are drawn balanced, not i.i.d.: informative groups are used in random order, and no
  group is copied a second time before every informative group was copied once. This spreads
  the batch over as many distinct prompts as possible (fewer duplicated gradients).
- Substitution needs every group to have the same size G, so that a copy fills its slot row for
  row; it raises otherwise (the driver substitutes before any per-row filtering).
- Rescue replaces the FIRST row (lowest index) of a group in which no finite reward reaches
  `correct_threshold` (with 0/1 rewards: all rewards 0). Groups with no finite reward at all are
  a scoring failure, not a model failure, and are left alone.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from grpo_ray.algo.filters import group_index

__all__ = [
    "PromptLedger",
    "RescueBuffer",
    "SubstitutionResult",
    "drop_easy",
    "group_mean_rewards",
    "informative_substitution",
    "latest_correct_rows",
    "rescue_plan",
    "update_from_batch",
]


def group_mean_rewards(rewards: np.ndarray, group_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(`unique_ids [K]` sorted, `mean [K]` over each group's finite rewards (NaN if none),
    `inverse [N]` row -> index into unique_ids)."""
    rewards, unique_ids, inverse = group_index(rewards, group_ids)
    finite = np.isfinite(rewards)
    num_groups = unique_ids.shape[0]
    sums = np.bincount(inverse, weights=np.where(finite, rewards, 0.0), minlength=num_groups)
    counts = np.bincount(inverse, weights=finite.astype(np.float64), minlength=num_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / counts, np.nan)
    return unique_ids, mean, inverse


# ---------------------------------------------------------------- informative substitution


@dataclass(frozen=True)
class SubstitutionResult:
    """What the driver applies: `slice.select(row_order)`, then group ids `new_group_ids`."""

    skip_batch: bool  # too few informative groups: skip the update, do not advance the step
    row_order: np.ndarray  # [N] int64: source row of each output row (identity when skipped)
    new_group_ids: np.ndarray  # [N] int64: group id of each output row; copies get fresh ids
    num_informative: int  # informative groups in the batch
    num_substituted: int  # non-informative groups overwritten by a copy


def informative_substitution(
    rewards: np.ndarray,
    group_ids: np.ndarray,
    batch_size: int,
    rng: np.random.Generator,
    min_reward: float = 0.0,
    max_reward: float = 1.0,
) -> SubstitutionResult:
    """Overwrite non-informative groups with copies of informative ones (POLARIS).

    rewards [N] float (NaN = failed), group_ids [N] int, G rows per group; batch_size: prompts per
    step (P). The batch is skipped unless more than `batch_size // 3` groups are informative.
    A copy takes all G rows of its source group (response, reward, answer travel together through
    `row_order`), row for row in ascending row order, and a fresh group id (max id + 1, + 2, ...),
    so it forms its own group with the same rewards and therefore the same advantages.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    _, mean, inverse = group_mean_rewards(rewards, group_ids)
    group_ids = np.asarray(group_ids).astype(np.int64)
    informative = (mean > min_reward) & (mean < max_reward)  # NaN compares False
    num_informative = int(informative.sum())
    unchanged = SubstitutionResult(
        skip_batch=False,
        row_order=np.arange(group_ids.shape[0], dtype=np.int64),
        new_group_ids=group_ids.copy(),
        num_informative=num_informative,
        num_substituted=0,
    )
    if num_informative <= batch_size // 3:
        return replace(unchanged, skip_batch=True)
    targets = np.flatnonzero(~informative)
    if targets.size == 0:
        return unchanged

    sizes = np.bincount(inverse)
    if sizes.min() != sizes.max():
        raise ValueError(f"informative substitution needs equal group sizes; got sizes {sorted(set(sizes.tolist()))}")
    # rows_of[k] = rows of group k, ascending: a stable sort by group keeps row order inside groups.
    rows_of = np.argsort(inverse, kind="stable").reshape(sizes.shape[0], int(sizes[0]))

    sources = np.flatnonzero(informative)
    rounds = -(-targets.size // sources.size)  # ceil: each round uses every source once
    chosen = np.concatenate([rng.permutation(sources) for _ in range(rounds)])[: targets.size]

    row_order = unchanged.row_order.copy()
    row_order[rows_of[targets]] = rows_of[chosen]
    new_group_ids = unchanged.new_group_ids.copy()
    fresh = int(group_ids.max()) + 1 + np.arange(targets.size, dtype=np.int64)
    new_group_ids[rows_of[targets]] = fresh[:, None]
    return SubstitutionResult(
        skip_batch=False,
        row_order=row_order,
        new_group_ids=new_group_ids,
        num_informative=num_informative,
        num_substituted=int(targets.size),
    )


# ---------------------------------------------------------------- rollout rescue


class RescueBuffer:
    """Latest correct response per prompt uid. The payload is opaque to this class (completion
    token ids, text, the reward it earned...), but must be JSON-serialisable for checkpoints."""

    def __init__(self) -> None:
        self._responses: dict[int, Any] = {}

    def record(self, prompt_uid: int, payload: Any) -> None:
        self._responses[int(prompt_uid)] = payload

    def get(self, prompt_uid: int) -> Any | None:
        return self._responses.get(int(prompt_uid))

    def __contains__(self, prompt_uid: object) -> bool:
        return isinstance(prompt_uid, (int, np.integer)) and int(prompt_uid) in self._responses

    def __len__(self) -> int:
        return len(self._responses)

    def state_dict(self) -> dict[str, Any]:
        # A list of pairs, not a dict: JSON object keys would turn the int uids into strings.
        return {"responses": [[uid, payload] for uid, payload in self._responses.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._responses = {int(uid): payload for uid, payload in state["responses"]}


def _correct(rewards: np.ndarray, correct_threshold: float) -> np.ndarray:
    """[N] bool: finite reward at or above the threshold."""
    return np.isfinite(rewards) & (rewards >= correct_threshold)


def rescue_plan(
    rewards: np.ndarray,
    group_ids: np.ndarray,
    prompt_uids: np.ndarray,
    buffer: RescueBuffer,
    correct_threshold: float = 1.0,
) -> list[tuple[int, int]]:
    """[(row_to_replace, prompt_uid)], one per all-failed group whose prompt has a kept response.

    A group is all-failed when it has finite rewards and none reaches `correct_threshold`. The row
    replaced is the group's first row. Groups are listed in ascending group id. The caller swaps in
    `buffer.get(prompt_uid)` for that row and sets its reward (re-score, or store it in the payload).
    """
    rewards, unique_ids, inverse = group_index(rewards, group_ids)
    prompt_uids = np.asarray(prompt_uids).astype(np.int64)
    if prompt_uids.shape != rewards.shape:
        raise ValueError(f"prompt_uids must be [N] like rewards; got {prompt_uids.shape} and {rewards.shape}")
    num_groups = unique_ids.shape[0]
    any_correct = np.bincount(inverse, weights=_correct(rewards, correct_threshold), minlength=num_groups) > 0
    any_finite = np.bincount(inverse, weights=np.isfinite(rewards), minlength=num_groups) > 0
    first_row = np.full(num_groups, rewards.shape[0], dtype=np.int64)
    np.minimum.at(first_row, inverse, np.arange(rewards.shape[0], dtype=np.int64))
    plan: list[tuple[int, int]] = []
    for k in np.flatnonzero(any_finite & ~any_correct):
        row = int(first_row[k])
        uid = int(prompt_uids[row])
        if uid in buffer:
            plan.append((row, uid))
    return plan


def latest_correct_rows(rewards: np.ndarray, prompt_uids: np.ndarray, correct_threshold: float = 1.0) -> dict[int, int]:
    """{prompt uid: its last correct row in row order}, for the prompts with a correct row.

    The rows whose responses the rescue buffer keeps: only these need their tokens read.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    prompt_uids = np.asarray(prompt_uids).astype(np.int64)
    return {int(prompt_uids[row]): int(row) for row in np.flatnonzero(_correct(rewards, correct_threshold))}


def update_from_batch(
    buffer: RescueBuffer,
    rewards: np.ndarray,
    prompt_uids: np.ndarray,
    payloads: Sequence[Any],
    correct_threshold: float = 1.0,
) -> int:
    """Record every correct row's payload under its prompt uid; the last correct row of a prompt
    in row order wins. Returns how many distinct prompts were recorded."""
    rewards = np.asarray(rewards, dtype=np.float64)
    prompt_uids = np.asarray(prompt_uids).astype(np.int64)
    if not (rewards.shape == prompt_uids.shape and len(payloads) == rewards.shape[0]):
        raise ValueError(
            f"rewards, prompt_uids and payloads must have one entry per row; got {rewards.shape}, "
            f"{prompt_uids.shape} and {len(payloads)}"
        )
    latest = latest_correct_rows(rewards, prompt_uids, correct_threshold)
    for uid, row in latest.items():
        buffer.record(uid, payloads[row])
    return len(latest)


# ---------------------------------------------------------------- per-prompt ledger, drop-easy


class PromptLedger:
    """Running average, per prompt uid, of the prompt's mean reward in each step it appeared in."""

    def __init__(self) -> None:
        self._sum: dict[int, float] = {}
        self._count: dict[int, int] = {}

    def record(self, prompt_uids: np.ndarray, rewards: np.ndarray) -> int:
        """Add one step: each uid's mean over its finite rewards counts once. Returns prompts added
        (a uid whose rewards all failed is not counted this step)."""
        uids, mean, _ = group_mean_rewards(rewards, np.asarray(prompt_uids).astype(np.int64))
        added = 0
        for uid, value in zip(uids.tolist(), mean.tolist()):
            if math.isnan(value):
                continue
            self._sum[uid] = self._sum.get(uid, 0.0) + value
            self._count[uid] = self._count.get(uid, 0) + 1
            added += 1
        return added

    def average(self, uid: int) -> float | None:
        """Mean of the per-step means; None for a prompt never recorded."""
        count = self._count.get(int(uid), 0)
        return self._sum[int(uid)] / count if count else None

    def count(self, uid: int) -> int:
        """Steps in which the prompt was recorded (0 for a prompt never seen)."""
        return self._count.get(int(uid), 0)

    def uids(self) -> list[int]:
        return sorted(self._count)

    def easy_prompts(self, threshold: float = 0.9) -> set[int]:
        """Prompts whose average is strictly above `threshold`."""
        return {uid for uid, total in self._sum.items() if total / self._count[uid] > threshold}

    def __len__(self) -> int:
        return len(self._count)

    def _records(self) -> Iterable[tuple[int, float, int]]:
        return ((uid, self._sum[uid], self._count[uid]) for uid in sorted(self._count))

    def state_dict(self) -> dict[str, Any]:
        return {"prompts": [[uid, total, count] for uid, total, count in self._records()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sum = {int(uid): float(total) for uid, total, _ in state["prompts"]}
        self._count = {int(uid): int(count) for uid, _, count in state["prompts"]}

    def save(self, path: str | os.PathLike[str]) -> None:
        """JSON lines `{"uid": .., "sum": .., "count": ..}`, written atomically (temp + rename)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as out:
            for uid, total, count in self._records():
                out.write(json.dumps({"uid": uid, "sum": total, "count": count}) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PromptLedger:
        ledger = cls()
        with Path(path).open(encoding="utf-8") as lines:
            records = [json.loads(line) for line in lines if line.strip()]
        ledger.load_state_dict({"prompts": [[r["uid"], r["sum"], r["count"]] for r in records]})
        return ledger


def drop_easy(prompt_uids: list[int], ledger: PromptLedger, threshold: float = 0.9) -> tuple[list[int], int]:
    """(uids kept in their order, number dropped): drop those whose ledger average > threshold.
    Prompts the ledger never saw are kept."""
    easy = ledger.easy_prompts(threshold)
    kept = [uid for uid in prompt_uids if int(uid) not in easy]
    return kept, len(prompt_uids) - len(kept)
