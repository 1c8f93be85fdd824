"""Recipe-level choices over loaded rows: instruction suffix, difficulty band, validation split.

Pure functions over `Row`s; `training/inputs.py` applies them in this order before tokenising. A filter
that removes every row is an error naming that filter, never an empty run.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from grpo_ray.data.formats import append_instruction, difficulty_in_band, parse_difficulty
from grpo_ray.data.loaders import DataError, Row


def with_instruction(rows: list[Row], instruction: str | None) -> list[Row]:
    """Append the instruction to every prompt that does not already contain it."""
    if not instruction:
        return rows
    return [replace(row, prompt=append_instruction(row.prompt, instruction)) for row in rows]


def in_difficulty_band(rows: list[Row], band: tuple[float, float] | None) -> tuple[list[Row], int]:
    """Rows whose difficulty (POLARIS "k/8", or a number in [0, 1]) lies in the band; and how many were dropped.

    Rows without a readable difficulty are dropped when a band is set.
    """
    if band is None:
        return rows, 0
    low, high = band
    kept = [
        row
        for row in rows
        if difficulty_in_band(
            row.fields.get("difficulty_frac", parse_difficulty(row.fields.get("difficulty"))), low, high
        )
    ]
    if not kept:
        raise DataError(
            f"data.difficulty_band: [{low}, {high}] removed all {len(rows)} rows; widen it or check the "
            "difficulty field"
        )
    return kept, len(rows) - len(kept)


def split_validation(rows: list[Row], fraction: float, seed: int) -> tuple[list[Row], list[Row]]:
    """(train, validation): a seeded random `fraction` of the rows held out; the same seed, the same split."""
    if fraction <= 0:
        return rows, []
    count = int(round(len(rows) * fraction))
    if count < 1 or count >= len(rows):
        raise DataError(
            f"data.val_fraction: {fraction} of {len(rows)} rows leaves no "
            f"{'validation' if count < 1 else 'training'} rows"
        )
    order = np.random.default_rng([seed, 7]).permutation(len(rows))
    held = set(order[:count].tolist())
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]
