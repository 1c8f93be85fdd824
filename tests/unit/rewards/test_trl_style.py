"""Reward functions written for TRL work unchanged: every argument goes by keyword.

TRL's GRPOTrainer calls ``reward_func(prompts=..., completions=..., completion_ids=..., **columns)``;
grpo-ray's contract is ``fn(completions, prompts, answers, **row_fields)``. The same rows are
scored with one function of each style, in this process and in the subprocess sandbox, and must
get the same scores.
"""

import textwrap

import numpy as np
import pytest

from grpo_ray.actors.reward import RewardFunctionSetting, RewardIsolation, RewardWorker, completion_token_ids
from grpo_ray.rewards import load_reward_function, score_completions
from grpo_ray.rewards.registry import RewardSpecError, contract_arguments, takes_completion_ids
from grpo_ray.rewards.sandbox import SandboxedScorer
from grpo_ray.types import RolloutSlice

# The founding notes' reward_func(completions, **kwargs) (it used to fail with "TypeError: ...
# takes 1 positional argument but 3 were given"), a TRL tutorial's (prompts, completions, answer,
# **kwargs), and grpo-ray's own style: each scores 1 where the completion ends with the answer,
# plus 0.5 x the row's "bonus" field.
REWARDS = """
def trl_style(completions, **kwargs):
    return [float(c.endswith(a)) + 0.5 * b for c, a, b in zip(completions, kwargs["answer"], kwargs["bonus"])]

def trl_tutorial(prompts, completions, answer, **kwargs):
    assert len(prompts) == len(completions)
    return [float(c.endswith(a)) + 0.5 * b for c, a, b in zip(completions, answer, kwargs["bonus"])]

def grpo_style(completions, prompts, answers, **row_fields):
    return [float(c.endswith(a)) + 0.5 * b for c, a, b in zip(completions, answers, row_fields["bonus"])]

def old_names(c, p, a, **row_fields):
    return [float(x.endswith(y)) + 0.5 * b for x, y, b in zip(c, a, row_fields["bonus"])]

def token_count(completions, completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]
"""
COMPLETIONS = ["so 82", "so 81", "72", ""]
PROMPTS = ["37+45=", "37+45=", "48+24=", "1+1="]
ANSWERS = ["82", "82", "72", "2"]
FIELDS = {"bonus": [0, 1, 1, 0]}
# Ends with the answer: 1, 0, 1, 0; plus 0.5 x bonus 0, 1, 1, 0.
EXPECTED = [1.0, 0.5, 1.5, 0.0]
STYLES = ["trl_style", "trl_tutorial", "grpo_style", "old_names"]


@pytest.fixture(scope="module")
def rewards_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("trl") / "rewards.py"
    path.write_text(textwrap.dedent(REWARDS))
    return path


@pytest.mark.parametrize("style", STYLES)
def test_every_style_scores_the_same_rows_in_process(rewards_file, style):
    fn = load_reward_function(f"{rewards_file}:{style}")
    assert score_completions(fn, COMPLETIONS, PROMPTS, ANSWERS, FIELDS) == EXPECTED


def test_every_style_scores_the_same_rows_in_the_sandbox(rewards_file):
    specs = [(f"{rewards_file}:{style}", {}) for style in STYLES]
    with SandboxedScorer(specs, num_processes=1, timeout_s=30) as scorer:
        results = scorer.score_many(COMPLETIONS, PROMPTS, ANSWERS, FIELDS)
    assert [r.scores for r in results] == [EXPECTED] * len(STYLES)
    assert [r.error for r in results] == [None] * len(STYLES)


def test_trl_names_reach_only_functions_written_for_them(rewards_file):
    trl = load_reward_function(f"{rewards_file}:trl_style")
    grpo = load_reward_function(f"{rewards_file}:grpo_style")
    fields = {**FIELDS, "completion_ids": [[1], [2], [3], [4]]}
    _, trl_kwargs = contract_arguments(trl, COMPLETIONS, PROMPTS, ANSWERS, fields)
    _, grpo_kwargs = contract_arguments(grpo, COMPLETIONS, PROMPTS, ANSWERS, fields)
    assert trl_kwargs["answer"] == ANSWERS and trl_kwargs["completion_ids"] == [[1], [2], [3], [4]]
    # grpo-ray's style (it names `answers`) gets exactly what it always got: nothing for the
    # http reward to forward, no token ids to pickle.
    assert set(grpo_kwargs) == {"completions", "prompts", "answers", "bonus"}
    assert takes_completion_ids(trl) and not takes_completion_ids(grpo)


def test_a_row_field_never_replaces_a_contract_argument(rewards_file):
    fn = load_reward_function(f"{rewards_file}:grpo_style")
    _, kwargs = contract_arguments(fn, COMPLETIONS, PROMPTS, ANSWERS, {**FIELDS, "completions": ["x"] * 4})
    assert kwargs["completions"] == COMPLETIONS


def test_trl_argument_names_are_not_options(rewards_file):
    with pytest.raises(RewardSpecError, match="has no option 'answer'"):
        load_reward_function(f"{rewards_file}:trl_tutorial", {"answer": ["1"]})


def _slice_with_tokens() -> RolloutSlice:
    # Two rows of 5 positions: prompt ids then completion ids (mask 1), right-padded with 0.
    input_ids = np.array([[7, 8, 11, 12, 0], [7, 9, 13, 14, 15]], dtype=np.int64)
    completion_mask = np.array([[0, 0, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=np.float32)
    return RolloutSlice(
        group_ids=np.arange(2),
        prompt_uids=np.arange(2),
        input_ids=input_ids,
        attention_mask=(input_ids > 0).astype(np.int64),
        completion_mask=completion_mask,
        rollout_logprobs=np.zeros((2, 5), dtype=np.float32),
        prompts=["a", "b"],
        completions=["xy", "xyz"],
        answers=["", ""],
        finish_reasons=["stop", "length"],
        row_fields={"bonus": [0, 1]},
        policy_versions=np.zeros(2, dtype=np.int64),
        group_diversity=np.zeros(2),
    )


def test_completion_ids_are_the_generated_tokens():
    assert completion_token_ids(_slice_with_tokens()) == [[11, 12], [13, 14, 15]]


@pytest.mark.parametrize("mode", ["none", "subprocess"])
def test_reward_worker_gives_trl_functions_their_token_ids(rewards_file, mode):
    worker = RewardWorker(
        [RewardFunctionSetting(f"{rewards_file}:token_count", 1.0, {})], RewardIsolation(mode, 1, 30.0)
    )
    try:
        scored = worker.score(_slice_with_tokens())
    finally:
        worker.close()
    assert scored.rewards.tolist() == [2.0, 3.0]
