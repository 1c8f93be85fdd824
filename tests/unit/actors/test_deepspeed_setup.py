"""The DeepSpeed config a learner rank builds from the recipe: offload and mixed precision."""

from grpo_ray.actors.deepspeed_setup import FP16_HYSTERESIS, deepspeed_config
from grpo_ray.cluster.settings import learner_settings
from grpo_ray.config import config_from_dict, plan_batches


def ds_config(world: int = 1, **sections) -> dict:
    cfg = config_from_dict(
        {
            "train": {"prompts_per_step": 4},
            "rollout": {"samples_per_prompt": 4},
            "learner": {"micro_batch_size": 4, "num_workers": world},
            **sections,
        }
    )
    return deepspeed_config(learner_settings(cfg, plan_batches(cfg)), world)


def test_plain_fp32_has_no_offload_and_no_mixed_precision():
    ds = ds_config()
    assert ds["zero_optimization"] == {"stage": 0}
    assert not ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    # 16 completions on one rank, micro-batches of 4: 4 accumulation steps.
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (
        4,
        4,
        16,
    )


def test_offload_goes_into_the_zero_section():
    ds = ds_config(
        2,
        learner={
            "micro_batch_size": 4,
            "num_workers": 2,
            "zero_stage": 3,
            "offload_optimizer": "cpu",
            "offload_params": "cpu",
        },
    )
    assert ds["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": False},
        "offload_param": {"device": "cpu", "pin_memory": False},
    }
    assert ds["train_batch_size"] == 16  # 4 per micro-batch x 2 accumulation x 2 ranks
    assert "offload_param" not in ds_config(learner={"zero_stage": 2, "offload_optimizer": "cpu"})["zero_optimization"]


def test_fp16_uses_dynamic_loss_scaling_by_default():
    ds = ds_config(model={"dtype": "float16"}, learner={"micro_batch_size": 4, "initial_scale_power": 12})
    assert ds["fp16"] == {
        "enabled": True,
        "loss_scale": 0.0,
        "initial_scale_power": 12,
        "loss_scale_window": 1000,
        "hysteresis": FP16_HYSTERESIS,
        "min_loss_scale": 1,
    }
    assert not ds["bf16"]["enabled"]
    assert ds_config(model={"dtype": "bfloat16"})["bf16"]["enabled"]
