"""Rows that name their own reward: each row is scored by the functions of its data source.

A mixed dataset (math, GSM8K and format-only rows in one file) needs a different reward per row.
The recipe maps a row field's values to function lists (``reward.by_source``) and keeps
``reward.functions`` as the default for rows whose source is not listed (or that have no such
field). This module is the one definition of that dispatch; the reward workers and
``grpo-ray rewards score`` both go through ``score_routed`` and ``RewardPlan.combine``.

    >>> plan = RewardPlan.build([("exact_match", 1.0, {})], {"gsm8k": [("gsm8k", 1.0, {})]})
    >>> plan.row_sources({"data_source": ["gsm8k", "math", None]}, 3)
    ['gsm8k', None, None]

Each function is called only on the rows that use it (a GSM8K parser never sees a math row, so
it cannot fail there). Scores are [N] arrays with NaN where the function failed or where the row's
source does not use it; ``failures`` counts only the first kind. A row's total is the weighted sum
of its own functions; NaN when any of them failed.

With ``by_source`` set, three kinds of entries are added beside the functions' own (they become
the step metrics ``reward/source/<src>/mean`` and ``reward/accuracy/<src>/mean``, and
``eval/accuracy/<src>`` at evaluation):
    ``source/<src>``   the row's total reward, on rows of that source (NaN elsewhere);
    ``accuracy/<src>`` the score of the source's first function (its accuracy), on its rows;
    ``accuracy``       every row's first function's score: the overall evaluation accuracy.
Rows of an unlisted source count under ``<src>`` = "default".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_ray.rewards.accuracy import accuracy_scores

# (spec, weight, options) of one function in a source's list, as the recipe gives it.
FunctionEntry = tuple[str, float, dict]
# Scores [n] (None where a row failed) and the first error, of one function over some rows.
FunctionResult = tuple[list[float | None], str | None]
# Label of rows whose source is not listed in by_source.
DEFAULT_SOURCE = "default"
# Characters MLflow refuses in metric names.
_NOT_IN_METRIC_NAMES = re.compile(r"[^A-Za-z0-9_\-. /]")


@dataclass(frozen=True)
class PlannedFunction:
    key: str  # its key in per_function and in the output rows: the spec, "#2", "#3" on repeats
    spec: str
    options: dict


@dataclass(frozen=True)
class RoutedScores:
    totals: np.ndarray  # [N] float64 weighted sum of each row's functions; NaN where one failed
    per_function: dict[str, np.ndarray]  # key -> [N] float64, NaN where failed or not used
    failures: dict[str, int]  # key -> rows the function failed on (among those that use it)
    first_errors: dict[str, str]  # key -> its first error


@dataclass(frozen=True)
class RewardPlan:
    """Distinct functions (spec + options, scored once per row) and each source's weighted list."""

    functions: tuple[PlannedFunction, ...]
    default: tuple[tuple[int, float], ...]  # (function index, weight) for rows of no listed source
    by_source: Mapping[str, tuple[tuple[int, float], ...]]
    source_field: str = "data_source"

    @staticmethod
    def build(
        default: Sequence[FunctionEntry],
        by_source: Mapping[str, Sequence[FunctionEntry]] | None = None,
        source_field: str = "data_source",
    ) -> RewardPlan:
        functions: list[PlannedFunction] = []
        repeats: dict[str, int] = {}

        def index_of(spec: str, options: dict) -> int:
            for i, f in enumerate(functions):
                if f.spec == spec and f.options == options:
                    return i
            repeats[spec] = repeats.get(spec, 0) + 1
            key = spec if repeats[spec] == 1 else f"{spec}#{repeats[spec]}"
            functions.append(PlannedFunction(key, spec, dict(options)))
            return len(functions) - 1

        def weighted(entries: Sequence[FunctionEntry]) -> tuple[tuple[int, float], ...]:
            return tuple((index_of(spec, dict(options)), float(weight)) for spec, weight, options in entries)

        plan_default = weighted(default)
        plan_sources = {str(source): weighted(entries) for source, entries in (by_source or {}).items()}
        return RewardPlan(tuple(functions), plan_default, plan_sources, source_field)

    @property
    def routed(self) -> bool:
        return bool(self.by_source)

    @property
    def specs(self) -> list[tuple[str, dict]]:
        return [(f.spec, f.options) for f in self.functions]

    def row_sources(self, row_fields: Mapping[str, Sequence[Any]], n: int) -> list[str | None]:
        """Each row's listed source, or None (the default functions)."""
        values = row_fields.get(self.source_field) or [None] * n
        return [str(v) if v is not None and str(v) in self.by_source else None for v in values]

    def entries(self, source: str | None) -> tuple[tuple[int, float], ...]:
        return self.default if source is None else self.by_source[source]

    def masks(self, sources: Sequence[str | None]) -> list[np.ndarray]:
        """[F] boolean [N] arrays: which rows each function scores."""
        masks = [np.zeros(len(sources), dtype=bool) for _ in self.functions]
        for row, source in enumerate(sources):
            for index, _ in self.entries(source):
                masks[index][row] = True
        return masks

    def combine(self, sources: Sequence[str | None], results: Sequence[FunctionResult]) -> RoutedScores:
        """Totals, per-function arrays and failure counts from each function's [N] results."""
        n = len(sources)
        masks = self.masks(sources)
        scores = [
            np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64) for values, _ in results
        ]
        totals = np.zeros(n, dtype=np.float64)
        for row, source in enumerate(sources):
            # NaN propagates: a row with any failed function is failed.
            totals[row] = math.fsum(weight * scores[index][row] for index, weight in self.entries(source))
        per_function, failures, first_errors = {}, {}, {}
        for f, values, mask, (_, error) in zip(self.functions, scores, masks, results):
            per_function[f.key] = values
            failures[f.key] = int(np.isnan(values[mask]).sum())
            if error is not None:
                first_errors[f.key] = error
            elif failures[f.key]:
                first_errors[f.key] = "returned None (could not score)"
        if self.routed:
            per_function.update(self._source_entries(sources, totals, scores))
        return RoutedScores(totals, per_function, failures, first_errors)

    def _source_entries(self, sources, totals: np.ndarray, scores: list[np.ndarray]) -> dict[str, np.ndarray]:
        n = len(sources)
        accuracy = np.full(n, math.nan)
        entries: dict[str, np.ndarray] = {}
        for source in dict.fromkeys(sources):
            rows = np.array([s == source for s in sources])
            if not self.entries(source):  # no default functions (a reward model alone scores them)
                continue
            first = self.entries(source)[0][0]
            accuracy[rows] = scores[first][rows]
            label = source_label(source)
            entries[f"source/{label}"] = np.where(rows, totals, math.nan)
            # One accuracy (rewards/accuracy.py): a row its function could not score counts as wrong.
            entries[f"accuracy/{label}"] = np.where(rows, accuracy_scores(scores[first]), math.nan)
        entries["accuracy"] = accuracy
        return entries


def eval_source_accuracies(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """``eval/accuracy/<src>``: the mean of each ``accuracy/<src>`` entry over the slices' rows.

    >>> eval_source_accuracies([{"accuracy/gsm8k": np.array([1.0, np.nan, 0.0]), "math": np.zeros(3)}])
    {'eval/accuracy/gsm8k': 0.5}
    """
    metrics = {}
    for key in parts[0] if parts else ():
        if key.startswith("accuracy/"):
            values = np.concatenate([part[key] for part in parts])
            metrics[f"eval/{key}"] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
    return metrics


def source_label(source: str | None) -> str:
    """A source as a metric-name part: "default" for unlisted ones, refused characters as "_"."""
    return DEFAULT_SOURCE if source is None else _NOT_IN_METRIC_NAMES.sub("_", source).replace("/", "_")


def score_routed(
    plan: RewardPlan,
    sources: Sequence[str | None],
    score_rows: Callable[[list[int], np.ndarray], list[FunctionResult]],
) -> list[FunctionResult]:
    """Every function's [N] results, each function called only on the rows that use it.

    ``score_rows(function_indices, rows)`` scores those functions over rows ``rows`` (indices)
    and returns one (scores [len(rows)], error) per function. Functions used by the same rows are
    asked together, so a plan without ``by_source`` makes exactly one call on all rows.
    """
    n = len(sources)
    masks = plan.masks(sources)
    results: list[FunctionResult] = [([None] * n, None) for _ in plan.functions]
    groups: dict[bytes, list[int]] = {}
    for index, mask in enumerate(masks):
        if mask.any():
            groups.setdefault(mask.tobytes(), []).append(index)
    for indices in groups.values():
        rows = np.flatnonzero(masks[indices[0]])
        for index, (values, error) in zip(indices, score_rows(indices, rows)):
            scores: list[float | None] = [None] * n
            for row, value in zip(rows, values):
                scores[int(row)] = value
            results[index] = (scores, error)
    return results


def take_rows(batch: tuple, rows: np.ndarray) -> tuple:
    """(completions, prompts, answers, row_fields) restricted to ``rows``, in that order."""
    completions, prompts, answers, row_fields = batch
    if len(rows) == len(completions) and (np.diff(rows) == 1).all():
        return batch
    pick = lambda values: [values[int(i)] for i in rows]  # noqa: E731
    return pick(completions), pick(prompts), pick(answers), {name: pick(v) for name, v in row_fields.items()}
