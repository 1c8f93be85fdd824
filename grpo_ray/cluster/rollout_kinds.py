"""The kinds of rollout, one interface: a batch of prompts issued to the rollout workers, its
scores collected, and what a dead worker held issued again. The run chooses its kind once
(rollout_service.choose_kind); nothing outside a kind's own module asks which kind it is.

    whole shares (whole_shares.py)   each worker returns its share as one slice per learner rank;
                                     the reward pool scores each slice, queued behind it
    streamed (streams.py)            groups handed back and scored as they finish; the recipe's stop
                                     rule ends the rollout once it has the groups it needs

What a sample is (one completion, or an episode with an environment) is the rollout worker's
affair (actors/samplers.py): both kinds ask every worker the same two methods.

The recipe (training/batch.py) hands `collect` its stop rule: given the chunks scored so far, how
many of the batch's groups to keep, or None while they do not settle it. Whole shares score
everything, so they never ask it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpo_ray.types import Prompt, SamplingSettings, ScoredBatch, ScoredSlice

# stop(scored chunks so far, the batch's first group id, its number of groups) -> groups to keep, or None.
StopRule = Callable[[list[ScoredSlice], int, int], "int | None"]


@dataclass
class Flight:
    """One batch of prompts sent to the rollout workers, its scoring queued behind it."""

    prompts: list[Prompt]
    sampling: SamplingSettings  # with this batch's seed
    group_offset: int  # group id of its first prompt within the step
    version: int  # the weights the rollout workers held when it was issued


class RolloutKind:
    def issue(self, prompts: list[Prompt], sampling: SamplingSettings, group_offset: int, version: int) -> Flight:
        """Queue the prompts' rollout and scoring; nothing is waited for."""
        raise NotImplementedError

    def generated(self, flight: Flight) -> bool:
        """Whether its rollout is over, without waiting (a streamed one as far as last seen)."""
        raise NotImplementedError

    def cancel(self, flight: Flight) -> None:
        """Abort what still generates of a flight nobody will collect."""

    def collect(self, flight: Flight, timer, current: int, stop: StopRule | None) -> ScoredBatch:
        """Wait for its rollout and scores (timed as "rollout" and "reward"). current: the weights the
        workers hold now (a dead worker's share is sampled again by the flight's, cluster/recovery.py)."""
        raise NotImplementedError
