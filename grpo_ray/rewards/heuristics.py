r"""Heuristic rewards from the project's founding notes: shaping terms, not correctness checks.

Example:
    >>> length_words(["one two three", "word " * 150], ["Summarise."] * 2, [""] * 2, target_words=3)
    [1.0, 1.0]
    >>> tldr_length(["x" * 20, "x" * 25], ["TL;DR:"] * 2, [""] * 2)
    [0.0, -5.0]

Each is a plain reward function per the registry's contract, registered under its own name:

    =====================  =============================================================
    think_tag_diversity    tag_weight * [has <think> and </think>] + diversity_weight *
                           distinct characters / characters
    length_words           min(words / target_words, 1)
    keywords               base + step * (positives present - negatives present), in [0, 1]
    gsm8k_answer_format    +1 / -1 for the GSM8K answer, +1.25 / -1 for the R1 format
    tldr_length            -|target_chars - characters| (TRL's tl;dr example)
    =====================  =============================================================

None of them needs a gold answer except ``gsm8k_answer_format``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from grpo_ray.rewards.format import compile_format_pattern
from grpo_ray.rewards.gsm8k import gsm8k_correct

# gsm8k_answer_format: the R1 format it rewards, and the answer block it reads when present.
_R1_FORMAT = compile_format_pattern("r1")
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def think_tag_diversity(
    completions: list[str],
    prompts: list[str],
    answers: list[str],
    *,
    tag_weight: float = 0.7,
    diversity_weight: float = 0.3,
    **_row_fields,
) -> list[float | None]:
    """Reward closing a think block, and not repeating the same few characters.

    Score: ``tag_weight`` if the completion contains both "<think>" and "</think>" (anywhere, in
    any order), plus ``diversity_weight`` times its distinct characters over its characters
    (0 for an empty completion).

    >>> think_tag_diversity(["<think></think>", "aaaa", ""], [""] * 3, [""] * 3)
    [0.86, 0.075, 0.0]
    """
    scores: list[float | None] = []
    for completion in completions:
        has_tags = "<think>" in completion and "</think>" in completion
        diversity = len(set(completion)) / len(completion) if completion else 0.0
        scores.append(tag_weight * float(has_tags) + diversity_weight * diversity)
    return scores


def length_words(
    completions: list[str],
    prompts: list[str],
    answers: list[str],
    *,
    target_words: int = 100,
    **_row_fields,
) -> list[float | None]:
    """Reward length up to ``target_words`` whitespace-separated words: min(words / target, 1).

    Raises ValueError when ``target_words`` is not positive.

    >>> length_words(["Natalia sold 24 clips.", ""], [""] * 2, [""] * 2, target_words=8)
    [0.5, 0.0]
    """
    if target_words <= 0:
        raise ValueError(f"length_words: target_words must be positive, got {target_words!r}")
    return [min(len(completion.split()) / target_words, 1.0) for completion in completions]


def _lowercase_keywords(option: str, keywords: Sequence[str]) -> list[str]:
    # A bare string would be iterated as characters ("good" -> "g", "o", ...), and an empty
    # keyword is in every completion: both are config mistakes, not rewards.
    if isinstance(keywords, str):
        raise ValueError(f"keywords: {option} must be a list of strings, got {keywords!r}")
    if any(not keyword for keyword in keywords):
        raise ValueError(f"keywords: {option} contains an empty keyword: {list(keywords)!r}")
    return [keyword.lower() for keyword in keywords]


def keywords(
    completions: list[str],
    prompts: list[str],
    answers: list[str],
    *,
    positive: Sequence[str] = (),
    negative: Sequence[str] = (),
    base: float = 0.5,
    step: float = 0.2,
    **_row_fields,
) -> list[float | None]:
    """``base``, plus ``step`` per positive keyword present, minus ``step`` per negative one.

    A keyword is present if it is a case-insensitive substring of the completion; each counts
    once however often it appears. The score is clipped to [0, 1].

    Raises ValueError when ``positive`` or ``negative`` is a bare string or has an empty keyword.

    >>> keywords(
    ...     ["Thanks, that is GOOD and clear.", "bad, bad, bad", "ok"],
    ...     [""] * 3,
    ...     [""] * 3,
    ...     positive=["good", "clear"],
    ...     negative=["bad"],
    ... )
    [0.9, 0.3, 0.5]
    """
    positive_words = _lowercase_keywords("positive", positive)
    negative_words = _lowercase_keywords("negative", negative)
    scores: list[float | None] = []
    for completion in completions:
        text = completion.lower()
        hits = sum(word in text for word in positive_words)
        misses = sum(word in text for word in negative_words)
        scores.append(min(max(base + step * (hits - misses), 0.0), 1.0))
    return scores


def gsm8k_answer_format(
    completions: list[str], prompts: list[str], answers: list[str], **_row_fields
) -> list[float | None]:
    """GSM8K correctness and the R1 format, summed: four possible scores.

    The answer is read from inside the last ``<answer>...</answer>`` when there is one, else from
    the whole completion, then extracted and compared as ``gsm8k`` does ("#### 72", else the last
    number). The format is the R1 one, ``<think>...</think><answer>...</answer>`` (whitespace
    allowed between and after the blocks).

    ==============  ===============  =============  =====
    answer          answer score     R1 format      total
    ==============  ===============  =============  =====
    right           +1               yes: +1.25      2.25
    right           +1               no: -1          0.0
    wrong/missing   -1               yes: +1.25      0.25
    wrong/missing   -1               no: -1         -2.0
    ==============  ===============  =============  =====

    None when the gold has no number, as for ``gsm8k``.

    >>> gsm8k_answer_format(
    ...     ["<think>48 + 24</think><answer>72</answer>", "<think>48 + 24</think> 72",
    ...      "<think>48 + 24</think><answer>71</answer>", "71"],
    ...     [""] * 4,
    ...     ["#### 72"] * 4,
    ... )
    [2.25, 0.0, 0.25, -2.0]
    """
    scores: list[float | None] = []
    for completion, answer in zip(completions, answers, strict=True):
        blocks = _ANSWER_BLOCK.findall(completion)
        correct = gsm8k_correct(blocks[-1] if blocks else completion, answer)
        if correct is None:
            scores.append(None)
            continue
        well_formed = _R1_FORMAT.fullmatch(completion) is not None
        scores.append((1.0 if correct else -1.0) + (1.25 if well_formed else -1.0))
    return scores


def tldr_length(
    completions: list[str],
    prompts: list[str],
    answers: list[str],
    *,
    target_chars: int = 20,
    **_row_fields,
) -> list[float | None]:
    """TRL's tl;dr length reward: minus the distance from ``target_chars`` characters.

    >>> tldr_length(["Cat sat on the mat.", ""], [""] * 2, [""] * 2)
    [-1.0, -20.0]
    """
    return [float(-abs(target_chars - len(completion))) for completion in completions]
