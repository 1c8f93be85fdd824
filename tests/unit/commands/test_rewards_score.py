"""`grpo-ray rewards score`: rows read with file:line errors, every function scored with per-row
failure isolation, the weighted total, the output file, and the command itself."""

import doctest
import importlib
import json
import textwrap

import pytest
from click.testing import CliRunner

from grpo_ray.cli import main
from grpo_ray.config import load_config
from grpo_ray.data.loaders import DataError
from grpo_ray.rewards.by_source import RewardPlan
from grpo_ray.rewards.scorer import RowScorer
from grpo_ray.commands.rewards_score import (
    ScoringRow,
    read_scoring_rows,
    row_fields_of,
    score_rows,
    summary_lines,
)

# Raises on the whole batch whenever one completion is "boom": only that row may fail.
USER_REWARDS = """
def picky_length(completions, prompts, answers, **row_fields):
    if "boom" in completions:
        raise ValueError("cannot score boom")
    return [float(len(c)) for c in completions]


def hangs(completions, prompts, answers, **row_fields):
    import time
    time.sleep(60)
"""

ROWS = [
    {"completion": "82", "answer": "82", "id": "a"},
    {"completion": "\\boxed{82}", "answer": 82, "prompt": "37+45=", "id": "b"},
    {"completion": "boom", "answer": "7", "id": "c", "level": 2},
]


@pytest.fixture
def files(tmp_path):
    """A recipe with exact_match (1.0), math (0.5) and the user's picky_length (0.25), and the rows."""
    rewards = tmp_path / "user_rewards.py"
    rewards.write_text(USER_REWARDS)
    config = tmp_path / "recipe.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            reward:
              isolation: subprocess
              timeout_s: 20
              functions:
                - {{name: exact_match, weight: 1.0}}
                - {{name: math, weight: 0.5}}
                - {{name: "{rewards}:picky_length", weight: 0.25}}
            """
        )
    )
    data = tmp_path / "answers.jsonl"
    # A blank line in the middle: skipped, and line numbers still count it.
    data.write_text(json.dumps(ROWS[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in ROWS[1:]))
    return config, data, rewards


def test_module_docstring_example_runs():
    module = importlib.import_module("grpo_ray.commands.rewards_score")
    assert doctest.testmod(module).failed == 0


# ---- reading ---------------------------------------------------------------------------------------


def test_rows_keep_their_fields_and_numeric_answers_become_text(files):
    _, data, _ = files
    rows = read_scoring_rows(data)
    assert [r.completion for r in rows] == ["82", "\\boxed{82}", "boom"]
    assert [r.answer for r in rows] == ["82", "82", "7"]
    assert [r.prompt for r in rows] == ["", "37+45=", ""]
    assert rows[2].fields == ROWS[2]
    # Functions get the extra fields only, None where a row has none.
    assert row_fields_of(rows) == {"id": ["a", "b", "c"], "level": [None, None, 2]}


@pytest.mark.parametrize(
    "line, expected",
    [
        ('{"answer": "1"}', "bad.jsonl:3: no string 'completion' field"),
        ('{"completion": "1"}', "bad.jsonl:3: no 'answer' field"),
        ('{"completion": "1", "answer": null}', "bad.jsonl:3: no 'answer' field"),
        ("[1, 2]", "bad.jsonl:3: a list, not a JSON object"),
        ("{not json", "bad.jsonl:3: not valid JSON"),
    ],
)
def test_unusable_row_is_an_error_naming_file_and_line(tmp_path, line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"completion": "1", "answer": "1"}\n\n' + line + "\n")
    with pytest.raises(DataError) as error:
        read_scoring_rows(path)
    message = str(error.value)
    assert "\n" not in message and expected in message


def test_missing_data_file_is_an_error(tmp_path):
    with pytest.raises(DataError, match="missing.jsonl: data file not found"):
        read_scoring_rows(tmp_path / "missing.jsonl")


# ---- scoring ---------------------------------------------------------------------------------------


def test_scores_per_function_and_weighted_total_with_one_failing_row(files):
    config, data, rewards = files
    report = score_rows(load_config(config).reward, read_scoring_rows(data))
    exact, math, picky = report.functions
    # exact_match: only "82" == "82". math: only the boxed 82 (an unboxed answer scores 0).
    assert exact.scores == [1.0, 0.0, 0.0] and exact.failures == 0 and exact.first_error is None
    assert math.scores == [0.0, 1.0, 0.0] and math.failures == 0
    # picky_length raised on the batch (it holds "boom"); rescored row by row, only "boom" fails.
    assert picky.name == f"{rewards}:picky_length"
    assert picky.scores == [2.0, 10.0, None]
    assert picky.failures == 1 and picky.first_error == "ValueError: cannot score boom"
    assert picky.mean == 6.0  # (2 + 10) / 2: over the rows it scored
    # Totals: row a 1 + 0.5 * 0 + 0.25 * 2 = 1.5; row b 0 + 0.5 * 1 + 0.25 * 10 = 3.0; row c failed.
    assert report.totals == [1.5, 3.0, None]
    records = report.records()
    assert [r["id"] for r in records] == ["a", "b", "c"]
    assert records[2] == {**ROWS[2], "reward": None, "exact_match": 0.0, "math": 0.0, picky.name: None}
    lines = summary_lines(report)
    assert lines[0] == "rows 3"
    assert any(line.startswith(picky.name) and line.endswith("1  ValueError: cannot score boom") for line in lines)


def test_in_process_isolation_gives_the_same_scores(files):
    config, data, _ = files
    cfg = load_config(config, ["reward.isolation=none"]).reward
    report = score_rows(cfg, read_scoring_rows(data))
    assert report.totals == [1.5, 3.0, None]
    assert report.functions[2].first_error == "ValueError: cannot score boom"


def test_rows_that_time_out_fail_and_retries_stop_after_three_timeouts(files):
    _, _, rewards = files
    # Batch call times out after 0.5 s; the rows are retried one by one, and after three
    # timeouts in a row the remaining two are left failed without another call.
    with RowScorer([(f"{rewards}:hangs", {})], timeout_s=0.5) as scorer:
        [(scores, error)] = scorer.score(["x"] * 5, [""] * 5, ["y"] * 5, {})
        assert scorer.sandbox.restarts == 4  # the batch call and three single rows
    assert scores == [None] * 5 and error == "timed out after 0.5 s"


def test_repeated_specs_get_distinct_names():
    # The same spec with other options is another function: "#2", "#3"; with the same, the same one.
    entries = [
        ("format", 1.0, {}),
        ("math", 1.0, {}),
        ("format", 1.0, {"pattern": "a"}),
        ("format", 1.0, {"pattern": "b"}),
    ]
    plan = RewardPlan.build(entries + [("format", 2.0, {})])
    assert [f.key for f in plan.functions] == ["format", "math", "format#2", "format#3"]


def test_scoring_row_default_prompt_is_empty():
    assert ScoringRow("c", "a").prompt == ""


# ---- the command -----------------------------------------------------------------------------------


def test_command_prints_summary_and_writes_output_in_input_order(files, tmp_path):
    config, data, rewards = files
    output = tmp_path / "out" / "scored.jsonl"
    result = CliRunner().invoke(
        main, ["rewards", "score", "--config", str(config), "--data", str(data), "--output", str(output)]
    )
    assert result.exit_code == 0, result.output
    assert "rows 3" in result.output and "ValueError: cannot score boom" in result.output
    assert f"wrote {output}" in result.output
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["id"] for r in written] == ["a", "b", "c"]
    assert [r["reward"] for r in written] == [1.5, 3.0, None]
    assert written[1]["answer"] == 82 and written[1]["prompt"] == "37+45="  # fields pass through as read
    assert [r[f"{rewards}:picky_length"] for r in written] == [2.0, 10.0, None]


def test_command_bad_row_is_one_line_error(files, tmp_path):
    config, _, _ = files
    data = tmp_path / "bad.jsonl"
    data.write_text('{"completion": "1", "answer": "1"}\n{"completion": "2"}\n')
    result = CliRunner().invoke(main, ["rewards", "score", "--config", str(config), "--data", str(data)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: {data}:2: no 'answer' field (a string or a number); every row needs the reference answer"
    ]
