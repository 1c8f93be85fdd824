"""Find reward functions by spec, and call them with their results checked.

Example:
    >>> fn = load_reward_function("math", {"require_think_close": True})
    >>> completions = ["<think>...</think> \\\\boxed{82}"]
    >>> score_completions(fn, completions, ["37+45="], ["82"], {"level": [1]})
    [1.0]

The reward contract (as TRL's): ``fn(completions, prompts, answers, **row_fields)`` returns one
``float | None`` per completion; None means "could not score", which the reward pool counts as a
failure, never as 0. Functions must accept and ignore unknown keyword arguments.

Functions written for TRL's GRPOTrainer work unchanged: every argument is passed by keyword
(``completions=``, ``prompts=``, ``answers=``, each row field by its name), so
``fn(completions, **kwargs)`` and ``fn(prompts, completions, answer, **kwargs)`` bind as in TRL.
A function that does not name ``answers`` (TRL's style) also gets TRL's names: ``answer`` (the
reference answers, unless the row has its own ``answer`` field) and ``completion_ids`` (token ids
of each completion, where the caller has them). Completions and prompts are plain strings, as TRL
passes them for a standard (not conversational) dataset. A function whose leading parameters
have other names (``fn(c, p, a, **kw)``) gets completions, prompts and answers positionally.

A spec is one of:
    * a built-in name: a key of ``BUILTIN_REWARDS`` ("exact_match", "math", "gsm8k", ...);
    * ``package.module:function`` (an importable module);
    * ``path/to/file.py:function`` (a file, loaded once per process under a name derived from
      its resolved path). Processes should exchange specs, not function objects: a function
      loaded from a file cannot be pickled by reference into another process.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from grpo_ray.user_code import load_attribute
from grpo_ray.rewards.environment import environment_reward
from grpo_ray.rewards.exact_match import exact_match
from grpo_ray.rewards.format import think_answer_format
from grpo_ray.rewards.gsm8k import first_number, gsm8k
from grpo_ray.rewards.heuristics import (
    gsm8k_answer_format,
    keywords,
    length_words,
    think_tag_diversity,
    tldr_length,
)
from grpo_ray.rewards.http import http_reward
from grpo_ray.rewards.math import math_reward

RewardScores = list[float | None]
# A reward function, plain or `async def`, per the contract in the module docstring.
RewardFn = Callable[..., RewardScores | Awaitable[RewardScores]]

BUILTIN_REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "math": math_reward,
    "gsm8k": gsm8k,
    "first_number": first_number,
    "format": think_answer_format,
    "think_tag_diversity": think_tag_diversity,
    "length_words": length_words,
    "keywords": keywords,
    "gsm8k_answer_format": gsm8k_answer_format,
    "tldr_length": tldr_length,
    "http": http_reward,
    "environment": environment_reward,
}

# Contract arguments: passed by the caller on every call, so never bindable as options.
_CONTRACT_ARGS = ("completions", "prompts", "answers")
# TRL's names for what grpo-ray passes otherwise: given to functions written in TRL's style (see
# the module docstring), and, like the contract arguments, never bindable as options.
_TRL_ARGS = ("answer", "completion_ids")


class RewardSpecError(ValueError):
    """A reward spec or its options cannot be turned into a function; the message is one line."""


class RewardResultError(ValueError):
    """A reward function returned something other than one finite score or None per completion."""


def _resolve(spec: str) -> RewardFn:
    if ":" not in spec:
        if spec in BUILTIN_REWARDS:
            return BUILTIN_REWARDS[spec]
        raise RewardSpecError(
            f"unknown reward {spec!r}; use a built-in ({', '.join(sorted(BUILTIN_REWARDS))}), "
            "'package.module:function' or 'path/to/file.py:function'"
        )
    target = load_attribute(spec, f"reward spec {spec!r}", RewardSpecError)
    if not callable(target):
        raise RewardSpecError(
            f"reward spec {spec!r}: {spec.rpartition(':')[2]!r} is a {type(target).__name__}, not callable; "
            "point the spec at a function"
        )
    return target


def _check_options(spec: str, fn: RewardFn, options: dict[str, Any]) -> None:
    """Every option must be a named keyword parameter of ``fn``.

    Options swallowed by ``**row_fields`` would be silently ignored, so a typo such as
    ``require_think_closed`` is an error at load time, not a quietly different run.
    """
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return  # No introspectable signature (some builtins/extensions): trust the caller.
    accepted = [
        name
        for name, parameter in parameters.items()
        if name not in _CONTRACT_ARGS + _TRL_ARGS
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    ]
    for option in options:
        if option not in accepted:
            raise RewardSpecError(
                f"reward {spec!r} has no option {option!r}; its options are: {', '.join(accepted) or '(none)'}"
            )


def load_reward_function(spec: str, options: dict[str, Any] | None = None) -> RewardFn:
    """Resolve ``spec`` to a reward function, with ``options`` bound as keyword arguments.

    Raises RewardSpecError (a ValueError, one-line message) when the spec cannot be resolved or
    an option is not a keyword parameter of the function.

    >>> load_reward_function("exact_match") is BUILTIN_REWARDS["exact_match"]
    True
    >>> load_reward_function("math", {"accept_unboxed": True}).keywords
    {'accept_unboxed': True}
    """
    if not isinstance(spec, str) or not spec.strip():
        raise RewardSpecError(f"reward spec {spec!r} is empty; name a built-in or a module/file")
    spec = spec.strip()
    fn = _resolve(spec)
    if not options:
        return fn
    _check_options(spec, fn, options)
    return functools.partial(fn, **options)


def _describe(fn: RewardFn) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(inner, "__qualname__", None) or type(inner).__name__


def _short_repr(value: Any) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


def _validate_scores(fn: RewardFn, result: Any, expected: int) -> RewardScores:
    name = _describe(fn)
    if hasattr(result, "tolist") and not isinstance(result, (str, bytes)):
        result = result.tolist()  # NumPy arrays: not a Sequence, but a fine answer.
    if not isinstance(result, Sequence) or isinstance(result, (str, bytes)):
        raise RewardResultError(f"reward {name!r} returned a {type(result).__name__}, expected a list of scores")
    if len(result) != expected:
        raise RewardResultError(f"reward {name!r} returned {len(result)} scores for {expected} completions")
    scores: RewardScores = []
    for index, score in enumerate(result):
        if score is None:
            scores.append(None)
        # numbers.Real covers int, float, bool, Fraction and NumPy scalars; not str or complex.
        elif isinstance(score, numbers.Real) and math.isfinite(float(score)):
            scores.append(float(score))
        else:
            raise RewardResultError(
                f"reward {name!r} score {index} is {_short_repr(score)} "
                f"({type(score).__name__}); scores must be finite real numbers or None"
            )
    return scores


def score_completions(
    fn: RewardFn,
    completions: list[str],
    prompts: list[str],
    answers: list[str],
    row_fields: dict[str, list],
) -> RewardScores:
    """Call ``fn`` per the reward contract and return its checked scores, as floats or None.

    An ``async def`` function (or one returning a coroutine) is run to completion with
    ``asyncio.run``, so this must not be called from inside a running event loop; the reward
    pool calls it from plain worker processes.

    Raises RewardResultError (one-line message) when the result is not a sequence of exactly
    ``len(completions)`` finite real numbers or None. Exceptions raised by ``fn`` propagate.

    >>> score_completions(BUILTIN_REWARDS["exact_match"], ["82", "81"], ["", ""], ["82", "82"], {})
    [1.0, 0.0]
    """
    if not len(completions) == len(prompts) == len(answers):
        # A caller bug, not a reward failure: kept out of RewardResultError on purpose.
        raise ValueError(f"{len(completions)} completions, {len(prompts)} prompts and {len(answers)} answers")
    args, kwargs = contract_arguments(fn, completions, prompts, answers, row_fields)
    result = fn(*args, **kwargs)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return _validate_scores(fn, result, len(completions))


def contract_arguments(
    fn: RewardFn, completions: list[str], prompts: list[str], answers: list[str], row_fields: dict[str, list]
) -> tuple[tuple, dict[str, Any]]:
    """(positional, keyword) arguments for one call of ``fn``: the one place that decides them.

    Everything goes by keyword, so grpo-ray's ``fn(completions, prompts, answers, **row_fields)``
    and TRL's ``fn(completions, **kwargs)`` both bind. ``completion_ids`` in ``row_fields`` is a
    TRL argument (token ids), passed only to TRL-style functions or ones that name it.

    >>> def trl_style(completions, **kwargs): ...
    >>> args, kwargs = contract_arguments(trl_style, ["a"], ["p"], ["1"], {"level": [3]})
    >>> args, sorted(kwargs)
    ((), ['answer', 'answers', 'completions', 'level', 'prompts'])
    >>> def other_names(c, p, a, **row_fields): ...
    >>> contract_arguments(other_names, ["a"], ["p"], ["1"], {})
    ((['a'], ['p'], ['1']), {})
    """
    # Token ids are TRL's argument, not a dataset field: only functions that take it get it.
    fields = {name: values for name, values in row_fields.items() if name != "completion_ids"}
    # The contract's own arguments win over row fields of the same name.
    kwargs: dict[str, Any] = {**fields, "completions": completions, "prompts": prompts, "answers": answers}
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no introspectable signature: the positional contract
        return (completions, prompts, answers), fields
    # Required positional parameters under other names than ours ("fn(c, p, a, **kw)", the
    # positional contract of old) take the contract arguments in order, as they always did.
    unnamed = [
        name
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty and name not in kwargs
    ][: len(_CONTRACT_ARGS)]
    if unnamed and not any(name in parameters for name in _CONTRACT_ARGS):
        return tuple(kwargs.pop(name) for name in _CONTRACT_ARGS[: len(unnamed)]), kwargs
    trl_style = "answers" not in parameters
    trl_values = {"answer": answers, "completion_ids": row_fields.get("completion_ids")}
    for name, value in trl_values.items():
        if value is not None and (trl_style or name in parameters) and name not in kwargs:
            kwargs[name] = value
    return (), kwargs


def takes_completion_ids(fn: RewardFn) -> bool:
    """Whether ``fn`` is given ``completion_ids`` (so the caller should gather them).

    >>> takes_completion_ids(BUILTIN_REWARDS["exact_match"])
    False
    """
    return "completion_ids" in contract_arguments(fn, [], [], [], {"completion_ids": []})[1]
