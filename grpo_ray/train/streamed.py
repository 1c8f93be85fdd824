"""The batch builder's side of a streamed rollout (cluster/streams.py, rollout.groups_per_chunk > 0).

    cut = drive(streamed, recovery, need, version, current, timer, preview)   # every chunk in, or enough
    refs, sizes, rows, scored = streamed_rows(streamed, cut, max_new_tokens, first_source, overlong)

`drive` takes chunks and scores as they come. With dynamic sampling it stops the rollout as soon as
the groups, read in id order, hold the informative groups the step still needs, and the workers
abort the rest. Reading in id order (never in finishing order) is what keeps the step's data a
function of the seed: the same groups are kept, and the rows come out in group order, whichever
group finished first. The builder (train/batch.py) then counts failures and shapes the rows as it
does on the whole-share path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from grpo_ray.algo.filters import groups_needed
from grpo_ray.algo.reward_shaping import clip_rewards
from grpo_ray.cluster.dispatch import CallFailed
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.streams import StreamedRollout
from grpo_ray.train.rows import Overlong, StepRows, shape_rewards
from grpo_ray.types import ScoredSlice


def drive(streamed: StreamedRollout, recovery: WorkerRecovery | None, need: int | None, version: int,
          current: int, timer, preview: Callable[[ScoredSlice], np.ndarray]) -> int | None:
    """Run the stream until every chunk is in and scored, or until (`need` given) the batch's first
    groups hold `need` informative ones; then the rest is cancelled. Returns how many of the
    batch's groups to keep, None: all. A worker that dies meanwhile is replaced (WorkerRecovery):
    a rollout worker's share is asked again with the same seeds and the weights `version` that sampled
    the batch (`current`: the rollout workers' now), a reward worker's unfinished calls. `preview`:
    a chunk's rewards as dynamic sampling judges them (preview_rewards)."""
    num_groups = len(streamed.prompts)
    while not streamed.done:
        with timer("reward" if streamed.arrived else "rollout"):
            try:
                streamed.advance()
            except CallFailed as failed:
                if recovery is None:
                    raise failed.cause from None
                role, index = recovery.recover(failed.cause)
                if role == "rollout":
                    recovery.reissue(version, current, lambda: streamed.issue(index, version))
                    recovery.reissued_prompts += len(streamed.prompts) // len(streamed.workers.rollouts)
                    recovery.log(f"re-issued rollout-{index}'s share of the streamed batch")
                else:
                    parts = streamed.reissue_lost_scoring(index)
                    recovery.log(f"re-issued reward-{index}'s {parts} unfinished scoring calls")
                continue
        if need is not None and (chunks := streamed.scored_chunks()):
            rewards = np.concatenate([preview(scored) for _, _, scored in chunks])
            group_ids = np.concatenate([scored.group_ids for _, _, scored in chunks])
            cut = groups_needed(rewards, group_ids, streamed.group_offset, num_groups, need)
            if cut is not None and cut < num_groups:
                streamed.cancel()
                return cut
    return None


def preview_rewards(scored: ScoredSlice, max_new_tokens: int, overlong: Overlong,
                    clip: tuple[float, float] | None) -> np.ndarray:
    """The rewards dynamic sampling will judge, as far as they are known before the batch is whole:
    overlong treatment and clipping (reward.clip). Running normalisation is left out: an affine map
    with a positive scale, it keeps equal rewards equal and different ones different."""
    (rewards,), _ = shape_rewards([scored], max_new_tokens, overlong)
    return clip_rewards(rewards, *clip) if clip is not None else rewards


def streamed_rows(streamed: StreamedRollout, cut: int | None, max_new_tokens: int, first_source: int,
                  overlong: Overlong) -> tuple[list, list[int], StepRows, list[ScoredSlice]]:
    """(chunk refs, their rows, the kept rows in group order, every scored chunk). Rows carry the
    overlong treatment; the builder's running shaping follows. Sources index the refs from
    `first_source` on (every scored chunk, kept rows or not)."""
    chunks = streamed.scored_chunks()
    refs, sizes, scored = [c[0] for c in chunks], [c[1] for c in chunks], [c[2] for c in chunks]
    rewards, weights = shape_rewards(scored, max_new_tokens, overlong)
    rows = StepRows.from_scored(scored, rewards, weights, first_source)
    rows = rows.select(np.argsort(rows.group_ids, kind="stable"))  # group order; a group's rows in sample order
    if cut is not None:
        rows = rows.select(np.flatnonzero(rows.group_ids < streamed.group_offset + cut))
    return refs, sizes, rows, scored
