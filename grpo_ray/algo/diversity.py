"""Response diversity within a group: the distinct-n ratio, a cheap collapse detector.

    distinct_n = |set of n-grams over all texts| / number of n-grams over all texts

N-grams are counted inside each text (none spans two texts); an n-gram repeated within one text or
across texts counts once in the numerator. 1.0 means no n-gram occurs twice; G identical texts
give at most 1/G. POLARIS watches this while tuning the sampling temperature: too low a
temperature collapses the G samples of a prompt onto one answer.

Definitions at the edges:
- Texts shorter than n words have no n-gram. When a group has no n-gram at all,
  `distinct_ngram_ratio` returns 0.0 (nothing distinct was produced: empty or near-empty outputs
  look like collapse, which is the safe reading for a monitor), and `group_diversity` leaves such
  a group out of its mean, since it says nothing either way; with no group left it returns 0.0.
- Tokens are whitespace-separated words unless a tokenizer is given: any object with an
  `encode(text) -> ids` method (a Hugging Face tokenizer) or a callable `text -> tokens`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

__all__ = ["distinct_ngram_ratio", "group_distinct_ratio", "group_diversity", "ngram_counts"]


def _tokenize_fn(tokenizer: Any) -> Callable[[str], Sequence[Hashable]]:
    if tokenizer is None:
        return str.split
    if hasattr(tokenizer, "encode"):
        return tokenizer.encode
    if callable(tokenizer):
        return tokenizer
    raise TypeError(f"tokenizer must have .encode or be callable; got {type(tokenizer).__name__}")


def ngram_counts(texts: Sequence[str], n: int = 4, tokenizer: Any = None) -> tuple[int, int]:
    """(distinct n-grams, total n-grams) over the texts."""
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}")
    tokenize = _tokenize_fn(tokenizer)
    seen: set[tuple[Hashable, ...]] = set()
    total = 0
    for text in texts:
        tokens = list(tokenize(text))
        grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return len(seen), total


def group_distinct_ratio(texts: Sequence[str], n: int = 4) -> float:
    """One group's distinct-n ratio over whitespace words, NaN when it has no n-gram at all (a
    monitor's "no information", which means over groups skip, as `group_diversity` does)."""
    distinct, total = ngram_counts(texts, n)
    return distinct / total if total else float("nan")


def distinct_ngram_ratio(texts: Sequence[str], n: int = 4, tokenizer: Any = None) -> float:
    """Distinct n-grams / total n-grams over `texts`; 0.0 when there is no n-gram."""
    distinct, total = ngram_counts(texts, n, tokenizer)
    return distinct / total if total else 0.0


def group_diversity(
    texts: Sequence[str], group_ids: Sequence[int] | np.ndarray, n: int = 4, tokenizer: Any = None
) -> float:
    """Mean over groups of the per-group distinct-n ratio; groups without an n-gram are left out.

    texts [N], group_ids [N]: rows sharing a group id are the completions of one prompt.
    """
    group_ids = np.asarray(group_ids)
    if group_ids.shape != (len(texts),):
        raise ValueError(f"texts and group_ids must both be [N]; got {len(texts)} and {group_ids.shape}")
    ratios = []
    for gid in np.unique(group_ids):
        distinct, total = ngram_counts([texts[i] for i in np.flatnonzero(group_ids == gid)], n, tokenizer)
        if total:
            ratios.append(distinct / total)
    return float(np.mean(ratios)) if ratios else 0.0
