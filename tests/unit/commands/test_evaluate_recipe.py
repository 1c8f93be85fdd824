"""`grpo-ray eval --config` (commands/evaluate_recipe.py) on hand-made inputs: the options typed
become the recipe's fields, what it prints of a report, its episode figures. The command itself
runs in tests/integration/test_eval_command.py."""

from pathlib import Path

import numpy as np
import pytest

from grpo_ray.commands.evaluate_recipe import RecipeEvalReport, episode_metrics, heldout_only, recipe_overrides
from grpo_ray.config import ConfigError, load_config
from grpo_ray.types import ScoredSlice

TINY_TOOLS = Path(__file__).resolve().parents[3] / "configs" / "tiny-tools.yaml"


def test_the_options_typed_set_the_recipes_fields(tmp_path):
    given = {"model": "runs/tiny-tools/model", "data": ("a.jsonl", "b c.jsonl"), "n": 2, "temperature": 0.5}
    given |= {"backend": "vllm", "max_tokens": 9, "limit": 10, "seed": 3, "tracking_uri": "sqlite:///x.db"}
    cfg = load_config(TINY_TOOLS, recipe_overrides(given, str(tmp_path / "eval")))
    assert cfg.model.path == str(Path("runs/tiny-tools/model").absolute())
    assert cfg.data.eval_files == (str(Path("a.jsonl").absolute()), str(Path("b c.jsonl").absolute()))
    assert (cfg.train.eval_samples, cfg.train.eval_temperature, cfg.rollout.backend) == (2, 0.5, "vllm")
    assert (cfg.rollout.max_new_tokens, cfg.data.eval_limit, cfg.seed) == (9, 10, 3)
    assert cfg.output_dir == str(tmp_path / "eval")
    # What was not typed is the recipe's.
    assert cfg.environment.spec.endswith("examples/agents/calculator.py:Calculator")
    assert load_config(TINY_TOOLS, recipe_overrides({}, "out")).train.eval_samples == 4


@pytest.mark.parametrize("option, words", [("reward", "--reward: with --config"), ("yarn_factor", "--yarn-factor")])
def test_an_option_the_recipe_has_no_field_for_is_refused_by_name(option, words):
    with pytest.raises(ConfigError, match=words):
        recipe_overrides({option: "x"}, "out")


def test_named_eval_files_are_read_without_the_training_files():
    cfg = load_config(TINY_TOOLS)
    assert heldout_only(cfg).data.train_files == cfg.data.eval_files == ("tiny-tools:heldout",)
    split = load_config(TINY_TOOLS, ["data.eval_files=[]"])
    assert heldout_only(split) is split  # the validation split is cut from the training files


def scored_episodes() -> ScoredSlice:
    # Four episodes: turns 2, 1, 2, 1 (mean 1.5); tool calls 1, 0, 2, 0 (0.75); one tool error (0.25).
    return ScoredSlice(
        group_ids=np.zeros(4, dtype=np.int64),
        prompt_uids=np.zeros(4, dtype=np.int64),
        rewards=np.array([1.0, 0.0, 1.0, 0.0]),
        per_function={"exact_match": np.array([1.0, 0.0, 1.0, 0.0])},
        failures={"exact_match": 0},
        first_errors={},
        completion_lengths=np.ones(4, dtype=np.int64),
        truncated=np.zeros(4, dtype=bool),
        group_diversity=np.ones(4),
        episode_stats={
            "turns": np.array([2.0, 1.0, 2.0, 1.0]),
            "tool_calls": np.array([1.0, 0.0, 2.0, 0.0]),
            "tool_errors": np.array([0.0, 0.0, 1.0, 0.0]),
            "failed": np.array([0.0, 0.0, 0.0, 1.0]),
        },
    )


def test_episode_figures_are_means_per_sample_and_printed():
    metrics = {"eval/accuracy": 0.5, **episode_metrics(scored_episodes())}
    assert metrics["eval/episode/turns"] == 1.5 and metrics["eval/episode/tool_calls"] == 0.75
    report = RecipeEvalReport(2, 2, True, metrics, Path("s.jsonl"), "run", "sqlite:///m.db")
    assert report.lines() == [
        "held-out accuracy 0.500 (avg@2 over 2 prompts)",
        "episodes: 1.50 turns, 0.75 tool calls, 0.25 tool errors per sample; 1 failed (the environment's error)",
    ]
    single = RecipeEvalReport(1, 4, False, {"eval/accuracy": 0.25, "eval/accuracy/gsm8k": 0.5}, Path("s"), "r", "u")
    assert single.lines() == ["held-out accuracy 0.250 (avg@1 over 4 prompts)", "  gsm8k: 0.500"]
