import pytest

from grpo_ray.data.formats import POLARIS_INSTRUCTION
from grpo_ray.data.loaders import DataError, Row
from grpo_ray.data.selection import in_difficulty_band, split_validation, with_instruction


def rows(n, **fields):
    return [Row(prompt=f"p{i}", answer=str(i), fields=dict(fields)) for i in range(n)]


def test_instruction_is_appended_once():
    already = Row(prompt=f"Solve x. {POLARIS_INSTRUCTION}", answer="1", fields={})
    out = with_instruction([Row("Solve y.", "2", {}), already], POLARIS_INSTRUCTION)
    assert out[0].prompt == f"Solve y.\n\n{POLARIS_INSTRUCTION}"
    assert out[1].prompt == already.prompt
    assert with_instruction(out, None) is out


def test_difficulty_band_keeps_rows_in_band_and_counts_the_rest():
    data = [
        Row("a", "1", {"difficulty": "2/8"}),
        Row("b", "2", {"difficulty": "7/8"}),
        Row("c", "3", {}),
        Row("d", "4", {"difficulty_frac": 0.5}),
    ]
    # 2/8 = 0.25 and 0.5 are inside [0.2, 0.6]; 7/8 is outside; no difficulty is dropped.
    kept, dropped = in_difficulty_band(data, (0.2, 0.6))
    assert [r.prompt for r in kept] == ["a", "d"] and dropped == 2
    assert in_difficulty_band(data, None) == (data, 0)


def test_a_band_that_removes_everything_names_the_filter():
    with pytest.raises(DataError, match=r"^data\.difficulty_band: \[0\.9, 1\.0\] removed all 2 rows"):
        in_difficulty_band([Row("a", "1", {"difficulty": "1/8"}), Row("b", "1", {"difficulty": "2/8"})], (0.9, 1.0))


def test_validation_split_is_seeded_disjoint_and_complete():
    data = rows(50)
    train, val = split_validation(data, 0.2, seed=3)
    assert len(val) == 10 and len(train) == 40
    assert {r.prompt for r in train} | {r.prompt for r in val} == {r.prompt for r in data}
    assert split_validation(data, 0.2, seed=3) == (train, val)
    assert split_validation(data, 0.2, seed=4)[1] != val
    assert split_validation(data, 0.0, seed=3) == (data, [])
    with pytest.raises(DataError, match="data.val_fraction"):
        split_validation(rows(3), 0.01, seed=0)
