"""A step's rows (StepRows) and the slices built from them (assemble_slice), on hand-made rows.

Log-probs are dyadic (-0.5, -0.25, ...) so that float32 holds them exactly and arrays compare equal.
"""

from dataclasses import replace

import numpy as np
import pytest

from grpo_ray.actors.slices import pack_slice
from grpo_ray.training.rows import KeptResponse, SliceAssembly, StepRows, assemble_slice, failure_counts, read_response
from grpo_ray.types import Completion, Prompt, ScoredSlice

PAD = 99

# -- StepRows on hand-made ScoredSlices ------------------------------------------------------------


def _scored(group_ids, uids, correct, lengths, truncated, diversity) -> ScoredSlice:
    """A ScoredSlice of one reward function "correct" whose score is also the raw total."""
    correct = np.array(correct, dtype=np.float64)
    return ScoredSlice(
        group_ids=np.array(group_ids, dtype=np.int64),
        prompt_uids=np.array(uids, dtype=np.int64),
        rewards=correct.copy(),
        per_function={"correct": correct},
        failures={"correct": int(np.isnan(correct).sum())},
        first_errors={},
        completion_lengths=np.array(lengths, dtype=np.int64),
        truncated=np.array(truncated, dtype=bool),
        group_diversity=np.array(diversity, dtype=np.float64),
    )


def _two_slices() -> list[ScoredSlice]:
    # Slice A: group 0 (prompt uid 10), 2 rows. Slice B: group 1 (prompt uid 20), 3 rows.
    return [
        _scored([0, 0], [10, 10], [1.0, 0.0], [4, 7], [False, True], [0.5, 0.5]),
        _scored([1, 1, 1], [20, 20, 20], [0.0, np.nan, 1.0], [3, 2, 9], [False, False, True], [0.25] * 3),
    ]


def _rows(first_source=0) -> StepRows:
    # The rewards the advantages see are passed apart from the scored totals: here the scored
    # totals minus 0.125 (as an overlong treatment might shape them), to tell the two apart.
    scored = _two_slices()
    rewards = [s.rewards - 0.125 for s in scored]
    weights = [np.ones(2), np.array([1.0, 0.0, 1.0])]
    return StepRows.from_scored(scored, rewards, weights, first_source=first_source)


def test_the_same_batch_gives_the_same_failure_rate_on_either_path():
    # Whole-share: the slices as they come. Streamed: the same rows in chunks, in finishing order.
    a, b = _two_slices()
    b = replace(b, first_errors={"correct": "ValueError: no answer"})
    chunks = [_take(b, [2]), _take(a, [0, 1]), _take(b, [0, 1])]
    expected = ({"correct": 1}, 5, {"correct": "ValueError: no answer"})
    assert failure_counts([a, b]) == expected
    assert failure_counts(chunks) == expected


def test_a_function_a_rows_source_does_not_use_is_no_failure():
    # reward.by_source: "fmt" scores only row 1; its NaN on row 0 is "not used", and the scorer
    # counted no failure. Counting NaNs would have stopped a healthy run at a 50% failure rate.
    routed = replace(
        _two_slices()[0],
        per_function={"correct": np.array([1.0, np.nan]), "fmt": np.array([np.nan, 1.0])},
        failures={"correct": 0, "fmt": 0},
    )
    assert failure_counts([routed]) == ({"correct": 0, "fmt": 0}, 2, {})


def _take(scored: ScoredSlice, rows: list[int]) -> ScoredSlice:
    """The given rows of a slice, as a streamed chunk of them would be scored."""
    pick = np.array(rows)
    per_function = {name: values[pick] for name, values in scored.per_function.items()}
    return replace(
        scored,
        group_ids=scored.group_ids[pick],
        prompt_uids=scored.prompt_uids[pick],
        rewards=scored.rewards[pick],
        per_function=per_function,
        failures={name: int(np.isnan(values).sum()) for name, values in per_function.items()},
        first_errors=scored.first_errors if any(np.isnan(v).any() for v in per_function.values()) else {},
        completion_lengths=scored.completion_lengths[pick],
        truncated=scored.truncated[pick],
        group_diversity=scored.group_diversity[pick],
    )


def _response(tokens, reward=0.75, finish_reason="stop", per_function=None) -> KeptResponse:
    return KeptResponse(
        token_ids=list(tokens),
        logprobs=[-0.5] * len(tokens),
        text=" ".join(str(t) for t in tokens),
        finish_reason=finish_reason,
        reward=reward,
        per_function={"correct": 1.0} if per_function is None else per_function,
    )


def test_from_scored_numbers_sources_from_first_source_and_rows_within_each_slice():
    rows = _rows(first_source=4)
    # Slice A is source 4 (rows 0, 1), slice B source 5 (rows 0, 1, 2).
    np.testing.assert_array_equal(rows.sources, [4, 4, 5, 5, 5])
    np.testing.assert_array_equal(rows.rows, [0, 1, 0, 1, 2])
    np.testing.assert_array_equal(rows.group_ids, [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(rows.prompt_uids, [10, 10, 20, 20, 20])
    # Rewards are the ones passed in (scored totals - 0.125), not the slices' own totals; NaN stays NaN.
    np.testing.assert_array_equal(rows.rewards, [0.875, -0.125, -0.125, np.nan, 0.875])
    np.testing.assert_array_equal(rows.per_function["correct"], [1.0, 0.0, 0.0, np.nan, 1.0])
    np.testing.assert_array_equal(rows.row_weights, [1, 1, 1, 0, 1])
    assert rows.row_weights.dtype == np.float32 and rows.rewards.dtype == np.float64
    np.testing.assert_array_equal(rows.completion_lengths, [4, 7, 3, 2, 9])
    np.testing.assert_array_equal(rows.truncated, [False, True, False, False, True])
    np.testing.assert_array_equal(rows.group_diversity, [0.5, 0.5, 0.25, 0.25, 0.25])
    assert len(rows) == 5 and rows.replacements == {}
    # Without first_source the first slice is source 0.
    np.testing.assert_array_equal(_rows().sources, [0, 0, 1, 1, 1])


def test_concat_shifts_replacement_rows_by_the_rows_before_them():
    first = _rows(first_source=0).with_replacement(4, _response([1]))  # 5 rows, row 4 replaced
    second = _rows(first_source=2).with_replacement(0, _response([2]))  # 5 rows, row 0 replaced
    both = StepRows.concat([first, second])
    # second's row 0 follows first's 5 rows: it becomes row 5.
    assert both.replacements == {4: first.replacements[4], 5: second.replacements[0]}
    np.testing.assert_array_equal(both.sources, [0, 0, 1, 1, 1, 2, 2, 3, 3, 3])
    np.testing.assert_array_equal(both.rows, [0, 1, 0, 1, 2] * 2)
    assert len(both) == 10 and both.per_function["correct"].shape == (10,)


def test_select_repeats_rows_and_replacements_follow_their_row():
    rows = _rows().with_replacement(2, _response([7, 8]))
    picked = rows.select(np.array([2, 0, 2, 4]))
    np.testing.assert_array_equal(picked.sources, [1, 0, 1, 1])
    np.testing.assert_array_equal(picked.rows, [0, 0, 0, 2])
    # Old row 2 (replaced, reward 0.75) lands at 0 and 2; old rows 0 and 4 keep their rewards.
    np.testing.assert_array_equal(picked.rewards, [0.75, 0.875, 0.75, 0.875])
    assert picked.replacements == {0: rows.replacements[2], 2: rows.replacements[2]}
    # A selection without the replaced row carries no replacement.
    assert rows.select([0, 1]).replacements == {}


def test_with_replacement_takes_the_responses_scores_length_and_truncation():
    rows = StepRows.from_scored(
        [replace(_two_slices()[1], per_function={"correct": np.zeros(3), "format": np.ones(3)})],
        [np.zeros(3)],
        [np.array([1.0, 0.0, 1.0])],
    )
    response = _response([31, 32, 33], reward=0.75, finish_reason="length", per_function={"correct": 1.0})
    replaced = rows.with_replacement(1, response)
    # Row 1: reward 0.75, correct 1.0, "format" absent from the response -> NaN, weight 0 -> 1,
    # length 3 tokens, finish "length" -> truncated. Rows 0 and 2 untouched.
    np.testing.assert_array_equal(replaced.rewards, [0.0, 0.75, 0.0])
    np.testing.assert_array_equal(replaced.per_function["correct"], [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(replaced.per_function["format"], [1.0, np.nan, 1.0])
    np.testing.assert_array_equal(replaced.row_weights, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(replaced.completion_lengths, [3, 3, 9])
    np.testing.assert_array_equal(replaced.truncated, [False, True, True])
    assert replaced.replacements == {1: response}
    # The original is not modified (frozen rows, copied arrays).
    np.testing.assert_array_equal(rows.rewards, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(rows.row_weights, [1.0, 0.0, 1.0])
    assert rows.replacements == {}
    # A "stop" response clears truncation.
    np.testing.assert_array_equal(replaced.with_replacement(2, _response([1])).truncated, [False, True, False])


def test_split_cuts_contiguous_equal_plans_and_reindexes_replacements():
    rows = StepRows.concat([_rows(0), _rows(2)]).with_replacement(7, _response([5]))  # 10 rows
    plans = rows.split(5)
    # 10 rows / 5 ranks = 2 rows each: plan k has rows 2k, 2k+1.
    assert [len(p.rows) for p in plans] == [2] * 5
    np.testing.assert_array_equal(np.concatenate([p.sources for p in plans]), rows.sources)
    np.testing.assert_array_equal(np.concatenate([p.rows for p in plans]), rows.rows)
    np.testing.assert_array_equal(np.concatenate([p.group_ids for p in plans]), rows.group_ids)
    # Row 7 is row 1 of plan 3 (rows 6, 7); the other plans have none.
    assert [p.replacements for p in plans] == [{}, {}, {}, {1: rows.replacements[7]}, {}]
    # Sources are [0 0 1 1 1 | 2 2 3 3 3]: plan 3 (rows 6, 7) reads slices 2 and 3, plan 4 only 3.
    np.testing.assert_array_equal(plans[3].sources, [2, 3])
    assert plans[3].sources_used == [2, 3] and plans[4].sources_used == [3]
    with pytest.raises(ValueError, match="10 rows do not split into 4 equal parts"):
        rows.split(4)


def test_whole_slices_only_for_whole_slices_in_order():
    slice_rows = [2, 3]
    rows = _rows()  # sources [0 0 1 1 1], rows [0 1 0 1 2]
    (plan,) = rows.split(1)
    assert plan.whole_slices(slice_rows) == [0, 1]
    # Two ranks over 4 rows of [2, 2]: each rank's cut is one whole slice.
    four = StepRows.concat([_rows().select([0, 1]), _rows(first_source=1).select([0, 1])])  # sources [0 0 1 1]
    assert [p.whole_slices([2, 2]) for p in four.split(2)] == [[0], [1]]
    # A permutation inside a slice, a slice cut short, a copied row, a replacement: not as they are.
    assert rows.select([1, 0, 2, 3, 4]).split(1)[0].whole_slices(slice_rows) is None
    assert rows.select([0, 1, 2, 3]).split(1)[0].whole_slices(slice_rows) is None
    assert rows.select([0, 0, 2, 3, 4]).split(1)[0].whole_slices(slice_rows) is None
    assert rows.with_replacement(3, _response([1])).split(1)[0].whole_slices(slice_rows) is None
    # Rows of slice 0 on both sides of slice 1's: not whole slices one after the other.
    assert rows.select([0, 2, 3, 4, 1]).split(1)[0].whole_slices(slice_rows) is None


# -- assemble_slice on slices packed from hand-made prompts and completions ------------------------

PA = Prompt(uid=10, text="pa", token_ids=(5, 6), answer="A", fields={"level": 1})
PB = Prompt(uid=20, text="pb", token_ids=(7,), answer="B")


def _slice_a():
    """Width 4: [5 6 11 12] and [5 6 13 pad], group 0, sampled with weights version 3."""
    rows = [
        (0, PA, Completion((11, 12), (-0.5, -0.25), "x y", "stop")),
        (0, PA, Completion((13,), (-0.75,), "z", "length")),
    ]
    return pack_slice(rows, PAD, policy_version=3, diversity_by_group={0: 0.5})


def _slice_b():
    """Width 5: [7 21 22 23 24] and [7 25 pad pad pad], group 1, weights version 2."""
    rows = [
        (1, PB, Completion((21, 22, 23, 24), (-1.0, -2.0, -3.0, -4.0), "long", "length")),
        (1, PB, Completion((25,), (-0.5,), "short", "stop")),
    ]
    return pack_slice(rows, PAD, policy_version=2, diversity_by_group={1: 0.25})


def _plan(sources, rows, group_ids, replacements=None) -> SliceAssembly:
    return SliceAssembly(
        sources=np.array(sources, dtype=np.int64),
        rows=np.array(rows, dtype=np.int64),
        group_ids=np.array(group_ids, dtype=np.int64),
        replacements=replacements or {},
    )


def test_assemble_rows_of_two_widths_with_a_repeat():
    # Output: B row 0, A row 1, B row 1, A row 1 again; new group ids 7, 8, 7, 9.
    plan = _plan([1, 0, 1, 0], [0, 1, 1, 1], [7, 8, 7, 9])
    assert plan.sources_used == [0, 1]
    out = assemble_slice(plan, [_slice_a(), _slice_b()], PAD)
    # Width 5 (slice B's); slice A's rows gain one more pad column.
    np.testing.assert_array_equal(out.input_ids, [
        [7, 21, 22, 23, 24],
        [5, 6, 13, PAD, PAD],
        [7, 25, PAD, PAD, PAD],
        [5, 6, 13, PAD, PAD],
    ])  # fmt: skip
    np.testing.assert_array_equal(
        out.attention_mask, [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    )
    np.testing.assert_array_equal(
        out.completion_mask, [[0, 1, 1, 1, 1], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0]]
    )
    np.testing.assert_array_equal(out.rollout_logprobs, [
        [0, -1.0, -2.0, -3.0, -4.0],
        [0, 0, -0.75, 0, 0],
        [0, -0.5, 0, 0, 0],
        [0, 0, -0.75, 0, 0],
    ])  # fmt: skip
    assert out.completions == ["long", "z", "short", "z"]
    assert out.finish_reasons == ["length", "length", "stop", "length"]
    assert out.prompts == ["pb", "pa", "pb", "pa"] and out.answers == ["B", "A", "B", "A"]
    np.testing.assert_array_equal(out.prompt_uids, [20, 10, 20, 10])
    # Group ids are the plan's; diversity stays the source group's.
    np.testing.assert_array_equal(out.group_ids, [7, 8, 7, 9])
    np.testing.assert_array_equal(out.group_diversity, [0.25, 0.5, 0.25, 0.5])
    # Slice B has no "level" field: its rows get None.
    assert out.row_fields == {"level": [None, 1, None, 1]}
    # Every row keeps the weights version it was sampled with: B's 2, A's 3.
    np.testing.assert_array_equal(out.policy_versions, [2, 3, 2, 3])
    np.testing.assert_array_equal(out.completion_lengths, [4, 1, 1, 1])


def test_assemble_replacement_longer_than_the_slice_widens_it():
    # Row 1 of slice A (prompt 5 6, completion 13) gets 4 tokens: 2 + 4 = 6 > width 4.
    response = KeptResponse(
        [31, 32, 33, 34], [-0.5, -0.25, -0.125, -1.0], "new long", "length", 1.0, {"correct": 1.0}, policy_version=1
    )
    out = assemble_slice(_plan([0, 0], [0, 1], [0, 0], {1: response}), [_slice_a()], PAD)
    # The rescued row is as old as the policy that sampled it.
    np.testing.assert_array_equal(out.policy_versions, [3, 1])
    # Every row widens to 6; row 0 gains two pad columns.
    np.testing.assert_array_equal(out.input_ids, [[5, 6, 11, 12, PAD, PAD], [5, 6, 31, 32, 33, 34]])
    np.testing.assert_array_equal(out.attention_mask, [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(out.completion_mask, [[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(out.rollout_logprobs, [[0, 0, -0.5, -0.25, 0, 0], [0, 0, -0.5, -0.25, -0.125, -1.0]])
    assert out.completions == ["x y", "new long"] and out.finish_reasons == ["stop", "length"]
    assert out.prompts == ["pa", "pa"]  # the prompt is kept
    assert out.input_ids.dtype == np.int64 and out.completion_mask.dtype == np.float32


def test_assemble_replacement_shorter_than_the_replaced_completion_clears_the_rest():
    # Row 0 of slice B (prompt 7, completion 21 22 23 24) gets one token 41: ends at column 2.
    response = KeptResponse([41], [-0.25], "tiny", "stop", 1.0, {"correct": 1.0})
    b = _slice_b()
    out = assemble_slice(_plan([1, 1], [0, 1], [1, 1], {0: response}), [b], PAD)
    # Width stays 5; columns 2-4 of row 0 go back to pad with every mask and log-prob 0.
    np.testing.assert_array_equal(out.input_ids, [[7, 41, PAD, PAD, PAD], [7, 25, PAD, PAD, PAD]])
    np.testing.assert_array_equal(out.attention_mask, [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(out.completion_mask, [[0, 1, 0, 0, 0], [0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(out.rollout_logprobs, [[0, -0.25, 0, 0, 0], [0, -0.5, 0, 0, 0]])
    assert out.completions == ["tiny", "short"] and out.finish_reasons == ["stop", "stop"]
    np.testing.assert_array_equal(out.completion_lengths, [1, 1])
    # The source slice (still in the object store, maybe read again) is left as it was.
    np.testing.assert_array_equal(b.input_ids, _slice_b().input_ids)
    np.testing.assert_array_equal(b.completion_mask, _slice_b().completion_mask)


def test_read_response_then_replace_reproduces_the_row():
    b = _slice_b()
    response = read_response(b, 0, reward=np.float64(0.5), per_function={"correct": np.float32(1.0)})
    # The generated part of row 0: tokens 21-24 with their log-probs; plain Python values (JSON-able).
    assert response == KeptResponse(
        [21, 22, 23, 24], [-1.0, -2.0, -3.0, -4.0], "long", "length", 0.5, {"correct": 1.0}, 2
    )
    assert all(type(t) is int for t in response.token_ids) and type(response.reward) is float
    # Row 1 (same prompt) takes row 0's response: row 1 becomes a copy of row 0.
    out = assemble_slice(_plan([1, 1], [0, 1], [1, 1], {1: response}), [b], PAD)
    for name in ("input_ids", "attention_mask", "completion_mask", "rollout_logprobs"):
        np.testing.assert_array_equal(getattr(out, name)[1], getattr(b, name)[0], err_msg=name)
    assert out.completions[1] == "long" and out.finish_reasons[1] == "length"


def test_step_rows_to_assembled_slices_end_to_end():
    # Two slices (A: 2 rows of group 0, B: 2 rows of group 1) -> rows -> keep B0, A0, B1, A1 ->
    # rescue row 3 (A1) with a 3-token response -> two ranks of 2 rows each.
    a, b = _slice_a(), _slice_b()
    scored = [
        _scored(
            s.group_ids,
            s.prompt_uids,
            [0.0, 0.0],
            s.completion_lengths,
            [f == "length" for f in s.finish_reasons],
            s.group_diversity,
        )
        for s in (a, b)
    ]
    rows = StepRows.from_scored(scored, [s.rewards for s in scored], [np.ones(2), np.ones(2)])
    rows = rows.select([2, 0, 3, 1]).with_replacement(3, _response([51, 52, 53], reward=1.0))
    plans = rows.split(2)
    slices = [a, b]
    built = [assemble_slice(p, [slices[s] for s in p.sources_used], PAD) for p in plans]
    # Rank 0: B row 0 then A row 0, width 5.
    np.testing.assert_array_equal(built[0].input_ids, [[7, 21, 22, 23, 24], [5, 6, 11, 12, PAD]])
    np.testing.assert_array_equal(built[0].group_ids, [1, 0])
    # Rank 1: B row 1, then A row 1 with 51 52 53 after its prompt (width 2 + 3 = 5).
    np.testing.assert_array_equal(built[1].input_ids, [[7, 25, PAD, PAD, PAD], [5, 6, 51, 52, 53]])
    np.testing.assert_array_equal(built[1].completion_mask, [[0, 1, 0, 0, 0], [0, 0, 1, 1, 1]])
    # The StepRows length of the rescued row agrees with the assembled completion mask.
    np.testing.assert_array_equal(np.concatenate([s.completion_lengths for s in built]), rows.completion_lengths)


def _episode_slice():
    """Two episodes of the prompt [7]: [7 | 21 22 | 50 51 | 23] (a reply between two turns; the step
    after turn 1 earned 0.5, credited x2) and [7 | 25] (one turn)."""
    from grpo_ray.actors.episodes import Episode, episode_sample
    from grpo_ray.actors.slices import pack_samples
    from grpo_ray.envs.episode import EpisodeTokens

    long, short = EpisodeTokens(prompt=[7]), EpisodeTokens(prompt=[7])
    long.add_turn([21, 22], [-1.0, -2.0])
    long.add_reply([50, 51])
    long.add_turn([23], [-3.0], earned_before=0.5)
    short.add_turn([25], [-0.5])
    rows = [
        (1, PB, episode_sample(Episode(long, answer="long"))),
        (1, PB, episode_sample(Episode(short, answer="short"))),
    ]
    return pack_samples(rows, PAD, policy_version=2, diversity={1: 0.25}, turn_credit=2.0)


def test_an_episode_kept_for_rescue_keeps_its_replies_as_context():
    b = _episode_slice()
    response = read_response(b, 0, reward=1.0, per_function={})
    assert response.token_ids == [21, 22, 50, 51, 23] and response.mask == [1, 1, 0, 0, 1]
    assert response.earned == [0, 0, 0, 0, 1.0] and response.generated_tokens == 3
    assert read_response(b, 1, 0.0, {}).mask is None  # one turn: every token the model's
    # Row 1 takes row 0's episode: it becomes row 0, replies masked out, credit kept.
    out = assemble_slice(_plan([0, 0], [0, 1], [1, 1], {1: response}), [b], PAD)
    for name in ("input_ids", "attention_mask", "completion_mask", "rollout_logprobs", "reward_before"):
        np.testing.assert_array_equal(getattr(out, name)[1], getattr(b, name)[0], err_msg=name)
    scored = _scored([1, 1], [20, 20], [0.0, 0.0], [3, 1], [False, False], [0.25, 0.25])
    rows = StepRows.from_scored([scored], [scored.rewards], [np.ones(2)])
    assert rows.with_replacement(1, response).completion_lengths.tolist() == [3, 3]
