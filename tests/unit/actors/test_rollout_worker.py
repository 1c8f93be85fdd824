"""The rollout worker as a plain class on the tiny hf model: its sampler and weight receiver are
chosen once, and both samplers (one turn, episodes) deliver a share whole or in chunks as the same
rows (actors/rollout.py, samplers.py, slices.py)."""

from pathlib import Path

import numpy as np
import pytest

from grpo_ray.actors.rollout import RolloutWorker
from grpo_ray.actors.samplers import OneTurn, WithEnvironment
from grpo_ray.actors.weight_receivers import InProcess
from grpo_ray.cluster.settings import rollout_settings
from grpo_ray.config import config_from_dict
from grpo_ray.models.loading import load_tokenizer
from grpo_ray.models.tiny import ensure_tiny_artifacts
from grpo_ray.types import Prompt, RolloutSlice, SamplingSettings

HIGHER_LOWER = Path(__file__).parents[3] / "examples" / "agents" / "higher_lower.py"
SAMPLING = SamplingSettings(samples_per_prompt=2, max_new_tokens=5, temperature=1.0, seed=3)


def worker(episodes: bool) -> RolloutWorker:
    """The worker a recipe with the tiny model (and the example higher-lower game) starts."""
    recipe = {"rollout": {"torch_threads": 1}, "model": {"dtype": "float32"}}
    if episodes:
        recipe["environment"] = {"spec": f"{HIGHER_LOWER}:HigherLower", "max_turns": 3, "reward_per_turn": True}
    return RolloutWorker(rollout_settings(config_from_dict(recipe), 0))


def prompts() -> list[Prompt]:
    tokenizer = load_tokenizer(str(ensure_tiny_artifacts().model_dir))
    texts, answers = ["71+28=", "36+47=", "55+19="], ["99", "83", "74"]
    rendered = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in texts
    ]
    ids = [tuple(r["input_ids"] if hasattr(r, "keys") else r) for r in rendered]  # transformers 5: a BatchEncoding
    return [Prompt(uid=i, text=t, token_ids=p, answer=a) for i, (t, p, a) in enumerate(zip(texts, ids, answers))]


def in_group_order(batch: RolloutSlice) -> RolloutSlice:
    return batch.select(np.argsort(batch.group_ids, kind="stable"))


def assert_same_rows(a: RolloutSlice, b: RolloutSlice) -> None:
    width = max(a.input_ids.shape[1], b.input_ids.shape[1])
    pad = lambda x: np.pad(x, ((0, 0), (0, width - x.shape[1])))  # noqa: E731
    np.testing.assert_array_equal(a.group_ids, b.group_ids)
    np.testing.assert_array_equal(pad(a.completion_mask), pad(b.completion_mask))
    np.testing.assert_array_equal(pad(a.input_ids), pad(b.input_ids))
    # The same tokens; an episode's turns batched with others may differ in the last float bit.
    np.testing.assert_allclose(pad(a.rollout_logprobs), pad(b.rollout_logprobs), atol=1e-5)
    assert a.completions == b.completions and a.row_fields == b.row_fields
    np.testing.assert_array_equal(a.group_diversity, b.group_diversity)


@pytest.mark.parametrize("episodes", [False, True], ids=["one-turn", "episodes"])
def test_a_share_whole_or_in_chunks_is_the_same_rows_whichever_sampler(episodes):
    rollout = worker(episodes)
    try:
        assert isinstance(rollout.sampler, WithEnvironment if episodes else OneTurn)
        assert isinstance(rollout.receiver, InProcess)  # hf: this process takes the sync's seat
        share = prompts()
        first, second = rollout.generate(share, 10, SAMPLING, num_slices=2)
        whole = RolloutSlice.concat([first, second], pad_id=0)
        chunks = list(rollout.generate_chunks(share, 10, SAMPLING, groups_per_chunk=2))
        assert [c.num_rows for c in chunks] == [4, 2]  # whole groups, the last chunk shorter
        assert_same_rows(whole, in_group_order(RolloutSlice.concat(chunks, pad_id=0)))
        assert whole.group_ids.tolist() == [10, 10, 11, 11, 12, 12]
        replies = (whole.completion_mask == 0) & (whole.attention_mask == 1)
        after_prompt = [bool(replies[i, np.flatnonzero(whole.completion_mask[i])[0] :].any()) for i in range(6)]
        # An episode's row holds the environment's replies between its turns (mask 0); one turn, none.
        turns = whole.row_fields.get("episode_turns", [1.0] * 6)
        assert after_prompt == [t > 1 for t in turns] and (any(after_prompt) or not episodes)
        assert (whole.reward_before is not None) == episodes  # per-turn credit travels with episodes only
    finally:
        rollout.close()


def test_a_worker_restarted_while_idle_refuses_to_sample_with_its_initial_weights():
    rollout = worker(False)
    try:
        with pytest.raises(Exception, match="rollout-0"):
            rollout.generate(prompts(), 0, SAMPLING, 1, expected_version=3)
        with pytest.raises(Exception, match="rollout-0"):
            next(rollout.generate_chunks(prompts(), 0, SAMPLING, 1, expected_version=3))
    finally:
        rollout.close()
