"""Compare training runs side by side: `grpo-ray runs compare`.

    grpo-ray runs compare runs/a runs/b
    grpo-ray runs compare 3f2a9c1e... 8b7d0a44... --tracking-uri sqlite:////abs/runs/try/mlflow.db
    MLFLOW_TRACKING_URI=http://mlflow:5000 grpo-ray runs compare --experiment grpo-ray --plot curves.png

The runs are the newest top-level run in each run folder's own mlflow.db (a run's output_dir), the
given run ids of one store, both in the order given, or every top-level run of an experiment (oldest
first); nested stage runs (`MlflowTracker.start_stage`, tagged `mlflow.parentRunId`) are left out:
their parent holds each curve complete. The table has one column per run and these rows:

    folder      for run folders only, the folder as given;
    params      only those whose values differ between the runs (a param missing from a run differs,
                shown "-"), sorted, each value whole (see `wrap_value`); a line counts the others;
    metrics     for each key, its last value (at the highest step) and its best value over the
                run's history with the step it was reached at; best is the minimum for costs and
                the maximum for everything else, by the one rule in `lower_is_better`;
    status      as MLflow has it (FINISHED, FAILED, KILLED, RUNNING), and the duration.

MLflow is read here (`load_compared`); the table (`table_lines`) and the plot (`plot_curves`) only see
`RunRecord`s of plain values, so they are tested on hand-made runs. Every failure of the store
becomes a `RunsCompareError` whose one-line message names the run, experiment or tracking URI.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from grpo_ray.errors import first_line

DEFAULT_METRICS = ("reward/mean", "eval/accuracy", "loss/total", "timing/step")
PLOT_METRICS = ("reward/mean", "eval/accuracy")  # the two panels of --plot
# A metric is a cost, best when lowest, when one of its "/"-separated parts is one of these
# (loss/total, timing/step, sync/seconds, reward/failed, reward/math/failures); any other key is
# best when highest (reward/mean, eval/accuracy, throughput/...).
COST_PARTS = frozenset({"loss", "timing", "seconds", "failed", "failures"})
# Longer param values wrap onto more lines of their cell, never cut. Wrapped rather than widened:
# a table line wider than the terminal folds at its edge and the runs' columns interleave, while a
# wrapped cell keeps every run's value in its own column. A fixed width, not the terminal's, so the
# table is the same in a pipe, a log or a test; 50 keeps two runs within 130 columns.
PARAM_WIDTH = 50
RUN_DB = "mlflow.db"  # what a run's output_dir holds (tracking.default_tracking_uri)
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
    folder: str | None = None  # the run folder it was read from, as given; None for a run id

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


def wrap_value(text: str, width: int = PARAM_WIDTH) -> str:
    """The whole value in lines of at most `width` characters, joined by newlines: each broken after
    its last space in its second half, else at the width, so joining the lines gives the value back.

    Runs of whitespace become one space first: YAML folds a long flow list onto indented lines.
    """
    text, lines = " ".join(text.split()), []
    while len(text) > width:
        space = text.rfind(" ", width // 2, width)
        cut = space + 1 if space >= 0 else width
        lines.append(text[:cut])
        text = text[cut:]
    return "\n".join([*lines, text])


def table_rows(runs: Sequence[RunRecord], metric_keys: Sequence[str]) -> tuple[list[list[str]], int]:
    """The rows of the table (header first, then params, metrics, status, duration) and the
    number of params identical in all runs, which have no row."""
    rows = [["", *(run.column for run in runs)]]
    if any(run.folder for run in runs):
        rows.append(["folder", *(run.folder or "-" for run in runs)])
    differ, identical = split_params([run.params for run in runs])
    for key in differ:
        rows.append([key, *(wrap_value(run.params.get(key, "-")) for run in runs)])
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
    """Left-aligned columns, two spaces apart, no trailing blanks; a cell holding newlines makes
    its row that many lines tall, the other cells blank below their first line."""
    cells = [[cell.split("\n") for cell in row] for row in rows]
    widths = [max(len(line) for row in cells for line in row[i]) for i in range(len(rows[0]))]
    lines = []
    for row in cells:
        for depth in range(max(len(cell) for cell in row)):
            parts = (cell[depth] if depth < len(cell) else "" for cell in row)
            lines.append("  ".join(part.ljust(width) for part, width in zip(parts, widths)).rstrip())
    return lines


def table_lines(runs: Sequence[RunRecord], metric_keys: Sequence[str] = DEFAULT_METRICS) -> list[str]:
    rows, identical = table_rows(runs, metric_keys)
    return [*format_grid(rows), f"{identical} params identical in all runs (not shown)"]


# ---- the plot ---------------------------------------------------------------------------------


def check_plot_path(path: str) -> None:
    """Before anything is fetched, so a wrong name fails at once."""
    if Path(path).suffix.lower() != ".png":
        raise RunsCompareError(f"--plot {path}: must be a .png file")


def plot_labels(runs: Sequence[RunRecord]) -> list[str]:
    """Run folders where all have one, else run names with the id prefix where two share a name."""
    if all(run.folder for run in runs):
        return [run.folder for run in runs]
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

THREE_WAYS = (
    "give run folders (runs/a runs/b), run ids with --tracking-uri URI, or --experiment NAME with --tracking-uri URI"
)


def load_compared(
    targets: Sequence[str], experiment: str | None, tracking_uri: str | None, keys: Sequence[str], uri_flag: bool
) -> tuple[list[RunRecord], list[str]]:
    """The runs the arguments name, and notes for the user (one line each). targets: run folders (a
    folder here, or a path: run ids hold no "/") or run ids; uri_flag: --tracking-uri was typed."""
    folders = [target for target in targets if "/" in target or Path(target).is_dir()]
    if 0 < len(folders) < len(targets):
        other = next(target for target in targets if target not in folders)
        raise RunsCompareError(f"{folders[0]} is a run folder but {other} is not: {THREE_WAYS}, not a mix")
    if folders and (experiment or uri_flag):  # not ignored: the user may think they chose the store
        option = "--experiment" if experiment else "--tracking-uri"
        raise RunsCompareError(f"{option}: not with run folders, each read from its own {RUN_DB}; drop {option}")
    if folders:
        return load_folders(folders, keys)
    if not targets and not experiment:
        raise RunsCompareError(THREE_WAYS)
    if targets and not tracking_uri:
        raise RunsCompareError(
            f"{targets[0]}: no such folder, and run ids need --tracking-uri (or MLFLOW_TRACKING_URI)"
        )
    return load_runs(tracking_uri, targets, experiment, keys), []


def folder_database(target: str) -> Path:
    """The absolute path of a run folder's mlflow.db; a one-line error naming the folder if none."""
    path = Path(target)
    if not path.is_dir():
        raise RunsCompareError(f"{target}: no such folder; give a run's output_dir (the folder holding {RUN_DB})")
    if not (path / RUN_DB).is_file():
        inside = [str(found.parent) for found in sorted(path.glob(f"*/{RUN_DB}"))[:4]]
        fix = f"the run folders in it: {', '.join(inside)}" if inside else "give the output_dir of a training run"
        raise RunsCompareError(f"{target} holds no {RUN_DB}: not a run's output_dir; {fix}")
    return (path / RUN_DB).resolve()


def load_folders(targets: Sequence[str], metric_keys: Sequence[str]) -> tuple[list[RunRecord], list[str]]:
    """The newest top-level run of each folder's own store, in the order given; a note for each
    folder holding several (its output_dir trained again), saying how to compare them all."""
    records, notes, seen = [], [], set()
    for target in targets:
        database = folder_database(target)
        if database not in seen:
            seen.add(database)
            found, note = _newest_run(f"sqlite:///{database}", str(Path(target)), metric_keys)
            records.append(found)
            notes.extend(note)
    if len(records) < 2:
        raise RunsCompareError("only one distinct run folder given; compare needs at least two different runs")
    return records, notes


def _newest_run(uri: str, folder: str, metric_keys: Sequence[str]) -> tuple[RunRecord, list[str]]:
    with _store_errors(uri):
        client = _open_client(uri)
        found = _top_level(client, [each.experiment_id for each in client.search_experiments()], "DESC")
        if not found:
            raise RunsCompareError(f"{folder}/{RUN_DB} holds no run yet; give the output_dir of a run that started")
        newest, experiment = found[0].info, client.get_experiment(found[0].info.experiment_id).name
        note = (
            f"{folder} holds {len(found)} runs; comparing its newest, {newest.run_name} ({newest.run_id[:8]}); "
            f"all: grpo-ray runs compare --experiment {experiment} --tracking-uri {uri}"
        )
        return replace(_record(client, found[0], metric_keys), folder=folder), [note] if len(found) > 1 else []


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
    return _top_level(client, [found.experiment_id], "ASC")


def _top_level(client, experiment_ids: list[str], order: str) -> list:
    """Every active run of the experiments without a parent, by start time (order: ASC or DESC)."""
    runs, token = [], None
    while True:
        page = client.search_runs(
            experiment_ids, order_by=[f"attributes.start_time {order}"], max_results=1000, page_token=token
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
