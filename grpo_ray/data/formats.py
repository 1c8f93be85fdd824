"""Dataset row formats: pure functions from one record (a dict) to `ParsedRow(prompt, answer,
fields)`, or None when the record is unusable (no prompt text, no answer).

    polaris  {"problem", "answer", "difficulty": "k/8"}        POLARIS-53K; difficulty_frac = k/8
    gsm8k    {"question", "answer": "...#### 72"}              answer "72"; `solution` keeps the text
    verl     {"prompt": [chat], "reward_model": {"ground_truth"}, "data_source", ...}
    generic  prompt from input/question/instruction/prompt/problem, answer from
             output/answer/response/completion/solution (or named fields)

`fields` holds the record's other top-level fields (they reach reward functions as keyword
arguments), plus what the format derives. Answers are stripped strings; a numeric answer (int or
float, not bool) becomes its `str`. Chat lists may be lists, tuples or numpy arrays of dicts
(pandas reads parquet list columns as arrays).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, NamedTuple

__all__ = [
    "GENERIC_ANSWER_FIELDS",
    "GENERIC_PROMPT_FIELDS",
    "POLARIS_INSTRUCTION",
    "ParsedRow",
    "RowFormat",
    "append_instruction",
    "detect_format",
    "difficulty_in_band",
    "generic_row",
    "gsm8k_row",
    "parse_difficulty",
    "parse_row",
    "polaris_row",
    "verl_row",
]

POLARIS_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
GENERIC_PROMPT_FIELDS = ("input", "question", "instruction", "prompt", "problem")
GENERIC_ANSWER_FIELDS = ("output", "answer", "response", "completion", "solution")
# Everything after the first "####"; the caller strips it. Found by fuzzing: the former
# r"####\s*(.+?)\s*$" backtracked quadratically (14 s on 50,000 spaces then text after "#### 1").
_GSM8K_FINAL = re.compile(r"####(.*)", re.DOTALL)


class ParsedRow(NamedTuple):
    prompt: str
    answer: str
    fields: dict[str, Any]


class RowFormat(str, Enum):
    POLARIS = "polaris"
    GSM8K = "gsm8k"
    VERL = "verl"
    GENERIC = "generic"


# ---------------------------------------------------------------- helpers


def _answer_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return str(value) if math.isfinite(value) else None
    if isinstance(value, int):
        # Found by fuzzing: math.isfinite overflowed on an int beyond float range (ints are finite),
        # and str() refuses ints of over 4300 digits.
        try:
            return str(value)
        except ValueError:
            return None
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _prompt_text(value: Any) -> str | None:
    """A non-empty string, or the content of the last user message of a chat list."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        messages = value.tolist() if hasattr(value, "tolist") else value
        if not isinstance(messages, (list, tuple)):
            return None
        users = [m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
        if users and isinstance(users[-1], str) and users[-1].strip():
            return users[-1]
    return None


def _rest(record: Mapping[str, Any], *used: str | None) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in used}


def parse_difficulty(value: Any) -> float | None:
    """Fraction in [0, 1] from "k/n" (POLARIS: solved k of n samples) or a number; else None."""
    if isinstance(value, bool):
        return None
    # Found by fuzzing: float() of a huge int and a huge "k/n" overflowed, and int() refuses "k/n"
    # of over 4300 digits; all of them are unreadable difficulties.
    try:
        if isinstance(value, (int, float)):
            frac = float(value)
        elif isinstance(value, str):
            match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value)
            if match:
                k, n = int(match[1]), int(match[2])
                if n == 0:
                    return None
                frac = k / n
            else:
                frac = float(value)
        else:
            return None
    except (ValueError, OverflowError):
        return None
    return frac if 0.0 <= frac <= 1.0 else None


# ---------------------------------------------------------------- formats


def polaris_row(record: Mapping[str, Any]) -> ParsedRow | None:
    """`problem`, `answer`, `difficulty` "k/8". Adds `difficulty_frac` (None when unparseable)."""
    prompt = _prompt_text(record.get("problem"))
    answer = _answer_text(record.get("answer"))
    if prompt is None or answer is None:
        return None
    fields = _rest(record, "problem", "answer")
    fields["difficulty_frac"] = parse_difficulty(record.get("difficulty"))
    return ParsedRow(prompt, answer, fields)


def gsm8k_row(record: Mapping[str, Any]) -> ParsedRow | None:
    """`question`, `answer` ending "#### n": answer n (commas removed), `solution` = full text."""
    prompt = _prompt_text(record.get("question"))
    solution = record.get("answer")
    if prompt is None or not isinstance(solution, str):
        return None
    match = _GSM8K_FINAL.search(solution)
    answer = match[1].replace(",", "").strip() if match else ""
    if not answer:
        return None
    fields = _rest(record, "question", "answer")
    fields["solution"] = solution
    return ParsedRow(prompt, answer, fields)


def verl_row(record: Mapping[str, Any]) -> ParsedRow | None:
    """`prompt` chat list (last user message), `reward_model.ground_truth`; other fields kept."""
    prompt = _prompt_text(record.get("prompt"))
    reward_model = record.get("reward_model")
    answer = _answer_text(reward_model.get("ground_truth")) if isinstance(reward_model, Mapping) else None
    if prompt is None or answer is None:
        return None
    return ParsedRow(prompt, answer, _rest(record, "prompt", "reward_model"))


def generic_row(
    record: Mapping[str, Any], prompt_field: str | None = None, answer_field: str | None = None
) -> ParsedRow | None:
    """Prompt and answer from the named fields, else from the first present candidate field.
    Only the two fields used are removed from `fields`."""
    prompt_key = prompt_field or _first_present(record, GENERIC_PROMPT_FIELDS)
    answer_key = answer_field or _first_present(record, GENERIC_ANSWER_FIELDS)
    if prompt_key is None or answer_key is None:
        return None
    prompt = _prompt_text(record.get(prompt_key))
    answer = _answer_text(record.get(answer_key))
    if prompt is None or answer is None:
        return None
    return ParsedRow(prompt, answer, _rest(record, prompt_key, answer_key))


def _first_present(record: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if record.get(name) is not None), None)


def detect_format(record: Mapping[str, Any]) -> RowFormat:
    """The most specific format whose signature fields the record has (checked in the order
    verl, polaris, gsm8k; else generic). A `RowFormat` is a str: == "verl" holds."""
    reward_model = record.get("reward_model")
    if isinstance(reward_model, Mapping) and "ground_truth" in reward_model and "prompt" in record:
        return RowFormat.VERL
    # Found by fuzzing: `datasets` gives every row every column of its file, None where the row has
    # none, so in a file mixing shapes a GSM8K row got problem: None, difficulty: None, was taken
    # for POLARIS and skipped. A None prompt or answer field counts as absent (as in generic_row).
    present = {key for key, value in record.items() if value is not None}
    if {"problem", "answer", "difficulty"} <= present:
        return RowFormat.POLARIS
    if "question" in present and isinstance(record.get("answer"), str) and "####" in record["answer"]:
        return RowFormat.GSM8K
    return RowFormat.GENERIC


_PARSERS: dict[RowFormat, Callable[[Mapping[str, Any]], ParsedRow | None]] = {
    RowFormat.POLARIS: polaris_row,
    RowFormat.GSM8K: gsm8k_row,
    RowFormat.VERL: verl_row,
    RowFormat.GENERIC: generic_row,
}


def parse_row(
    record: Mapping[str, Any], prompt_field: str | None = None, answer_field: str | None = None
) -> ParsedRow | None:
    """Named fields go through `generic_row`; otherwise the detected format's parser."""
    if prompt_field or answer_field:
        return generic_row(record, prompt_field, answer_field)
    return _PARSERS[detect_format(record)](record)


# ---------------------------------------------------------------- POLARIS data helpers


def difficulty_in_band(frac: float | None, low: float, high: float) -> bool:
    """low <= frac <= high (both ends inclusive); a missing or NaN difficulty is out of band."""
    if low > high:
        raise ValueError(f"difficulty band is empty: low {low} > high {high}")
    if frac is None or math.isnan(frac):
        return False
    return low <= frac <= high


def append_instruction(prompt: str, suffix: str = POLARIS_INSTRUCTION) -> str:
    """`prompt` + "\\n\\n" + `suffix`, unless the prompt already contains the suffix (or it is
    empty). Trailing whitespace of the prompt is dropped first, so the gap is exactly one blank line."""
    if not suffix.strip() or suffix.strip() in prompt:
        return prompt
    return prompt.rstrip() + "\n\n" + suffix
