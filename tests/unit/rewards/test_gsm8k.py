"""gsm8k and extract_gsm8k_answer: hand examples, then GSM8K-style solutions scored end to end."""

import doctest
import importlib

import pytest

from grpo_ray.rewards import (
    BUILTIN_REWARDS,
    RewardSpecError,
    extract_gsm8k_answer,
    gsm8k,
    load_reward_function,
    score_completions,
)
from grpo_ray.rewards.gsm8k import gsm8k_answers_equal

# Not `import grpo_ray.rewards.gsm8k as ...`: that attribute of the package is the re-exported
# function, which shadows the submodule of the same name.
gsm8k_module = importlib.import_module("grpo_ray.rewards.gsm8k")

# Rows in the GSM8K train split's shape: the gold is a worked solution with <<calculator>>
# annotations and a final "#### N" line.
NATALIA_PROMPT = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. How many clips did Natalia sell altogether in April and May?"
)
NATALIA_GOLD = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
    "#### 72"
)
WENG_PROMPT = (
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?"
)
WENG_GOLD = (
    "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
    "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n"
    "#### 10"
)


def score(completion: str, gold: str) -> float | None:
    return gsm8k([completion], ["a prompt"], [gold])[0]


# ---- extract_gsm8k_answer ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 72", "72"),
        (NATALIA_GOLD, "72"),  # the numbers of the working (48, 24, <<48/2=24>>) come before ####
        (WENG_GOLD, "10"),
        ("#### 72 clips", "72"),  # the first number after the marker
        ("#### 72\nWait, no.\n#### 73", "73"),  # the last marker counts
        ("#### $1,234,567.89", "1234567.89"),  # "$" and thousands commas removed
        ("The answer is 72.", "72"),  # no marker: the last number; its trailing period dropped
        ("She pays $1,200.", "1200"),
        ("It takes 3.5 hours.", "3.5"),
        ("The temperature is -4 degrees.", "-4"),
        ("72.0", "72.0"),  # the string is kept; the comparison is numeric
        ("So 10-3", "3"),  # a minus right after a number is subtraction, not a sign
        ("x = 42, y = 7, so x + y = 49", "49"),  # "42, y": a comma before a non-group is text
        ("1, 2, 3", "3"),  # a list, not the number 123
        ("3 molecules of H2O", "3"),  # digits inside a word are not a number
        ("Step 1: 5 apples.\n#### I am not sure", None),  # a marker with no number: no answer
        ("I cannot tell.", None),
        ("", None),
    ],
)
def test_extract_gsm8k_answer(text, expected):
    assert extract_gsm8k_answer(text) == expected


@pytest.mark.parametrize(
    ("predicted", "gold", "expected"),
    [
        ("72", "72", True),
        ("72.0", "72", True),
        ("72.0000001", "72", True),  # 1e-7 apart: within the 1e-6 tolerance
        ("72.001", "72", False),
        ("-5", "5", False),
        ("0.5", "0.50", True),
    ],
)
def test_gsm8k_answers_equal(predicted, gold, expected):
    assert gsm8k_answers_equal(predicted, gold) is expected


# ---- gsm8k: scores ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (
            "In May she sold 48 / 2 = 24 clips. Altogether she sold 48 + 24 = 72 clips.\n#### 72",
            1.0,
        ),
        ("In May she sold 24 clips, so altogether 48 + 24 = 72.", 1.0),  # no marker: last number
        ("<think>48/2 = 24, 48 + 24 = 72</think>\nNatalia sold 72 clips.", 1.0),
        ("#### 72.0", 1.0),
        ("She sold 48 + 24 = 72 clips in April and May.\n#### 74", 0.0),  # the marker wins
        ("In May she sold half of 48, which is 24.", 0.0),  # stopped one step short
        ("#### 72\n\nOr maybe 71", 1.0),  # the first number after the last marker, not the last
        ("She sold clips in April and May.", 0.0),  # no number at all: no answer
        ("", 0.0),
    ],
)
def test_natalia(completion, expected):
    assert score(completion, NATALIA_GOLD) == expected


def test_more_gsm8k_style_rows():
    completions = [
        "12 dollars an hour is 12/60 = $0.20 a minute, so 50 minutes earn 0.2 x 50 = $10.",
        "Weng earns $12 per hour, so for 50 minutes she earns 12 x 50 / 60 = $10.00",
        "She earns 12 * 50 = $600.\n#### 600",
        "James writes 3 pages x 2 friends = 6 pages twice a week, 12 a week, so 12 x 52 = 624.",
    ]
    golds = [WENG_GOLD, WENG_GOLD, WENG_GOLD, "He writes 3*2=<<3*2=6>>6 pages...\n#### 624"]
    assert gsm8k(completions, [WENG_PROMPT] * 3 + ["James?"], golds) == [1.0, 1.0, 0.0, 1.0]


def test_bare_number_golds():
    assert score("The total cost is $1,200.", "1200") == 1.0
    assert score("The total cost is $1,200.", "$1,200") == 1.0
    assert score("It is 72", "72.0") == 1.0
    assert score("It is -3", "-3") == 1.0
    assert score("It is 3", "-3") == 0.0


@pytest.mark.parametrize("gold", ["", "no number here", "#### ", "#### seventy-two"])
def test_gold_without_a_number_scores_none(gold):
    # The row is broken, not the completion: None (a failure), never a 0 that would train on it.
    assert score("#### 72", gold) is None


def test_scores_are_floats_one_per_completion_and_row_fields_ignored():
    scores = gsm8k(
        ["#### 72", "#### 71", "#### 72"],
        [NATALIA_PROMPT] * 3,
        [NATALIA_GOLD, NATALIA_GOLD, "broken"],
        data_source=["gsm8k"] * 3,
        split=["train"] * 3,
    )
    assert scores == [1.0, 0.0, None]
    assert all(type(s) is float for s in scores[:2])


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        gsm8k(["#### 72", "#### 72"], ["", ""], ["72"])


# ---- registry ---------------------------------------------------------------------------------


def test_registered_and_round_trips_through_the_registry():
    assert BUILTIN_REWARDS["gsm8k"] is gsm8k
    fn = load_reward_function("gsm8k")
    assert fn is gsm8k
    scores = score_completions(fn, ["#### 72", "71"], [NATALIA_PROMPT] * 2, [NATALIA_GOLD] * 2, {"level": [1, 1]})
    assert scores == [1.0, 0.0]


def test_has_no_options():
    with pytest.raises(RewardSpecError, match="has no option 'tolerance'"):
        load_reward_function("gsm8k", {"tolerance": 0.1})


def test_docstring_examples_run():
    assert doctest.testmod(gsm8k_module).failed == 0
