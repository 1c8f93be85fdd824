"""Fuzzing dataset rows: bad records are skipped and counted, never a traceback.

hypothesis builds records of every recognised shape (POLARIS, GSM8K, verl, generic fields) whose
prompt and answer fields are missing, empty, whitespace, None, numbers, lists, dicts or very long,
and checks:

    parse_row          returns None or a row with non-empty text prompt and stripped answer, or
                       refuses a chat list that cannot be a prompt (PromptShapeError, one line)
    load_rows (jsonl)  len(rows) + skipped == records, Row.index == position, the same rows
                       parse_row keeps; DataError (one line, naming the file) only when none is,
                       or naming the file and the record parse_row refuses
    tokenize_prompts   any non-empty text tokenises; prompts over the limit are dropped and counted
    parse_difficulty   any input gives None or a fraction in [0, 1]
    selection          any band / val_fraction a recipe accepts gives rows or a DataError
"""

from __future__ import annotations

import functools
import json
import math
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo_ray.config import ConfigError, config_from_dict
from grpo_ray.data.formats import (
    GENERIC_ANSWER_FIELDS,
    GENERIC_PROMPT_FIELDS,
    PromptShapeError,
    parse_difficulty,
    parse_row,
)
from grpo_ray.data.loaders import DataError, Row, load_rows
from grpo_ray.data.prompts import tokenize_prompts
from grpo_ray.data.selection import in_difficulty_band, split_validation, with_instruction

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# One `datasets` load (~30 ms) per example: fewer.
FUZZ_FILES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_TOKENS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- strategies

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
short_text = st.text(max_size=20)
long_text = st.builds(
    lambda piece, n: piece * n, st.sampled_from(["x", "ab ", " ", "\n", "é漢", "#### 1 "]), st.integers(500, 5000)
)


def field_values(ints=st.integers(min_value=-(10**400), max_value=10**400)):
    """What a prompt or answer field may hold. `ints` is narrowed to int64 for JSON files (below)."""
    return st.one_of(
        st.none(),
        st.sampled_from(["", " ", "\n\t ", "\u00a0", "\u2028", "\x00", "#### ", "####", "#### ,", "#### 1,200"]),
        short_text,
        long_text,
        ints,
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.lists(short_text | INT64, max_size=3),
        st.dictionaries(short_text, short_text | INT64, max_size=3),
    )


def chat_lists(values):
    message = st.fixed_dictionaries(
        {}, optional={"role": st.sampled_from(["user", "system", "assistant", "", 1]) | st.none(), "content": values}
    )
    return st.lists(message | values, max_size=3)


def records(values, difficulty_values):
    """One record of each recognised shape, each field possibly missing, plus arbitrary extra fields."""
    gsm8k_answer = st.builds(lambda text, final: f"{text}\n#### {final}", short_text | long_text, values)
    polaris = st.fixed_dictionaries({}, optional={"problem": values, "answer": values, "difficulty": difficulty_values})
    gsm8k = st.fixed_dictionaries({}, optional={"question": values, "answer": gsm8k_answer | values})
    verl = st.fixed_dictionaries(
        {},
        optional={
            "prompt": chat_lists(values) | values,
            "reward_model": st.fixed_dictionaries({}, optional={"ground_truth": values, "style": short_text}) | values,
            "data_source": short_text,
        },
    )
    generic_names = st.sampled_from(GENERIC_PROMPT_FIELDS + GENERIC_ANSWER_FIELDS) | short_text
    generic = st.dictionaries(generic_names, values, max_size=5)
    return st.one_of(polaris, gsm8k, verl, generic)


def difficulties(ints=st.integers(min_value=-(10**400), max_value=10**400)):
    return st.one_of(
        st.none(),
        st.text(max_size=12),
        st.from_regex(r"\s*\d{1,3}\s*/\s*\d{1,3}\s*", fullmatch=True),
        st.sampled_from(["0/0", "9/8", "١/٢", "1e999", "nan", "-0", "1_0/2_0", "1" * 400 + "/1", "1" * 5000 + "/1"]),
        ints,
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.lists(INT64, max_size=2),
    )


field_names = st.none() | st.sampled_from(GENERIC_PROMPT_FIELDS + GENERIC_ANSWER_FIELDS + ("missing",))


# ---------------------------------------------------------------- parse_row


def assert_usable(prompt, answer):
    assert isinstance(prompt, str) and prompt.strip()
    assert isinstance(answer, str) and answer and answer == answer.strip()


@FUZZ
@given(records(field_values(), difficulties()), field_names, field_names)
@example({"prompt": "p", "answer": 10**400}, None, None)  # beyond float: math.isfinite overflowed
@example({"prompt": "p", "answer": 10**5000}, None, None)  # beyond str(): over 4300 digits
@example({"question": "q", "answer": "#### 1" + " " * 30_000 + "x"}, None, None)  # quadratic regex
@example({"problem": "p", "answer": "1", "difficulty": "1" * 400 + "/1"}, None, None)
def test_parse_row_keeps_only_usable_rows(record, prompt_field, answer_field):
    try:
        parsed = parse_row(record, prompt_field, answer_field)
    except PromptShapeError as err:
        assert "\n" not in str(err) and str(err).startswith(("the prompt's last message", "prompt message")), err
        return
    if parsed is not None:
        assert_usable(parsed.prompt, parsed.answer)
        assert all(isinstance(message["content"], str) for message in parsed.context)


def outcome(record):
    """parse_row's row, None, or the line of its refusal."""
    try:
        return parse_row(record)
    except PromptShapeError as err:
        return str(err)


KNOWN_FIELDS = ("difficulty", "reward_model") + GENERIC_PROMPT_FIELDS + GENERIC_ANSWER_FIELDS


@FUZZ
@given(records(field_values(), difficulties()), st.sets(st.sampled_from(KNOWN_FIELDS)))
@example({"question": "q", "answer": "#### 1"}, {"problem", "difficulty"})  # a GSM8K row in a file with POLARIS rows
@example({"problem": "p", "question": "q", "answer": "1"}, {"difficulty"})
def test_a_none_field_counts_as_absent(record, filled):
    # What `datasets` does to a row of a file mixing shapes: every column present, None where absent.
    as_loaded = {name: None for name in filled} | record
    parsed, parsed_as_loaded = outcome(record), outcome(as_loaded)
    if isinstance(parsed, str):
        assert parsed == parsed_as_loaded
    else:
        assert (parsed and parsed[:2]) == (parsed_as_loaded and parsed_as_loaded[:2])


@FUZZ
@given(difficulties())
@example(10**400)  # float(int) overflowed
@example("1" * 5000 + "/1")  # int() of over 4300 digits raised
@example("1" * 400 + "/1")  # k / n overflowed
def test_parse_difficulty_never_raises(value):
    frac = parse_difficulty(value)
    assert frac is None or (isinstance(frac, float) and 0.0 <= frac <= 1.0)


# ---------------------------------------------------------------- load_rows on a jsonl file


@pytest.fixture(scope="module", autouse=True)
def datasets_cache_in_tmp(tmp_path_factory):
    """Keep the fuzzed files' `datasets` caches out of ~/.cache/huggingface."""
    import datasets

    with mock.patch.object(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf-datasets"))):
        yield


# JSON files hold int64 only: `datasets` cannot read a file with a larger int at all (see the report).
json_records = st.lists(records(field_values(INT64), difficulties(INT64)), min_size=1, max_size=6)


@FUZZ_FILES
@given(json_records)
@example([{}, {"prompt": "p", "answer": "1"}, {}])
@example([{"prompt": None, "answer": None}])
@example([{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": "x"}])  # mixed column types
# `datasets` refused these whole files (a field with an empty name; one field a list in one record
# and a dict in another) and cast a number question to text: JSON lines are now read as written.
@example([{"question": "\x00", "answer": "\x00"}, {"": None, "\x00": None}, {"reward_model": {}, "prompt": [None]}])
@example([{"question": "\x00", "answer": "\x00"}, {"prompt": [None, None]}, {"\x00": {}}])
@example([{"question": "0", "answer": 1}, {"question": 0}, {"input": "\x00", "output": "\x00"}])
def test_load_rows_skips_and_counts(recs):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        outcomes = [outcome(r) for r in recs]
        usable = [i for i, parsed in enumerate(outcomes) if isinstance(parsed, tuple)]
        refused = next((i for i, parsed in enumerate(outcomes) if isinstance(parsed, str)), None)
        try:
            rows, skipped = load_rows(str(path))
        except DataError as err:
            message = str(err)
            assert "\n" not in message and message.startswith(f"{path}: "), message
            if refused is not None:
                assert message == f"{path}: record {refused} (counting from 0): {outcomes[refused]}"
            else:
                assert not usable, message
            return
        assert refused is None
    assert len(rows) + skipped == len(recs)
    assert [row.index for row in rows] == usable
    for row in rows:
        assert_usable(row.prompt, row.answer)
        assert row.prompt == parse_row(recs[row.index]).prompt


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "p", "answer": "1"}\n\n[1, 2]\n{"prompt": "q",\n')
    with pytest.raises(DataError, match=r"rows.jsonl: line 4 is not JSON \(.*\); fix or remove that line$"):
        load_rows(str(path))
    path.write_text('{"prompt": "p", "answer": "1"}\n\n[1, 2]\n"text"\n')  # blank lines pass; non-records skip
    rows, skipped = load_rows(str(path))
    assert [row.index for row in rows] == [0] and skipped == 2


def test_a_json_file_holding_one_array_is_read(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"problem": "p", "answer": "2"}, {"problem": "", "answer": "3"}]))
    rows, skipped = load_rows(str(path))
    assert [(row.prompt, row.answer, row.index) for row in rows] == [("p", "2", 0)] and skipped == 1


# ---------------------------------------------------------------- tokenize_prompts


@functools.cache
def tiny_tokenizer():
    from grpo_ray.models.loading import load_tokenizer

    return load_tokenizer("tiny")


prompt_texts = st.one_of(
    st.text(min_size=1, max_size=40),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=40),  # control characters, surrogate-free
    st.text(st.characters(max_codepoint=0x1F), min_size=1, max_size=20),
    long_text,
)


@FUZZ_TOKENS
@given(st.lists(prompt_texts, min_size=1, max_size=5), st.integers(1, 64), st.booleans())
@example(["\x00\x01\x7f", "\u202e\ufeff", "😀" * 10], 4, True)
def test_tokenize_prompts_drops_and_counts_long_prompts(texts, max_tokens, chat):
    rows = [Row(prompt=text, answer="1", fields={}, index=i) for i, text in enumerate(texts)]
    everything = tokenize_prompts(rows, tiny_tokenizer(), max_prompt_tokens=10**9, apply_chat_template=chat)
    limited = tokenize_prompts(rows, tiny_tokenizer(), max_prompt_tokens=max_tokens, apply_chat_template=chat)
    assert len(everything.prompts) == len(rows) and everything.dropped_too_long == 0
    # The limit drops exactly the prompts whose unlimited tokenisation is longer, and counts them.
    fits = [p.uid for p in everything.prompts if len(p.token_ids) <= max_tokens]
    assert [p.uid for p in limited.prompts] == fits
    assert limited.dropped_too_long == len(rows) - len(fits)
    assert all(len(p.token_ids) <= max_tokens for p in limited.prompts)


# ---------------------------------------------------------------- selection over accepted recipes


def accepted(data_section: dict):
    """The data section a recipe accepts, or None where load refuses it (with a ConfigError)."""
    try:
        return config_from_dict({"data": data_section}).data
    except ConfigError:
        return None


band_ends = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 0.25, 0.5, 1.0])


@FUZZ
@given(band_ends, band_ends, st.lists(st.sampled_from(["1/8", "4/8", "8/8", 0.3, None, "x", "0/0"]), max_size=8))
@example(0.9, 0.1, ["1/8"])  # an empty band: ValueError from deep in the data path
@example(math.nan, 0.5, ["1/8"])
def test_any_accepted_difficulty_band_gives_rows_or_a_data_error(low, high, difficulty_values):
    data = accepted({"difficulty_band": [low, high]})
    if data is None:
        return
    rows = [Row(prompt="p", answer="1", fields={"difficulty": d}, index=i) for i, d in enumerate(difficulty_values)]
    try:
        kept, dropped = in_difficulty_band(rows, data.difficulty_band)
    except DataError as err:
        assert str(err).startswith("data.difficulty_band: ") and "\n" not in str(err)
        return
    assert len(kept) + dropped == len(rows)


@FUZZ
@given(st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 20), st.text(max_size=10) | st.none())
def test_any_accepted_val_fraction_gives_a_split_or_a_data_error(fraction, count, instruction):
    data = accepted({"val_fraction": fraction, "instruction": instruction})
    if data is None:
        return
    rows = [Row(prompt=f"p{i}", answer="1", fields={}, index=i) for i in range(count)]
    rows = with_instruction(rows, data.instruction)
    try:
        train, held = split_validation(rows, data.val_fraction, seed=0)
    except DataError as err:
        assert str(err).startswith("data.val_fraction: ") and "\n" not in str(err)
        return
    assert sorted(r.index for r in train + held) == list(range(count))
