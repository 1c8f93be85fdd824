"""One scorer, one accuracy: `grpo-ray rewards score` and `grpo-ray eval` see what training sees.

The same rows go through the run's RewardWorker (as the reward pool calls it, no Ray needed) and
through the command's score_rows; a function that raises on one row must fail that row alone in both.
"""

import math

import numpy as np
import pytest

from grpo_ray.actors.reward import RewardFunctionSetting, RewardIsolation, RewardWorker
from grpo_ray.actors.slices import pack_slice
from grpo_ray.commands.evaluate import summarize
from grpo_ray.commands.rewards_score import ScoringRow, score_rows
from grpo_ray.config import RewardConfig, RewardFunctionConfig
from grpo_ray.rewards.accuracy import mean_accuracy
from grpo_ray.types import Completion, Prompt

PICKY = """
def picky(completions, prompts, answers, **_):
    # Raises on any batch holding "bad": the batch call fails, and only a row-by-row retry
    # can score the other rows.
    if any("bad" in c for c in completions):
        raise ValueError("cannot read 'bad'")
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answers)]
"""
TEXTS = ["12", "bad", "7", "9"]
ANSWERS = ["12", "3", "8", "9"]


def training_scores(spec: str, isolation: str):
    rows = [
        (i, Prompt(uid=i, text="q", token_ids=(1, 2), answer=a), Completion((3,), (-0.1,), t, "stop"))
        for i, (t, a) in enumerate(zip(TEXTS, ANSWERS))
    ]
    worker = RewardWorker([RewardFunctionSetting(spec, 1.0, {})], RewardIsolation(mode=isolation, timeout_s=20))
    try:
        return worker.score(pack_slice(rows, pad_id=0, policy_version=0))
    finally:
        worker.close()


@pytest.mark.parametrize("isolation", ["none", "subprocess"])
def test_the_command_and_the_reward_pool_fail_the_same_rows(tmp_path, isolation):
    path = tmp_path / "picky.py"
    path.write_text(PICKY)
    spec = f"{path}:picky"
    scored = training_scores(spec, isolation)
    cfg = RewardConfig(isolation=isolation, timeout_s=20, functions=(RewardFunctionConfig(name=spec),))
    report = score_rows(cfg, [ScoringRow(t, a) for t, a in zip(TEXTS, ANSWERS)])
    # Row 1 fails alone (retried row by row); the others are scored: 1, -, 0, 1.
    [(name, values)] = scored.per_function.items()
    assert [None if math.isnan(v) else v for v in values] == [1.0, None, 0.0, 1.0]
    assert report.functions[0].scores == [1.0, None, 0.0, 1.0]
    assert scored.failures[name] == report.functions[0].failures == 1
    assert "cannot read 'bad'" in scored.first_errors[name] and "cannot read 'bad'" in report.functions[0].first_error


def test_eval_and_training_accuracy_agree_on_the_same_scores():
    # Two prompts x 2 samples; one sample could not be scored. Counted as wrong: (1 + 0 + 0 + 1) / 4.
    scores = [[1.0, None], [0.0, 1.0]]
    [result] = summarize(["aime"] * 2, scores, [[False, False], [False, False]])
    training = mean_accuracy(np.array([1.0, np.nan, 0.0, 1.0]))  # the run's arrays carry NaN for a failure
    assert result.avg_at_k == training == 0.5
    assert result.failures == 1
