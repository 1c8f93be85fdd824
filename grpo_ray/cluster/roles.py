"""Start every role of a run from the config: learners, rollout workers, reward pool, reference,
teachers.

Settings dataclasses are built here from the Config, so actors never see the Config object.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from grpo_ray.actors.learner import LearnerWorker
from grpo_ray.actors.reference import ReferenceWorker
from grpo_ray.actors.reward import RewardWorker
from grpo_ray.actors.rollout import RolloutWorker
from grpo_ray.actors.teacher import TeacherWorker
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.settings import learner_settings, reward_worker_args, rollout_settings, teacher_settings
from grpo_ray.cluster.placement import (
    Placement,
    error_line,
    ClusterError,
    node_address_and_port,
    reserve,
    spawn,
    wait_ready,
)
from grpo_ray.cluster.weight_broadcast import SYNC_GROUP
from grpo_ray.config import BatchPlan, Config, RoleResources, plan_resources, syncs_during_generation
from grpo_ray.types import LearnerShard


@dataclass
class Workers:
    placement: Placement
    learners: list[Any]
    rollouts: list[Any]
    rewards: list[Any]
    reference: Any | None
    reward_model: Any | None = None
    resources: dict[str, RoleResources] = field(default_factory=dict)
    teachers: list[Any] = field(default_factory=list)  # one per distillation.teachers entry, in its order
    teacher_names: list[str] = field(default_factory=list)  # their names (distillation.teachers[].name)

    def all(self) -> dict[str, Any]:
        named = {f"learner-{i}": a for i, a in enumerate(self.learners)}
        named.update({f"rollout-{i}": a for i, a in enumerate(self.rollouts)})
        named.update({f"reward-{i}": a for i, a in enumerate(self.rewards)})
        if self.reference is not None:
            named["reference"] = self.reference
        if self.reward_model is not None:
            named["reward_model"] = self.reward_model
        named.update(self.named_teachers())
        return named

    def named_teachers(self) -> dict[str, Any]:
        """teacher-<name> -> its actor, in the recipe's order."""
        return {f"teacher-{name}": actor for name, actor in zip(self.teacher_names, self.teachers)}

    def nodes(self) -> dict[str, str]:
        """Where every actor runs: name -> Ray node id (all asked at once)."""

        def node_id(_self) -> str:
            import ray as ray_in_actor

            return ray_in_actor.get_runtime_context().get_node_id()

        named = self.all()
        return dict(zip(named, ray.get([actor.__ray_call__.remote(node_id) for actor in named.values()])))

    # -- calls every learner rank (and the reference) takes part in --------------------------------

    def update(self, shards: list[LearnerShard], payloads: list[list], beside: list[list]) -> list:
        """Start every rank's optimizer step: rank r's shard, its RolloutSlice refs and the refs that
        go beside them (`beside[r]`: reference log-probs with the KL in the loss, then the teachers'),
        passed as top-level arguments so that the learner fetches them and the driver never does.
        The calls, to gather (dispatch.gather_fail_fast)."""
        return [
            learner.train_step.remote(shard, *payloads[rank], *beside[rank])
            for rank, (learner, shard) in enumerate(zip(self.learners, shards))
        ]

    def reference_logprobs(self, payloads: list[list], temperature: float) -> list[list]:
        """The reference's log-probs of every rank's slices, as refs the learners fetch (ranks x
        slices, as `payloads`); returns once all are computed, so the reference phase is timed."""
        refs = [[self.reference.logprobs.remote(ref, temperature) for ref in rank_refs] for rank_refs in payloads]
        ray.wait([r for rank_refs in refs for r in rank_refs], num_returns=sum(map(len, refs)), fetch_local=False)
        return refs

    def teacher_logprobs(
        self, payloads: list[list], temperature: float, recovery: WorkerRecovery | None = None
    ) -> tuple[list[list[list]], dict[str, list]]:
        """Every teacher's log-probs of every rank's slices, as refs the learners fetch: ranks x
        teachers x slices (each [N, T] float32, NaN on the rows that teacher does not teach), and per
        teacher name the refs of its TeacherSums, one per slice in payload order. Returns once all are
        computed, so the teacher phase is timed. A teacher holds nothing between calls: one that died
        is brought back by `recovery` (Ray restarts it) and its lost calls are issued again, the same
        slices and temperature, so the same log-probs; without `recovery` the death is the error."""
        keys = [
            (t, rank, s)
            for t in range(len(self.teachers))
            for rank, refs in enumerate(payloads)
            for s in range(len(refs))
        ]
        calls: dict[tuple[int, int, int], Any] = {}
        pending = keys
        while pending:
            for t, rank, s in pending:
                teacher = self.teachers[t].logprobs.options(num_returns=2)
                calls[(t, rank, s)] = teacher.remote(payloads[rank][s], temperature)
            issued = [ref for key in pending for ref in calls[key]]
            ray.wait(issued, num_returns=len(issued), fetch_local=False)
            pending = self._lost_teacher_calls(calls, pending, recovery)
        logprobs = [
            [[calls[(t, rank, s)][0] for s in range(len(refs))] for t in range(len(self.teachers))]
            for rank, refs in enumerate(payloads)
        ]
        sums = {name: [calls[key][1] for key in keys if key[0] == t] for t, name in enumerate(self.teacher_names)}
        return logprobs, sums

    def _lost_teacher_calls(
        self, calls: dict[tuple[int, int, int], Any], keys: list[tuple[int, int, int]], recovery: WorkerRecovery | None
    ) -> list[tuple[int, int, int]]:
        """Those of `keys` whose teacher died, once it is back; raises any other failure (and a death
        when there is no recovery). A call's sums tell: a few numbers the driver's metrics read anyway."""
        lost: list[tuple[int, int, int]] = []
        for key in keys:
            try:
                ray.get(calls[key][1])
            except ray.exceptions.RayError as err:
                if recovery is None:
                    raise
                if not any(t == key[0] for t, _, _ in lost):
                    recovery.recover(err)  # re-raises what is not a teacher's death; restarts are bounded
                lost.append(key)
        for t, count in sorted(Counter(key[0] for key in lost).items()) if recovery is not None else ():
            recovery.log(f"re-issued teacher-{self.teacher_names[t]}'s {count} log-prob calls")
        return lost

    def reference_sequence_kl(self, payloads: list[list], temperature: float, estimator: str) -> list:
        """Calls of the reference's summed KL (by `estimator`) of each slice's completions, in
        payload order, to fetch."""
        return [
            self.reference.sequence_kl.remote(ref, temperature, estimator)
            for rank_refs in payloads
            for ref in rank_refs
        ]

    def sleep_rollouts(self) -> None:
        """Every rollout engine frees its GPU memory for the update (rollout.vllm.sleep_level); the
        next weight sync wakes them (cluster/weight_broadcast.py)."""
        ray.get([worker.sleep.remote() for worker in self.rollouts])

    def save_checkpoint(self, folder: Path, with_reference: bool) -> None:
        """Each rank's DeepSpeed state under folder/learner; the reference's weights when it was refreshed."""
        calls = [learner.save_checkpoint.remote(str(folder / "learner")) for learner in self.learners]
        if with_reference:  # refreshed from the policy: no longer the model the recipe names
            calls.append(self.reference.save_weights.remote(str(folder / "reference")))
        ray.get(calls)

    def load_checkpoint(self, folder: Path, with_reference: bool) -> None:
        calls = [learner.load_checkpoint.remote(str(folder / "learner")) for learner in self.learners]
        if with_reference:
            calls.append(self.reference.load_saved_weights.remote(str(folder / "reference")))
        ray.get(calls)

    def save_model(self, path: Path) -> str | None:
        """The policy as a Hugging Face folder (every rank takes part in the gather; rank 0 writes)."""
        return ray.get([learner.save_model.remote(str(path)) for learner in self.learners])[0]

    def refresh_reference(self) -> None:
        """Copy the policy into the reference model (every rank gathers; rank 0's copy is sent)."""
        snapshots = [learner.policy_weights.remote() for learner in self.learners]
        ray.get(self.reference.load_weights.remote(snapshots[0]))
        ray.get(snapshots[1:])

    def stop(self) -> None:
        for actor in self.all().values():
            ray.kill(actor)
        self.placement.remove()


def start_learners(cfg: Config, plan: BatchPlan, placement: Placement, resources: RoleResources) -> list[Any]:
    """Spawn the learner ranks; call `setup_learners` once they are ready."""
    world = cfg.learner.num_workers
    settings = learner_settings(cfg, plan)
    return [
        spawn(LearnerWorker, placement, "learner", rank, resources, settings, rank, world, name=f"learner-{rank}")
        for rank in range(world)
    ]


def setup_learners(learners: list[Any]) -> None:
    """Join the learners' torch.distributed world (it meets at rank 0's node) and build DeepSpeed."""
    host, port = node_address_and_port(learners[0])
    try:
        ray.get([learner.setup.remote(host, port) for learner in learners])
    except ray.exceptions.RayError as err:
        raise ClusterError(f"learner set-up failed: {error_line(err)}") from None


def start_rollouts(cfg: Config, placement: Placement, resources: RoleResources) -> list[Any]:
    settings = [(rollout_settings(cfg, i),) for i in range(cfg.rollout.num_workers)]
    # A sync's receive runs in a group of its own, beside a generate call (vllm_engine.py).
    groups = {SYNC_GROUP: 1} if syncs_during_generation(cfg) else None
    return _start_pool(cfg, RolloutWorker, "rollout", placement, resources, settings, groups)


def start_rewards(cfg: Config, placement: Placement, resources: RoleResources) -> list[Any]:
    return _start_pool(
        cfg, RewardWorker, "reward", placement, resources, [reward_worker_args(cfg)] * cfg.reward.num_workers
    )


def _start_pool(
    cfg: Config,
    cls: type,
    role: str,
    placement: Placement,
    resources: RoleResources,
    worker_args: list[tuple],
    concurrency_groups: dict[str, int] | None = None,
) -> list[Any]:
    """One worker of `role` per entry of `worker_args` (its constructor's arguments): a pool whose
    workers Ray restarts when they die (ray.max_actor_restarts), unlike a learner rank or the reference."""
    return [
        spawn(
            cls,
            placement,
            role,
            i,
            resources,
            *args,
            name=f"{role}-{i}",
            max_restarts=cfg.ray.max_actor_restarts,
            concurrency_groups=concurrency_groups,
        )
        for i, args in enumerate(worker_args)
    ]


def start_teachers(cfg: Config, plan: BatchPlan, placement: Placement, roles: dict[str, RoleResources]) -> list[Any]:
    """One TeacherWorker per distillation.teachers entry, in its own role (teacher-<name>): stateless,
    so Ray restarts one that died (ray.max_actor_restarts) and the driver issues its calls again."""
    return [
        spawn(
            TeacherWorker,
            placement,
            f"teacher-{t.name}",
            0,
            roles[f"teacher-{t.name}"],
            teacher_settings(cfg, plan, i),
            name=f"teacher-{t.name}",
            max_restarts=cfg.ray.max_actor_restarts,
        )
        for i, t in enumerate(cfg.distillation.teachers)
    ]


def start_reference(cfg: Config, plan: BatchPlan, placement: Placement, resources: RoleResources) -> Any:
    return spawn(
        ReferenceWorker,
        placement,
        "reference",
        0,
        resources,
        cfg.reference.model_path or cfg.model.path,
        cfg.model.dtype,
        plan.micro_batch_size,
        cfg.learner.torch_threads,
        cfg.learner.logprob_chunk_tokens,
        cfg.learner.packing,
        cfg.learner.max_tokens_per_micro_batch,
        cfg.learner.logprob_kernel,
        name="reference",
    )


def start_reward_model(cfg: Config, placement: Placement, resources: RoleResources) -> Any:
    from grpo_ray.actors.reward_model import RewardModelWorker

    m = cfg.reward.model
    return spawn(
        RewardModelWorker,
        placement,
        "reward_model",
        0,
        resources,
        m.path,
        m.tokenizer,
        cfg.model.dtype,
        m.batch_size,
        cfg.learner.torch_threads,
        m.max_length,
        name="reward_model",
    )


def start_workers(cfg: Config, plan: BatchPlan) -> Workers:
    """Reserve the whole plan and start every actor, without waiting for them: their constructors
    (models loaded, engines built) run in their own processes while the driver goes on with its
    own start-up; `wait_started` then waits for them."""
    roles = {role.role: role for role in plan_resources(cfg)}
    placement = reserve(
        list(roles.values()), cfg.ray.placement_timeout_s, cfg.placement.colocate, cfg.placement.strategy
    )
    try:
        return Workers(
            placement=placement,
            learners=start_learners(cfg, plan, placement, roles["learner"]),
            rollouts=start_rollouts(cfg, placement, roles["rollout"]),
            rewards=start_rewards(cfg, placement, roles["reward"]),
            reference=start_reference(cfg, plan, placement, roles["reference"]) if cfg.use_reference else None,
            reward_model=start_reward_model(cfg, placement, roles["reward_model"]) if "reward_model" in roles else None,
            resources=roles,
            teachers=start_teachers(cfg, plan, placement, roles),
            teacher_names=[t.name for t in cfg.distillation.teachers],
        )
    except BaseException:
        placement.remove()
        raise


def wait_started(workers: Workers) -> None:
    """Wait until every actor's constructor finished, then join the learners' world; the first
    actor that failed to start (ClusterError, one line) or an interrupt gives the reservation back."""
    try:
        wait_ready(workers.all())
        setup_learners(workers.learners)
    except BaseException:
        workers.placement.remove()
        raise
