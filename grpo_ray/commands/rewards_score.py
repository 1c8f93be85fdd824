"""Score existing completions with a recipe's reward functions: `grpo-ray rewards score`.

Check a reward on real answers before a run spends GPU hours on it:

    grpo-ray rewards score --config configs/tiny.yaml --data answers.jsonl --output scored.jsonl

Each input line is a JSON object with a `completion` and an `answer` (a `prompt` is optional;
every other field passes through and reaches the functions as a keyword argument, as in
training). The output has one line per input row, in input order: the row's fields, `reward`
(the weighted total, null when any function failed on the row) and each function's score under
its name (null when it failed).

Scores come from the scorer the run's reward workers use (rewards/scorer.py), so the failures
this command reports are the ones training will see: a failed batch call is retried row by row,
and one bad row fails alone.

    >>> from grpo_ray.config import RewardConfig, RewardFunctionConfig
    >>> cfg = RewardConfig(isolation="none", functions=(RewardFunctionConfig(name="exact_match"),))
    >>> score_rows(cfg, [ScoringRow("82", "82"), ScoringRow("81", "82")]).totals
    [1.0, 0.0]

Pure Python and the reward registry: no torch, no Ray.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_ray.config import ConfigError, RewardConfig, load_config
from grpo_ray.data.loaders import DataError
from grpo_ray.rewards.by_source import RewardPlan, score_routed, take_rows
from grpo_ray.rewards.scorer import RowScorer

# Field names of an input row that are not passed to reward functions as row fields.
COMPLETION_FIELD, ANSWER_FIELD, PROMPT_FIELD = "completion", "answer", "prompt"
# Row fields that would collide with the contract's own arguments.
_CONTRACT_ARGS = ("completions", "prompts", "answers")


@dataclass(frozen=True)
class ScoringRow:
    """One completion to score, as read from a line of the input file."""

    completion: str
    answer: str
    prompt: str = ""
    # Every field of the line as read, in file order (written back out with the scores).
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FunctionScores:
    """One reward function's scores over all rows."""

    name: str  # its key in the output rows: the spec, with "#2", "#3" on repeats
    weight: float
    scores: list[float | None]  # [N] None where the function failed on the row
    first_error: str | None  # one line; None when no row failed

    @property
    def failures(self) -> int:
        return sum(score is None for score in self.scores)

    @property
    def mean(self) -> float | None:
        """Mean over the rows it scored; None when it scored none."""
        scored = [score for score in self.scores if score is not None]
        return sum(scored) / len(scored) if scored else None


@dataclass(frozen=True)
class ScoringReport:
    rows: list[ScoringRow]  # [N] in input order
    functions: list[FunctionScores]  # in config order
    totals: list[float | None]  # [N] weighted sum; None where any function failed
    # With reward.by_source: "source/<src>" -> [N] total reward on that source's rows (None elsewhere).
    by_source: dict[str, list[float | None]] = field(default_factory=dict)

    def records(self) -> list[dict[str, Any]]:
        """Output rows: the input fields, then `reward`, then each function's score by name."""
        records = []
        for i, row in enumerate(self.rows):
            record = dict(row.fields)
            record["reward"] = self.totals[i]
            for function in self.functions:
                record[function.name] = function.scores[i]
            records.append(record)
        return records


# ---- reading rows ------------------------------------------------------------------------------


def read_scoring_rows(path: str | Path) -> list[ScoringRow]:
    """Rows of a JSON-lines file; DataError naming the file and line for anything unusable.

    Blank lines are skipped (and still counted, so line numbers match an editor's).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: data file not found; give a JSON-lines file with completion and answer fields")
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                rows.append(_parse_line(line, f"{path}:{number}"))
    if not rows:
        raise DataError(f"{path}: no rows; give one JSON object per line with completion and answer fields")
    return rows


def _parse_line(line: str, where: str) -> ScoringRow:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not valid JSON ({err.msg}); give one JSON object per line") from None
    if not isinstance(record, dict):
        raise DataError(f"{where}: a {type(record).__name__}, not a JSON object; give one object per line")
    completion = record.get(COMPLETION_FIELD)
    if not isinstance(completion, str):
        raise DataError(f"{where}: no string '{COMPLETION_FIELD}' field; every row needs the completion to score")
    answer = record.get(ANSWER_FIELD)
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)  # as the dataset loaders read numeric answers
    if not isinstance(answer, str):
        raise DataError(
            f"{where}: no '{ANSWER_FIELD}' field (a string or a number); every row needs the reference answer"
        )
    prompt = record.get(PROMPT_FIELD)
    return ScoringRow(completion, answer, prompt if isinstance(prompt, str) else "", record)


# ---- scoring -----------------------------------------------------------------------------------


def row_fields_of(rows: list[ScoringRow]) -> dict[str, list]:
    """Extra fields as the reward contract wants them: name -> [N] values (None where a row has none)."""
    skip = {COMPLETION_FIELD, ANSWER_FIELD, PROMPT_FIELD, *_CONTRACT_ARGS}
    names = list(dict.fromkeys(name for row in rows for name in row.fields if name not in skip))
    return {name: [row.fields.get(name) for row in rows] for name in names}


def reward_plan(cfg_reward: RewardConfig) -> RewardPlan:
    """The recipe's functions, per source when reward.by_source is set (see rewards/by_source.py)."""
    entries = lambda functions: [(f.name, f.weight, dict(f.options)) for f in functions]  # noqa: E731
    by_source = {source: entries(functions) for source, functions in cfg_reward.by_source.items()}
    return RewardPlan.build(entries(cfg_reward.functions), by_source, cfg_reward.source_field)


def score_rows(cfg_reward: RewardConfig, rows: list[ScoringRow]) -> ScoringReport:
    """Score every row with `cfg_reward.functions` (weights, options, isolation, timeout), each row
    with its source's functions when reward.by_source is set."""
    if not cfg_reward.functions:
        raise ConfigError("reward.functions: empty; name at least one reward function to score with")
    plan = reward_plan(cfg_reward)
    fields = row_fields_of(rows)
    batch = ([r.completion for r in rows], [r.prompt for r in rows], [r.answer for r in rows], fields)
    sources = plan.row_sources(fields, len(rows))
    with RowScorer(
        plan.specs,
        isolation=cfg_reward.isolation,
        timeout_s=cfg_reward.timeout_s,
        processes=cfg_reward.processes_per_worker,
        memory_limit_mb=cfg_reward.memory_limit_mb,
    ) as scorer:
        results = score_routed(plan, sources, lambda indices, picked: scorer.score(*take_rows(batch, picked), indices))
    routed = plan.combine(sources, results)
    weights: dict[int, float] = {}  # a function's weight where it is first listed (sources may differ)
    for index, weight in [entry for entries in (plan.default, *plan.by_source.values()) for entry in entries]:
        weights.setdefault(index, weight)
    functions = [
        FunctionScores(f.key, weights[i], scores, error)
        for i, (f, (scores, error)) in enumerate(zip(plan.functions, results))
    ]
    totals = [None if math.isnan(t) else float(t) for t in routed.totals]
    by_source = {
        key: [None if math.isnan(v) else float(v) for v in values]
        for key, values in routed.per_function.items()
        if key.startswith("source/")
    }
    return ScoringReport(rows=rows, functions=functions, totals=totals, by_source=by_source)


# ---- the command -------------------------------------------------------------------------------


def write_records(records: list[dict[str, Any]], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")


def summary_lines(report: ScoringReport) -> list[str]:
    """The table `grpo-ray rewards score` prints: mean and failures per function."""
    width = max(len("function"), *(len(f.name) for f in report.functions))
    lines = [
        f"rows {len(report.rows)}",
        f"{'function':<{width}}  {'weight':>7}  {'mean':>7}  {'failures':>8}  first error",
    ]
    for f in report.functions:
        mean = "-" if f.mean is None else f"{f.mean:.4f}"
        lines.append(f"{f.name:<{width}}  {f.weight:>7g}  {mean:>7}  {f.failures:>8}  {f.first_error or ''}".rstrip())
    scored = [t for t in report.totals if t is not None]
    mean_total = f"{sum(scored) / len(scored):.4f}" if scored else "-"
    failed = len(report.totals) - len(scored)
    lines.append(
        f"{'reward':<{width}}  {'':>7}  {mean_total:>7}  {failed:>8}  (weighted total; rows where any function failed)"
    )
    for key, values in report.by_source.items():  # reward.by_source: the total per data source
        scored = [v for v in values if v is not None]
        mean = f"{sum(scored) / len(scored):.4f}" if scored else "-"
        lines.append(f"{key:<{width}}  {'':>7}  {mean:>7}  {'':>8}  (weighted total on the source's rows)")
    return lines


def score_file(config: str, data: str, output: str | None = None, overrides: tuple[str, ...] = ()) -> ScoringReport:
    """Read the recipe and the rows, score them, write `output` if given."""
    cfg = load_config(config, overrides)
    rows = read_scoring_rows(data)
    report = score_rows(cfg.reward, rows)
    if output is not None:
        write_records(report.records(), output)
    return report
