"""think_answer_format: the "think" and "r1" families, custom regexes, and the registry."""

import doctest
import importlib

import pytest

from grpo_ray.rewards import (
    BUILTIN_REWARDS,
    RewardSpecError,
    load_reward_function,
    score_completions,
    think_answer_format,
)

format_module = importlib.import_module("grpo_ray.rewards.format")

NATALIA_THINKING = "Natalia sold 48 in April.\nIn May half as many: 48/2 = 24.\nSo 48 + 24 = 72."


def score(completion: str, **options) -> float | None:
    return think_answer_format([completion], ["a prompt"], ["72"], **options)[0]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (f"<think>{NATALIA_THINKING}</think>\nNatalia sold 72 clips.", 1.0),  # "." spans lines
        ("<think>48 + 24</think>72", 1.0),  # no space needed before the answer
        ("<think></think>72", 1.0),  # an empty think block is still a block
        (f"<think>{NATALIA_THINKING}</think><answer>72</answer>", 1.0),  # R1 is also "think"
        (f"<think>{NATALIA_THINKING}</think>", 0.0),  # nothing after the block
        (f"<think>{NATALIA_THINKING}</think>  \n\t", 0.0),  # only whitespace after it
        (f"<think>{NATALIA_THINKING} #### 72", 0.0),  # never closed (cut off at max tokens)
        (" <think>48 + 24</think> 72", 0.0),  # must start with <think>, not even a space
        ("So <think>48 + 24</think> 72", 0.0),
        ("48 + 24</think> 72", 0.0),  # template put <think> in the prompt: not this format
        ("72", 0.0),
        ("", 0.0),
    ],
)
def test_think_family(completion, expected):
    assert score(completion) == expected  # "think" is the default
    assert score(completion, pattern="think") == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (f"<think>{NATALIA_THINKING}</think>\n<answer>72</answer>", 1.0),
        ("<think>48 + 24</think><answer>72</answer>", 1.0),  # no whitespace needed between
        ("<think>48 + 24</think><answer>72</answer>\n\n", 1.0),  # trailing whitespace allowed
        ("<think>\n48 + 24\n</think>\n<answer>\n72\n</answer>", 1.0),  # blocks span lines
        ("<think>48 + 24</think><answer>72</answer> Hope this helps!", 0.0),  # text after
        ("<think>48 + 24</think> 72", 0.0),  # the "think" shape, not R1: no answer block
        ("<think>48 + 24</think> The answer: <answer>72</answer>", 0.0),  # text before it
        ("<think>48 + 24</think><answer>72", 0.0),  # answer never closed
        ("<answer>72</answer>", 0.0),  # no thinking
        ("<answer>72</answer><think>48 + 24</think>", 0.0),  # wrong order
        ("", 0.0),
    ],
)
def test_r1_family(completion, expected):
    assert score(completion, pattern="r1") == expected


@pytest.mark.parametrize(
    ("pattern", "completion", "expected"),
    [
        (r"#### -?\d+", "#### 72", 1.0),
        (r"#### -?\d+", "So #### 72", 0.0),  # fullmatch: the whole completion, not a search
        (r"#### -?\d+", "#### 72\n", 0.0),  # ...so no trailing newline either, unless allowed
        (r"#### -?\d+\s*", "#### 72\n", 1.0),
        (r".*#### -?\d+", f"{NATALIA_THINKING}\n#### 72", 1.0),  # DOTALL: ".*" crosses lines
        (r"<answer>\d+</answer>", "<answer>72</answer>", 1.0),
        (r"<answer>\d+</answer>", "<answer>seventy-two</answer>", 0.0),
    ],
)
def test_custom_regex(pattern, completion, expected):
    assert score(completion, pattern=pattern) == expected


def test_invalid_regex_raises_a_one_line_value_error_naming_the_pattern():
    with pytest.raises(ValueError, match=r"format pattern '<answer>\(' .*nor a valid regex") as err:
        score("<answer>72</answer>", pattern="<answer>(")
    assert "\n" not in str(err.value)


def test_scores_are_floats_one_per_completion_and_row_fields_ignored():
    scores = think_answer_format(["<think>a</think> b", "b"], ["", ""], ["", ""], pattern="think", level=[1, 2])
    assert scores == [1.0, 0.0]
    assert all(type(s) is float for s in scores)


# ---- registry ---------------------------------------------------------------------------------


def test_registered_as_format_and_options_are_checked():
    assert BUILTIN_REWARDS["format"] is think_answer_format
    assert load_reward_function("format") is think_answer_format
    fn = load_reward_function("format", {"pattern": "r1"})
    completions = ["<think>a</think><answer>72</answer>", "<think>a</think> 72"]
    assert score_completions(fn, completions, ["", ""], ["72", "72"], {}) == [1.0, 0.0]
    with pytest.raises(RewardSpecError, match="has no option 'patern'; its options are: pattern"):
        load_reward_function("format", {"patern": "r1"})


def test_an_invalid_regex_loads_but_raises_when_called():
    # Options are bound, not run, at load time: the regex is only compiled on the first call.
    fn = load_reward_function("format", {"pattern": "(unclosed"})
    with pytest.raises(ValueError, match="'\\(unclosed'"):
        score_completions(fn, ["x"], [""], [""], {})


def test_docstring_examples_run():
    assert doctest.testmod(format_module).failed == 0
