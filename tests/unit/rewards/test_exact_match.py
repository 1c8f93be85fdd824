"""exact_match: the reward of the tiny arithmetic task ("37+45=" -> "82")."""

import doctest
import importlib

import pytest

from grpo_ray.rewards import exact_match
from grpo_ray.rewards.exact_match import strip_completion

# Not `import grpo_ray.rewards.exact_match as ...`: that attribute of the package is the
# re-exported function, which shadows the submodule of the same name.
exact_match_module = importlib.import_module("grpo_ray.rewards.exact_match")


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("82", 1.0),
        ("  82\n", 1.0),  # surrounding whitespace is formatting, not the answer
        ("82<|im_end|>", 1.0),  # end-of-turn marker left by the chat template
        ("82 <|im_end|>\n", 1.0),
        ("82<|im_end|><|endoftext|>", 1.0),  # stacked markers
        ("82.", 0.0),  # exact means exact: the task asks for the bare number
        ("8 2", 0.0),
        ("The answer is 82", 0.0),
        ("<|im_end|>82", 0.0),  # only a trailing marker is stripped
        ("", 0.0),
        ("<|im_end|>", 0.0),
    ],
)
def test_exact_match_cases(completion, expected):
    assert exact_match([completion], ["37+45="], ["82"]) == [expected]


def test_answer_is_stripped_too():
    assert exact_match(["82"], ["37+45="], [" 82\n"]) == [1.0]


def test_one_score_per_completion_and_unknown_fields_ignored():
    scores = exact_match(
        ["82", "81", "82"],
        ["37+45=", "37+45=", "40+42="],
        ["82", "82", "82"],
        difficulty=[1, 1, 2],
        source=["a", "b", "c"],
    )
    assert scores == [1.0, 0.0, 1.0]
    assert all(type(score) is float for score in scores)


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        exact_match(["82", "82"], ["37+45="], ["82"])


def test_strip_completion_keeps_inner_text():
    assert strip_completion(" a <|im_end|> b ") == "a <|im_end|> b"


def test_docstring_examples_run():
    assert doctest.testmod(exact_match_module).failed == 0
