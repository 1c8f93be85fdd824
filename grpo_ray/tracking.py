"""Where a run's numbers go: MLflow (compare runs) and the terminal (watch this one).

Metric keys are "phase/name" (reward/mean, timing/rollout, eval/accuracy). The MLflow store
defaults to sqlite under the run's output_dir, with artefacts beside it, so a run is one folder.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from grpo_ray import __version__

# Environment variables whose names look like credentials never reach MLflow or the logs.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)


def default_tracking_uri(output_dir: Path) -> str:
    return f"sqlite:///{output_dir.resolve() / 'mlflow.db'}"


class MlflowTracker:
    """One MLflow run per training run; metrics are logged in batches per step."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        run_name: str | None,
        artifact_root: Path | None,
        resume_run_id: str | None = None,
    ):
        # MLflow's file store refuses to work without this; harmless for other stores.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        self.tracking_uri = tracking_uri
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            location = artifact_root.resolve().as_uri() if artifact_root else None
            experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        else:
            experiment_id = found.experiment_id
        self.experiment_id = experiment_id
        self.stage_run_id: str | None = None  # the open stage's nested run, if any
        self._pending: list = []  # metric batches queued to MLflow's logging thread
        if resume_run_id is not None:  # a resumed run goes on logging into the run it started
            self.run_id = resume_run_id
            self.client.update_run(resume_run_id, status="RUNNING")
            return
        tags = {"grpo_ray.version": __version__, "grpo_ray.command": " ".join(sys.argv[:3])}
        commit = _git_commit()
        if commit:
            tags["mlflow.source.git.commit"] = commit
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id

    def log_config(self, flat_params: dict[str, Any], config_dict: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key, _param_value(value)) for key, value in flat_params.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        text = yaml.safe_dump(config_dict, sort_keys=False)
        self.client.log_text(self.run_id, text, "config.yaml")
        # Two runs with the same hash ran the same resolved recipe (output paths included).
        self.client.set_tag(self.run_id, "grpo_ray.config_hash", hashlib.sha256(text.encode()).hexdigest()[:16])

    def set_tags(self, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Into the training run, and into the open stage's run too (each curve complete in both)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, step) for key, value in metrics.items() if math.isfinite(value)]
        for run_id in filter(None, (self.run_id, self.stage_run_id)):
            for start in range(0, len(batch), 1000):
                # Queued to MLflow's logging thread: a database commit per step would be ~10% of a
                # tiny step. flush() waits for the queue (every checkpoint and the run's end).
                self._pending.append(
                    self.client.log_batch(run_id, metrics=batch[start : start + 1000], synchronous=False)
                )

    def flush(self) -> None:
        """Wait until every metric logged so far is in the store."""
        pending, self._pending = self._pending, []
        for operation in pending:
            operation.wait()

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        """A table (one dict per row) as a JSON artefact the MLflow UI shows as a table."""
        if rows:
            self.client.log_table(self.run_id, {key: [row[key] for row in rows] for key in rows[0]}, artifact_file)

    def start_stage(self, name: str, params: dict[str, Any]) -> str:
        """Open a run nested under the training run (MLflow's parent tag) for one training stage."""
        self.end_stage("FINISHED")
        from mlflow.entities import Param

        tags = {"mlflow.parentRunId": self.run_id, "grpo_ray.stage": name}
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        self.stage_run_id = run.info.run_id
        self.client.log_batch(self.stage_run_id, params=[Param(k, _param_value(v)) for k, v in params.items()])
        return self.stage_run_id

    def resume_stage(self, stage_run_id: str) -> None:
        self.stage_run_id = stage_run_id
        self.client.update_run(stage_run_id, status="RUNNING")

    def set_stage_tag(self, key: str, value: str) -> None:
        if self.stage_run_id is not None:
            self.client.set_tag(self.stage_run_id, key, value)

    def log_stage_artifact(self, path: Path) -> None:
        if self.stage_run_id is not None:
            self.client.log_artifact(self.stage_run_id, str(path))

    def end_stage(self, status: str) -> None:
        self.flush()
        if self.stage_run_id is not None:
            self.client.set_terminated(self.stage_run_id, status=status)
            self.stage_run_id = None

    @contextmanager
    def ending(self) -> Iterator[MlflowTracker]:
        """End the run (and an open stage) however the block leaves: FINISHED, KILLED on Ctrl-C or
        SIGTERM (raised as KeyboardInterrupt), FAILED on any error."""
        status = "FAILED"
        try:
            yield self
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            self.finish(status)

    def finish(self, status: str) -> None:
        self.end_stage(status)  # flushes the queued metrics first
        self.client.set_terminated(self.run_id, status=status)


def _param_value(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip() if isinstance(value, (list, dict)) else str(value)
    return text[:6000]


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def redact_config(value: Any, environ: dict[str, str] | None = None) -> Any:
    """The config as MLflow may see it: values under secret-looking keys (api_key, token, ...)
    and any string equal to the value of a secret-looking environment variable become "***"."""
    environ = os.environ if environ is None else environ
    secrets = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= 4}

    def walk(item: Any, key: str = "") -> Any:
        if isinstance(item, dict):
            return {k: walk(v, str(k)) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v, key) for v in item]
        if isinstance(item, str) and (item in secrets or (_SECRET_NAME.search(key) and item)):
            return "***"
        return item

    return walk(value)


class ConsoleReporter:
    """A progress bar on a terminal; one plain line per step otherwise (job logs, CI).

    Both show the step, reward, held-out accuracy, seconds per step, the ETA and, in pipelined runs
    (rollout.max_staleness > 0), how many updates old the step's batch was. Pauses between steps
    (evaluation, checkpoints) are named by phase() so the bar does not look frozen.
    """

    # The bar's own ETA (tqdm's elapsed<remaining) would count evaluation and start-up as step time.
    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(self, total_steps: int, stream=None, pipelined: bool = False):
        self.stream = stream or sys.stdout
        self.total = total_steps
        self.pipelined = pipelined
        self.step_seconds: list[float] = []
        self.accuracy: float | None = None  # the last held-out accuracy, shown until the next evaluation
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_steps, file=self.stream, unit="step", dynamic_ncols=True, bar_format=self.BAR_FORMAT
            )

    def info(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message)
        else:
            self._write(message)

    def phase(self, what: str | None) -> None:
        """Say what the run does between steps ("step 10: evaluating 64 held-out prompts"); None
        when it goes back to training steps."""
        if self.bar is not None:
            self.bar.set_description_str(what or "", refresh=True)
        elif what:
            self._write(what)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.accuracy = metrics.get("eval/accuracy", self.accuracy)
        # From step times only: start-up and evaluation would inflate the first estimates.
        self.step_seconds.append(metrics.get("timing/step", 0.0))
        eta = sum(self.step_seconds) / len(self.step_seconds) * (self.total - step)
        fields = self.fields(metrics, eta)
        if self.bar is not None:
            self.bar.set_description_str("", refresh=False)
            self.bar.set_postfix_str("  ".join(f"{k} {v}" for k, v in fields.items()), refresh=False)
            self.bar.update(1)
            return
        self._write(f"step {step}/{self.total}  " + "  ".join(f"{k} {v}" for k, v in fields.items()))

    def fields(self, metrics: dict[str, float], eta: float) -> dict[str, str]:
        """What a step shows, formatted: absent values are left out (no accuracy before the first evaluation)."""
        shown = {
            "reward": metrics.get("reward/mean"),
            "acc": self.accuracy,
            "loss": metrics.get("loss/total"),
            "s/step": metrics.get("timing/step"),
            # Updates between the weights that sampled this step's batch and the learner's.
            "stale": metrics.get("batch/staleness") if self.pipelined else None,
            # Episodes (environment.spec): turns, tool calls and failed calls per episode, the failed
            # fraction, then each kind of failure counted (env_failures/*: "reset-timeouts 1").
            "turns": metrics.get("episode/turns"),
            "calls": metrics.get("episode/tool_calls"),
            "tool-errors": metrics.get("episode/tool_errors") or None,
            "env-failed": metrics.get("episode/failed") or None,
            **{
                key.removeprefix("env_failures/").replace("_", "-"): value or None
                for key, value in metrics.items()
                if key.startswith("env_failures/")
            },
        }
        fields = {k: f"{v:.4g}" for k, v in shown.items() if v is not None and math.isfinite(v)}
        if self.pipelined and "pipeline/ahead_during_update" in metrics:
            # The update overlapped this many batches started ahead, of which this many finished before it.
            fields["ahead"] = (
                f"{metrics['pipeline/ahead_generated_by_update_end']:.0f}/"
                f"{metrics['pipeline/ahead_during_update']:.0f} done"
            )
        fields["eta"] = _duration(eta)
        return fields

    def _write(self, line: str) -> None:
        # Straight to the stream: print() in a Ray driver goes through Ray's tqdm-aware wrapper,
        # ~1.5 ms a line (a tiny-recipe step is 0.2 s).
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _duration(seconds: float) -> str:
    """45s, 12m05s, 3h07m: a glance's worth of precision."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
