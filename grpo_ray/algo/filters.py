"""Dynamic sampling (DAPO): keep only the groups whose rewards carry a learning signal.

A group (the G completions of one prompt) whose rewards are all equal has advantage 0 under every
estimator, so it adds nothing to the gradient but still costs a forward/backward pass and dilutes
token-mean losses. DAPO drops such groups and keeps generating more prompts until the step holds
`target_groups` informative groups (or gives up after `max_tries` generation batches).

Everything here works on the small per-row arrays the driver already holds (`rewards [N]`,
`group_ids [N]`) and returns ROW INDICES: the driver applies them with `RolloutSlice.select(rows)`
and never moves token arrays to decide.

Choices worth knowing:
- "Equal" is over the group's finite rewards only: a NaN (failed) or infinite reward is ignored,
  as the advantage step ignores it. A group with no finite reward at all counts as zero-variance
  (it has no signal), and so does a group of one.
- Kept groups are kept whole, failed rows included: the advantage step gives those rows 0.
- Equality is exact (min == max), the same test as `advantages.py`, immune to rounding in a mean.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

__all__ = [
    "GroupAccumulator",
    "groups_needed",
    "group_index",
    "select_informative_rows",
    "zero_variance_groups",
]


def group_index(rewards: np.ndarray, group_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated `(rewards [N] float64, unique_ids [K] sorted, inverse [N])` for per-group reductions."""
    rewards = np.asarray(rewards, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    if rewards.ndim != 1 or rewards.shape != group_ids.shape:
        raise ValueError(f"rewards and group_ids must both be [N]; got {rewards.shape} and {group_ids.shape}")
    unique_ids, inverse = np.unique(group_ids, return_inverse=True)
    return rewards, unique_ids, inverse.reshape(-1)


def zero_variance_groups(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """[N] bool: True on every row of a group whose finite rewards are all equal (or absent).

    rewards [N] float (NaN = failed), group_ids [N] int. Groups need not be contiguous.
    """
    rewards, unique_ids, inverse = group_index(rewards, group_ids)
    finite = np.isfinite(rewards)
    low = np.full(unique_ids.shape[0], np.inf)
    high = np.full(unique_ids.shape[0], -np.inf)
    np.minimum.at(low, inverse, np.where(finite, rewards, np.inf))
    np.maximum.at(high, inverse, np.where(finite, rewards, -np.inf))
    # No finite reward leaves low = inf > high = -inf: "not low < high", so constant.
    constant = ~(low < high)
    return constant[inverse]


def select_informative_rows(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """[M] int64, ascending: the rows of every group that is NOT zero-variance."""
    return np.flatnonzero(~zero_variance_groups(rewards, group_ids)).astype(np.int64)


def groups_needed(
    rewards: np.ndarray, group_ids: np.ndarray, first_group: int, num_groups: int, need: int
) -> int | None:
    """How many of the groups first_group, first_group + 1, ... (num_groups of them) it takes to
    hold `need` informative groups, once the groups seen so far settle it; None while they do not.

    rewards / group_ids: the rows of the groups seen so far (any order, any subset). Reading the
    groups in id order, not in the order they were seen, makes the answer depend only on their
    contents: a streamed rollout stops at the same group whichever group finished first. When every
    group was seen and fewer than `need` are informative, the answer is num_groups (all of them).
    """
    if need <= 0:
        return 0
    seen = set(np.unique(group_ids).tolist())
    informative = set(np.unique(np.asarray(group_ids)[select_informative_rows(rewards, group_ids)]).tolist())
    count = 0
    for k in range(num_groups):
        if first_group + k not in seen:
            return None
        count += first_group + k in informative
        if count >= need:
            return k + 1
    return num_groups


class GroupAccumulator:
    """Collects informative groups over several generation batches of one step (DAPO).

    Use one accumulator per step:

        acc = GroupAccumulator(target_groups=P, max_tries=max_tries)
        while not acc.done:
            batch = generate_and_score(...)               # one generation batch
            acc.add(batch_key, batch.rewards, batch.group_ids)
        for batch_key, rows in acc.take():                # exactly P groups when acc.full
            slices.append(batches[batch_key].select(rows))

    Groups are kept first come, first served: batch by batch in `add` order, and within a batch in
    ascending group id. `take` returns whole groups, trimmed to exactly `target_groups`; when the
    tries ran out first (`full` is False) it returns every group collected, fewer than the target,
    and the caller decides whether to train on them or to fail.
    """

    def __init__(self, target_groups: int, max_tries: int | None = None) -> None:
        if target_groups < 1:
            raise ValueError(f"target_groups must be >= 1; got {target_groups}")
        if max_tries is not None and max_tries < 1:
            raise ValueError(f"max_tries must be >= 1 or None (no limit); got {max_tries}")
        self.target_groups = target_groups
        self.max_tries = max_tries
        self.tries = 0  # generation batches added
        self.dropped_groups = 0  # zero-variance groups seen and dropped
        self.surplus_groups = 0  # informative groups cut by `take` beyond the target
        self._kept: list[tuple[Hashable, list[np.ndarray]]] = []  # (batch_key, rows of each group)

    @property
    def num_groups(self) -> int:
        """Informative groups collected so far."""
        return sum(len(groups) for _, groups in self._kept)

    @property
    def full(self) -> bool:
        return self.num_groups >= self.target_groups

    @property
    def done(self) -> bool:
        """Full, or out of tries: time to stop generating."""
        return self.full or (self.max_tries is not None and self.tries >= self.max_tries)

    def add(self, batch_key: Hashable, rewards: np.ndarray, group_ids: np.ndarray) -> int:
        """Keep the informative groups of one generation batch; returns how many were kept."""
        rewards, unique_ids, inverse = group_index(rewards, group_ids)
        constant_rows = zero_variance_groups(rewards, group_ids)
        constant_groups = np.zeros(unique_ids.shape[0], dtype=bool)
        constant_groups[inverse] = constant_rows
        groups = [np.flatnonzero(inverse == k).astype(np.int64) for k in np.flatnonzero(~constant_groups)]
        self.tries += 1
        self.dropped_groups += int(constant_groups.sum())
        if groups:
            self._kept.append((batch_key, groups))
        return len(groups)

    def take(self) -> list[tuple[Hashable, np.ndarray]]:
        """[(batch_key, rows [M] int64 ascending)] holding at most `target_groups` whole groups.

        Empties the collected groups; the counters stay, to be logged for the step.
        """
        out: list[tuple[Hashable, np.ndarray]] = []
        room = self.target_groups
        for batch_key, groups in self._kept:
            used = groups[:room]
            self.surplus_groups += len(groups) - len(used)
            room -= len(used)
            if used:
                out.append((batch_key, np.sort(np.concatenate(used))))
        self._kept = []
        return out
