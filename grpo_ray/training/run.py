"""What every phase of a run reaches for (Run), where the run is (Progress), what it returns."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from grpo_ray.algo.kl_control import KLController
from grpo_ray.cluster.ray_metrics import StepGauges
from grpo_ray.cluster.recovery import WorkerRecovery
from grpo_ray.cluster.roles import Workers
from grpo_ray.cluster.weight_broadcast import WeightBroadcaster
from grpo_ray.config import Config, syncs_during_generation, syncs_lora_adapter, time_checkpoint_due
from grpo_ray.data.prompts import PromptStream
from grpo_ray.tracking import ConsoleReporter, MlflowTracker
from grpo_ray.training.batch import BatchBuilder
from grpo_ray.training.far_moves import FarMoveWatch
from grpo_ray.training.inputs import RunInputs


@dataclass(frozen=True)
class TrainResult:
    run_id: str
    tracking_uri: str
    steps: int
    eval_accuracy: dict[int, float]  # step -> held-out accuracy
    model_dir: str | None
    last_metrics: dict[str, float]


# The phase the driver is in now ("rollout", "update", "sync", "evaluation", "checkpoint"...): what a
# fault landed in, for the logs and the chaos test's report. One driver per process, so one value.
_phase = ["between phases"]


def current_phase() -> str:
    return _phase[0]


@contextmanager
def in_phase(name: str):
    before, _phase[0] = _phase[0], name
    try:
        yield
    finally:
        _phase[0] = before


class PhaseTimer:
    """`with timer("rollout"):` adds the block's wall seconds under timing/rollout."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        started = time.perf_counter()
        with in_phase(phase):
            yield
        self.seconds[f"timing/{phase}"] = self.seconds.get(f"timing/{phase}", 0.0) + time.perf_counter() - started


@dataclass
class Run:
    """What every phase of a run reaches for."""

    cfg: Config
    inputs: RunInputs
    workers: Workers
    tracker: MlflowTracker
    console: ConsoleReporter
    recipe_hash: str = ""

    def __post_init__(self) -> None:
        # The probe later syncs check: none when weight_sync.probe_every is 0 (the broadcaster is then
        # built without one, and a recovery's resend must not ask for one either).
        self.sync_probe = probe = self.inputs.probe if self.cfg.weight_sync.probe_every else None
        self.sync = WeightBroadcaster(
            self.workers.learners,
            self.workers.rollouts,
            self.cfg.weight_sync.bucket_mb,
            self.cfg.weight_sync.timeout_s,
            adapter_only=syncs_lora_adapter(self.cfg),
            # A batch k updates old is finished after the next version was sent: k + 1.
            keep_versions=self.cfg.rollout.max_staleness + 1 if self.cfg.rollout.max_staleness else 0,
            during_generation=syncs_during_generation(self.cfg),
            same_device=self.cfg.weight_sync.same_device,
            sleeps=self.cfg.rollout.vllm.sleep_level > 0,
            # Scored now, while every role holds the starting weights (a resumed
            # run's too: the checkpoint loads later): each engine's baseline.
            probe=probe,
        )
        self.probe_notice_given = False  # the first undecided probe says so in one line; the rest are metrics
        self.recovery = WorkerRecovery(
            self.workers.rollouts,
            self.workers.rewards,
            max_restarts=self.cfg.ray.max_actor_restarts,
            log=self.console.info,
            resync=lambda: self.sync.resend(probe, self.cfg.weight_sync.probe_tolerance),
            with_weights=self.sync.with_kept_weights,
            teachers=self.workers.named_teachers(),
        )
        self.builder = BatchBuilder(
            self.cfg,
            self.workers,
            PromptStream(self.inputs.train_prompts, seed=self.cfg.seed),
            self.recovery,
            policy_version=lambda: self.sync.version,
            log=self.console.info,
        )
        self.output_dir = Path(self.cfg.output_dir)
        self.last_checkpoint = time.monotonic()  # train.checkpoint_every_minutes counts from here
        self.faults_logged: dict[str, float] = {}  # the recovery counters the last step's metrics reached
        self.ray_metrics = StepGauges(self.tracker.run_id)  # for Prometheus: dashboards/grpo-ray.json
        a = self.cfg.algorithm
        self.kl = KLController(a.kl_controller, a.kl_coef, a.kl_target, a.kl_horizon)  # the coefficient of each step
        self.far_moves = FarMoveWatch(a.clip_low, a.clip_high, self.cfg.learner.lr)  # steps that moved the policy far

    def log_stopped_step(self, step: int, metrics: dict[str, float]) -> None:
        """The figures of the step a RunStoppedError ended before it finished (what stopped it: the
        failures by kind), in MLflow and as the console's step line, before the error's own line."""
        if metrics:
            self.tracker.log_metrics(step, metrics)
            self.console.step(step, metrics)

    def checkpoint_time_due(self) -> bool:
        return time_checkpoint_due(self.cfg.train.checkpoint_every_minutes, time.monotonic() - self.last_checkpoint)


@dataclass
class Progress:
    """Where the run is; a checkpoint stores it (TrainerState) and a resume starts from it."""

    step: int = 0
    stage_index: int = 0  # the stage the next step belongs to
    accuracy: dict[int, float] = field(default_factory=dict)
    skipped_in_a_row: int = 0
    nonfinite_in_a_row: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    open_stage_run: str | None = None  # a resumed run goes on logging into its stage's run
