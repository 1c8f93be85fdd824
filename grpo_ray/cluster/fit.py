"""Does a plan fit a cluster? Bundles from the roles, and what is missing, in words.

Pure: no Ray import. `reserve()` (actors.py) asks it before it creates the placement group, and
`grpo-ray validate --address` asks it of a running cluster, so both say the same thing:

    rollout needs 8 GPUs, the cluster has 4
    learner needs resource gpu_node x2, no node has it
    rollout needs a node labelled pool=rollout, no node has that label
    a rollout worker needs CPU 16 on one node, the largest node has CPU 8
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from grpo_ray.config import RoleResources


@dataclass(frozen=True)
class NodeView:
    resources: dict[str, float]  # totals of the node
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Bundle:
    roles: tuple[str, ...]  # one role, or several colocated ones (worker i of each)
    resources: dict[str, float]
    labels: dict[str, str]


def plan_bundles(
    roles: list[RoleResources], colocate: tuple[str, ...] = ()
) -> tuple[list[Bundle], dict[str, list[int]]]:
    """One bundle per worker; colocated roles share theirs worker by worker. Returns the bundles and,
    per role, the bundle index of each of its workers."""
    bundles: list[Bundle] = []
    index: dict[str, list[int]] = {role.role: [] for role in roles}
    together = [role for role in roles if role.role in colocate]
    groups = ([together] if together else []) + [[role] for role in roles if role.role not in colocate]
    for group in groups:
        for _ in range(group[0].count):
            resources: dict[str, float] = {}
            labels: dict[str, str] = {}
            for role in group:
                for name, amount in role.bundle().items():
                    resources[name] = resources.get(name, 0.0) + amount
                labels.update(role.labels)
                index[role.role].append(len(bundles))
            bundles.append(Bundle(tuple(role.role for role in group), resources, labels))
    return bundles, index


def shortfalls(roles: list[RoleResources], bundles: list[Bundle], nodes: list[NodeView]) -> list[str]:
    """What the cluster lacks for the plan, one line each; empty when every bundle can be placed."""
    found: list[str] = []
    for name in sorted({name for role in roles for name in role.bundle()}, key=_order):
        need = {role.role: role.count * role.bundle().get(name, 0.0) for role in roles if role.bundle().get(name, 0.0)}
        total, have = math.fsum(need.values()), math.fsum(node.resources.get(name, 0.0) for node in nodes)
        if total <= have + 1e-9:
            continue
        who = " and ".join(need)
        verb = "needs" if len(need) == 1 else "need"
        if name in ("CPU", "GPU"):
            found.append(f"{who} {verb} {total:g} {name}s, the cluster has {have:g}")
        elif have == 0:
            found.append(f"{who} {verb} resource {name} x{total:g}, no node has it")
        else:
            found.append(f"{who} {verb} resource {name} x{total:g}, the cluster has {have:g}")
    for role in roles:
        if role.labels and not any(_has_labels(node, role.labels) for node in nodes):
            wanted = ",".join(f"{k}={v}" for k, v in role.labels.items())
            found.append(f"{role.role} needs a node labelled {wanted}, no node has that label")
    found += nccl_conflicts(roles, bundles, math.fsum(node.resources.get("GPU", 0.0) for node in nodes))
    if found:
        return found
    for bundle in bundles:
        if not any(_has_labels(node, bundle.labels) and _holds(node, bundle.resources) for node in nodes):
            largest = max(
                nodes,
                key=lambda n: tuple(n.resources.get(k, 0.0) for k in sorted(bundle.resources, key=_order)),
                default=NodeView({}),
            )
            found.append(
                f"a {'+'.join(bundle.roles)} worker needs {_amounts(bundle.resources)} on one node, the largest "
                "node has "
                f"{_amounts({k: largest.resources.get(k, 0.0) for k in bundle.resources})}"
            )
            break  # the same shape repeats for the role's other workers
    return found


def nccl_conflicts(roles: list[RoleResources], bundles: list[Bundle], gpus: float) -> list[str]:
    """Learner ranks with GPUs form one NCCL group, and NCCL refuses two ranks on one GPU ("invalid
    usage" at set-up): a plan that can put two there cannot start. One line each, naming the fields."""
    learner = next((role for role in roles if role.role == "learner"), None)
    if learner is None or learner.count < 2 or not learner.num_gpus:
        return []
    if gpus < learner.count:
        return [
            f"learner.num_workers {learner.count}: its ranks form one NCCL group, which needs a GPU per rank, and "
            f"the cluster has {gpus:g}; set learner.num_workers to {max(1, int(gpus))} or add GPUs"
        ]
    shares = {bundle.resources.get("GPU", 0.0) for bundle in bundles if "learner" in bundle.roles}
    if min(shares) < 1:
        return [
            f"learner.num_gpus {learner.num_gpus:g} with learner.num_workers {learner.count}: Ray may place two ranks "
            "of one NCCL group on one GPU, which NCCL refuses; set learner.num_gpus to 1, or colocate learner with "
            "rollout (placement.colocate) so that each pair takes a whole GPU"
        ]
    return []


def _has_labels(node: NodeView, labels: dict[str, str]) -> bool:
    return all(node.labels.get(key) == value for key, value in labels.items())


def _holds(node: NodeView, resources: dict[str, float]) -> bool:
    return all(node.resources.get(name, 0.0) + 1e-9 >= amount for name, amount in resources.items())


def _order(name: str) -> tuple[int, str]:
    return ({"CPU": 0, "GPU": 1}.get(name, 2), name)


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(
        f"{name} {amount:g}" for name, amount in sorted(resources.items(), key=lambda item: _order(item[0]))
    )
