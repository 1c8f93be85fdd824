"""`grpo-ray sweep-temperature`: the temperature list and the per-temperature figures worked by
hand, then the real command on the tiny model (hf, in this process), checked against `grpo-ray
eval` at the same temperature, and its one-line errors."""

import json

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from grpo_ray.cli import main
from grpo_ray.config import ConfigError
from grpo_ray.commands.evaluate import evaluate
from grpo_ray.commands.temperature_sweep import (
    SweepReport,
    TemperatureResult,
    parse_temperatures,
    summarize_temperature,
)
from grpo_ray.types import Completion

from ...conftest import tiny_heldout_eval


def completion(text: str, tokens: int, finish_reason: str = "stop") -> Completion:
    return Completion(token_ids=tuple(range(tokens)), logprobs=(0.0,) * tokens, text=text, finish_reason=finish_reason)


# ---- the temperature list ----------------------------------------------------------------------


def test_parse_temperatures_keeps_the_order_given():
    assert parse_temperatures("1.4, 0.6,1") == (1.4, 0.6, 1.0)
    assert parse_temperatures("0.7") == (0.7,)


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "empty"),
        ("  ", "empty"),
        ("0.6,abc", "'abc' is not a number"),
        ("0.6,,1.0", "'' is not a number"),
        ("0.6,0", "0 must be a finite number > 0"),
        ("-1", "-1 must be a finite number > 0"),
        ("nan", "nan must be a finite number > 0"),
        ("inf", "inf must be a finite number > 0"),
        ("1.0,1", "1 is listed twice"),
    ],
)
def test_bad_temperature_lists_name_the_flag(text, why):
    with pytest.raises(ConfigError) as raised:
        parse_temperatures(text)
    message = str(raised.value)
    assert message.startswith("--temperatures") and why in message and "\n" not in message


# ---- the figures of one temperature --------------------------------------------------------------


def test_summarize_temperature_hand_worked():
    completions = [
        [completion("a b c d e", 5), completion("a b c d f", 5, "length")],
        [completion("x y z w", 4), completion("x y z w", 2)],
    ]
    scores = [[1.0, 1.0], [None, 1.0]]
    result = summarize_temperature(1.2, scores, completions)
    # accuracy: prompt 1 mean (1 + 1) / 2 = 1; prompt 2 (None counts 0) (0 + 1) / 2 = 0.5; mean 0.75.
    assert (result.temperature, result.accuracy, result.failures) == (1.2, 0.75, 1)
    # diversity: prompt 1 has 4-grams (a b c d) (b c d e) (a b c d) (b c d f): 3 distinct of 4 = 0.75;
    # prompt 2 has (x y z w) twice: 1 of 2 = 0.5. Mean over prompts 0.625.
    assert result.diversity == 0.625
    # tokens 5 + 5 + 4 + 2 = 16 over 4 samples; one of 4 samples hit max_tokens.
    assert (result.mean_length, result.truncated) == (4.0, 0.25)


def test_a_prompt_without_any_4gram_is_left_out_of_diversity():
    completions = [
        [completion("x y z w", 4), completion("x y z w", 4)],  # 1 of 2 = 0.5
        [completion("42", 1), completion("42", 1)],  # no 4-gram: says nothing, left out (not 0)
    ]
    result = summarize_temperature(1.0, [[0.0, 0.0], [1.0, 1.0]], completions)
    assert result.diversity == 0.5
    assert result.accuracy == 0.5  # but it counts for accuracy


def test_metrics_and_table_of_a_report():
    result = TemperatureResult(
        temperature=0.6, accuracy=0.25, diversity=0.5, mean_length=12.5, truncated=0.125, failures=2
    )
    assert result.metrics() == {
        "sweep/temperature": 0.6,
        "sweep/accuracy": 0.25,
        "sweep/diversity": 0.5,
        "sweep/mean_length": 12.5,
        "sweep/truncated": 0.125,
        "sweep/failures": 2.0,
    }
    report = SweepReport(n=8, prompts=3, results=[result], sweep_file=None, run_id="r", tracking_uri="u")
    header, row = report.table_lines()
    assert header.split() == ["temperature", "avg@8", "diversity", "mean", "length", "truncated"]
    assert row.split() == ["0.6", "0.2500", "0.5000", "12.5", "12.5%"]


# ---- the command on the tiny model ---------------------------------------------------------------

SWEEP_TINY = ["sweep-temperature", "--model", "tiny", "--data", "tiny:heldout"]


def test_sweep_command_on_the_tiny_model(tmp_path):
    args = [
        *SWEEP_TINY,
        "--limit",
        "4",
        "--n",
        "4",
        "--max-tokens",
        "4",
        "--reward",
        "exact_match",
        "--temperatures",
        "0.5,2.0",
        "--backend",
        "hf",
        "--output-dir",
        str(tmp_path),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output

    rows = [json.loads(line) for line in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    assert [row["temperature"] for row in rows] == [0.5, 2.0]
    for row in rows:
        assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["diversity"] <= 1.0 and 0.0 <= row["truncated"] <= 1.0
        assert 1 <= row["mean_length"] <= 4 and row["failures"] == 0

    # The table: a header, then one line per temperature with the figures of sweep.jsonl.
    lines = result.output.splitlines()
    [header_at] = [i for i, line in enumerate(lines) if line.split()[:2] == ["temperature", "avg@4"]]
    for line, row in zip(lines[header_at + 1 : header_at + 3], rows):
        assert line.split()[:3] == [str(row["temperature"]), f"{row['accuracy']:.4f}", f"{row['diversity']:.4f}"]

    # One MLflow run: the temperatures as a param, each figure at step = the temperature's index.
    client = MlflowClient(f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("grpo-ray-sweep-temperature").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["temperatures"] == "[0.5, 2.0]" and "temperature" not in run.data.params
    for key, figure in (
        ("sweep/accuracy", "accuracy"),
        ("sweep/diversity", "diversity"),
        ("sweep/truncated", "truncated"),
    ):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == [(0, rows[0][figure]), (1, rows[1][figure])]

    # avg@n is eval's: `grpo-ray eval` at 0.5 with the same seed samples and scores the same.
    report = evaluate(tiny_heldout_eval(tmp_path / "eval", n=4, temperature=0.5, limit=4), log=lambda line: None)
    assert report.sources[0].avg_at_k == rows[0]["accuracy"]


@pytest.mark.parametrize("temperatures", ["", "0.6,abc", "0", "1.0,-0.5"])
def test_bad_temperatures_are_one_line_errors(tmp_path, temperatures):
    args = [
        *SWEEP_TINY,
        "--temperatures",
        temperatures,
        "--output-dir",
        str(tmp_path),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: --temperatures")
    assert not (tmp_path / "mlflow.db").exists()  # refused before any run was logged
