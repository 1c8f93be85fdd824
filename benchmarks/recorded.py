"""What a grpo-ray run recorded in its MLflow store, as the benchmarks read it back, and what a
benchmark found, as it writes it.

client, run = training_run(f"sqlite:///{output_dir / 'mlflow.db'}")
curve = history(client, run, "eval/accuracy")
write_results(args.json, found, markdown(found))
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def training_run(tracking_uri: str):
    """(MlflowClient, the run) of the store's one training run: experiment grpo-ray's top-level run
    (a staged recipe's nested stage runs are left out)."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x only reads a file store when asked
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("grpo-ray").experiment_id
    (run,) = [r for r in client.search_runs([experiment]) if "mlflow.parentRunId" not in r.data.tags]
    return client, run


def history(client, run, key: str) -> list:
    """Every value of `key` the run logged, by step."""
    return sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)


def write_results(path: Path, found: dict, table: str) -> None:
    """The benchmark's findings as JSON at `path`, its table beside it (the same name, .md), and the
    table printed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found, indent=1) + "\n")
    path.with_suffix(".md").write_text(table)
    print(table)
