"""Compare training runs side by side: `grpo-ray runs compare`.

    grpo-ray runs compare 3f2a9c1e... 8b7d0a44... --tracking-uri sqlite:////abs/runs/try/mlflow.db
    MLFLOW_TRACKING_URI=http://mlflow:5000 grpo-ray runs compare --experiment grpo-ray --plot curves.png

The runs are the given run ids (in that order) or every top-level run of an experiment (oldest
first); the nested stage runs `MlflowTracker.start_stage` opens carry `mlflow.parentRunId` and are
left out, since their parent already holds each curve complete. The table has one column per run
and these rows:

    params      only those whose values differ between the runs (a param missing from a run
                differs, shown "-"), sorted; a line after the table counts the identical ones;
    metrics     for each key, its last value (at the highest step) and its best value over the
                run's history with the step it was reached at; best is the minimum for costs and
                the maximum for everything else, by the one rule in `lower_is_better`;
    status      as MLflow has it (FINISHED, FAILED, KILLED, RUNNING), and the duration.

MLflow is read here (`load_runs`); the table (`table_lines`) and the plot (`plot_curves`) only see
`RunRecord`s of plain values, so they are tested on hand-made runs. Every failure of the store
becomes a `RunsCompareError` whose one-line message names the run, experiment or tracking URI.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from grpo_ray.errors import first_line

DEFAULT_METRICS = ("reward/mean", "eval/accuracy", "loss/total", "timing/step")
PLOT_METRICS = ("reward/mean", "eval/accuracy")  # the two panels of --plot
# A metric is a cost, best when lowest, when one of its "/"-separated parts is one of these
# (loss/total, timing/step, sync/seconds, reward/failed, reward/math/failures); any other key is
# best when highest (reward/mean, eval/accuracy, throughput/...).
COST_PARTS = frozenset({"loss", "timing", "seconds", "failed", "failures"})
CELL_WIDTH = 40  # longer param values are cut to this many characters, ending in "…"
CONNECT_TIMEOUT_S = 5.0  # for an http(s) tracking server, before MLflow's own (long) retries


class RunsCompareError(ValueError):
    """Runs that cannot be compared; the message is one line naming the run, experiment or store."""


@dataclass(frozen=True)
class RunRecord:
    """What the table and the plot need of one MLflow run, as plain values."""

    run_id: str
    name: str
    status: str  # FINISHED, FAILED, KILLED, RUNNING, SCHEDULED
    duration_s: float | None  # None while the run has not ended
    params: dict[str, str]  # the flattened config, "train.steps" -> "20"
    history: dict[str, list[tuple[int, float]]]  # metric key -> (step, value), in step order

    @property
    def column(self) -> str:
        return f"{self.name} ({self.run_id[:8]})"


# ---- the table: pure functions of RunRecords ------------------------------------------------


def lower_is_better(key: str) -> bool:
    """The one rule for "best": the minimum for costs (see COST_PARTS), the maximum otherwise."""
    return any(part in COST_PARTS for part in key.split("/"))


def last_and_best(points: Sequence[tuple[int, float]], key: str) -> tuple[float, tuple[int, float]] | None:
    """(last value, (step, best value)) of a history in step order; None if it is empty.

    On a tie the earliest step at which the best value was reached is reported.
    """
    if not points:
        return None
    pick = min if lower_is_better(key) else max
    best_value = pick(value for _, value in points)
    best_step = next(step for step, value in points if value == best_value)
    return points[-1][1], (best_step, best_value)


def split_params(params_per_run: Sequence[dict[str, str]]) -> tuple[list[str], int]:
    """(sorted keys whose values differ between the runs, number of keys equal in all of them)."""
    keys = set().union(*params_per_run)
    differ = sorted(key for key in keys if len({run.get(key) for run in params_per_run}) > 1)
    return differ, len(keys) - len(differ)


def format_value(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _cut(text: str) -> str:
    text = " ".join(text.split())  # a YAML list param may hold newlines
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 1] + "…"


def table_rows(runs: Sequence[RunRecord], metric_keys: Sequence[str]) -> tuple[list[list[str]], int]:
    """The rows of the table (header first, then params, metrics, status, duration) and the
    number of params identical in all runs, which have no row."""
    rows = [["", *(run.column for run in runs)]]
    differ, identical = split_params([run.params for run in runs])
    for key in differ:
        rows.append([key, *(_cut(run.params.get(key, "-")) for run in runs)])
    for key in metric_keys:
        summaries = [last_and_best(run.history.get(key, []), key) for run in runs]
        rows.append([f"{key} last", *(format_value(s[0]) if s else "-" for s in summaries)])
        rows.append(
            [
                f"{key} best ({'min' if lower_is_better(key) else 'max'})",
                *(f"{format_value(s[1][1])} (step {s[1][0]})" if s else "-" for s in summaries),
            ]
        )
    rows.append(["status", *(run.status for run in runs)])
    rows.append(["duration", *(format_duration(run.duration_s) for run in runs)])
    return rows, identical


def format_grid(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def table_lines(runs: Sequence[RunRecord], metric_keys: Sequence[str] = DEFAULT_METRICS) -> list[str]:
    rows, identical = table_rows(runs, metric_keys)
    return [*format_grid(rows), f"{identical} params identical in all runs (not shown)"]


# ---- the plot ---------------------------------------------------------------------------------


def check_plot_path(path: str) -> None:
    """Before anything is fetched, so a wrong name fails at once."""
    if Path(path).suffix.lower() != ".png":
        raise RunsCompareError(f"--plot {path}: must be a .png file")


def plot_labels(runs: Sequence[RunRecord]) -> list[str]:
    """Run names, with the id prefix only where two runs share a name."""
    names = [run.name for run in runs]
    return [run.column if names.count(run.name) > 1 else run.name for run in runs]


def plot_curves(runs: Sequence[RunRecord], path: str, keys: Sequence[str] = PLOT_METRICS) -> None:
    """One panel per key, value against step, one line per run; a PNG through matplotlib's Agg
    canvas (no pyplot, so no global backend is switched in the caller's process)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(6 * len(keys), 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    for axes, key in zip(figure.subplots(1, len(keys), squeeze=False)[0], keys):
        for run, label in zip(runs, plot_labels(runs)):
            points = run.history.get(key)
            if points:
                steps, values = zip(*points)
                axes.plot(steps, values, label=label, marker="." if len(points) <= 50 else None)
        axes.set_title(key)
        axes.set_xlabel("step")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        if axes.has_data():
            axes.legend()
        else:
            axes.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=axes.transAxes)
    destination = Path(path)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(destination, dpi=100)
    except OSError as err:
        raise RunsCompareError(f"--plot {path}: {err.strerror or err}") from err


# ---- reading MLflow ---------------------------------------------------------------------------


def load_runs(
    tracking_uri: str | None, run_ids: Sequence[str], experiment: str | None, metric_keys: Sequence[str]
) -> list[RunRecord]:
    """The runs to compare, each with the history of those of `metric_keys` it logged."""
    if not tracking_uri:
        raise RunsCompareError("--tracking-uri: give the MLflow tracking URI (or set MLFLOW_TRACKING_URI)")
    if bool(run_ids) == bool(experiment):
        raise RunsCompareError("give either run ids or --experiment NAME, not both or neither")
    with _store_errors(tracking_uri):
        client = _open_client(tracking_uri)
        if run_ids:
            found = [_get_run(client, run_id, tracking_uri) for run_id in dict.fromkeys(run_ids)]
        else:
            found = _top_level_runs(client, experiment, tracking_uri)
        if len(found) < 2:
            what = (
                f"experiment {experiment!r} has {len(found)} top-level run(s)"
                if experiment
                else "only one distinct run id given"
            )
            raise RunsCompareError(f"{what}; compare needs at least two different runs")
        return [_record(client, run, metric_keys) for run in found]


@contextmanager
def _store_errors(tracking_uri: str) -> Iterator[None]:
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError  # a sqlite file that is not MLflow's, a database refusing

    try:
        yield
    except (MlflowException, SQLAlchemyError) as err:
        text = str(err.message if isinstance(err, MlflowException) else err).strip()
        message = first_line(text, limit=200) or type(err).__name__
        raise RunsCompareError(f"tracking URI {tracking_uri}: {message}") from err


def _open_client(tracking_uri: str):
    """An MlflowClient, once the store is known to exist: MLflow would create an empty sqlite
    database at a mistyped path, and retry an unreachable server for minutes."""
    from mlflow.tracking import MlflowClient

    parts = urlsplit(tracking_uri)
    if parts.scheme == "sqlite" and tracking_uri.startswith("sqlite:///"):
        database = tracking_uri[len("sqlite:///") :].split("?")[0]
        if database and not Path(database).is_file():
            raise RunsCompareError(f"tracking URI {tracking_uri}: no MLflow database at {database}")
    elif parts.scheme == "file" and not Path(parts.path).is_dir():
        raise RunsCompareError(f"tracking URI {tracking_uri}: no MLflow store at {parts.path}")
    elif parts.scheme in ("http", "https"):
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            socket.create_connection((parts.hostname or "", port), timeout=CONNECT_TIMEOUT_S).close()
        except (OSError, ValueError) as err:  # ValueError: a port that is no number
            raise RunsCompareError(
                f"tracking URI {tracking_uri}: cannot connect ({getattr(err, 'strerror', None) or err})"
            ) from err
    return MlflowClient(tracking_uri)


def _get_run(client, run_id: str, tracking_uri: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as err:
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise RunsCompareError(f"unknown run id {run_id} at {tracking_uri}") from err
        raise


def _top_level_runs(client, experiment: str, tracking_uri: str) -> list:
    """Every active run of the experiment without a parent, oldest first."""
    found = client.get_experiment_by_name(experiment)
    if found is None or found.lifecycle_stage == "deleted":
        raise RunsCompareError(f"unknown experiment {experiment!r} at {tracking_uri}")
    runs, token = [], None
    while True:
        page = client.search_runs(
            [found.experiment_id], order_by=["attributes.start_time ASC"], max_results=1000, page_token=token
        )
        runs.extend(run for run in page if "mlflow.parentRunId" not in run.data.tags)
        token = page.token
        if not token:
            return runs


def _record(client, run, metric_keys: Sequence[str]) -> RunRecord:
    info = run.info
    history = {}
    for key in dict.fromkeys(metric_keys):
        if key in run.data.metrics:
            points = sorted(client.get_metric_history(info.run_id, key), key=lambda m: (m.step, m.timestamp))
            history[key] = [(m.step, m.value) for m in points]
    ended = info.end_time is not None and info.start_time is not None
    return RunRecord(
        run_id=info.run_id,
        name=info.run_name or info.run_id[:8],
        status=info.status,
        duration_s=(info.end_time - info.start_time) / 1000 if ended else None,
        params=dict(run.data.params),
        history=history,
    )
