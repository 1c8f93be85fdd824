"""Reward shaping before advantages: clipping and running normalisation (reward.clip, reward.normalize).

    shaper = RewardShaper(clip=(-1.0, 1.0), normalize="running")
    rewards = shaper(rewards, row_weights)    # per generation batch, after the overlong treatment

clip: every finite reward is clipped into [low, high]. Failed rows (NaN) stay NaN.
normalize running: the running mean and std of every finite reward in the loss (weight > 0) seen
so far, this batch included (stats are updated first, as OpenRLHF's and baselines' RunningMeanStd
do), then r <- (r - mean) / (std + 1e-6). The stats merge batch by batch with Chan et al.'s
parallel update (exact: the same as over all values at once); they go into checkpoints.

Order: clip, then normalise (clipping bounds what the running stats see).
"""

from __future__ import annotations

from enum import Enum

import numpy as np

# Added to the running std: the first batch of equal rewards has std 0.
NORMALIZE_EPS = 1e-6


class RewardNormalization(str, Enum):
    NONE = "none"
    RUNNING = "running"


def clip_rewards(rewards: np.ndarray, low: float, high: float) -> np.ndarray:
    """[N] rewards clipped into [low, high]; NaN (failed rows) stays NaN."""
    return np.clip(rewards, low, high)  # np.clip keeps NaN


class RunningMeanStd:
    """Mean and (population) variance of every value seen, merged batch by batch."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean

    @property
    def std(self) -> float:
        return float(np.sqrt(self.m2 / self.count)) if self.count else 0.0

    def update(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        n = len(values)
        if n == 0:
            return
        batch_mean = float(values.mean())
        batch_m2 = float(((values - batch_mean) ** 2).sum())
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta * delta * self.count * n / total
        self.count = total

    def normalize(self, values: np.ndarray) -> np.ndarray:
        return (values - self.mean) / (self.std + NORMALIZE_EPS)

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


class RewardShaper:
    """Clip then normalise each generation batch's rewards; counts what it did for the metrics."""

    def __init__(self, clip: tuple[float, float] | None, normalize: RewardNormalization | str = "none"):
        self.clip = clip
        self.normalize = RewardNormalization(normalize)
        self.stats = RunningMeanStd()
        self.clipped = 0  # rows clipped since the last metrics() call
        self.seen = 0

    @property
    def active(self) -> bool:
        return self.clip is not None or self.normalize is RewardNormalization.RUNNING

    def __call__(self, rewards: list[np.ndarray], weights: list[np.ndarray]) -> list[np.ndarray]:
        """Per slice [N_k] rewards (and [N_k] loss weights) of one generation batch, shaped."""
        if self.clip is not None:
            low, high = self.clip
            finite = [np.isfinite(r) for r in rewards]
            self.clipped += int(sum(((r[f] < low) | (r[f] > high)).sum() for r, f in zip(rewards, finite)))
            self.seen += int(sum(f.sum() for f in finite))
            rewards = [clip_rewards(r, low, high) for r in rewards]
        if self.normalize is RewardNormalization.RUNNING:
            self.stats.update(np.concatenate([r[np.isfinite(r) & (w > 0)] for r, w in zip(rewards, weights)]))
            rewards = [self.stats.normalize(r) for r in rewards]
        return rewards

    def metrics(self) -> dict[str, float]:
        """reward/clipped_fraction since the last call; reward/running_mean|std now."""
        out: dict[str, float] = {}
        if self.clip is not None:
            out["reward/clipped_fraction"] = self.clipped / self.seen if self.seen else 0.0
            self.clipped = self.seen = 0
        if self.normalize is RewardNormalization.RUNNING:
            out["reward/running_mean"] = self.stats.mean
            out["reward/running_std"] = self.stats.std
        return out

    def state_dict(self) -> dict:
        return {"running": self.stats.state_dict()}

    def load_state_dict(self, state: dict | None) -> None:
        # A checkpoint written before reward shaping existed has no state: start the stats afresh.
        if state:
            self.stats.load_state_dict(state["running"])
