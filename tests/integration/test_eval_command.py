"""`grpo-ray eval` on the tiny model: a real benchmark parquet scored with math, the held-out split
whose greedy accuracy is known from the model's build, YaRN at evaluation time, one-line errors;
with --config, an agent recipe's episodes on the tiny-tools model.

No Ray: evaluation runs in the test's process (the reward function in a sandbox child)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from grpo_ray.cli import main
from grpo_ray.commands.evaluate import EvalSettings, evaluate, load_engine, metric_key, summarize
from grpo_ray.models.loading import load_tokenizer
from grpo_ray.models.tiny import ensure_tiny_artifacts

from ..conftest import tiny_heldout_eval

TINY_TOOLS = Path(__file__).resolve().parents[2] / "configs" / "tiny-tools.yaml"
AIME24 = Path("/work/shared/data/math-eval/aime24.parquet")
# The rows' own data_source field names the source (verl files carry it); the file stem is the
# fallback for files without one.
AIME24_SOURCE = "test-math-aime24"


def finished_run(report):
    client = MlflowClient(report.tracking_uri)
    run = client.get_run(report.run_id)
    assert run.info.status == "FINISHED"
    return run


@pytest.mark.skipif(not AIME24.exists(), reason="needs the shared math-eval data")
def test_aime24_with_math_reward(tmp_path):
    report = evaluate(
        EvalSettings(model="tiny", data=(str(AIME24),), n=2, max_tokens=8, reward="math", output_dir=str(tmp_path)),
        log=lambda line: None,
    )
    # The tiny model cannot do AIME: every score is 0, none failed.
    assert report.k == 2
    [source] = report.sources
    assert (source.source, source.prompts, source.avg_at_k, source.pass_at_k, source.failures) == (
        AIME24_SOURCE,
        30,
        0.0,
        0.0,
        0,
    )
    samples = [json.loads(line) for line in report.samples_file.read_text().splitlines()]
    assert len(samples) == 60  # 30 prompts x 2
    assert {"prompt", "answer", "completion", "score", "data_source"} <= samples[0].keys()
    assert {s["data_source"] for s in samples} == {AIME24_SOURCE}
    assert [s["sample"] for s in samples[:2]] == [0, 1] and samples[0]["prompt"] == samples[1]["prompt"]
    assert samples[0]["answer"] == "204" and all(s["score"] == 0.0 for s in samples)
    run = finished_run(report)
    # MLflow refuses "@" in metric names: avg@2 is logged as avg_at_2.
    assert run.data.metrics[f"eval/{AIME24_SOURCE}/avg_at_2"] == 0.0
    assert run.data.metrics[f"eval/{AIME24_SOURCE}/pass_at_2"] == 0.0
    params = run.data.params
    assert (params["model"], params["n"], params["temperature"], params["max_tokens"]) == ("tiny", "2", "1.0", "8")
    assert str(AIME24) in params["files"]
    assert report.tracking_uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"


def test_heldout_greedy_accuracy_matches_the_build_record(tmp_path):
    report = evaluate(tiny_heldout_eval(tmp_path), log=lambda line: None)
    [source] = report.sources
    expected = ensure_tiny_artifacts().info["start_heldout_accuracy"]
    assert source.source == "heldout" and source.prompts == 500
    assert source.avg_at_k == pytest.approx(expected, abs=0.01)
    assert source.pass_at_k == source.avg_at_k  # one sample: best = mean
    assert finished_run(report).data.metrics["eval/heldout/avg_at_1"] == source.avg_at_k


def test_yarn_factor_sets_rope_scaling_of_the_loaded_model(tmp_path):
    settings = tiny_heldout_eval(tmp_path, yarn_factor=4.0, limit=8)
    report = evaluate(settings, log=lambda line: None)
    assert report.sources[0].prompts == 8
    max_positions = json.loads((ensure_tiny_artifacts().model_dir / "config.json").read_text())[
        "max_position_embeddings"
    ]
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": max_positions}
    assert yarn.items() <= report.rope_parameters.items()
    assert json.loads(finished_run(report).data.params["rope_parameters"]) == report.rope_parameters
    # The model really runs YaRN (attention scaling > 1), not just a config that says so.
    engine = load_engine(settings, load_tokenizer("tiny"), max_model_len=64)
    assert engine.model.model.rotary_emb.rope_type == "yarn"
    assert engine.model.model.rotary_emb.attention_scaling > 1.0


def test_summarize_hand_worked():
    # a: scores (1, 0) -> mean 0.5, best 1; b: (None, 0) -> None counts 0: mean 0, best 0, one failure.
    [a, b] = summarize(["a", "b"], [[1.0, 0.0], [None, 0.0]], [[False, True], [False, False]])
    assert (a.avg_at_k, a.pass_at_k, a.failures, a.truncated) == (0.5, 1.0, 0, 0.5)
    assert (b.avg_at_k, b.pass_at_k, b.failures) == (0.0, 0.0, 1)
    assert metric_key("lighteval/MATH:500", "avg_at_4") == "eval/lighteval/MATH_500/avg_at_4"


def test_missing_data_file_is_one_line_error(tmp_path):
    missing = tmp_path / "missing.parquet"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_ray.cli",
            "eval",
            "--model",
            "tiny",
            "--data",
            str(missing),
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: --data: {missing} does not exist (relative to the working directory); give a "
        "jsonl/json/parquet/arrow file or a hub id"
    ]
    assert not (tmp_path / "mlflow.db").exists()  # refused before any run was logged


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--model", "no/such/dir", "--data", "tiny:heldout"], "error: --model: no/such/dir does not exist"),
        (
            ["--model", "tiny", "--data", "tiny:heldout", "--n", "2", "--temperature", "0"],
            "error: --n 2 with --temperature 0",
        ),
        (["--model", "tiny", "--data", "tiny:heldout", "--reward", "nope"], "error: unknown reward 'nope'"),
        (["--data", "tiny:heldout"], "error: --model and --data: give both, or a recipe with --config"),
        (["--config", str(TINY_TOOLS), "--reward", "math"], "error: --reward: with --config the recipe's"),
    ],
)
def test_bad_input_is_one_line_error(tmp_path, args, expected):
    result = CliRunner().invoke(main, ["eval", *args, "--output-dir", str(tmp_path)])
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith(expected)


def test_an_agent_recipe_runs_its_environment_for_each_heldout_row(tmp_path):
    """`eval --config` runs the recipe's calculator in an episode per held-out row, as the run's
    evaluation does (at the recipe's full size it prints the run's step-0 accuracy, 0.171)."""
    args = ["eval", "--config", str(TINY_TOOLS), "--temperature", "0", "--n", "1", "--limit", "20"]
    result = CliRunner().invoke(main, [*args, "--output-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # Greedy, the tiny-tools model calls the calculator first (configs/tiny-tools.yaml): every
    # episode is the call, the calculator's reply and an answer.
    assert "sampling 20 prompts x 1 episode with Calculator on hf" in result.output
    assert "episodes: 2.00 turns, 1.00 tool calls, 0.00 tool errors per sample; 0 failed" in result.output
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 20
    for sample in samples:
        user, call, reply, answer = sample["episode"].splitlines()
        arguments = json.loads(call.removeprefix("assistant: <tool_call>").removesuffix("</tool_call>"))["arguments"]
        assert user == f"user: {sample['prompt']}" and reply == f"tool: {arguments['a'] * arguments['b']}"
        assert answer == f"assistant: {sample['completion']}" and sample["turns"] == 2
    # The accuracy is the first reward function's mean (exact_match), as the run's eval/accuracy.
    accuracy = sum(s["scores"]["exact_match"] for s in samples) / 20
    assert f"held-out accuracy {accuracy:.3f} (avg@1 over 20 prompts)" in result.output
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("grpo-ray-eval").experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["eval/accuracy"] == accuracy
    assert run.data.metrics["eval/episode/tool_calls"] == 1.0 and run.data.params["train.eval_samples"] == "1"
