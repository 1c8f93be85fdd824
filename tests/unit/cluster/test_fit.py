"""Plans against clusters, on hand-made nodes: bundles, colocation and what is missing, in words."""

import pytest

from grpo_ray.cluster.fit import NodeView, plan_bundles, shortfalls
from grpo_ray.config import ConfigError, config_from_dict, plan_resources
from grpo_ray.config import check_config

NODE_8_CPU_4_GPU = NodeView({"CPU": 8, "GPU": 4})


def roles_of(**sections):
    return plan_resources(config_from_dict({"model": {"path": "tiny"}, **sections}))


def test_rollout_needs_more_gpus_than_the_cluster_has():
    roles = roles_of(rollout={"num_workers": 4, "num_gpus": 2}, learner={"num_gpus": 0})
    bundles, _ = plan_bundles(roles)
    assert shortfalls(roles, bundles, [NODE_8_CPU_4_GPU]) == ["rollout needs 8 GPUs, the cluster has 4"]
    assert shortfalls(roles, bundles, [NODE_8_CPU_4_GPU, NODE_8_CPU_4_GPU]) == []


def test_several_roles_short_of_cpus_are_named_together():
    roles = roles_of(rollout={"num_cpus": 4}, learner={"num_cpus": 4})
    bundles, _ = plan_bundles(roles)
    # learner 4 + rollout 4 + reward 0.25 = 8.25 CPUs
    assert shortfalls(roles, bundles, [NodeView({"CPU": 8})]) == [
        "learner and rollout and reward need 8.25 CPUs, the cluster has 8"
    ]


def test_custom_resources_and_labels_target_nodes():
    roles = roles_of(
        learner={"resources": {"gpu_node": 1}, "num_workers": 2}, rollout={"node_labels": {"pool": "rollout"}}
    )
    bundles, index = plan_bundles(roles)
    assert bundles[index["learner"][1]].resources == {"CPU": 1.0, "gpu_node": 1.0}
    assert bundles[index["rollout"][0]].labels == {"pool": "rollout"}
    plain = [NodeView({"CPU": 16})]
    assert shortfalls(roles, bundles, plain) == [
        "learner needs resource gpu_node x2, no node has it",
        "rollout needs a node labelled pool=rollout, no node has that label",
    ]
    fits = [NodeView({"CPU": 4, "gpu_node": 2}), NodeView({"CPU": 4}, {"pool": "rollout"})]
    assert shortfalls(roles, bundles, fits) == []


def test_a_worker_bigger_than_any_node_cannot_be_placed_even_if_the_total_is_enough():
    roles = roles_of(rollout={"num_cpus": 6})
    bundles, _ = plan_bundles(roles)
    assert shortfalls(roles, bundles, [NodeView({"CPU": 4}), NodeView({"CPU": 4})]) == [
        "a rollout worker needs CPU 6 on one node, the largest node has CPU 4"
    ]


def test_colocated_roles_share_bundles_worker_by_worker():
    roles = roles_of(
        rollout={"num_workers": 2, "num_gpus": 0.5},
        learner={"num_workers": 2, "num_gpus": 0.5},
        placement={"colocate": ["rollout", "learner"]},
    )
    bundles, index = plan_bundles(roles, ("rollout", "learner"))
    assert index["learner"] == index["rollout"] == [0, 1] and index["reward"] == [2]
    assert bundles[0].roles == ("learner", "rollout") and bundles[0].resources == {"CPU": 2.0, "GPU": 1.0}
    # Two one-GPU bundles: a node with 2 GPUs holds both, half a GPU per actor.
    assert shortfalls(roles, bundles, [NodeView({"CPU": 8, "GPU": 2})]) == []


@pytest.mark.parametrize(
    "sections, message",
    [
        (
            {"placement": {"colocate": ["rollout", "learner"]}, "rollout": {"num_workers": 2}},
            "placement.colocate: colocated roles share bundles worker by worker, so they need equal "
            "num_workers; got rollout 2, learner 1",
        ),
        (
            {"placement": {"colocate": ["rollout", "reference"]}},
            "placement.colocate: reference does not run with this recipe (see `grpo-ray validate`)",
        ),
        (
            {"placement": {"colocate": ["rollout"]}},
            "placement.colocate: name two or more different roles, got ['rollout']",
        ),
        (
            {"rollout": {"tensor_parallel_size": 2, "backend": "vllm", "num_gpus": 1}},
            "rollout.num_gpus: an engine with tensor_parallel_size 2 holds that many GPUs in its worker's "
            "bundle; set rollout.num_gpus: 2",
        ),
        (
            {"rollout": {"tensor_parallel_size": 2}},
            "rollout.tensor_parallel_size: tensor parallelism needs rollout.backend: vllm",
        ),
    ],
)
def test_placement_settings_that_cannot_work_are_one_line_errors(sections, message):
    with pytest.raises(ConfigError) as err:
        check_config(config_from_dict({"model": {"path": "tiny"}, **sections}))
    assert str(err.value) == message


def test_tensor_parallel_engines_reserve_their_gpus():
    cfg = config_from_dict(
        {
            "model": {"path": "tiny"},
            "rollout": {"tensor_parallel_size": 2, "backend": "vllm", "num_gpus": 2, "num_workers": 2},
        }
    )
    check_config(cfg)
    bundles, index = plan_bundles(plan_resources(cfg))
    assert [bundles[i].resources["GPU"] for i in index["rollout"]] == [2.0, 2.0]


def test_two_learner_ranks_on_one_gpu_cannot_start():
    # Two learner ranks form one NCCL group; NCCL refuses two ranks on one GPU ("invalid usage"),
    # though Ray's bookkeeping (0.5 + 0.5) fits them on one.
    roles = roles_of(learner={"num_workers": 2, "num_gpus": 0.5}, rollout={"num_gpus": 0})
    bundles, _ = plan_bundles(roles)
    assert shortfalls(roles, bundles, [NodeView({"CPU": 16, "GPU": 1})]) == [
        "learner.num_workers 2: its ranks form one NCCL group, which needs a GPU per rank, and the cluster has 1; "
        "set learner.num_workers to 1 or add GPUs"
    ]


def test_fractional_learner_gpus_may_share_one_even_where_there_are_enough():
    roles = roles_of(learner={"num_workers": 2, "num_gpus": 0.5}, rollout={"num_gpus": 0.5})
    bundles, _ = plan_bundles(roles)
    (line,) = shortfalls(roles, bundles, [NODE_8_CPU_4_GPU])
    assert line.startswith(
        "learner.num_gpus 0.5 with learner.num_workers 2: Ray may place two ranks of one NCCL group on one GPU"
    )
    # Colocated with a rollout worker, each pair takes a whole GPU of its own: it starts.
    together, _ = plan_bundles(roles, ("learner", "rollout"))
    assert shortfalls(roles, together, [NODE_8_CPU_4_GPU]) == []
