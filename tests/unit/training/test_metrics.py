"""The generation metrics of a step, on six hand-made rows."""

import math

import numpy as np
import pytest

from grpo_ray.algo.diversity import distinct_ngram_ratio, group_diversity
from grpo_ray.training.rows import StepRows
from grpo_ray.training.metrics import generation_metrics, function_label

NAN = np.nan


def _rows(group_ids, rewards, per_function, lengths, truncated, diversity) -> StepRows:
    n = len(group_ids)
    return StepRows(
        sources=np.zeros(n, dtype=np.int64),
        rows=np.arange(n, dtype=np.int64),
        group_ids=np.array(group_ids, dtype=np.int64),
        prompt_uids=np.array(group_ids, dtype=np.int64),
        rewards=np.array(rewards, dtype=np.float64),
        per_function={name: np.array(v, dtype=np.float64) for name, v in per_function.items()},
        row_weights=np.ones(n, dtype=np.float32),
        completion_lengths=np.array(lengths, dtype=np.int64),
        truncated=np.array(truncated, dtype=bool),
        group_diversity=np.array(diversity, dtype=np.float64),
    )


def _six_rows() -> StepRows:
    # Groups of 3, 2 and 1 rows (ids 5, 2, 9, interleaved), with diversities 0.5, 1.0, 0.0.
    return _rows(
        group_ids=[5, 2, 5, 2, 5, 9],
        rewards=[1.0, NAN, 0.0, 0.5, NAN, 1.0],
        per_function={
            "correct": [1.0, NAN, 0.0, 1.0, NAN, 1.0],
            "format": [0.5] * 6,
            "judge": [NAN] * 6,  # failed on every row
        },
        lengths=[10, 20, 30, 40, 50, 60],
        truncated=[False, False, True, False, False, True],
        diversity=[0.5, 1.0, 0.5, 1.0, 0.5, 0.0],
    )


def test_distinct_4_is_a_mean_over_groups_not_rows():
    metrics = generation_metrics(_six_rows())
    # Over groups: (0.5 + 1.0 + 0.0) / 3 = 0.5. Over rows it would be (3 x 0.5 + 2 x 1.0 + 0) / 6 = 0.583.
    assert metrics["diversity/distinct_4"] == pytest.approx(0.5)


def test_reward_mean_and_std_ignore_failed_rows():
    metrics = generation_metrics(_six_rows())
    # Finite rewards 1, 0, 0.5, 1: mean 0.625; deviations 0.375, -0.625, -0.125, 0.375,
    # squares sum to 0.6875, population variance 0.6875 / 4 = 0.171875.
    assert metrics["reward/mean"] == pytest.approx(0.625)
    assert metrics["reward/std"] == pytest.approx(math.sqrt(0.171875))
    assert metrics["reward/failed"] == 2.0


def test_per_function_stats_and_failure_counts():
    metrics = generation_metrics(_six_rows())
    # correct: 1, 0, 1, 1 finite -> mean 0.75, variance 0.75 x 0.25 = 0.1875; 2 NaNs.
    assert metrics["reward/correct/mean"] == pytest.approx(0.75)
    assert metrics["reward/correct/std"] == pytest.approx(math.sqrt(0.1875))
    assert metrics["reward/correct/failures"] == 2.0
    assert (metrics["reward/format/mean"], metrics["reward/format/std"], metrics["reward/format/failures"]) == (
        0.5,
        0.0,
        0.0,
    )
    # Every row failed: no mean or std (NaN, without a numpy warning), 6 failures.
    assert math.isnan(metrics["reward/judge/mean"]) and math.isnan(metrics["reward/judge/std"])
    assert metrics["reward/judge/failures"] == 6.0


def test_lengths_and_truncation():
    metrics = generation_metrics(_six_rows())
    # Lengths 10..60: mean 35, max 60; 2 of 6 truncated.
    assert metrics["response/length_mean"] == 35.0 and metrics["response/length_max"] == 60.0
    assert metrics["response/truncated_fraction"] == pytest.approx(1 / 3)


def test_all_rewards_failed_gives_nan_not_a_warning():
    rows = _rows([0, 0], [NAN, NAN], {"correct": [NAN, NAN]}, [1, 2], [False, False], [0.5, 0.5])
    with np.errstate(all="raise"):
        metrics = generation_metrics(rows)
    assert math.isnan(metrics["reward/mean"]) and math.isnan(metrics["reward/std"])
    assert metrics["reward/failed"] == 2.0


def test_distinct_4_agrees_with_group_diversity_on_texts():
    # Rollout workers store each group's distinct_ngram_ratio on its rows; the step metric should
    # then be group_diversity over the texts (every group here has 4-grams, so none is left out).
    texts = ["a b c d e", "a b c d f", "p q r s", "p q r s", "p q r s", "x y z w v"]
    group_ids = [0, 0, 1, 1, 1, 2]
    # Group 0: 4 four-grams, 3 distinct -> 0.75. Group 1: (p q r s) three times -> 1/3. Group 2: 2 of 2 -> 1.
    per_group = {g: distinct_ngram_ratio([t for t, h in zip(texts, group_ids) if h == g]) for g in set(group_ids)}
    assert per_group == {0: 0.75, 1: pytest.approx(1 / 3), 2: 1.0}
    rows = _rows(group_ids, [1.0] * 6, {}, [1] * 6, [False] * 6, [per_group[g] for g in group_ids])
    expected = (0.75 + 1 / 3 + 1.0) / 3
    assert generation_metrics(rows)["diversity/distinct_4"] == pytest.approx(expected)
    assert group_diversity(texts, group_ids) == pytest.approx(expected)


def test_groups_without_a_4_gram_are_left_out_of_distinct_4():
    # Rollout workers store NaN for a group whose texts have no 4-gram (group_distinct_ratio);
    # the step's mean skips it, as group_diversity does, instead of counting it as collapse (0).
    from grpo_ray.algo.diversity import group_distinct_ratio

    assert np.isnan(group_distinct_ratio(["82", "81"]))
    rows = _rows([0, 0, 1, 1], [1.0, 0.0, 1.0, 0.0], {}, [1, 1, 1, 1], [False] * 4, [np.nan, np.nan, 0.75, 0.75])
    assert generation_metrics(rows)["diversity/distinct_4"] == pytest.approx(0.75)


def test_reward_functions_given_by_file_path_get_metric_keys_mlflow_accepts():
    # Found by the reward-worker kill test: "reward//tmp/x/slow.py:fn/mean" is refused by MLflow.
    assert function_label("/tmp/x/slow_reward.py:slow_exact_match") == "slow_reward.py:slow_exact_match"
    assert function_label("rewards/mine.py:score") == "mine.py:score"
    assert function_label("my_pkg.rewards:score") == "my_pkg.rewards:score"
    assert function_label("math") == "math"


def test_episodes_figures_are_means_and_their_failures_counted_by_kind():
    from dataclasses import replace

    rows = replace(
        _rows([0, 0, 1, 1], [1.0, NAN, NAN, 0.0], {}, [3, 3, 3, 3], [False] * 4, [0.5] * 4),
        episode_stats={
            "turns": np.array([2.0, 1.0, 1.0, 2.0]),
            "failed": np.array([0.0, 1.0, 1.0, 0.0]),
            "reset_timeouts": np.array([0.0, 1.0, 0.0, 0.0]),
            "lost_with_process": np.array([0.0, 0.0, 1.0, 0.0]),
        },
    )
    metrics = generation_metrics(rows)
    assert (metrics["episode/turns"], metrics["episode/failed"]) == (1.5, 0.5)
    # Failures are episodes counted, not a mean: "1 reset timed out" reads as it is.
    assert (metrics["env_failures/reset_timeouts"], metrics["env_failures/lost_with_process"]) == (1.0, 1.0)
    assert "episode/reset_timeouts" not in metrics


def test_a_run_without_held_out_prompts_says_so_rather_than_nan():
    from grpo_ray.training.metrics import accuracy_change, accuracy_text

    assert accuracy_text(0.6954) == "0.695" and accuracy_change(0.08, 0.695) == "0.080 -> 0.695"
    nothing = "not measured (no held-out prompts: data.eval_files is empty and data.val_fraction 0)"
    assert accuracy_text(float("nan")) == nothing and accuracy_change(float("nan"), float("nan")) == nothing


def test_an_accuracy_nothing_scores_says_why():
    from grpo_ray.config import config_from_dict
    from grpo_ray.training.evaluation import heldout_metrics, unmeasured_reason
    from grpo_ray.training.metrics import accuracy_text
    from grpo_ray.types import ScoredSlice

    teacher_only = config_from_dict(
        {
            "reward": {"functions": []},
            "distillation": {"teachers": [{"name": "t", "model_path": "tiny"}], "with_rewards": False},
        }
    )
    why = unmeasured_reason(teacher_only)
    assert accuracy_text(float("nan"), why) == (
        "not measured (no reward function scores the held-out samples: reward.functions is empty)"
    )
    assert "data.eval_files" in unmeasured_reason(config_from_dict({}))
    # An environment's reward is no accuracy (heldout_metrics reads the first reward function's).
    agent = config_from_dict(
        {
            "reward": {"functions": []},
            "environment": {"spec": "examples/agents/higher_lower.py:HigherLower"},
            "distillation": {"teachers": [{"name": "t", "model_path": "tiny"}], "with_rewards": False},
        }
    )
    assert unmeasured_reason(agent) == why
    zeros = np.zeros(2)
    unscored = ScoredSlice(
        group_ids=np.arange(2),
        prompt_uids=np.arange(2),
        rewards=zeros,
        per_function={},
        failures={},
        first_errors={},
        completion_lengths=np.ones(2, dtype=np.int64),
        truncated=np.zeros(2, dtype=bool),
        group_diversity=zeros,
    )
    # `grpo-ray eval --config` of such a recipe: its samples counted, no accuracy.
    metrics = heldout_metrics(teacher_only, [unscored])
    assert np.isnan(metrics["eval/accuracy"]) and metrics["eval/samples"] == 2.0
