"""Per-turn credit (environment.reward_per_turn) needs the advantage estimator's per-turn slope: a
recipe whose estimator registers none is refused when it loads, in one line naming both fields."""

import pytest

from grpo_ray.algo.advantages import _ADVANTAGE_ESTIMATORS, AdvantageEstimator, Estimator
from grpo_ray.config import ConfigError, config_from_dict

EPISODES = {"model": {"path": "tiny"}, "environment": {"spec": "x.py:X", "reward_per_turn": True}}


def test_every_built_in_estimator_has_a_slope_so_loads_with_per_turn_credit():
    for name in AdvantageEstimator:
        assert config_from_dict({**EPISODES, "algorithm": {"advantage": name.value}}).environment.reward_per_turn


def test_an_estimator_registered_without_a_slope_is_refused_at_load_naming_both_fields(monkeypatch):
    rloo = _ADVANTAGE_ESTIMATORS[AdvantageEstimator.RLOO]
    monkeypatch.setitem(_ADVANTAGE_ESTIMATORS, AdvantageEstimator.RLOO, Estimator(rloo.advantages, turn_slope=None))
    with pytest.raises(ConfigError) as refused:
        config_from_dict({**EPISODES, "algorithm": {"advantage": "rloo"}})
    assert str(refused.value) == (
        "algorithm.advantage: advantage estimator 'rloo' registers no per-turn slope, which per-turn credit "
        "(environment.reward_per_turn) needs; choose one of ['grpo', 'dr_grpo', 'reinforce_pp_baseline'], "
        "or set environment.reward_per_turn: false"
    )
    # Without per-turn credit the same estimator loads: its advantages need no slope.
    episodes = {**EPISODES["environment"], "reward_per_turn": False}
    assert config_from_dict({**EPISODES, "environment": episodes, "algorithm": {"advantage": "rloo"}})
