"""Loaders and the seeded prompt stream."""

import json
from pathlib import Path

import pytest

from grpo_ray.data.loaders import DataError, load_rows
from grpo_ray.data.prompts import PromptStream
from grpo_ray.types import Prompt

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "math-eval"


def prompts(n):
    return [Prompt(uid=i, text=str(i), token_ids=(i,), answer=str(i)) for i in range(n)]


def test_stream_is_a_permutation_per_epoch_and_reproducible():
    stream = PromptStream(prompts(5), seed=3)
    first_epoch = [p.uid for p in stream.take(5)]
    assert sorted(first_epoch) == [0, 1, 2, 3, 4]
    again = PromptStream(prompts(5), seed=3)
    assert [p.uid for p in again.take(5)] == first_epoch
    # Taking past the end starts a new, differently shuffled epoch.
    second = [p.uid for p in stream.take(5)]
    assert sorted(second) == [0, 1, 2, 3, 4] and stream.state() == {"epoch": 1, "position": 5}


def test_stream_resumes_from_its_state():
    stream = PromptStream(prompts(7), seed=1)
    stream.take(4)
    resumed = PromptStream(prompts(7), seed=1, **stream.state())
    assert [p.uid for p in resumed.take(6)] == [p.uid for p in stream.take(6)]


def test_generic_jsonl_rows_and_skips(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [
        {"question": "1+1?", "answer": 2},
        {"question": "", "answer": "x"},
        {"prompt": "p", "solution": "s", "extra": 5},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    rows, skipped = load_rows(str(path))
    assert [(r.prompt, r.answer) for r in rows] == [("1+1?", "2"), ("p", "s")]
    assert skipped == 1 and rows[1].fields == {"extra": 5}


def test_unusable_file_names_the_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text(json.dumps({"text": "no prompt field"}))
    with pytest.raises(DataError, match=r"empty\.jsonl: no usable rows \(1 skipped\)"):
        load_rows(str(path))


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/data/math-eval is not beside the checkout")
def test_verl_parquet_reads_chat_prompt_and_ground_truth():
    rows, skipped = load_rows(str(SHARED / "aime24.parquet"))
    assert len(rows) == 30 and skipped == 0
    assert all(r.prompt and r.answer for r in rows)
