"""RolloutSlice packing: the [N, T] conventions of types.py, checked on a hand example."""

import numpy as np

from grpo_ray.actors.slices import pack_slice
from grpo_ray.types import Completion, Prompt


def test_pack_slice_aligns_tokens_masks_and_logprobs():
    p1 = Prompt(uid=7, text="1+1=", token_ids=(5, 6), answer="2", fields={"level": 1})
    p2 = Prompt(uid=9, text="2+2=", token_ids=(5, 6, 8), answer="4")
    c1 = Completion(token_ids=(11, 2), logprobs=(-0.5, -0.1), text="2", finish_reason="stop")
    c2 = Completion(token_ids=(12,), logprobs=(-2.0,), text="4", finish_reason="length")
    batch = pack_slice([(0, p1, c1), (3, p2, c2)], pad_id=0, policy_version=4)
    # Row 0: prompt 5 6, completion 11 2 -> width 4. Row 1: prompt 5 6 8, completion 12, width 4.
    np.testing.assert_array_equal(batch.input_ids, [[5, 6, 11, 2], [5, 6, 8, 12]])
    np.testing.assert_array_equal(batch.attention_mask, [[1, 1, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(batch.completion_mask, [[0, 0, 1, 1], [0, 0, 0, 1]])
    np.testing.assert_allclose(batch.rollout_logprobs, [[0, 0, -0.5, -0.1], [0, 0, 0, -2.0]])
    np.testing.assert_array_equal(batch.group_ids, [0, 3])
    np.testing.assert_array_equal(batch.prompt_uids, [7, 9])
    np.testing.assert_array_equal(batch.completion_lengths, [2, 1])
    assert batch.row_fields == {"level": [1, None]}
    assert batch.finish_reasons == ["stop", "length"] and batch.policy_versions.tolist() == [4, 4]


def test_shorter_rows_are_right_padded():
    p = Prompt(uid=0, text="x", token_ids=(5,), answer="y")
    long = Completion(token_ids=(1, 2, 3), logprobs=(-1.0, -1.0, -1.0), text="", finish_reason="length")
    short = Completion(token_ids=(1,), logprobs=(-1.0,), text="", finish_reason="stop")
    batch = pack_slice([(0, p, long), (0, p, short)], pad_id=99, policy_version=0)
    np.testing.assert_array_equal(batch.input_ids[1], [5, 1, 99, 99])
    np.testing.assert_array_equal(batch.attention_mask[1], [1, 1, 0, 0])
