"""Registry: resolving specs, binding options, and checking what reward functions return."""

import doctest
import functools
import importlib
import math
import sys
import textwrap

import pytest

from grpo_ray.rewards import (
    BUILTIN_REWARDS,
    RewardResultError,
    RewardSpecError,
    exact_match,
    load_reward_function,
    math_reward,
    score_completions,
)

registry_module = importlib.import_module("grpo_ray.rewards.registry")


def write_reward_file(tmp_path, body: str, name: str = "my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def assert_one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and message, message
    return message


def call(fn, completions, answers=None, **row_fields):
    answers = answers if answers is not None else ["x"] * len(completions)
    return score_completions(fn, completions, [""] * len(completions), answers, row_fields)


# ---- resolving specs ---------------------------------------------------------------------------


def test_builtins_are_registered_by_name():
    assert {"exact_match": exact_match, "math": math_reward}.items() <= BUILTIN_REWARDS.items()
    assert load_reward_function("exact_match") is exact_match
    assert load_reward_function(" math ") is math_reward


def test_file_spec_loads_the_function(tmp_path):
    path = write_reward_file(
        tmp_path,
        """
        def length_reward(completions, prompts, answers, **row_fields):
            return [float(len(c)) for c in completions]
        """,
    )
    fn = load_reward_function(f"{path}:length_reward")
    assert call(fn, ["ab", "abcd"]) == [2.0, 4.0]
    # The same file loads once: a second load returns the same function object.
    assert load_reward_function(f"{path}:length_reward") is fn


def test_files_with_the_same_stem_do_not_collide(tmp_path):
    for folder, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / folder).mkdir()
        write_reward_file(
            tmp_path / folder,
            f"def r(completions, prompts, answers, **_):\n    return [{value}] * len(completions)",
            name="reward.py",
        )
    fn_a = load_reward_function(f"{tmp_path}/a/reward.py:r")
    fn_b = load_reward_function(f"{tmp_path}/b/reward.py:r")
    assert (call(fn_a, ["x"]), call(fn_b, ["x"])) == ([1.0], [2.0])


def test_module_spec_loads_the_function(tmp_path, monkeypatch):
    write_reward_file(
        tmp_path,
        """
        class Scorers:
            @staticmethod
            def half(completions, prompts, answers, **_):
                return [0.5] * len(completions)

        def always_one(completions, prompts, answers, **_):
            return [1.0] * len(completions)
        """,
        name="my_reward_pkg_mod.py",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_reward_pkg_mod", raising=False)
    assert call(load_reward_function("my_reward_pkg_mod:always_one"), ["a", "b"]) == [1.0, 1.0]
    assert call(load_reward_function("my_reward_pkg_mod:Scorers.half"), ["a"]) == [0.5]
    # An installed package's function works the same way.
    assert load_reward_function("grpo_ray.rewards.math:math_reward") is math_reward


def test_unknown_name_lists_the_builtins():
    with pytest.raises(RewardSpecError) as error:
        load_reward_function("exact_mtach")
    message = assert_one_line(error)
    assert "'exact_mtach'" in message and "exact_match" in message and "math" in message


@pytest.mark.parametrize(
    ("spec", "expected_in_message"),
    [
        ("{tmp}/missing.py:fn", "not found"),
        ("no_such_module_xyz:fn", "not importable"),
        ("{tmp}/my_reward.py:nope", "no attribute 'nope'"),
        ("{tmp}/my_reward.py:NOT_CALLABLE", "not callable"),
        ("{tmp}/broken.py:fn", "ZeroDivisionError"),
        (":fn", "needs both parts"),
        ("{tmp}/my_reward.py:", "needs both parts"),
        ("", "empty"),
    ],
)
def test_bad_specs_raise_one_line_errors(tmp_path, spec, expected_in_message):
    write_reward_file(tmp_path, "NOT_CALLABLE = 3\ndef fn(completions, **_): return []\n")
    write_reward_file(tmp_path, "1 / 0\n", name="broken.py")
    spec = spec.format(tmp=tmp_path)
    with pytest.raises(RewardSpecError) as error:
        load_reward_function(spec)
    message = assert_one_line(error)
    assert expected_in_message in message
    assert isinstance(error.value, ValueError)
    if spec:
        assert repr(spec) in message  # every message names the spec


def test_a_file_that_failed_to_import_is_not_left_half_loaded(tmp_path):
    path = write_reward_file(tmp_path, "1 / 0\n", name="broken.py")
    with pytest.raises(RewardSpecError):
        load_reward_function(f"{path}:fn")
    assert not [name for name in sys.modules if name.startswith("_grpo_ray_reward_broken")]


# ---- options -----------------------------------------------------------------------------------


def test_options_are_bound_with_partial():
    fn = load_reward_function("math", {"require_think_close": True})
    assert isinstance(fn, functools.partial) and fn.func is math_reward
    assert fn.keywords == {"require_think_close": True}
    assert call(fn, [r"\boxed{4}", r"<think></think>\boxed{4}"], ["4", "4"]) == [0.0, 1.0]


def test_unknown_option_for_a_builtin_names_it():
    # math_reward has **_row_fields, yet a typo must not vanish into it.
    with pytest.raises(RewardSpecError) as error:
        load_reward_function("math", {"require_think_closed": True})
    message = assert_one_line(error)
    assert "'require_think_closed'" in message and "require_think_close" in message


@pytest.mark.parametrize("option", ["completions", "answers", "prompts"])
def test_contract_arguments_are_not_options(option):
    with pytest.raises(RewardSpecError):
        load_reward_function("exact_match", {option: []})


def test_options_for_a_file_function(tmp_path):
    path = write_reward_file(
        tmp_path,
        """
        def scaled(completions, prompts, answers, *, scale=1.0, **_):
            return [scale] * len(completions)
        """,
    )
    assert call(load_reward_function(f"{path}:scaled", {"scale": 2.5}), ["a"]) == [2.5]
    with pytest.raises(RewardSpecError, match="'scal'"):
        load_reward_function(f"{path}:scaled", {"scal": 2.5})


# ---- checking results --------------------------------------------------------------------------


def returning(value):
    def reward(completions, prompts, answers, **_):
        return value

    return reward


@pytest.mark.parametrize(
    ("result", "expected_in_message"),
    [
        ([1.0], "1 scores for 2 completions"),
        ([1.0, 2.0, 3.0], "3 scores for 2 completions"),
        ([1.0, math.nan], "score 1 is nan"),
        ([math.inf, 1.0], "score 0 is inf"),
        ([1.0, "1.0"], "score 1 is '1.0' (str)"),
        ([1.0, 1j], "complex"),
        ("10", "returned a str"),
        (1.0, "returned a float"),
        (None, "returned a NoneType"),
        ({0: 1.0, 1: 1.0}, "returned a dict"),
    ],
)
def test_bad_results_raise_one_line_errors(result, expected_in_message):
    with pytest.raises(RewardResultError) as error:
        call(returning(result), ["a", "b"])
    message = assert_one_line(error)
    assert expected_in_message in message and "'returning.<locals>.reward'" in message


def test_none_and_real_numbers_pass_as_floats():
    from fractions import Fraction

    scores = call(returning([None, 1, True, Fraction(1, 4), -0.5]), ["a"] * 5)
    assert scores == [None, 1.0, 1.0, 0.25, -0.5]
    assert [type(s) for s in scores] == [type(None), float, float, float, float]
    assert call(returning((0.0, None)), ["a", "b"]) == [0.0, None]  # a tuple is fine too


def test_row_fields_are_passed_as_keyword_arguments():
    def reward(completions, prompts, answers, *, weight, **_):
        return [w for w in weight]

    assert call(reward, ["a", "b"], weight=[0.1, 0.2], other=[1, 2]) == [0.1, 0.2]


def test_async_reward_functions_are_run_to_completion(tmp_path):
    path = write_reward_file(
        tmp_path,
        """
        import asyncio

        async def judged(completions, prompts, answers, *, bonus=0.0, **_):
            await asyncio.sleep(0)
            return [1.0 + bonus if c == a else None for c, a in zip(completions, answers)]

        async def too_short(completions, prompts, answers, **_):
            return []
        """,
    )
    fn = load_reward_function(f"{path}:judged", {"bonus": 0.5})
    assert call(fn, ["a", "b"], ["a", "x"]) == [1.5, None]
    # The awaited result of an async function is validated like any other.
    with pytest.raises(RewardResultError, match="0 scores for 1 completions"):
        call(load_reward_function(f"{path}:too_short"), ["a"])


def test_mismatched_inputs_are_a_caller_error():
    with pytest.raises(ValueError) as error:
        score_completions(exact_match, ["a", "b"], ["p"], ["a", "b"], {})
    assert not isinstance(error.value, RewardResultError)


def test_exceptions_from_the_reward_function_propagate():
    def reward(completions, prompts, answers, **_):
        raise KeyError("boom")

    with pytest.raises(KeyError):
        call(reward, ["a"])


def test_docstring_examples_run():
    assert doctest.testmod(registry_module).failed == 0
