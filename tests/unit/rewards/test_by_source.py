"""Rows that name their own reward (reward.by_source): a mixed file of math, GSM8K and format-only
rows, scored with the real functions by `grpo-ray rewards score` and by a reward worker, which
share one dispatch (rewards/by_source.py), and the per-source metrics they feed."""

import json
import math

import numpy as np
import pytest

from grpo_ray.actors.reward import RewardFunctionSetting, RewardIsolation, RewardWorker
from grpo_ray.training.rows import StepRows
from grpo_ray.config import ConfigError, config_from_dict
from grpo_ray.commands.rewards_score import read_scoring_rows, score_rows, summary_lines
from grpo_ray.rewards.by_source import RewardPlan, eval_source_accuracies
from grpo_ray.training.metrics import generation_metrics
from grpo_ray.types import RolloutSlice

R1 = {"pattern": "r1"}
REWARD = {
    "isolation": "none",
    # Rows of no listed source (or with no data_source): exact match.
    "functions": [{"name": "exact_match"}],
    "by_source": {
        "math": [{"name": "math"}],
        # The format function is shared with format_only, at another weight.
        "gsm8k": [{"name": "gsm8k"}, {"name": "format", "weight": 0.5, "options": R1}],
        "format_only": [{"name": "format", "options": R1}],
    },
}
# (data_source, completion, answer, expected total)
ROWS = [
    ("math", "<think>6 x 7</think> \\boxed{42}", "42", 1.0),  # math: right
    ("math", "\\boxed{41}", "42", 0.0),  # math: wrong
    ("gsm8k", "<think>48+24</think><answer>#### 72</answer>", "72", 1.5),  # gsm8k 1 + 0.5 x format 1
    ("gsm8k", "#### 71", "72", 0.0),  # gsm8k 0 + 0.5 x format 0
    # Format-only rows have no answer: gsm8k would return None (a failure) if it ever saw them.
    ("format_only", "<think>x</think><answer>y</answer>", "", 1.0),
    ("format_only", "y", "", 0.0),
    (None, "82", "82", 1.0),  # no data_source: the default, exact_match
    ("aime", "81", "82", 0.0),  # a source not listed: the default
]


def write_rows(path):
    with path.open("w") as out:
        for source, completion, answer, _ in ROWS:
            row = {"completion": completion, "answer": answer}
            if source is not None:
                row["data_source"] = source
            out.write(json.dumps(row) + "\n")
    return path


def reward_config(isolation="none"):
    return config_from_dict({"reward": {**REWARD, "isolation": isolation}}).reward


@pytest.mark.parametrize("isolation", ["none", "subprocess"])
def test_rewards_score_routes_each_row_to_its_sources_functions(tmp_path, isolation):
    report = score_rows(reward_config(isolation), read_scoring_rows(write_rows(tmp_path / "mixed.jsonl")))
    assert report.totals == [expected for *_, expected in ROWS]
    scores = {f.name: f.scores for f in report.functions}
    # Each function scored only its own rows: None elsewhere, and no failures anywhere.
    assert scores["math"] == [1.0, 0.0, None, None, None, None, None, None]
    assert scores["gsm8k"] == [None, None, 1.0, 0.0, None, None, None, None]
    assert scores["format"] == [None, None, 1.0, 0.0, 1.0, 0.0, None, None]
    assert scores["exact_match"] == [None] * 6 + [1.0, 0.0]
    assert all(f.first_error is None for f in report.functions)
    # Per source: math (1 + 0) / 2, gsm8k (1.5 + 0) / 2, format_only (1 + 0) / 2, default (1 + 0) / 2.
    lines = "\n".join(summary_lines(report))
    for key, mean in [("math", 0.5), ("gsm8k", 0.75), ("format_only", 0.5), ("default", 0.5)]:
        assert f"source/{key}" in lines and f"{mean:.4f}" in lines.split(f"source/{key}")[1].splitlines()[0]


def _slice() -> RolloutSlice:
    n = len(ROWS)
    zeros = np.zeros((n, 1))
    return RolloutSlice(
        group_ids=np.arange(n) // 2,
        prompt_uids=np.arange(n) // 2,
        input_ids=zeros.astype(np.int64),
        attention_mask=zeros.astype(np.int64),
        completion_mask=zeros.astype(np.float32),
        rollout_logprobs=zeros.astype(np.float32),
        prompts=[""] * n,
        completions=[c for _, c, _, _ in ROWS],
        answers=[a for _, _, a, _ in ROWS],
        finish_reasons=["stop"] * n,
        row_fields={"data_source": [s for s, *_ in ROWS]},
        policy_versions=np.zeros(n, dtype=np.int64),
        group_diversity=np.zeros(n),
    )


def _worker(isolation: str) -> RewardWorker:
    settings = lambda functions: [  # noqa: E731
        RewardFunctionSetting(f["name"], f.get("weight", 1.0), f.get("options", {})) for f in functions
    ]
    by_source = {source: settings(functions) for source, functions in REWARD["by_source"].items()}
    return RewardWorker(settings(REWARD["functions"]), RewardIsolation(isolation, 1, 30.0), by_source)


@pytest.mark.parametrize("isolation", ["none", "subprocess"])
def test_reward_worker_scores_a_mixed_slice_like_rewards_score(isolation):
    worker = _worker(isolation)
    try:
        scored = worker.score(_slice())
    finally:
        worker.close()
    assert scored.rewards.tolist() == [expected for *_, expected in ROWS]
    assert scored.failures == {"exact_match": 0, "math": 0, "gsm8k": 0, "format": 0}
    assert scored.first_errors == {}
    # The source's first function is its accuracy: math 1, 0; gsm8k 1, 0; format_only 1, 0; default 1, 0.
    np.testing.assert_array_equal(scored.per_function["accuracy"], [1, 0, 1, 0, 1, 0, 1, 0])
    np.testing.assert_array_equal(scored.per_function["source/gsm8k"], [np.nan, np.nan, 1.5, 0, *[np.nan] * 4])


def test_step_metrics_per_source_and_failures_only_where_rows_failed():
    scored = _worker("none").score(_slice())
    rows = StepRows.from_scored([scored], [scored.rewards], [np.ones(len(ROWS))])
    metrics = generation_metrics(rows)
    assert metrics["reward/source/math/mean"] == 0.5
    assert metrics["reward/source/gsm8k/mean"] == 0.75
    assert metrics["reward/source/format_only/mean"] == 0.5
    assert metrics["reward/source/default/mean"] == 0.5
    assert metrics["reward/accuracy/gsm8k/mean"] == 0.5
    # gsm8k is NaN on the 6 rows it does not score; none of them failed.
    assert metrics["reward/gsm8k/failures"] == 0.0 and metrics["reward/failed"] == 0.0
    assert eval_source_accuracies([scored.per_function]) == {
        "eval/accuracy/math": 0.5,
        "eval/accuracy/gsm8k": 0.5,
        "eval/accuracy/format_only": 0.5,
        "eval/accuracy/default": 0.5,
    }


def test_a_failed_row_is_counted_for_its_own_function_only():
    # Row 0 is a gsm8k row whose gold has no number: gsm8k returns None there (a failure).
    plan = RewardPlan.build([("exact_match", 1.0, {})], {"gsm8k": [("gsm8k", 1.0, {})]})
    sources = plan.row_sources({"data_source": ["gsm8k", None]}, 2)
    routed = plan.combine(sources, [([None, 1.0], None), ([None, None], None)])
    assert routed.failures == {"exact_match": 0, "gsm8k": 1}
    assert math.isnan(routed.totals[0]) and routed.totals[1] == 1.0
    assert routed.first_errors == {"gsm8k": "returned None (could not score)"}


def test_without_by_source_the_plan_is_the_functions():
    plan = RewardPlan.build([("math", 1.0, {}), ("format", 0.5, {})])
    routed = plan.combine([None, None], [([1.0, 0.0], None), ([1.0, 1.0], None)])
    assert routed.totals.tolist() == [1.5, 0.5]
    assert set(routed.per_function) == {"math", "format"}  # no source/ or accuracy entries


def test_source_field_is_configurable():
    plan = RewardPlan.build([("exact_match", 1.0, {})], {"gsm8k": [("gsm8k", 1.0, {})]}, source_field="reward")
    assert plan.row_sources({"reward": ["gsm8k", "x"], "data_source": ["x", "gsm8k"]}, 2) == ["gsm8k", None]


@pytest.mark.parametrize(
    "reward, field",
    [
        ({"by_source": {"math": []}}, "reward.by_source.math"),
        ({"by_source": {"": [{"name": "math"}]}}, "reward.by_source"),
        ({"source_field": ""}, "reward.source_field"),
    ],
)
def test_bad_by_source_is_refused_naming_the_field(reward, field):
    with pytest.raises(ConfigError) as error:
        config_from_dict({"reward": reward})
    assert str(error.value).startswith(field) and "\n" not in str(error.value)


def test_rows_of_no_listed_source_may_have_no_functions():
    # reward.functions may be empty beside a reward model: those rows get 0 from the functions.
    plan = RewardPlan.build([], {"gsm8k": [("gsm8k", 1.0, {})]})
    routed = plan.combine(["gsm8k", None], [([1.0, None], None)])
    assert routed.totals.tolist() == [1.0, 0.0] and routed.failures == {"gsm8k": 0}
    assert "accuracy/default" not in routed.per_function
