"""GSM8K reward: the final number of the completion compared, as a number, with the gold answer.

Example:
    >>> gsm8k(
    ...     ["48/2 = 24 clips in May, 48+24 = 72 in all.\\n#### 72", "So the total is $1,200."],
    ...     ["How many clips did Natalia sell?", "How much did she pay?"],
    ...     ["Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\n#### 72", "1200"],
    ... )
    [1.0, 1.0]

The answer of a text (completion or gold) is the number after its last ``####`` (the GSM8K
convention) or, without one, its last number. Scores: 1.0 equal, 0.0 different or no number in
the completion, None when the gold has no number (the row is broken, not the completion).
"""

from __future__ import annotations

import re

# The GSM8K answer marker: the solution's final line is "#### 72".
ANSWER_MARKER = "####"

# Two numbers closer than this are equal ("72.0" == "72"; float noise from "0.1 + 0.2").
ABS_TOLERANCE = 1e-6

# A number: optional minus, thousands groups ("1,200") or plain digits, optional decimals. It does
# not start inside a word or after a dot ("H2O", "x2"); a minus after a word or digit is an
# operator ("10-3" is 10 and 3). A trailing period ("72.") is not a decimal point, so not taken.
_NUMBER = re.compile(r"(?:(?<![\w)\]])-)?(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def _numbers(text: str) -> list[str]:
    """Every number in ``text``, in order, with "$" and thousands commas removed."""
    return [match.replace(",", "") for match in _NUMBER.findall(text.replace("$", ""))]


def extract_gsm8k_answer(text: str) -> str | None:
    """The number after the last ``####`` in ``text``, else its last number; None if none.

    With a ``####`` marker the answer is the first number after it, and the text before the
    marker is never read: a marker followed by no number (a truncated completion) is no answer.

    >>> extract_gsm8k_answer("She earns 12 * 50 = $600 a week.\\n#### $1,800.")
    '1800'
    >>> extract_gsm8k_answer("10 - 3 leaves 7 apples.")
    '7'
    >>> extract_gsm8k_answer("#### seventy-two") is None
    True
    """
    # Without a marker, rpartition leaves the whole text in ``tail``.
    _, marker, tail = str(text).rpartition(ANSWER_MARKER)
    numbers = _numbers(tail)
    if not numbers:
        return None
    return numbers[0] if marker else numbers[-1]


def gsm8k_answers_equal(predicted: str, gold: str) -> bool:
    """Whether two extracted answers are the same number, within ``ABS_TOLERANCE``.

    >>> gsm8k_answers_equal("72.0", "72"), gsm8k_answers_equal("-5", "5")
    (True, False)
    """
    return abs(float(predicted) - float(gold)) <= ABS_TOLERANCE


def gsm8k_correct(text: str, answer: str) -> bool | None:
    """Whether the answer read from ``text`` equals the gold ``answer``'s as a number (False when
    ``text`` has none); None when the gold has no number.

    >>> gsm8k_correct("so 72 in all", "#### 72"), gsm8k_correct("no idea", "#### 72"), gsm8k_correct("72", "n/a")
    (True, False, None)
    """
    gold = extract_gsm8k_answer(answer)
    if gold is None:
        return None
    predicted = extract_gsm8k_answer(text)
    return predicted is not None and gsm8k_answers_equal(predicted, gold)


def gsm8k(completions: list[str], prompts: list[str], answers: list[str], **_row_fields) -> list[float | None]:
    """1.0 where the completion's answer equals the gold's as a number, 0.0 where not.

    Args:
        completions: model outputs; the whole text is read (a "####" line, else the last number).
        prompts: unused; part of the reward contract.
        answers: gold answers, a full GSM8K solution ending "#### 72" or a bare number ("72").

    >>> gsm8k(["The answer is 72.", "#### 71", "I don't know"], [""] * 3, ["#### 72"] * 3)
    [1.0, 0.0, 0.0]
    >>> gsm8k(["72"], [""], ["no number here"])
    [None]
    """
    scores: list[float | None] = []
    for completion, answer in zip(completions, answers, strict=True):
        correct = gsm8k_correct(completion, answer)
        scores.append(None if correct is None else float(correct))
    return scores


def first_number(completions: list[str], prompts: list[str], answers: list[str], **_row_fields) -> list[float | None]:
    """1.0 where the completion's first number equals the gold answer's (last) number, 0.0 where not.

    For a base model asked in a few-shot format: it answers, then goes on writing the next
    "Question: ..." of the pattern, so its answer is the first number it writes, not the last.

    >>> first_number([" 18\\n\\nQuestion: What is 20 + 3?", " 17", "I think 18"], [""] * 3, ["18"] * 3)
    [1.0, 0.0, 1.0]
    >>> first_number(["18"], [""], ["no number here"])
    [None]
    """
    scores: list[float | None] = []
    for completion, answer in zip(completions, answers, strict=True):
        gold = extract_gsm8k_answer(answer)
        if gold is None:
            scores.append(None)
            continue
        numbers = _numbers(str(completion))
        scores.append(float(bool(numbers) and gsm8k_answers_equal(numbers[0], gold)))
    return scores
