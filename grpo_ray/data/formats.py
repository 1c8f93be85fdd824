"""Dataset row formats: pure functions from one record (a dict) to `ParsedRow(prompt, answer,
fields)`, or None when the record is unusable (no prompt text, no answer).

    polaris  {"problem", "answer", "difficulty": "k/8"}        POLARIS-53K; difficulty_frac = k/8
    gsm8k    {"question", "answer": "...#### 72"}              answer "72"; `solution` keeps the text
    verl     {"prompt": [chat], "reward_model": {"ground_truth"}, "data_source", ...}
    generic  prompt from input/question/instruction/prompt/problem, answer from
             output/answer/response/completion/solution (or named fields)

A prompt given as a chat list (verl's `prompt`, or a generic field holding one) is read whole: its
last message, the user's, is the prompt's text (what reward functions see), and the messages before
it (a system message, earlier turns) are its `context`, rendered before it by the chat template.
A chat list that cannot be such a prompt (a last message that is not the user's, content that is
not text, a message without a role) raises `PromptShapeError` rather than losing part of it: the
loader names the file and the record.

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
    "CHAT_ROLES",
    "ParsedRow",
    "PromptShapeError",
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
# The roles a prompt's messages may have: what chat templates render.
CHAT_ROLES = ("system", "user", "assistant", "tool")
# Everything after the first "####"; the caller strips it. Found by fuzzing: the former
# r"####\s*(.+?)\s*$" backtracked quadratically (14 s on 50,000 spaces then text after "#### 1").
_GSM8K_FINAL = re.compile(r"####(.*)", re.DOTALL)


class ParsedRow(NamedTuple):
    prompt: str  # the user's message (the last of a chat list)
    answer: str
    fields: dict[str, Any]
    # The chat messages before the prompt ({"role", "content", ...}: a system message, earlier
    # turns); () for a prompt given as text.
    context: tuple[dict[str, Any], ...] = ()


class PromptShapeError(ValueError):
    """A chat-list prompt that cannot be a prompt here; the message says why and what to do (the
    loader adds the file and the record)."""


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


def _prompt(value: Any) -> tuple[str, tuple[dict[str, Any], ...]] | None:
    """(text, context) of a non-empty string or of a chat list read whole; None when there is no
    prompt text. Raises PromptShapeError on a chat list that cannot be a prompt."""
    if isinstance(value, str):
        return (value, ()) if value.strip() else None
    if not (isinstance(value, (list, tuple)) or hasattr(value, "tolist")):
        return None
    messages = value.tolist() if hasattr(value, "tolist") else value
    # A list with no message in it is no chat (a list of numbers or strings): no prompt, as before.
    if not isinstance(messages, (list, tuple)) or not any(isinstance(m, Mapping) and "role" in m for m in messages):
        return None
    chat = [_chat_message(position, message) for position, message in enumerate(messages)]
    last = chat[-1]
    if last["role"] != "user":
        raise PromptShapeError(
            f"the prompt's last message is the {last['role']}'s, not the user's; end each prompt with the user "
            "message the model answers (a chat template's generation prompt starts a new assistant turn)"
        )
    if not last["content"].strip():
        return None
    return last["content"], tuple(chat[:-1])


def _chat_message(position: int, message: Any) -> dict[str, Any]:
    """The message as a plain dict without its None fields (parquet gives every message every key
    of its struct); PromptShapeError when it is not a text message of a known role."""
    if not isinstance(message, Mapping) or message.get("role") not in CHAT_ROLES:
        role = repr(message.get("role"))[:40] if isinstance(message, Mapping) else type(message).__name__
        raise PromptShapeError(
            f"prompt message {position} is not a chat message (role {role}); give each message a role "
            f"of {', '.join(CHAT_ROLES)} and text content"
        )
    content = message.get("content")
    if not isinstance(content, str):
        raise PromptShapeError(
            f"prompt message {position} ({message['role']}) has content that is not text "
            f"({type(content).__name__}); prompts here are text: give its content as one string"
        )
    return {key: item for key, item in message.items() if item is not None}


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
    prompt = _prompt(record.get("problem"))
    answer = _answer_text(record.get("answer"))
    if prompt is None or answer is None:
        return None
    fields = _rest(record, "problem", "answer")
    fields["difficulty_frac"] = parse_difficulty(record.get("difficulty"))
    return ParsedRow(prompt[0], answer, fields, prompt[1])


def gsm8k_row(record: Mapping[str, Any]) -> ParsedRow | None:
    """`question`, `answer` ending "#### n": answer n (commas removed), `solution` = full text."""
    prompt = _prompt(record.get("question"))
    solution = record.get("answer")
    if prompt is None or not isinstance(solution, str):
        return None
    match = _GSM8K_FINAL.search(solution)
    answer = match[1].replace(",", "").strip() if match else ""
    if not answer:
        return None
    fields = _rest(record, "question", "answer")
    fields["solution"] = solution
    return ParsedRow(prompt[0], answer, fields, prompt[1])


def verl_row(record: Mapping[str, Any]) -> ParsedRow | None:
    """`prompt` chat list read whole (the last message, the user's, is the text; the ones before
    it the context), `reward_model.ground_truth`; other fields kept."""
    reward_model = record.get("reward_model")
    answer = _answer_text(reward_model.get("ground_truth")) if isinstance(reward_model, Mapping) else None
    prompt = _prompt(record.get("prompt"))
    if prompt is None or answer is None:
        return None
    return ParsedRow(prompt[0], answer, _rest(record, "prompt", "reward_model"), prompt[1])


def generic_row(
    record: Mapping[str, Any], prompt_field: str | None = None, answer_field: str | None = None
) -> ParsedRow | None:
    """Prompt and answer from the named fields, else from the first present candidate field.
    Only the two fields used are removed from `fields`."""
    prompt_key = prompt_field or _first_present(record, GENERIC_PROMPT_FIELDS)
    answer_key = answer_field or _first_present(record, GENERIC_ANSWER_FIELDS)
    if prompt_key is None or answer_key is None:
        return None
    prompt = _prompt(record.get(prompt_key))
    answer = _answer_text(record.get(answer_key))
    if prompt is None or answer is None:
        return None
    return ParsedRow(prompt[0], answer, _rest(record, prompt_key, answer_key), prompt[1])


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


# The parser that reads each detected format (docs/configuration.md's data fields list them from here).
ROW_PARSERS: dict[RowFormat, Callable[[Mapping[str, Any]], ParsedRow | None]] = {
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
    return ROW_PARSERS[detect_format(record)](record)


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
