"""A run's step metrics as Ray metrics, for Prometheus and Grafana (dashboards/grpo-ray.json).

    gauges = StepGauges(run_id)                  # after ray.init, in the driver
    gauges.record(step, metrics, completions=256)
    gauges.flush()                               # at the run's end: the last steps' values

Each exported metric is declared once in `EXPORTED`, with the step-metric keys it is set from.
How Ray exports them (Ray 2.60, OpenTelemetry recorder): the driver's core worker sends its values
to its node's metrics agent every `metrics_report_interval_ms` (10 s by default) and at
ray.shutdown; the agent serves them at http://<node>:<metrics_export_port>/metrics with Ray's
`ray_` prefix: `grpo_ray_reward_mean` is scraped as `ray_grpo_ray_reward_mean`, a counter as
`ray_grpo_ray_completions_total` (`prometheus_name`), each with Ray's labels (SessionName,
NodeAddress, WorkerId, ...) besides ours. The agent drops a gauge's series two report intervals
after its process stops reporting it, so a finished run's gauges vanish within about 20 s;
counters stay until the agent restarts.

Ray reports every 10 s, so setting every gauge at every step buys nothing, and it cost ~4 ms of
the driver's time per tiny-recipe step (1.9% of its loop): `record` hands values to Ray at most
once per `every_s` (5 s), the gauges their latest values and the counter the sum since the last
hand-over.

Gauges hold the last step's value; the one counter, completions, sums over steps, so its rate is
completions per second however often Prometheus scrapes. Policy staleness (steps between the
weights a batch was sampled with and the learner's) is always 0 with the synchronous loop; it is
exported from `batch/staleness` when a step reports it, else 0, so the panel exists before
pipelining does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

# The prefix Ray's metrics agent puts before every metric name it serves.
RAY_PREFIX = "ray_"


class Kind(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True)
class RayMetric:
    # Name declared to ray.util.metrics (Prometheus-safe: letters, digits, _).
    name: str
    kind: Kind
    description: str
    # Step-metric keys it is set from, the first one present wins; with `tag`, one series per key.
    keys: tuple[str, ...]
    # Tag whose value is the last part of each key ("timing/rollout" -> phase="rollout").
    tag: str | None = None
    # Value when no key is present; None: nothing is recorded.
    default: float | None = None


PHASES = ("rollout", "reward", "reference", "teacher", "advantages", "update", "sync")
# Keys StepGauges.record adds from its arguments: the step number, and the step's generated rows
# (unless the step's metrics report them).
STEP_KEY = "train/step"
COMPLETIONS_KEY = "batch/completions"

EXPORTED: tuple[RayMetric, ...] = (
    RayMetric("grpo_ray_step", Kind.GAUGE, "Optimizer steps done", (STEP_KEY,)),
    RayMetric(
        "grpo_ray_rollout_tokens_per_s",
        Kind.GAUGE,
        "Completion tokens generated per second of the last step",
        ("throughput/completion_tokens_per_s",),
    ),
    RayMetric(
        "grpo_ray_learner_tokens_per_s",
        Kind.GAUGE,
        "Tokens the learners trained on per second of the update phase",
        ("throughput/learner_tokens_per_s",),
    ),
    RayMetric(
        "grpo_ray_completions_in_flight",
        Kind.GAUGE,
        "Completions generated for the last step (sampled together)",
        (COMPLETIONS_KEY,),
    ),
    RayMetric("grpo_ray_completions", Kind.COUNTER, "Completions generated", (COMPLETIONS_KEY,)),
    RayMetric("grpo_ray_reward_mean", Kind.GAUGE, "Mean reward of the last step's completions", ("reward/mean",)),
    RayMetric(
        "grpo_ray_reward_failures",
        Kind.GAUGE,
        "Completions of the last step whose reward failed (None or an error)",
        ("reward/failed",),
    ),
    RayMetric(
        "grpo_ray_phase_seconds",
        Kind.GAUGE,
        "Wall seconds of each phase of the last step",
        tuple(f"timing/{phase}" for phase in PHASES),
        tag="phase",
    ),
    RayMetric("grpo_ray_step_seconds", Kind.GAUGE, "Wall seconds of the last step", ("timing/step",)),
    RayMetric("grpo_ray_weight_sync_seconds", Kind.GAUGE, "Seconds of the last weight sync", ("sync/seconds",)),
    RayMetric(
        "grpo_ray_weight_sync_gbytes_per_s",
        Kind.GAUGE,
        "Gigabytes per second of the last weight sync",
        ("sync/gbytes_per_s",),
    ),
    RayMetric(
        "grpo_ray_policy_staleness",
        Kind.GAUGE,
        "Steps between the weights the last batch was sampled with and the learner's",
        ("batch/staleness",),
        default=0.0,
    ),
)


def prometheus_name(metric: RayMetric) -> str:
    """The name a Prometheus scrape of Ray's metrics agent shows."""
    return RAY_PREFIX + metric.name + ("_total" if metric.kind is Kind.COUNTER else "")


EXPORTED_NAMES = frozenset(prometheus_name(m) for m in EXPORTED)


def readings(metric: RayMetric, metrics: Mapping[str, float]) -> list[tuple[dict[str, str], float]]:
    """(extra tags, value) of each series of `metric` this step; missing or non-finite keys skipped."""
    if metric.tag is not None:
        return [
            ({metric.tag: key.rsplit("/", 1)[1]}, float(metrics[key]))
            for key in metric.keys
            if key in metrics and math.isfinite(metrics[key])
        ]
    present = [key for key in metric.keys if key in metrics]
    if not present:
        return [] if metric.default is None else [({}, metric.default)]
    value = float(metrics[present[0]])
    if not math.isfinite(value) or (metric.kind is Kind.COUNTER and value <= 0):
        return []  # a Ray counter only moves up
    return [({}, value)]


def _ray_instrument(metric: RayMetric, tag_keys: tuple[str, ...]):
    from ray.util.metrics import Counter, Gauge

    cls = Gauge if metric.kind is Kind.GAUGE else Counter
    return cls(metric.name, description=metric.description, tag_keys=tag_keys)


class StepGauges:
    """Ray metrics of one run, tagged run=<MLflow run id>; create after ray.init, in the driver."""

    def __init__(
        self,
        run_id: str,
        make: Callable[[RayMetric, tuple[str, ...]], object] = _ray_instrument,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tags = {"run": run_id}
        self.instruments = {m.name: make(m, ("run",) + ((m.tag,) if m.tag else ())) for m in EXPORTED}
        self.every_s, self.clock = every_s, clock
        self._last_flush = -math.inf
        # (metric name, extra tags as a sorted tuple) -> the latest gauge value / the counter's sum.
        self._gauges: dict[tuple[str, tuple], float] = {}
        self._counts: dict[tuple[str, tuple], float] = {}

    def record(self, step: int, metrics: Mapping[str, float], completions: int | None = None) -> None:
        """Take the step's metric dict (`completions`: its generated rows); hand them to Ray when
        every_s has passed since the last hand-over."""
        metrics = {**metrics, STEP_KEY: float(step)}
        if completions is not None:
            metrics.setdefault(COMPLETIONS_KEY, float(completions))
        for metric in EXPORTED:
            for extra, value in readings(metric, metrics):
                key = (metric.name, tuple(sorted(extra.items())))
                if metric.kind is Kind.GAUGE:
                    self._gauges[key] = value
                else:
                    self._counts[key] = self._counts.get(key, 0.0) + value
        if self.clock() - self._last_flush >= self.every_s:
            self.flush()

    def flush(self) -> None:
        """Hand what was recorded since the last hand-over to Ray."""
        for (name, extra), value in self._gauges.items():
            self.instruments[name].set(value, tags={**self.tags, **dict(extra)})
        for (name, extra), value in self._counts.items():
            self.instruments[name].inc(value, tags={**self.tags, **dict(extra)})
        self._gauges, self._counts = {}, {}
        self._last_flush = self.clock()
