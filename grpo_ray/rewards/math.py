r"""Math reward: the last ``\boxed{...}`` answer checked against the gold answer by math-verify.

Example:
    >>> math_reward(
    ...     ["<think>half of 1</think> so the answer is \\boxed{0.5}", "\\boxed{2}"],
    ...     ["What is 1/2?", "What is 1/2?"],
    ...     ["\\frac{1}{2}", "\\frac{1}{2}"],
    ... )
    [1.0, 0.0]

Scores: 1.0 correct, 0.0 wrong or no answer found, None when it could not be scored (the gold
answer does not parse, or math-verify raised). None is a failure for the reward pool, never a 0.

Timeouts: math-verify's own timeouts use ``signal.alarm``, which only works on the main thread
of the main interpreter. They are switched off here (``parsing_timeout=None``,
``timeout_seconds=None``); bounding the time a pathological expression takes is the reward
pool's job, which runs reward functions in subprocesses it can kill. math-verify logs one warning
per process saying its timeout is disabled; that is expected.
"""

from __future__ import annotations

import functools
import re
from types import ModuleType

# A \boxed or \fbox command, not a longer macro name such as \boxedanswer.
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


# Timeouts off (see module docstring); raise_on_error so that a math-verify failure becomes a
# None score instead of being silently swallowed into a 0.
_PARSE_KWARGS = {"parsing_timeout": None, "raise_on_error": True}
_VERIFY_KWARGS = {"timeout_seconds": None, "raise_on_error": True}


def _math_verify() -> ModuleType:
    """math-verify, imported where answers are scored: it brings sympy (0.3 s), and the driver,
    which imports this module with the reward actor's class, scores nothing."""
    import math_verify

    return math_verify


@functools.cache
def _unboxed_extraction() -> tuple:
    """Extraction for an unboxed final line: LaTeX first ("$\\frac{1}{2}$"), then plain expressions
    ("the answer is 82"). math-verify takes the rightmost match, i.e. the line's final expression.
    Built once per process, on first use."""
    mv = _math_verify()
    return (mv.LatexExtractionConfig(), mv.ExprExtractionConfig())


def _braced_group(text: str, start: int) -> str | None:
    """Content of the brace group opening at ``text[start] == "{"``; None if never closed."""
    depth = 0
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":
            # Skip the escaped character: \{ and \} are literal braces, not grouping.
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def last_boxed_answer(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}``, ``\boxed x`` or ``\fbox{...}`` in ``text``.

    Braces nest. A brace-less ``\boxed 5`` takes the next whitespace-delimited token, without a
    closing ``$`` or trailing punctuation. Returns None when there is no box, or when the last box
    is never closed (a truncated completion: an earlier box is not the model's final answer).

    >>> last_boxed_answer(r"first \boxed{1}, then \boxed{\frac{1}{2}}.")
    '\\frac{1}{2}'
    >>> last_boxed_answer(r"$\boxed 5$.")
    '5'
    >>> last_boxed_answer("no box") is None
    True
    """
    matches = list(_BOX_COMMAND.finditer(text))
    if not matches:
        return None
    rest_start = matches[-1].end()
    rest = text[rest_start:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        return _braced_group(text, rest_start + len(rest) - len(stripped))
    if not stripped:
        return None
    # Brace-less argument: the next token, cut at a closing "$" ("$\boxed 5$").
    token = stripped.split(maxsplit=1)[0].split("$", 1)[0].rstrip(".,;")
    return token or None


def _answer_section(completion: str) -> str:
    """The text after the last ``</think>``, or the whole completion without one."""
    return completion.rpartition("</think>")[2]


def _parse_gold(answer: str) -> list:
    r"""Parse a gold answer, wrapping plain strings ("204", "\frac{1}{2}") in ``\boxed{}``.

    The wrapper makes math-verify read the whole string as one LaTeX answer instead of searching
    it for the last number. Golds that already carry a box or math delimiters are used as given.
    """
    answer = str(answer).strip()
    if "\\boxed" not in answer and "$" not in answer:
        answer = f"\\boxed{{{answer}}}"
    return _math_verify().parse(answer, **_PARSE_KWARGS)


def _parse_prediction(answer_text: str, accept_unboxed: bool) -> list:
    """Parse the model's final answer; [] when it gave none."""
    boxed = last_boxed_answer(answer_text)
    if boxed is not None:
        # Re-box the extracted content so math-verify applies its boxed-answer normalisation.
        return _math_verify().parse(f"\\boxed{{{boxed}}}", **_PARSE_KWARGS)
    if not accept_unboxed:
        return []
    lines = [line for line in answer_text.splitlines() if line.strip()]
    if not lines:
        return []
    return _math_verify().parse(lines[-1], extraction_config=list(_unboxed_extraction()), **_PARSE_KWARGS)


def _score_one(completion: str, gold: list, *, require_think_close: bool, accept_unboxed: bool) -> float | None:
    if require_think_close and "</think>" not in completion:
        return 0.0
    try:
        predicted = _parse_prediction(_answer_section(completion), accept_unboxed)
        if not predicted:
            return 0.0
        # Gold first: math-verify's comparison is not symmetric (e.g. gold sets vs intervals).
        return 1.0 if _math_verify().verify(gold, predicted, **_VERIFY_KWARGS) else 0.0
    except Exception:  # noqa: BLE001 - any math-verify failure means "could not score"
        return None


def math_reward(
    completions: list[str],
    prompts: list[str],
    answers: list[str],
    *,
    require_think_close: bool = False,
    accept_unboxed: bool = False,
    **_row_fields,
) -> list[float | None]:
    r"""Score each completion's last boxed answer against its gold answer with math-verify.

    Args:
        completions: model outputs; only the text after the last ``</think>`` is read.
        prompts: unused; part of the reward contract.
        answers: gold answers, plain ("204", "\frac{1}{2}") or already boxed/``$``-delimited.
        require_think_close: score 0.0 unless the completion closed its reasoning with
            ``</think>`` (penalises runaway thinking that was cut off).
        accept_unboxed: without a box, read the final expression of the last non-empty line.

    >>> math_reward(["\\boxed{2\\sqrt{2}}", "\\boxed{3}"], ["", ""], ["\\sqrt{8}", "4"])
    [1.0, 0.0]
    """
    # A GRPO group shares one gold answer, so each distinct gold is parsed once.
    gold_cache: dict[str, list | None] = {}
    scores: list[float | None] = []
    for completion, answer in zip(completions, answers, strict=True):
        key = str(answer)
        if key not in gold_cache:
            try:
                gold_cache[key] = _parse_gold(key) or None
            except Exception:  # noqa: BLE001 - an unparseable gold is not the model's fault
                gold_cache[key] = None
        gold = gold_cache[key]
        if gold is None:
            scores.append(None)
            continue
        scores.append(
            _score_one(
                completion,
                gold,
                require_think_close=require_think_close,
                accept_unboxed=accept_unboxed,
            )
        )
    return scores
