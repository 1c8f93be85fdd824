"""The recipe schema: one pydantic section per YAML section, frozen, unknown keys refused.

This module and role_sections.py (what each role runs) are the only home of defaults. Every field
carries a comment saying what it does; `configs/*.yaml` repeat those comments for the user. This
module holds the run's own sections (train, stages, POLARIS, weight sync, tracking, Ray, placement)
and `Config`, and re-exports every section class.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from pydantic import Field, field_validator

from grpo_ray.config.base import ConfigError, _Section  # noqa: F401 - ConfigError is part of the API
from grpo_ray.config.distillation import DistillationConfig, TeacherConfig  # noqa: F401 - part of the API
from grpo_ray.config.role_sections import *  # noqa: F403 - every section class is part of the API
from grpo_ray.config.role_sections import (
    AlgorithmConfig,
    DataConfig,
    LearnerConfig,
    ModelConfig,
    ReferenceConfig,
    RewardConfig,
    RolloutConfig,
)


class TrainConfig(_Section):
    # Prompts sampled per step (each gets samples_per_prompt completions).
    prompts_per_step: int = Field(32, ge=1)
    # Optimizer steps to run.
    steps: int = Field(100, ge=1)
    # Evaluate held-out accuracy every N steps (and always before the first and after the last); 0: only those two.
    eval_every: int = Field(0, ge=0)
    # Save a checkpoint every N steps; one is always saved at the end of each stage (and of the run).
    # A run started on an output_dir that holds one continues from it (see `grpo-ray train --help`).
    checkpoint_every: int = Field(0, ge=0)
    # Also save one once this many minutes have passed since the last (0 = off), so that a failure
    # never loses more than that much work. Pipelined runs save it once no batch started ahead is in flight.
    checkpoint_every_minutes: float = Field(10.0, ge=0)
    # Checkpoints kept on disk (the newest ones); older ones are deleted once a new one is complete.
    keep_checkpoints: int = Field(3, ge=1)
    # Stop with an error after this many updates in a row were skipped for a NaN or infinite loss or gradient.
    max_nonfinite_updates: int = Field(3, ge=1)
    # Stop with an error after this many batches in a row had nothing to learn from and were skipped
    # (polaris.substitution found too few informative groups; dynamic sampling found none).
    max_skipped_batches: int = Field(20, ge=1)
    # Sampling temperature of evaluation; 0 is greedy. A stage's eval_temperature overrides it.
    eval_temperature: float = Field(0.0, ge=0)
    # Samples per evaluation prompt; accuracy is their mean (avg@k). Needs eval_temperature > 0 when > 1.
    eval_samples: int = Field(1, ge=1)
    # End the run at the first evaluation whose held-out accuracy reaches this (its model and a
    # final checkpoint are saved as at the last step); null: run every step.
    stop_at_accuracy: float | None = Field(None, gt=0, le=1)


class StageConfig(_Section):
    # Name of the stage: its MLflow run (nested under the training run) and its output folder.
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # Optimizer steps in this stage.
    steps: int = Field(ge=1)
    # Longest completion in tokens; null: rollout.max_new_tokens.
    max_new_tokens: int | None = Field(None, ge=1)
    # Rollout sampling temperature; null: rollout.temperature.
    temperature: float | None = Field(None, gt=0)
    # Rollout nucleus mass; null: rollout.top_p.
    top_p: float | None = Field(None, gt=0, le=1)
    # Evaluation temperature; null: train.eval_temperature.
    eval_temperature: float | None = Field(None, ge=0)
    # Peak LR of a schedule that starts afresh at this stage (warmup again, over this stage and the
    # following stages that set neither lr nor lr_schedule); null with lr_schedule null: the stage
    # continues the running schedule.
    lr: float | None = Field(None, gt=0)
    # Kind of the fresh schedule (as learner.lr_schedule); null: learner.lr_schedule when lr is set.
    lr_schedule: Literal["constant", "linear", "cosine"] | None = None


class PolarisConfig(_Section):
    # Intra-batch informative substitution: a group is informative when its mean reward is strictly
    # between 0 and 1. With more than prompts_per_step // 3 informative groups, every other group is
    # overwritten by a copy of a random informative one; otherwise the batch is skipped and the step
    # counter does not advance.
    substitution: bool = False
    # Rollout rescue: keep each prompt's latest correct response; when all G samples of a prompt
    # fail, one failed sample is replaced by the kept one.
    rescue: bool = False
    # A reward at or above this counts as correct (rescue).
    correct_threshold: float = 1.0
    # At the end of each stage but the last, drop the training prompts whose average reward in the
    # per-prompt ledger is above this (POLARIS: 0.9); null: keep every prompt.
    drop_easy_threshold: float | None = Field(None, ge=0, le=1)


class WeightSyncConfig(_Section):
    # Size of each flat bucket sent from learner rank 0 to the rollout workers, in MiB.
    bucket_mb: float = Field(64.0, gt=0)
    # Compare a probe sequence's log-probs (rollout engine vs learner) every N syncs; 0 disables.
    probe_every: int = Field(10, ge=0)
    # The least engine-learner kernel gap (mean |log-prob difference| on the probe) the probe allows
    # for. The gap is measured per engine at start-up; the probe decides loaded / not loaded only
    # once the updates moved the learner's probe log-probs 4x past the larger of the two, and
    # logs sync/probe_undecided otherwise (transport/probe.py).
    probe_tolerance: float = Field(1e-3, gt=0)
    # Seconds a sync may take before it is an error.
    timeout_s: float = Field(600.0, gt=0)
    # At the start, time a plain broadcast of the model's bytes in the sync's group (for the
    # hand-off: a plain copy on learner rank 0's device) and log it as sync/raw_broadcast_gbps,
    # the yardstick of sync/gbytes_per_s (costs three more broadcasts or copies).
    measure_raw_broadcast: bool = False
    # With model.lora.enabled, send only the LoRA adapter's matrices: the rollout engine applies
    # the adapter itself (peft in the hf engine, vLLM's LoRA support). false: the merged weights.
    lora_adapter_only: bool = True
    # A rollout rank on learner rank 0's device: "handoff" takes the weights through memory both
    # map (CUDA IPC on a GPU, shared memory on a CPU; one line says so if that is refused there and
    # it falls back), "broadcast" through the broadcast group (gloo: via host memory and a socket).
    same_device: Literal["handoff", "broadcast"] = "handoff"


class TrackingConfig(_Section):
    # MLflow tracking URI; null: a sqlite store at <output_dir>/mlflow.db.
    tracking_uri: str | None = None
    # MLflow experiment name.
    experiment: str = "grpo-ray"
    # MLflow run name; null: generated by MLflow.
    run_name: str | None = None
    # Every N steps, log a table of sample completions with their prompts, answers and rewards
    # (samples/step_NNNNNN.json in the run's artefacts); an episode's row also shows its conversation
    # (each model turn, tool call and reply), turns and tool calls; 0: never.
    samples_every: int = Field(0, ge=0)
    # Completions per sample table (the first rows of the step's batch).
    samples_per_table: int = Field(8, ge=1)


class RayConfig(_Section):
    # Cluster address; null: RAY_ADDRESS if set (e.g. under `ray job submit`), else a new local Ray.
    address: str | None = None
    # CPUs of a local Ray; null: this machine's core count.
    num_cpus: int | None = Field(None, ge=1)
    # Address a local Ray's servers (GCS, raylet, object manager, metrics) listen on; null:
    # 127.0.0.1, so a run on a laptop or a shared machine is not reachable from the network. Set this
    # machine's network address only to let other machines join or scrape it.
    node_ip: str | None = None
    # Start the Ray dashboard with a local Ray (bound to dashboard_host).
    dashboard: bool = False
    # Dashboard bind address; 127.0.0.1 keeps it off the network.
    dashboard_host: str = "127.0.0.1"
    # Port of a local Ray's Prometheus metrics endpoint (grpo-ray's and Ray's own metrics); null: any
    # free port (printed at start either way).
    metrics_export_port: int | None = Field(None, ge=1024, le=65535)
    # Times Ray may restart a rollout, reward or teacher worker that died (SIGKILL, OOM, a crash); the
    # step it died in re-issues what it held. One worker dying more often stops the run.
    max_actor_restarts: int = Field(3, ge=0)
    # Seconds to wait for the placement group (all actors' resources) before giving up.
    placement_timeout_s: float = Field(120.0, gt=0)

    @field_validator("node_ip")
    @classmethod
    def _an_ip_address(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"expected an IP address of this machine such as 10.0.0.5, got {value!r}") from None
        return value


class PlacementConfig(_Section):
    # Roles whose workers share bundles, and so nodes and GPUs (e.g. [rollout, learner] with
    # num_gpus 0.5 each: worker i of each role on the same GPU); they need equal num_workers.
    colocate: tuple[Literal["learner", "rollout", "reward", "reference", "reward_model"], ...] = ()
    # Ray placement-group strategy: PACK (fill nodes in turn), SPREAD, STRICT_PACK (one node), STRICT_SPREAD.
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"


class EnvironmentConfig(_Section):
    # The environment of multi-turn episodes (docs/agents.md): "path/to/file.py:ClassName" or
    # "package.module:ClassName", a grpo_ray.envs.Environment or a class whose public methods are
    # tools (TRL's environment_factory contract); null: single-turn rows, one answer per completion.
    spec: str | None = None
    # Keyword arguments of the class's constructor.
    options: dict[str, Any] = Field(default_factory=dict)
    # Most model turns an episode may take; it then ends where it is.
    max_turns: int = Field(4, ge=1)
    # Most tokens after the prompt an episode may hold, the model's turns and the environment's
    # replies together; a reply that would pass it ends the episode (env/overflows).
    max_episode_tokens: int = Field(512, ge=1)
    # Seconds one reset, step or reward may take; beyond, its process is killed and the episode fails.
    step_timeout_s: float = Field(10.0, gt=0)
    # Seconds a whole episode may take, the model's turns included; beyond, it fails.
    episode_timeout_s: float = Field(300.0, gt=0)
    # Processes per rollout worker that run the environments (each hosts many episodes).
    processes_per_worker: int = Field(2, ge=1)
    # Stop the run when more than this fraction of the episodes failed over the last
    # reward.failure_window_steps steps: their reset, step or reward raised, timed out or lost its
    # process, or the episode passed episode_timeout_s (docs/agents.md). A failed episode has no
    # reward (advantage 0, out of its group's statistics); a tool call that fails is no failure.
    max_failure_rate: float = Field(0.5, gt=0, le=1)
    # Weight of the environment's reward (its steps' rewards plus reward() at the end) in the total
    # reward, beside reward.functions, which score the episode's last answer.
    reward_weight: float = 1.0
    # Per-turn credit: a step's reward is credited to the turns before it, not after. Each turn's
    # tokens are trained on the episode's reward less what the steps before that turn earned
    # (reward-to-go), under the group's same baseline (algo.advantage_slopes). false: the episode's
    # whole reward applies to every model token of it.
    reward_per_turn: bool = False


class Config(_Section):
    # Everything a run writes (MLflow store, checkpoints, logs) goes under this folder.
    output_dir: str = "runs/default"
    # Seed for data order, sampling and initialisation.
    seed: int = 0
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    reference: ReferenceConfig = ReferenceConfig()
    distillation: DistillationConfig = DistillationConfig()
    learner: LearnerConfig = LearnerConfig()
    train: TrainConfig = TrainConfig()
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    tracking: TrackingConfig = TrackingConfig()
    ray: RayConfig = RayConfig()
    placement: PlacementConfig = PlacementConfig()
    polaris: PolarisConfig = PolarisConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    # Training stages run in order, each from the previous stage's weights; empty: one stage of
    # train.steps with the rollout section's settings.
    stages: tuple[StageConfig, ...] = ()

    @property
    def use_reference(self) -> bool:
        return self.algorithm.kl_coef > 0

    @property
    def use_distillation(self) -> bool:
        """Whether teachers run and their per-token term enters the advantages (distillation.teachers)."""
        return bool(self.distillation.teachers)
