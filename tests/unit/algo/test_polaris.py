"""POLARIS: informative substitution, rollout rescue, per-prompt ledger and drop-easy."""

import json
from collections import Counter

import numpy as np
import pytest

from grpo_ray.algo.polaris import (
    PromptLedger,
    RescueBuffer,
    drop_easy,
    group_mean_rewards,
    informative_substitution,
    rescue_plan,
    update_from_batch,
)

NAN = float("nan")


def _source_groups(result, group_ids, rows_per_group):
    """For each substituted slot (its rows), the original group id its rows were copied from."""
    sources = {}
    for slot_rows in rows_per_group:
        src = result.row_order[slot_rows]
        assert len(set(group_ids[src].tolist())) == 1  # a whole group, not a mix
        sources[tuple(slot_rows)] = int(group_ids[src[0]])
    return sources


# ---------------------------------------------------------------- informative substitution


def test_group_means_agree_with_loop():
    rewards = np.array([1.0, NAN, 0.0, 0.5, NAN, NAN, 1.0])
    group_ids = np.array([4, 4, 9, 9, 2, 2, 4])
    uids, mean, inverse = group_mean_rewards(rewards, group_ids)
    np.testing.assert_array_equal(uids, [2, 4, 9])
    # group 2 no finite reward -> NaN; group 4 finite [1, 1] -> 1; group 9 [0, .5] -> .25
    np.testing.assert_array_equal(mean, [NAN, 1.0, 0.25])
    np.testing.assert_array_equal(uids[inverse], group_ids)


def test_substitution_batch6_three_informative_substitutes_each_once():
    # six groups of G=2: g0 [1,0] .5 inf | g1 [1,1] 1 no | g2 [0,1] .5 inf
    #                    g3 [0,0] 0 no   | g4 [.5,0] .25 inf | g5 [NaN,NaN] no finite reward
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.0, NAN, NAN])
    group_ids = np.repeat(np.arange(6), 2)
    # 3 informative > 6 // 3 = 2 -> substitute the 3 others; 3 slots, 3 sources: each copied once
    result = informative_substitution(rewards, group_ids, batch_size=6, rng=np.random.default_rng(0))
    assert not result.skip_batch
    assert (result.num_informative, result.num_substituted) == (3, 3)
    for row in [0, 1, 4, 5, 8, 9]:  # informative groups map to themselves, ids unchanged
        assert result.row_order[row] == row and result.new_group_ids[row] == group_ids[row]
    sources = _source_groups(result, group_ids, [[2, 3], [6, 7], [10, 11]])
    assert sorted(sources.values()) == [0, 2, 4]
    for (first, second), src in sources.items():  # row for row: first row from first row
        assert result.row_order[first] == 2 * src and result.row_order[second] == 2 * src + 1
    # copies get fresh ids max(5) + 1, + 2, + 3 in slot order
    np.testing.assert_array_equal(result.new_group_ids[[2, 3, 6, 7, 10, 11]], [6, 6, 7, 7, 8, 8])
    _, means, _ = group_mean_rewards(rewards[result.row_order], result.new_group_ids)
    assert ((means > 0) & (means < 1)).all()  # every output group now informative


def test_substitution_batch6_two_informative_skips():
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    group_ids = np.repeat(np.arange(6), 2)
    # informative: g0 and g2 only; 2 > 6 // 3 = 2 is false -> skip, rows untouched
    result = informative_substitution(rewards, group_ids, batch_size=6, rng=np.random.default_rng(0))
    assert result.skip_batch
    assert (result.num_informative, result.num_substituted) == (2, 0)
    np.testing.assert_array_equal(result.row_order, np.arange(12))
    np.testing.assert_array_equal(result.new_group_ids, group_ids)


def test_substitution_is_balanced_when_sources_are_scarce():
    # batch_size 5: 5 // 3 = 1 < 2 informative; 4 slots from 2 sources -> each source copied twice
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    group_ids = np.repeat(np.arange(6), 2)
    result = informative_substitution(rewards, group_ids, batch_size=5, rng=np.random.default_rng(3))
    slots = [[2, 3], [4, 5], [8, 9], [10, 11]]
    assert Counter(_source_groups(result, group_ids, slots).values()) == {0: 2, 3: 2}
    assert len(set(result.new_group_ids.tolist())) == 6


def test_substitution_non_contiguous_groups_copy_row_for_row():
    # group 7 on rows 0,2,4 [1,0,0] informative; group 3 on rows 1,3,5 [1,1,1] not
    rewards = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    group_ids = np.array([7, 3, 7, 3, 7, 3])
    result = informative_substitution(rewards, group_ids, batch_size=1, rng=np.random.default_rng(0))
    # 1 > 1 // 3 = 0; slot rows 1,3,5 take source rows 0,2,4 in order; fresh id 8
    np.testing.assert_array_equal(result.row_order, [0, 0, 2, 2, 4, 4])
    np.testing.assert_array_equal(result.new_group_ids, [7, 8, 7, 8, 7, 8])


def test_substitution_all_informative_changes_nothing_and_is_seed_deterministic():
    rewards = np.array([1.0, 0.0, 0.0, 1.0])
    group_ids = np.array([0, 0, 1, 1])
    result = informative_substitution(rewards, group_ids, batch_size=2, rng=np.random.default_rng(0))
    assert not result.skip_batch and result.num_substituted == 0
    np.testing.assert_array_equal(result.row_order, np.arange(4))

    rewards = np.tile([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], 4)
    group_ids = np.repeat(np.arange(12), 2)
    first = informative_substitution(rewards, group_ids, 12, np.random.default_rng(42))
    again = informative_substitution(rewards, group_ids, 12, np.random.default_rng(42))
    np.testing.assert_array_equal(first.row_order, again.row_order)


def test_substitution_reward_range_and_errors():
    # rewards in [-1, 1]: a group of [1, -1] has mean 0, informative inside (-1, 1)
    rewards = np.array([1.0, -1.0, -1.0, -1.0])
    result = informative_substitution(
        rewards, np.array([0, 0, 1, 1]), 2, np.random.default_rng(0), min_reward=-1.0, max_reward=1.0
    )
    np.testing.assert_array_equal(result.row_order, [0, 1, 0, 1])
    with pytest.raises(ValueError, match="equal group sizes"):
        informative_substitution(
            np.array([1.0, 0.0, 1.0, 1.0, 1.0]), np.array([0, 0, 1, 1, 1]), 2, np.random.default_rng(0)
        )
    with pytest.raises(ValueError, match="batch_size"):
        informative_substitution(np.array([1.0]), np.array([0]), 0, np.random.default_rng(0))


# ---------------------------------------------------------------- rollout rescue


def test_rescue_plan_hand_worked():
    rewards = np.array([0.0, 0.0, 1.0, 0.0, 0.0, NAN, NAN, NAN, 0.0, 0.0])
    group_ids = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    prompt_uids = group_ids + 10
    buffer = RescueBuffer()
    for uid in [10, 11, 12, 13]:
        buffer.record(uid, f"kept-{uid}")
    # g0 all 0 and uid 10 kept -> row 0; g1 has a correct row -> no; g2 [0, NaN] none correct ->
    # row 4; g3 all NaN (a scoring failure) -> no; g4 all 0 but uid 14 has nothing kept -> no
    assert rescue_plan(rewards, group_ids, prompt_uids, buffer) == [(0, 10), (4, 12)]


def test_rescue_plan_threshold_and_non_contiguous_first_row():
    # one group on rows 3 and 1 (ids 5); partial credit .5 and .2
    rewards = np.array([1.0, 0.5, 0.0, 0.2])
    group_ids = np.array([9, 5, 9, 5])
    prompt_uids = np.array([90, 50, 90, 50])
    buffer = RescueBuffer()
    buffer.record(50, [1, 2, 3])
    assert rescue_plan(rewards, group_ids, prompt_uids, buffer) == [(1, 50)]  # .5 < 1.0: failed
    assert rescue_plan(rewards, group_ids, prompt_uids, buffer, correct_threshold=0.5) == []


def test_update_from_batch_keeps_latest_correct_and_round_trips():
    buffer = RescueBuffer()
    buffer.record(10, "old")
    recorded = update_from_batch(
        buffer, np.array([1.0, 0.0, 1.0, 1.0, NAN]), np.array([10, 10, 11, 11, 12]), ["a", "b", "c", "d", "e"]
    )
    # uid 10: row 0 correct -> "a" replaces "old"; uid 11: rows 2 and 3 correct, the later wins
    assert recorded == 2
    assert (buffer.get(10), buffer.get(11), buffer.get(12)) == ("a", "d", None)
    restored = RescueBuffer()
    restored.load_state_dict(json.loads(json.dumps(buffer.state_dict())))
    assert (restored.get(10), restored.get(11), len(restored)) == ("a", "d", 2)
    with pytest.raises(ValueError):
        update_from_batch(buffer, np.array([1.0]), np.array([1]), ["a", "b"])


# ---------------------------------------------------------------- ledger and drop-easy


def _ledger():
    ledger = PromptLedger()
    # step 1: uid 1 [1,1] -> 1; uid 2 [1,0] -> .5; uid 3 [NaN,NaN] -> not recorded
    assert ledger.record(np.array([1, 1, 2, 2, 3, 3]), np.array([1.0, 1.0, 1.0, 0.0, NAN, NAN])) == 2
    # step 2 (rows shuffled): uid 1 [1,0] -> .5; uid 2 [0,0] -> 0; uid 3 [1,NaN] -> 1
    assert ledger.record(np.array([3, 1, 2, 1, 3, 2]), np.array([1.0, 1.0, 0.0, 0.0, NAN, 0.0])) == 3
    return ledger  # averages: uid 1 (1 + .5) / 2 = .75, uid 2 (.5 + 0) / 2 = .25, uid 3 1 / 1 = 1


def test_ledger_averages_and_easy_prompts():
    ledger = _ledger()
    assert (ledger.average(1), ledger.average(2), ledger.average(3)) == (0.75, 0.25, 1.0)
    assert ledger.average(99) is None
    assert ledger.easy_prompts(0.9) == {3}
    assert ledger.easy_prompts(0.75) == {3}  # strictly above
    assert ledger.easy_prompts(0.7) == {1, 3}
    assert ledger.easy_prompts(1.0) == set()


def test_ledger_save_load_and_state_dict(tmp_path):
    ledger = _ledger()
    path = tmp_path / "ledger.jsonl"
    ledger.save(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"uid": 1, "sum": 1.5, "count": 2},
        {"uid": 2, "sum": 0.5, "count": 2},
        {"uid": 3, "sum": 1.0, "count": 1},
    ]
    loaded = PromptLedger.load(path)
    assert loaded.state_dict() == ledger.state_dict()
    restored = PromptLedger()
    restored.load_state_dict(json.loads(json.dumps(ledger.state_dict())))
    assert restored.average(1) == 0.75 and len(restored) == 3


def test_drop_easy_keeps_order_and_unknown_prompts():
    kept, dropped = drop_easy([3, 1, 2, 99], _ledger(), threshold=0.7)
    assert (kept, dropped) == ([2, 99], 2)
