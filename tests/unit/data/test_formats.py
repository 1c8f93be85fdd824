"""Dataset row formats on tiny realistic records, and one real verl-style parquet row."""

from pathlib import Path

import numpy as np
import pytest

from grpo_ray.data.formats import (
    POLARIS_INSTRUCTION,
    ParsedRow,
    PromptShapeError,
    RowFormat,
    append_instruction,
    detect_format,
    difficulty_in_band,
    generic_row,
    gsm8k_row,
    parse_difficulty,
    parse_row,
    polaris_row,
    verl_row,
)

AIME24 = Path("/work/shared/data/math-eval/aime24.parquet")

POLARIS = {"problem": "Find $x$ if $2x = 6$.", "answer": "3", "difficulty": "6/8"}
GSM8K = {
    "question": "Tom has 3 boxes of 400 pens. How many pens?",
    "answer": "3 boxes of 400 is 3*400=<<3*400=1200>>1200 pens.\n#### 1,200",
}
VERL = {
    "data_source": "test-math",
    "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}],
    "ability": "math",
    "reward_model": {"ground_truth": "2", "style": "rule"},
    "extra_info": {"index": 0, "split": "test"},
}


def test_polaris_row_parses_difficulty_fraction():
    row = polaris_row(POLARIS)
    assert row == ParsedRow("Find $x$ if $2x = 6$.", "3", {"difficulty": "6/8", "difficulty_frac": 0.75})
    assert polaris_row({**POLARIS, "difficulty": "hard"}).fields["difficulty_frac"] is None
    assert polaris_row({**POLARIS, "answer": 3}).answer == "3"  # numeric answers become text
    assert polaris_row({**POLARIS, "answer": "  "}) is None
    assert polaris_row({"answer": "3"}) is None


def test_parse_difficulty():
    assert parse_difficulty("0/8") == 0.0 and parse_difficulty(" 8 / 8 ") == 1.0
    assert parse_difficulty(0.25) == 0.25 and parse_difficulty("0.5") == 0.5
    for bad in ["9/8", "1/0", "easy", None, True, -0.1]:
        assert parse_difficulty(bad) is None


def test_gsm8k_row_takes_final_answer_and_keeps_solution():
    row = gsm8k_row(GSM8K)
    # "#### 1,200" -> "1200" (thousands separator dropped); the full text stays as `solution`
    assert row.prompt == GSM8K["question"] and row.answer == "1200"
    assert row.fields == {"solution": GSM8K["answer"]}
    assert gsm8k_row({**GSM8K, "answer": "no marker here"}) is None
    assert gsm8k_row({**GSM8K, "answer": "#### "}) is None


def test_verl_row_reads_the_whole_chat_and_keeps_other_fields():
    row = verl_row(VERL)
    # The user's message is the text; the system message before it is the context, not dropped.
    assert (row.prompt, row.answer) == ("1+1?", "2")
    assert row.context == ({"role": "system", "content": "Be brief."},)
    extra_info = {"index": 0, "split": "test"}
    assert row.fields == {"data_source": "test-math", "ability": "math", "extra_info": extra_info}
    # pandas reads parquet list columns as numpy object arrays; parquet gives every message every
    # key of its struct, None where a message has none.
    as_read = np.array([{**m, "name": None} for m in VERL["prompt"]], dtype=object)
    assert verl_row({**VERL, "prompt": as_read})[::3] == ("1+1?", row.context)
    assert verl_row({**VERL, "reward_model": {"style": "rule"}}) is None
    turns = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "And 2+2?"},
    ]
    row = verl_row({**VERL, "prompt": turns})
    assert (row.prompt, row.context) == ("And 2+2?", tuple(turns[:3]))
    assert verl_row({**VERL, "prompt": [{"role": "user", "content": "1+1?"}]}).context == ()


@pytest.mark.parametrize(
    ("prompt", "refusal"),
    [
        ([{"role": "system", "content": "x"}], r"^the prompt's last message is the system's, not the user's; end each"),
        (
            [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "The answer is"}],
            r"^the prompt's last message is the assistant's, not the user's; end each prompt with the user message",
        ),
        (
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}],
            r"^prompt message 0 \(user\) has content that is not text \(list\); .*give its content as one string$",
        ),
        ([{"role": "user", "content": None}], r"^prompt message 0 \(user\) has content that is not text \(NoneType\)"),
        (
            [{"role": "narrator", "content": "x"}, {"role": "user", "content": "1+1?"}],
            r"^prompt message 0 is not a chat message \(role 'narrator'\); give each message a role of system, user",
        ),
        ([{"role": "system", "content": "x"}, "1+1?"], r"^prompt message 1 is not a chat message \(role str\)"),
    ],
)
def test_a_chat_that_cannot_be_a_prompt_is_refused_in_one_line(prompt, refusal):
    with pytest.raises(PromptShapeError, match=refusal):
        verl_row({**VERL, "prompt": prompt})
    # The same reading for a chat list in a generic row (TRL's conversational "prompt").
    with pytest.raises(PromptShapeError, match=refusal):
        generic_row({"prompt": prompt, "answer": "2"})


def test_verl_row_on_real_aime24_parquet():
    pq = pytest.importorskip("pyarrow.parquet")
    if not AIME24.exists():
        pytest.skip(f"{AIME24} is missing")
    record = pq.read_table(AIME24).slice(0, 1).to_pylist()[0]
    assert detect_format(record) == "verl"
    row = verl_row(record)
    assert row is not None and row.answer == record["reward_model"]["ground_truth"]
    assert row.prompt.startswith("Every morning Aya") and row.fields["data_source"] == "test-math-aime24"
    assert append_instruction(row.prompt, POLARIS_INSTRUCTION) == row.prompt  # already asks for \boxed{}


def test_generic_row_candidates_and_named_fields():
    record = {"instruction": "Say hi", "output": "hi", "solution": "greeting", "id": 7}
    # prompt candidates in order input, question, instruction, ...: "instruction";
    # answer candidates output, answer, ...: "output"; only those two leave `fields`
    assert generic_row(record) == ParsedRow("Say hi", "hi", {"solution": "greeting", "id": 7})
    assert generic_row(record, answer_field="solution").answer == "greeting"
    named = generic_row({"q": "2*3?", "a": 6}, prompt_field="q", answer_field="a")
    assert named == ParsedRow("2*3?", "6", {})
    assert generic_row({"q": "2*3?"}, prompt_field="q") is None
    assert generic_row({"text": "nothing usable"}) is None


def test_detect_format_and_parse_row():
    assert detect_format(POLARIS) is RowFormat.POLARIS and detect_format(POLARIS) == "polaris"
    assert detect_format(GSM8K) == "gsm8k"
    assert detect_format(VERL) == "verl"
    assert detect_format({"question": "q", "answer": "a"}) == "generic"  # no "####"
    assert parse_row(GSM8K).answer == "1200"
    assert parse_row(VERL).prompt == "1+1?"
    assert parse_row(GSM8K, prompt_field="question", answer_field="answer").answer.endswith("#### 1,200")


def test_difficulty_band():
    assert difficulty_in_band(0.25, 0.0, 0.75) and difficulty_in_band(0.75, 0.0, 0.75)  # inclusive
    assert not difficulty_in_band(0.875, 0.0, 0.75)
    assert not difficulty_in_band(None, 0.0, 1.0) and not difficulty_in_band(float("nan"), 0.0, 1.0)
    with pytest.raises(ValueError):
        difficulty_in_band(0.5, 0.8, 0.2)


def test_append_instruction():
    assert append_instruction("Solve 1+1.") == "Solve 1+1.\n\n" + POLARIS_INSTRUCTION
    assert append_instruction("Solve 1+1.\n", "Answer briefly.") == "Solve 1+1.\n\nAnswer briefly."
    once = append_instruction("Solve 1+1.")
    assert append_instruction(once) == once  # idempotent
    assert append_instruction("Solve.", "") == "Solve."
