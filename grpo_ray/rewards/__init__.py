"""Reward functions: the built-ins, the registry that loads them by spec, and the checked call.

Example:
    >>> from grpo_ray.rewards import load_reward_function, score_completions
    >>> fn = load_reward_function("exact_match")
    >>> score_completions(fn, ["82", "83"], ["37+45=", "37+45="], ["82", "82"], {})
    [1.0, 0.0]

Everything here is pure Python (no Ray, torch, vLLM or DeepSpeed), so the reward pool's worker
processes import it cheaply and it is tested on CPU.
"""

from grpo_ray.rewards.exact_match import exact_match
from grpo_ray.rewards.format import think_answer_format
from grpo_ray.rewards.gsm8k import extract_gsm8k_answer, first_number, gsm8k
from grpo_ray.rewards.heuristics import (
    gsm8k_answer_format,
    keywords,
    length_words,
    think_tag_diversity,
    tldr_length,
)
from grpo_ray.rewards.http import http_reward
from grpo_ray.rewards.math import last_boxed_answer, math_reward
from grpo_ray.rewards.registry import (
    BUILTIN_REWARDS,
    RewardFn,
    RewardResultError,
    RewardScores,
    RewardSpecError,
    load_reward_function,
    score_completions,
)

__all__ = [
    "BUILTIN_REWARDS",
    "RewardFn",
    "RewardResultError",
    "RewardScores",
    "RewardSpecError",
    "exact_match",
    "extract_gsm8k_answer",
    "first_number",
    "gsm8k",
    "gsm8k_answer_format",
    "http_reward",
    "keywords",
    "last_boxed_answer",
    "length_words",
    "load_reward_function",
    "math_reward",
    "score_completions",
    "think_answer_format",
    "think_tag_diversity",
    "tldr_length",
]
