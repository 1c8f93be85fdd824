"""Synthetic two-digit addition task for the offline tiny model.

Every problem ``a+b`` with ``10 <= a, b <= 99`` (8,100 of them) appears exactly once, in either the
train split or the held-out split. Rows are plain dicts so they can be written as JSON lines and
passed to reward functions as row fields::

    >>> train, heldout = make_addition_split(seed=0)
    >>> len(train), len(heldout)
    (7600, 500)
    >>> sorted(train[0])
    ['answer', 'prompt']

The split depends only on ``seed``: the same seed gives the same rows in the same order.
Pure Python, no third-party imports.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path

OPERAND_MIN = 10
OPERAND_MAX = 99
# Held-out problems: a fixed number, drawn from the shuffled list before the rest goes to train.
HELDOUT_SIZE = 500


def addition_problem(a: int, b: int) -> dict[str, str]:
    """One row: ``{"prompt": "37+45=", "answer": "82"}``."""
    return {"prompt": f"{a}+{b}=", "answer": str(a + b)}


def make_addition_split(
    seed: int, heldout_size: int = HELDOUT_SIZE
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """All two-digit additions, shuffled with ``seed``, split into ``(train, heldout)``.

    The first ``heldout_size`` problems of the shuffled list are held out; the rest are train.
    The two splits are disjoint and together cover every pair ``(a, b)``, so ``37+45`` and
    ``45+37`` are separate problems that may land in different splits.
    """
    pairs = [(a, b) for a in range(OPERAND_MIN, OPERAND_MAX + 1) for b in range(OPERAND_MIN, OPERAND_MAX + 1)]
    if not 0 < heldout_size < len(pairs):
        raise ValueError(f"heldout_size must be in (0, {len(pairs)}), got {heldout_size}")
    random.Random(seed).shuffle(pairs)
    rows = [addition_problem(a, b) for a, b in pairs]
    return rows[heldout_size:], rows[:heldout_size]


def write_jsonl(rows: Iterable[dict], path: str | Path) -> Path:
    """Write one JSON object per line; returns the path."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    """Read the rows written by :func:`write_jsonl`."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
