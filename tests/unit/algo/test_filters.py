"""Dynamic sampling filters: hand-worked arrays, and agreement with a slow per-group loop."""

import numpy as np
import pytest

from grpo_ray.algo.filters import GroupAccumulator, groups_needed, select_informative_rows, zero_variance_groups

NAN = float("nan")


def _reference_zero_variance(rewards, group_ids):
    """One group at a time, straight from the definition."""
    out = np.zeros(len(rewards), dtype=bool)
    for gid in set(group_ids.tolist()):
        rows = [i for i, g in enumerate(group_ids) if g == gid]
        finite = [rewards[i] for i in rows if np.isfinite(rewards[i])]
        constant = len(set(finite)) <= 1
        for i in rows:
            out[i] = constant
    return out


def test_zero_variance_hand_worked():
    rewards = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    group_ids = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    # group 0 [1,1] all equal, group 1 [0,1] spread, group 2 [0,0] all equal, group 3 [.5,.5] equal
    expected = np.array([True, True, False, False, True, True, True, True])
    np.testing.assert_array_equal(zero_variance_groups(rewards, group_ids), expected)
    np.testing.assert_array_equal(select_informative_rows(rewards, group_ids), [2, 3])


def test_nan_rows_are_ignored_and_all_nan_group_is_constant():
    rewards = np.array([1.0, NAN, 1.0, NAN, NAN, 0.0, NAN, 1.0, 9.0])
    group_ids = np.array([5, 5, 5, 8, 8, 2, 2, 2, 4])
    # group 5 finite [1,1] -> constant; group 8 no finite reward -> constant (no signal);
    # group 2 finite [0,1] -> informative, its NaN row 6 kept with the group; group 4 alone -> constant
    expected = np.array([True, True, True, True, True, False, False, False, True])
    np.testing.assert_array_equal(zero_variance_groups(rewards, group_ids), expected)
    np.testing.assert_array_equal(select_informative_rows(rewards, group_ids), [5, 6, 7])


def test_non_contiguous_groups_agree_with_loop():
    rng = np.random.default_rng(0)
    rewards = rng.integers(0, 2, size=60).astype(np.float64)
    rewards[rng.random(60) < 0.1] = NAN
    group_ids = rng.permutation(np.repeat(np.arange(15) * 3 + 7, 4))
    np.testing.assert_array_equal(
        zero_variance_groups(rewards, group_ids), _reference_zero_variance(rewards, group_ids)
    )


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match=r"\[N\]"):
        zero_variance_groups(np.zeros(3), np.zeros(4, dtype=np.int64))


def test_accumulator_trims_to_exactly_target_groups():
    acc = GroupAccumulator(target_groups=3, max_tries=5)
    # try 1: groups 0 [1,0] and 2 [0,1] informative, group 1 [1,1] dropped -> kept 2 (rows 0,1,4,5)
    kept = acc.add("a", np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0]), np.array([0, 0, 1, 1, 2, 2]))
    assert (kept, acc.full, acc.done) == (2, False, False)
    # try 2: groups 10 [0,1] and 11 [1,0] informative, group 12 [0,0] dropped -> 4 collected >= 3
    kept = acc.add("b", np.array([0.0, 1.0, 1.0, 0.0, 0.0, 0.0]), np.array([10, 10, 11, 11, 12, 12]))
    assert (kept, acc.full, acc.done) == (2, True, True)
    assert (acc.tries, acc.dropped_groups, acc.num_groups) == (2, 2, 4)
    taken = acc.take()
    # first come first served: both groups of "a", then group 10 of "b" (rows 0,1); group 11 cut
    assert [key for key, _ in taken] == ["a", "b"]
    np.testing.assert_array_equal(taken[0][1], [0, 1, 4, 5])
    np.testing.assert_array_equal(taken[1][1], [0, 1])
    assert acc.surplus_groups == 1
    assert acc.num_groups == 0 and acc.tries == 2  # emptied, counters kept for logging


def test_accumulator_out_of_tries_returns_what_it_has():
    acc = GroupAccumulator(target_groups=4, max_tries=2)
    assert acc.add(0, np.array([1.0, 1.0]), np.array([0, 0])) == 0
    assert not acc.done
    assert acc.add(1, np.array([1.0, 0.0, 0.0, 0.0]), np.array([3, 3, 4, 4])) == 1
    assert acc.done and not acc.full
    taken = acc.take()
    assert len(taken) == 1 and taken[0][0] == 1
    np.testing.assert_array_equal(taken[0][1], [0, 1])
    assert acc.dropped_groups == 2


def test_accumulator_rejects_bad_arguments():
    with pytest.raises(ValueError):
        GroupAccumulator(target_groups=0)
    with pytest.raises(ValueError):
        GroupAccumulator(target_groups=2, max_tries=0)


# groups_needed: groups 10..13 of a batch, two rows each. Informative (rewards differ): 11 and 13.
REWARDS = {10: [1.0, 1.0], 11: [0.0, 1.0], 12: [0.0, 0.0], 13: [1.0, 0.0]}


def rows_of(*groups):
    return (np.array([r for g in groups for r in REWARDS[g]]), np.array([g for g in groups for _ in REWARDS[g]]))


def test_groups_needed_reads_the_groups_in_id_order_whatever_order_they_arrived_in():
    # Group 11 alone settles one needed group: the first two groups hold it.
    assert groups_needed(*rows_of(11, 10), first_group=10, num_groups=4, need=1) == 2
    assert groups_needed(*rows_of(10, 11), first_group=10, num_groups=4, need=1) == 2
    # Group 13 arrived first, but group 12 (before it) is unknown: nothing is settled yet.
    assert groups_needed(*rows_of(13, 10, 11), first_group=10, num_groups=4, need=2) is None
    assert groups_needed(*rows_of(13, 12, 10, 11), first_group=10, num_groups=4, need=2) == 4


def test_groups_needed_is_all_of_them_when_the_batch_has_too_few_and_none_when_nothing_is_needed():
    assert groups_needed(*rows_of(10, 11, 12, 13), first_group=10, num_groups=4, need=3) == 4
    assert groups_needed(*rows_of(10), first_group=10, num_groups=4, need=0) == 0
    # A group with a failed row (NaN) and otherwise equal rewards holds no signal.
    assert groups_needed(np.array([np.nan, 1.0, 0.0, 1.0]), np.array([10, 10, 11, 11]), 10, 2, need=1) == 2
