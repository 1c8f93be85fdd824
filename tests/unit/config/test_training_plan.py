"""The optimisation switches of a recipe: LR segments over stages, and one-line refusals naming the field."""

import pytest

from grpo_ray.algo.schedules import LrSegment
from grpo_ray.config import ConfigError, config_from_dict, plan_lr_segments


def test_defaults_are_one_constant_schedule_over_the_run():
    cfg = config_from_dict({"train": {"steps": 7}, "learner": {"lr": 2e-6}})
    assert plan_lr_segments(cfg) == (LrSegment(1, 7, 2e-6, "constant", 0, 0.0),)
    # Everything else is off by default.
    assert cfg.learner.offload_optimizer is None and cfg.learner.offload_params is None
    assert cfg.algorithm.kl_controller == "fixed" and cfg.reward.clip is None and cfg.reward.normalize == "none"


def test_stages_continue_the_schedule_unless_one_sets_its_own():
    cfg = config_from_dict(
        {
            "learner": {"lr": 1e-5, "lr_schedule": "cosine", "warmup_ratio": 0.25, "min_lr": 1e-7},
            "stages": [
                {"name": "a", "steps": 3},
                {"name": "b", "steps": 2, "lr": 5e-6},
                {"name": "c", "steps": 4},
                {"name": "d", "steps": 4, "lr_schedule": "linear"},
            ],
        }
    )
    # a alone (steps 1-3; warmup ceil(0.75) = 1); b starts a fresh one that c continues (steps 4-9:
    # 6 steps, warmup ceil(1.5) = 2, peak 5e-6); d starts another at learner.lr, linear (steps 10-13).
    assert plan_lr_segments(cfg) == (
        LrSegment(1, 3, 1e-5, "cosine", 1, 1e-7),
        LrSegment(4, 6, 5e-6, "cosine", 2, 1e-7),
        LrSegment(10, 4, 1e-5, "linear", 1, 1e-7),
    )


@pytest.mark.parametrize(
    "sections, message",
    [
        ({"learner": {"lr_schedule": "step"}}, "learner.lr_schedule"),
        ({"learner": {"warmup_steps": -1}}, "learner.warmup_steps"),
        ({"learner": {"warmup_ratio": 1.5}}, "learner.warmup_ratio"),
        (
            {"learner": {"warmup_steps": 5, "warmup_ratio": 0.1}},
            "learner.warmup_ratio: set either warmup_steps or warmup_ratio",
        ),
        ({"learner": {"lr": 1e-6, "min_lr": 1e-5}}, "learner.min_lr: 1e-05 is above learner.lr"),
        (
            {
                "learner": {"lr": 1e-4, "min_lr": 1e-5},
                "stages": [{"name": "a", "steps": 1}, {"name": "b", "steps": 1, "lr": 1e-6}],
            },
            "learner.min_lr: 1e-05 is above the lr of a stage",
        ),
        ({"learner": {"offload_optimizer": "cpu"}}, "learner.offload_optimizer: optimizer offload is part of ZeRO"),
        ({"learner": {"offload_optimizer": "nvme"}}, "learner.offload_optimizer"),
        (
            {"learner": {"offload_params": "cpu", "zero_stage": 2}},
            "learner.offload_params: parameter offload needs learner.zero_stage: 3",
        ),
        ({"learner": {"loss_scale": -1}}, "learner.loss_scale"),
        (
            {"algorithm": {"kl_controller": "adaptive"}},
            "algorithm.kl_controller: adaptive scales algorithm.kl_coef, which is 0",
        ),
        ({"algorithm": {"kl_controller": "pid"}}, "algorithm.kl_controller"),
        ({"algorithm": {"kl_target": 0}}, "algorithm.kl_target"),
        ({"reward": {"clip": [1.0, -1.0]}}, "reward.clip"),
        ({"reward": {"normalize": "batch"}}, "reward.normalize"),
        ({"reward": {"normalize": "running"}, "polaris": {"rescue": True}}, "reward.normalize: polaris.rescue"),
    ],
)
def test_bad_values_are_refused_naming_the_field(sections, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")) as err:
        config_from_dict(sections)
    assert "\n" not in str(err.value)


def test_the_switches_load_together():
    cfg = config_from_dict(
        {
            "learner": {
                "zero_stage": 3,
                "offload_optimizer": "cpu",
                "offload_params": "cpu",
                "lr_schedule": "linear",
                "warmup_steps": 2,
            },
            "algorithm": {"kl_coef": 0.05, "kl_controller": "adaptive", "kl_target": 0.01, "kl_horizon": 1000},
            "reward": {"clip": [-1, 1], "normalize": "running"},
        }
    )
    assert cfg.reward.clip == (-1.0, 1.0) and cfg.learner.offload_params == "cpu"


def test_validate_prints_each_lr_schedule():
    from click.testing import CliRunner

    from grpo_ray.cli import main

    result = CliRunner().invoke(
        main,
        [
            "validate",
            "configs/tiny.yaml",
            "--set",
            "learner.lr_schedule=cosine",
            "--set",
            "learner.warmup_ratio=0.1",
            "--set",
            "learner.min_lr=1e-6",
        ],
    )
    assert result.exit_code == 0, result.output
    # tiny.yaml: 800 steps at lr 1e-4; warmup ceil(0.1 x 800) = 80.
    assert (
        "steps 1-800  cosine  lr 0.0001  warmup 80 steps  min_lr 1e-06" in result.output.split("# learning rate", 1)[1]
    )
