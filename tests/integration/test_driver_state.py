"""What a checkpoint keeps of the driver: the batch builder's state and the skipped-update count.

No Ray is started: these parts of the driver are plain Python over small arrays.
"""

import io
import json

import numpy as np
import pytest

from grpo_ray.config import config_from_dict
from grpo_ray.data.prompts import PromptStream
from grpo_ray.training.errors import NonFiniteUpdateError, RunStoppedError
from grpo_ray.training.loop import _count_skipped_update
from grpo_ray.training.run import Progress
from grpo_ray.training.batch import BatchBuilder
from grpo_ray.tracking import ConsoleReporter
from grpo_ray.types import Prompt

PROMPTS = [Prompt(uid=10 + i, text=f"q{i}", token_ids=(1, 2 + i), answer=str(i)) for i in range(7)]


def builder(prompts=PROMPTS) -> BatchBuilder:
    cfg = config_from_dict(
        {"model": {"path": "tiny"}, "train": {"prompts_per_step": 2}, "rollout": {"samples_per_prompt": 2}, "seed": 3}
    )
    return BatchBuilder(cfg, workers=None, stream=PromptStream(prompts, seed=3))


def test_builder_state_survives_json_and_draws_the_same_batches():
    original = builder()
    original.stream.take(5)  # into the second epoch after drop-easy-like shrinking below
    original.stream = PromptStream(PROMPTS[1:6], seed=3)
    original.stream.take(7)
    original.batches_drawn = 9
    original.rng.random(3)
    original.ledger.record(np.array([11, 11, 12]), np.array([1.0, 0.0, 0.5]))
    original.rescue.record(11, {"completion": "4", "reward": 1.0})
    original.failures.record({"math": 2}, 8, {"math": "ValueError: x"})

    state = json.loads(json.dumps(original.state_dict()))  # what state.json holds
    resumed = builder()
    resumed.load_state_dict(state, PROMPTS)

    assert [p.uid for p in resumed.stream.take(9)] == [p.uid for p in original.stream.take(9)]
    assert resumed.batches_drawn == 9
    assert resumed.rng.random() == original.rng.random()
    assert resumed.ledger.state_dict() == original.ledger.state_dict()
    assert resumed.rescue.get(11) == {"completion": "4", "reward": 1.0}
    assert resumed.failures.rates() == original.failures.rates() == {"math": 0.25}


def test_a_checkpoint_naming_prompts_this_run_lacks_is_refused():
    state = builder().state_dict()
    with pytest.raises(RunStoppedError, match="names 7 prompts, 6 of them are in this run's data"):
        builder().load_state_dict(state, PROMPTS[:6])


def test_k_skipped_updates_in_a_row_stop_the_run_and_a_good_one_resets_the_count():
    out = io.StringIO()
    console = ConsoleReporter(10, stream=out)
    progress = Progress()
    for skipped in (1.0, 1.0, 0.0, 1.0, 1.0):
        progress.step += 1
        progress.metrics = {"update/skipped": skipped}
        _count_skipped_update(progress, 3, console)
    assert progress.nonfinite_in_a_row == 2
    assert (
        "step 5: update skipped, the loss or a gradient was NaN or infinite (2 in a row, the run stops at 3)"
        in out.getvalue()
    )
    progress.metrics = {"update/skipped": 1.0}
    with pytest.raises(NonFiniteUpdateError, match=r"skipped 3 steps in a row .* \(train.max_nonfinite_updates\)"):
        _count_skipped_update(progress, 3, console)


def test_batches_started_ahead_are_left_out_of_a_checkpoint_and_drawn_again():
    from grpo_ray.cluster.whole_shares import WholeShareFlight
    from grpo_ray.training.batch import Generation
    from grpo_ray.types import SamplingSettings

    b = builder()
    b.stream.take(2)
    b.batches_drawn = 1
    before = json.loads(json.dumps(b.state_dict()))
    # What prefetch does for the next step: note the cursor, draw the prompts and a seed.
    b.pending.append(
        Generation(
            WholeShareFlight(
                prompts=b.stream.take(2),
                sampling=SamplingSettings(2, 5, 1.0),
                group_offset=0,
                version=1,
                rows_per_slice=4,
            ),
            cursor=before_cursor(before),
        )
    )
    b.batches_drawn += 1
    # A checkpoint now holds the cursor from before the batch in flight: a resume draws it again.
    assert b.state_dict()["stream"] == before["stream"] and b.state_dict()["batches_drawn"] == 1
    # Dropping it (the prompts change at a stage end) rewinds the builder the same way.
    b.discard_pending()
    assert not b.pending and b.batches_drawn == 1
    assert [p.uid for p in b.stream.take(2)] == [p.uid for p in builder_after(before).stream.take(2)]


def before_cursor(state: dict) -> dict:
    return {
        "stream": {"epoch": state["stream"]["epoch"], "position": state["stream"]["position"]},
        "batches_drawn": state["batches_drawn"],
    }


def builder_after(state: dict) -> BatchBuilder:
    resumed = builder()
    resumed.load_state_dict(state, PROMPTS)
    return resumed


def test_reward_shaping_state_survives_json_and_an_older_checkpoint_starts_it_afresh():
    cfg = config_from_dict(
        {
            "model": {"path": "tiny"},
            "train": {"prompts_per_step": 2},
            "rollout": {"samples_per_prompt": 2},
            "reward": {"clip": [0, 1], "normalize": "running"},
        }
    )
    original = BatchBuilder(cfg, workers=None, stream=PromptStream(PROMPTS, seed=3))
    original.shaper([np.array([0.0, 1.0, 0.5])], [np.ones(3)])
    state = json.loads(json.dumps(original.state_dict()))
    resumed = BatchBuilder(cfg, workers=None, stream=PromptStream(PROMPTS, seed=3))
    resumed.load_state_dict(state, PROMPTS)
    assert (
        resumed.shaper.stats.state_dict() == original.shaper.stats.state_dict() == {"count": 3, "mean": 0.5, "m2": 0.5}
    )
    # A checkpoint written before reward shaping existed has no "reward_shaper" key.
    del state["reward_shaper"]
    older = BatchBuilder(cfg, workers=None, stream=PromptStream(PROMPTS, seed=3))
    older.load_state_dict(state, PROMPTS)
    assert older.shaper.stats.count == 0
