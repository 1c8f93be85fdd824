"""A teacher's actor as the cluster starts it (cluster/settings.py, cluster/fit.py): its settings from
its recipe entry and the learner's forward, and its own bundle in the plan."""

from grpo_ray.cluster.fit import NodeView, plan_bundles, shortfalls
from grpo_ray.cluster.settings import reward_worker_args, teacher_settings
from grpo_ray.config import config_from_dict, plan_batches, plan_resources


def test_a_teachers_settings_are_its_entry_and_the_learners_forward():
    cfg = config_from_dict(
        {
            "distillation": {
                "teachers": [{"name": "big", "model_path": "tiny", "sources": ["gsm8k", "math"]}],
                "source_field": "origin",
            },
            "model": {"dtype": "bfloat16"},
            "train": {"prompts_per_step": 4},
            "rollout": {"samples_per_prompt": 4},
            "learner": {
                "micro_batch_size": 8,
                "torch_threads": 3,
                "logprob_chunk_tokens": 64,
                "packing": True,
                "max_tokens_per_micro_batch": 256,
            },
        }
    )
    settings = teacher_settings(cfg, plan_batches(cfg), 0)
    assert (settings.name, settings.model_path, settings.dtype) == ("big", "tiny", "bfloat16")
    assert (settings.source_field, settings.sources) == ("origin", ("gsm8k", "math"))
    # The reference's forward: the plan's micro-batch (8 of the rank's 16 rows), the learner's threads and head.
    assert (settings.micro_batch_size, settings.torch_threads, settings.chunk_tokens) == (8, 3, 64)
    assert (settings.packing, settings.max_tokens_per_micro_batch, settings.logprob_kernel) == (True, 256, "torch")


def test_each_teacher_takes_a_bundle_and_a_gpu_teacher_is_named_where_gpus_are_missing():
    cfg = config_from_dict(
        {
            "distillation": {
                "teachers": [
                    {"name": "big", "model_path": "tiny", "num_gpus": 1, "sources": ["gsm8k"]},
                    {"name": "small", "model_path": "tiny"},
                ]
            }
        }
    )
    roles = plan_resources(cfg)
    bundles, index = plan_bundles(roles)
    assert [bundle.roles for bundle in bundles][-2:] == [("teacher-big",), ("teacher-small",)]
    assert index["teacher-big"] == [3] and bundles[3].resources == {"CPU": 0.5, "GPU": 1.0}
    assert shortfalls(roles, bundles, [NodeView({"CPU": 8, "GPU": 0})]) == [
        "teacher-big needs 1 GPUs, the cluster has 0"
    ]
    # The teacher without sources teaches every row but those big takes.
    small = teacher_settings(cfg, plan_batches(cfg), 1)
    assert (small.sources, small.others) == ((), ("gsm8k",))


def test_a_recipe_without_reward_functions_has_a_reward_pool_that_scores_nothing_without_a_sandbox():
    # The teachers' signal alone: the pool still runs (for an environment's fields and the rows' stats),
    # with no function to isolate, so no sandbox child (which needs one).
    cfg = config_from_dict(
        {
            "distillation": {"teachers": [{"name": "big", "model_path": "tiny"}], "with_rewards": False},
            "reward": {"functions": []},
        }
    )
    functions, isolation, by_source, _ = reward_worker_args(cfg)
    assert (functions, by_source, isolation.mode) == ([], {}, "none")
    # With a function the recipe's isolation stands.
    assert reward_worker_args(config_from_dict({}))[1].mode == "subprocess"
