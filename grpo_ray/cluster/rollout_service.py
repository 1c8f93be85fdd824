"""The rollout service: a batch of prompts from issue to scores, whoever dies on the way.

    service = RolloutService(cfg, workers, recovery)
    flight = service.issue(prompts, sampling, group_offset, version)       # queued; nothing waited for
    batch = service.collect(flight, timer, current, stop)                  # a ScoredBatch

The rollout's kind (cluster/rollout_kinds.py: whole shares or streamed) is chosen once,
here, from the recipe; the service hands each call to it. A worker that dies meanwhile is replaced,
and only what it held is issued again (each kind's own `_recover`), so the batch is the one an
unhurt run draws. `stop` is the recipe's rule for ending a streamed rollout early (dynamic
sampling: training/batch.py), handed in rather than known here.

Next hop: the recipe (training/batch.py's BatchBuilder) turns the ScoredBatch into rows (training/rows.py).
"""

from __future__ import annotations

from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.roles import Workers
from grpo_ray.cluster.rollout_kinds import Flight, RolloutKind, StopRule
from grpo_ray.cluster.streams import Streamed
from grpo_ray.cluster.whole_shares import WholeShares
from grpo_ray.config import Config
from grpo_ray.types import Prompt, SamplingSettings, ScoredBatch

__all__ = ["Flight", "RolloutService", "StopRule"]


class RolloutService:
    def __init__(self, cfg: Config, workers: Workers, recovery: WorkerRecovery | None):
        self.kind = choose_kind(cfg, workers, recovery)

    def issue(self, prompts: list[Prompt], sampling: SamplingSettings, group_offset: int, version: int) -> Flight:
        """Queue the prompts' rollout and scoring, sampled by the weights `version` the workers hold."""
        return self.kind.issue(prompts, sampling, group_offset, version)

    def generated(self, flight: Flight) -> bool:
        """Whether its rollout is over, without waiting (a streamed one as far as last seen)."""
        return self.kind.generated(flight)

    def cancel(self, flight: Flight) -> None:
        """Abort what still generates of a flight nobody will collect (a streamed one's requests)."""
        self.kind.cancel(flight)

    def collect(self, flight: Flight, timer, current: int, stop: StopRule | None = None) -> ScoredBatch:
        """Wait for the flight's rollout and scores (timed as "rollout" and "reward"); `current`: the
        weights version the workers hold now. stop: the recipe's rule for ending a streamed rollout
        once it has the groups it needs (rollout_kinds.StopRule)."""
        return self.kind.collect(flight, timer, current, stop)


def choose_kind(cfg: Config, workers: Workers, recovery: WorkerRecovery | None) -> RolloutKind:
    """The run's kind, chosen once from the recipe."""
    if cfg.rollout.groups_per_chunk:
        return Streamed(cfg, workers, recovery)
    return WholeShares(cfg, workers, recovery)
