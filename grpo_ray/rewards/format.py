r"""Format reward: 1.0 when the whole completion has the expected shape, whatever its answer.

Example:
    >>> think_answer_format(
    ...     ["<think>24 + 48</think> 72", "<think>24 + 48</think><answer>72</answer>", "72"],
    ...     ["How many clips?"] * 3,
    ...     ["72"] * 3,
    ...     pattern="r1",
    ... )
    [0.0, 1.0, 0.0]

``pattern`` names a family of ``FORMAT_PATTERNS`` or is itself a regex; either way the whole
completion must match (``re.fullmatch`` with ``re.DOTALL``, so ``.`` crosses newlines). The
completion is read as the engine decoded it: a chat template that puts ``<think>`` in the prompt
leaves completions that do not start with it, which then score 0.0.
"""

from __future__ import annotations

import re

# Named pattern families. A custom regex spelled exactly like a family name means the family.
FORMAT_PATTERNS: dict[str, str] = {
    # A closed think block, then some answer text after it.
    "think": r"^<think>.*?</think>\s*\S.*$",
    # DeepSeek-R1: a think block, then an answer block, and nothing after it but whitespace.
    "r1": r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$",
}


def compile_format_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a family name of ``FORMAT_PATTERNS`` or a custom regex, with ``re.DOTALL``.

    Raises ValueError (one-line message naming the pattern) when the custom regex is invalid.

    >>> bool(compile_format_pattern("r1").fullmatch("<think>a</think>\\n<answer>b</answer>\\n"))
    True
    """
    regex = FORMAT_PATTERNS.get(pattern, pattern)
    try:
        return re.compile(regex, re.DOTALL)
    except re.error as error:
        raise ValueError(
            f"format pattern {pattern!r} is neither {' nor '.join(map(repr, FORMAT_PATTERNS))} "
            f"nor a valid regex ({error}); fix the pattern"
        ) from error


def think_answer_format(
    completions: list[str],
    prompts: list[str],
    answers: list[str],
    *,
    pattern: str = "think",
    **_row_fields,
) -> list[float | None]:
    r"""1.0 where the whole completion matches ``pattern``, else 0.0.

    Args:
        completions: model outputs, matched whole.
        prompts: unused; part of the reward contract.
        answers: unused; part of the reward contract.
        pattern: "think" (``<think>...</think>`` then some text), "r1"
            (``<think>...</think><answer>...</answer>``, whitespace allowed between and after),
            or any other string as a regex the whole completion must match.

    Raises ValueError when ``pattern`` is an invalid regex.

    >>> think_answer_format(["<think>hm</think>\n72", "<think>hm</think>"], [""] * 2, [""] * 2)
    [1.0, 0.0]
    >>> think_answer_format(["#### 72", "72"], [""] * 2, [""] * 2, pattern=r".*#### -?\d+")
    [1.0, 0.0]
    """
    compiled = compile_format_pattern(pattern)
    return [1.0 if compiled.fullmatch(completion) else 0.0 for completion in completions]
