"""The synthetic addition task: split sizes, disjointness, determinism, JSON lines."""

import pytest

from grpo_ray.models.tiny_task import (
    HELDOUT_SIZE,
    addition_problem,
    make_addition_split,
    read_jsonl,
    write_jsonl,
)


def _pairs(rows):
    return {tuple(int(x) for x in row["prompt"].removesuffix("=").split("+")) for row in rows}


def test_row_format():
    assert addition_problem(37, 45) == {"prompt": "37+45=", "answer": "82"}


def test_splits_are_disjoint_and_cover_every_two_digit_pair():
    train, heldout = make_addition_split(seed=0)
    # 90 choices for a times 90 for b.
    assert len(train) + len(heldout) == 90 * 90
    assert len(heldout) == HELDOUT_SIZE == 500
    train_pairs, heldout_pairs = _pairs(train), _pairs(heldout)
    assert len(train_pairs) == len(train) and len(heldout_pairs) == len(heldout)  # no duplicates
    assert not train_pairs & heldout_pairs
    assert train_pairs | heldout_pairs == {(a, b) for a in range(10, 100) for b in range(10, 100)}


def test_answers_are_the_sums():
    train, heldout = make_addition_split(seed=3)
    for row in train + heldout:
        a, b = map(int, row["prompt"].removesuffix("=").split("+"))
        assert row["answer"] == str(a + b)
        assert 10 <= a <= 99 and 10 <= b <= 99


def test_same_seed_same_rows_other_seed_other_heldout():
    assert make_addition_split(seed=7) == make_addition_split(seed=7)
    assert _pairs(make_addition_split(seed=7)[1]) != _pairs(make_addition_split(seed=8)[1])


def test_heldout_size_is_validated():
    train, heldout = make_addition_split(seed=0, heldout_size=100)
    assert (len(train), len(heldout)) == (8000, 100)
    with pytest.raises(ValueError, match="heldout_size"):
        make_addition_split(seed=0, heldout_size=0)


def test_jsonl_round_trip(tmp_path):
    rows = make_addition_split(seed=0)[1][:5]
    path = write_jsonl(rows, tmp_path / "heldout.jsonl")
    assert path.read_text().splitlines()[0].startswith('{"prompt": "')
    assert read_jsonl(path) == rows
