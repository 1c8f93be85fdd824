"""Heuristic rewards: each branch worked by hand, then the registry round trip with options."""

import doctest
import importlib

import pytest

from grpo_ray.rewards import (
    BUILTIN_REWARDS,
    RewardSpecError,
    gsm8k_answer_format,
    keywords,
    length_words,
    load_reward_function,
    score_completions,
    think_tag_diversity,
    tldr_length,
)

heuristics_module = importlib.import_module("grpo_ray.rewards.heuristics")

NATALIA_GOLD = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
    "#### 72"
)


def one(fn, completion: str, answer: str = "", **options) -> float | None:
    return fn([completion], ["a prompt"], [answer], **options)[0]


# ---- think_tag_diversity ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        # Both tags: 0.7. Distinct characters < t h i n k > / = 8 of 15: 0.3 * 8/15 = 0.16.
        ("<think></think>", 0.86),
        # No tags; 1 distinct of 4: 0.3 * 0.25.
        ("aaaa", 0.075),
        # No tags; all 4 distinct: 0.3 * 1.
        ("abcd", 0.3),
        # "</think>" alone is no "<think>": no tag bonus; < / t h i n k > a b c all distinct.
        ("</think>abc", 0.3),
        # Both tags, in the wrong order, still count (presence only); all 15 characters of
        # "</think><think>" give 8 distinct: 0.7 + 0.16 again.
        ("</think><think>", 0.86),
        # Empty: no tags, diversity 0 by definition (not 0/0).
        ("", 0.0),
    ],
)
def test_think_tag_diversity(completion, expected):
    assert one(think_tag_diversity, completion) == pytest.approx(expected)


def test_think_tag_diversity_weights():
    # "<think>ab</think>": 17 characters, distinct < t h i n k > a b / = 10.
    completion = "<think>ab</think>"
    assert one(think_tag_diversity, completion, tag_weight=1.0, diversity_weight=0.0) == 1.0
    assert one(think_tag_diversity, completion, tag_weight=0.0, diversity_weight=1.0) == (pytest.approx(10 / 17))


# ---- length_words -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (" ".join(["clip"] * 100), 1.0),
        (" ".join(["clip"] * 50), 0.5),
        (" ".join(["clip"] * 150), 1.0),  # capped at 1
        ("  Natalia\n\tsold   72 clips.  ", 0.04),  # any whitespace separates: 4 words
        ("", 0.0),
        ("   \n", 0.0),
    ],
)
def test_length_words(completion, expected):
    assert one(length_words, completion) == pytest.approx(expected)


def test_length_words_target():
    assert one(length_words, "Natalia sold 72 clips.", target_words=4) == 1.0
    assert one(length_words, "sold 72 clips", target_words=4) == 0.75
    with pytest.raises(ValueError, match="target_words must be positive"):
        one(length_words, "x", target_words=0)


# ---- keywords ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("The weather today.", 0.5),  # nothing present: the base
        ("This summary is GOOD.", 0.7),  # case-insensitive: 0.5 + 0.2
        ("Good and clear.", 0.9),  # two positives: 0.5 + 0.4
        ("good, good, good", 0.7),  # each keyword counts once
        ("Goodness me", 0.7),  # a substring, not a word match
        ("That was bad.", 0.3),  # a negative: 0.5 - 0.2
        ("Good, but bad.", 0.5),  # one of each cancels
        ("Clear, good, but wrong and bad.", 0.5),  # two of each: 0.5 + 0.4 - 0.4
    ],
)
def test_keywords(completion, expected):
    options = {"positive": ["good", "clear"], "negative": ["bad", "wrong"]}
    assert one(keywords, completion, **options) == pytest.approx(expected)


def test_keywords_are_clipped_to_the_unit_interval():
    # 0.5 + 4 * 0.2 = 1.3 -> 1.0; 0.5 - 3 * 0.2 = -0.1 -> 0.0.
    assert one(keywords, "a b c d", positive=["a", "b", "c", "d"]) == 1.0
    assert one(keywords, "x y z", negative=["x", "y", "z"]) == 0.0


def test_keywords_without_options_is_the_base():
    assert keywords(["anything", ""], ["", ""], ["", ""]) == [0.5, 0.5]


def test_keywords_base_and_step():
    assert one(keywords, "yes", positive=["yes"], base=0.0, step=0.5) == 0.5
    assert one(keywords, "no", negative=["no"], base=1.0, step=0.25) == 0.75


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"positive": "good"}, "positive must be a list of strings"),  # would be "g", "o", ...
        ({"negative": ["bad", ""]}, "negative contains an empty keyword"),  # in every text
    ],
)
def test_keywords_config_mistakes_raise(options, message):
    with pytest.raises(ValueError, match=message):
        one(keywords, "good", **options)


# ---- gsm8k_answer_format ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        # The four cases. Right (+1) and R1 format (+1.25).
        ("<think>48/2 = 24, 48 + 24 = 72</think>\n<answer>72</answer>", 2.25),
        # Right (+1), no answer block so not R1 (-1): the last number of the whole text is read.
        ("<think>48/2 = 24, 48 + 24 = 72</think>\nNatalia sold 72 clips.", 0.0),
        # Wrong (-1) and R1 format (+1.25).
        ("<think>48/2 = 24, 48 + 24 = 71</think>\n<answer>71</answer>", 0.25),
        # Wrong (-1) and not R1 (-1).
        ("Natalia sold 48 + 48 = 96 clips.", -2.0),
        # Which answer is read: the answer block, not the thinking. 72 in the thinking, 71 answered:
        # -1 + 1.25.
        ("<think>It is 72.</think><answer>71</answer>", 0.25),
        # ...and the other way round: 71 in the thinking, 72 answered: +1 + 1.25.
        ("<think>Maybe 71? No.</think><answer>72</answer>", 2.25),
        # Missing answer counts as wrong: -1 + 1.25.
        ("<think>Not sure.</think><answer>I don't know</answer>", 0.25),
        # A GSM8K-style answer block: "$", commas and "####" are understood. +1 + 1.25.
        ("<think>48 + 24</think><answer>#### $72.</answer>", 2.25),
        # An answer block with text after it: right (+1) but not R1 (-1).
        ("<think>48 + 24</think><answer>72</answer> Hope this helps!", 0.0),
        # No thinking: right (+1) but not R1 (-1).
        ("<answer>72</answer>", 0.0),
        # Nothing: missing (-1), not R1 (-1).
        ("", -2.0),
    ],
)
def test_gsm8k_answer_format(completion, expected):
    assert one(gsm8k_answer_format, completion, NATALIA_GOLD) == expected


def test_gsm8k_answer_format_gold_without_a_number_scores_none():
    assert one(gsm8k_answer_format, "<think>x</think><answer>72</answer>", "n/a") is None


# ---- tldr_length ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("x" * 20, 0.0),
        ("Cat sat on the mat.", -1.0),  # 3+1+3+1+2+1+3+1+4 = 19 characters
        ("Cat sat on the mat, then slept.", -11.0),  # 31 characters
        ("x" * 15, -5.0),  # too short costs as much as too long
        ("x" * 25, -5.0),
        ("", -20.0),
    ],
)
def test_tldr_length(completion, expected):
    assert one(tldr_length, completion) == expected


def test_tldr_length_counts_characters_not_bytes_and_target():
    assert one(tldr_length, "café", target_chars=4) == 0.0  # 5 bytes in UTF-8, 4 characters
    assert one(tldr_length, "hello world", target_chars=5) == -6.0


# ---- registry ---------------------------------------------------------------------------------

HEURISTICS = {
    "think_tag_diversity": think_tag_diversity,
    "length_words": length_words,
    "keywords": keywords,
    "gsm8k_answer_format": gsm8k_answer_format,
    "tldr_length": tldr_length,
}


@pytest.mark.parametrize("name", sorted(HEURISTICS))
def test_registered_and_round_trip_through_the_registry(name):
    assert BUILTIN_REWARDS[name] is HEURISTICS[name]
    fn = load_reward_function(name)
    assert fn is HEURISTICS[name]
    completions = ["<think>48 + 24</think><answer>72</answer>", "72", ""]
    scores = score_completions(fn, completions, [""] * 3, [NATALIA_GOLD] * 3, {"level": [1] * 3})
    assert len(scores) == 3 and all(type(s) is float for s in scores)


@pytest.mark.parametrize(
    ("name", "options", "completion", "expected"),
    [
        ("keywords", {"positive": ["good"]}, "A good summary.", 0.7),
        ("keywords", {"negative": ["bad"], "base": 1.0, "step": 0.5}, "bad", 0.5),
        ("think_tag_diversity", {"tag_weight": 1.0, "diversity_weight": 0.0}, "<think></think>", 1),
        ("length_words", {"target_words": 2}, "two words", 1.0),
        ("tldr_length", {"target_chars": 3}, "abcde", -2.0),
    ],
)
def test_options_bind_through_the_registry(name, options, completion, expected):
    fn = load_reward_function(name, options)
    assert score_completions(fn, [completion], [""], [""], {}) == [pytest.approx(expected)]


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("keywords", {"postive": ["good"]}, "has no option 'postive'"),
        ("length_words", {"target": 50}, "has no option 'target'"),
        ("tldr_length", {"target_words": 20}, "has no option 'target_words'"),
        ("think_tag_diversity", {"weight": 1.0}, "has no option 'weight'"),
        ("gsm8k_answer_format", {"format_bonus": 1.0}, r"its options are: \(none\)"),
    ],
)
def test_misspelt_options_are_rejected_at_load(name, options, message):
    with pytest.raises(RewardSpecError, match=message):
        load_reward_function(name, options)


def test_docstring_examples_run():
    assert doctest.testmod(heuristics_module).failed == 0
