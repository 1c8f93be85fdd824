"""Training stages and the cross-field checks: resolved plans, and one-line errors naming the field."""

import pytest

from grpo_ray.cluster.settings import learner_settings, rollout_settings
from grpo_ray.config import (
    ConfigError,
    config_from_dict,
    longest_completion,
    plan_batches,
    plan_stages,
    total_steps,
)
from grpo_ray.config.plans import StagePlan

# Rollout settings every stage falls back to.
ROLLOUT = {"max_new_tokens": 128, "temperature": 0.8, "top_p": 0.9}


def test_no_stages_is_one_stage_named_train():
    cfg = config_from_dict({"train": {"steps": 7, "eval_temperature": 0.3}, "rollout": ROLLOUT})
    # One stage of train.steps, steps 1..7, with the rollout section's sampling settings.
    assert plan_stages(cfg) == [StagePlan("train", 7, 1, 128, 0.8, 0.9, 0.3)]
    assert plan_stages(cfg)[0].last_step == 7
    assert total_steps(cfg) == 7 and longest_completion(cfg) == 128


def test_stages_chain_their_steps_and_fill_nulls():
    cfg = config_from_dict({
        "rollout": ROLLOUT,
        "train": {"eval_temperature": 0.5},
        "stages": [
            {"name": "short", "steps": 3, "max_new_tokens": 64},
            {"name": "mid", "steps": 5, "temperature": 1.2, "eval_temperature": 0.0},
            {"name": "long", "steps": 2, "max_new_tokens": 512, "top_p": 0.5},
        ],
    })  # fmt: skip
    short, mid, long = plan_stages(cfg)
    # Steps 1-3, 4-8 (3 + 1 .. 3 + 5), 9-10.
    assert [(s.first_step, s.last_step) for s in (short, mid, long)] == [(1, 3), (4, 8), (9, 10)]
    # Nulls come from rollout.* (128 tokens, temperature 0.8, top_p 0.9) and train.eval_temperature (0.5).
    assert short == StagePlan("short", 3, 1, 64, 0.8, 0.9, 0.5)
    # An explicit eval_temperature 0 (greedy) is kept, not mistaken for null.
    assert mid == StagePlan("mid", 5, 4, 128, 1.2, 0.9, 0.0)
    assert long == StagePlan("long", 2, 9, 512, 0.8, 0.5, 0.5)
    # train.steps (default 100) plays no part once stages are given: 3 + 5 + 2.
    assert total_steps(cfg) == 10
    assert longest_completion(cfg) == 512


TWO_STAGES = [{"name": "a", "steps": 1}, {"name": "b", "steps": 1, "max_new_tokens": 64}]


@pytest.mark.parametrize(
    "raw, start",
    [
        ({"train": {"steps": 5}, "stages": TWO_STAGES}, "train.steps: with stages, each stage sets its own steps"),
        ({"stages": [{"name": "a", "steps": 1}, {"name": "a", "steps": 2}]}, "stages: names must be unique; got a, a"),
        ({"stages": [{"name": "warm/up", "steps": 1}]}, "stages.0.name: String should match pattern"),
        (
            {"algorithm": {"dynamic_sampling": True}, "polaris": {"substitution": True}},
            "algorithm.dynamic_sampling: both it and polaris.substitution",
        ),
        ({"reference": {"refresh_every": 5}}, "reference.refresh_every: needs algorithm.kl_coef > 0"),
        # Greedy evaluation (train.eval_temperature defaults to 0) with 4 samples per prompt.
        ({"train": {"eval_samples": 4}}, "train.eval_temperature: greedy evaluation gives 4 identical samples"),
        # Stage 1 overrides a sampled train.eval_temperature with greedy.
        (
            {
                "train": {"eval_samples": 2, "eval_temperature": 0.7},
                "stages": [{"name": "a", "steps": 1}, {"name": "b", "steps": 1, "eval_temperature": 0}],
            },
            "stages.1.eval_temperature: greedy evaluation gives 2 identical samples",
        ),
        # A stage that leaves eval_temperature null inherits greedy from train: the message names train's field.
        (
            {"train": {"eval_samples": 2}, "stages": [{"name": "a", "steps": 1}]},
            "train.eval_temperature: greedy evaluation gives 2 identical samples",
        ),
        # 512 prompt tokens + 256 new tokens do not fit in a 600-token engine.
        ({"rollout": {"vllm": {"max_model_len": 600}}}, "rollout.vllm.max_model_len: 600 cannot hold"),
        # Stage b completes in at most 64 tokens: a 100-token buffer does not fit (rollout's 256 would).
        (
            {"algorithm": {"overlong": "soft_penalty", "overlong_buffer": 100}, "stages": TWO_STAGES},
            "algorithm.overlong_buffer: soft_penalty needs 0 < overlong_buffer <= max_new_tokens of every stage "
            "(64), got 100",
        ),
        # A zero buffer has no penalty ramp at all.
        (
            {"algorithm": {"overlong": "soft_penalty"}},
            "algorithm.overlong_buffer: soft_penalty needs 0 < overlong_buffer",
        ),
        # vLLM refuses a temperature above 2 in every request; said before any actor starts.
        (
            {"rollout": {"backend": "vllm", "temperature": 2.5}},
            "rollout.temperature: vLLM samples at temperature 2 at most",
        ),
        (
            {"rollout": {"backend": "vllm"}, "train": {"eval_temperature": 3.0}},
            "train.eval_temperature: vLLM samples at temperature 2 at most",
        ),
        (
            {
                "rollout": {"backend": "vllm"},
                "stages": [{"name": "a", "steps": 1}, {"name": "hot", "steps": 1, "temperature": 2.2}],
            },
            "stages.1.temperature: vLLM samples at temperature 2 at most",
        ),
    ],
)
def test_cross_field_errors_are_one_line_naming_the_field(raw, start):
    with pytest.raises(ConfigError) as caught:
        config_from_dict(raw)
    message = str(caught.value)
    assert message.startswith(start), message
    assert "\n" not in message


@pytest.mark.parametrize(
    "raw",
    [
        {"stages": [{"name": "warm-up_1.0", "steps": 1}]},  # letters, digits, - _ . are allowed
        {"algorithm": {"dynamic_sampling": True}, "polaris": {"rescue": True}},
        {"reference": {"refresh_every": 5}, "algorithm": {"kl_coef": 0.1}},
        {"train": {"eval_samples": 4, "eval_temperature": 0.7}},
        {"algorithm": {"overlong": "soft_penalty", "overlong_buffer": 64}, "stages": TWO_STAGES},  # 64 <= 64
    ],
)
def test_the_same_fields_set_consistently_load(raw):
    config_from_dict(raw)


def test_rollout_engines_hold_the_longest_stage():
    cfg = config_from_dict({"data": {"max_prompt_tokens": 100}, "rollout": {"max_new_tokens": 50}, "stages": [
        {"name": "a", "steps": 1, "max_new_tokens": 64},
        {"name": "b", "steps": 1, "max_new_tokens": 300},
        {"name": "c", "steps": 1},  # rollout's 50
    ]})  # fmt: skip
    # 100 prompt tokens + the longest stage's 300 completion tokens.
    assert rollout_settings(cfg, 0).max_model_len == 400
    # No stages: 100 + rollout.max_new_tokens 50; an explicit vllm.max_model_len wins.
    plain = config_from_dict({"data": {"max_prompt_tokens": 100}, "rollout": {"max_new_tokens": 50}})
    assert rollout_settings(plain, 1).max_model_len == 150
    assert rollout_settings(config_from_dict({"rollout": {"vllm": {"max_model_len": 4096}}}), 0).max_model_len == 4096


@pytest.mark.parametrize("placement, loss_kl", [("loss", 0.05), ("reward", 0.0)])
def test_kl_in_the_reward_leaves_no_kl_term_in_the_loss(placement, loss_kl):
    cfg = config_from_dict({"algorithm": {"kl_coef": 0.05, "kl_placement": placement}})
    assert learner_settings(cfg, plan_batches(cfg)).kl_coef == loss_kl
    # Either way the reference model runs: the reward-side KL needs it too.
    assert cfg.use_reference
