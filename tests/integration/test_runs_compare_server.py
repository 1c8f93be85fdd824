"""`grpo-ray runs compare` against a real `mlflow server` (the REST store a shared cluster uses),
started here as a subprocess and always stopped, with every process it forked."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from grpo_ray.cli import main
from grpo_ray.tracking import MlflowTracker

START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until_healthy(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail(f"mlflow server not healthy after {START_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")


def stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its workers too), SIGKILL what is left after 20 s."""
    pgid = server.pid  # start_new_session: the server leads its own group
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
        server.wait(timeout=10)
        deadline = time.monotonic() + 10
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.fixture
def mlflow_server(tmp_path):
    mlflow = Path(sys.executable).parent / "mlflow"
    port = free_port()
    log = tmp_path / "server.log"
    command = [
        str(mlflow),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        "--default-artifact-root",
        str(tmp_path / "art"),
    ]
    # The server's job runner (a pool of huey consumers, for GenAI features) is not needed to track runs.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(url, server, log)
        yield url
    finally:
        stop(server)
        assert server.poll() is not None
        assert not group_alive(server.pid), "a process of the mlflow server is still running"


def log_run(uri: str, name: str, lr: float, rewards: list[float]) -> str:
    tracker = MlflowTracker(tracking_uri=uri, experiment="grpo-server", run_name=name, artifact_root=None)
    tracker.log_config({"model": "tiny", "train.steps": len(rewards), "train.lr": lr}, {"model": "tiny"})
    for step, reward in enumerate(rewards, start=1):
        tracker.log_metrics(step, {"reward/mean": reward, "loss/total": 1 - reward, "timing/step": 0.5})
    tracker.log_metrics(len(rewards), {"eval/accuracy": rewards[-1] / 2})
    tracker.finish("FINISHED")
    return tracker.run_id


def test_compare_runs_on_a_tracking_server(mlflow_server, tmp_path):
    first = log_run(mlflow_server, "first", 1e-6, [0.1, 0.4, 0.3])
    second = log_run(mlflow_server, "second", 1e-5, [0.2, 0.5, 0.9])
    plot = tmp_path / "curves.png"

    result = CliRunner().invoke(
        main,
        ["runs", "compare", "--experiment", "grpo-server", "--plot", str(plot)],
        env={"MLFLOW_TRACKING_URI": mlflow_server},
    )
    assert result.exit_code == 0, result.output
    rows = {label: cells for label, *cells in (re.split(r" {2,}", line) for line in result.output.splitlines())}
    assert rows[""] == [f"first ({first[:8]})", f"second ({second[:8]})"]
    assert rows["train.lr"] == ["1e-06", "1e-05"]
    assert "2 params identical in all runs (not shown)" in result.output
    # first: rewards 0.1, 0.4, 0.3 -> last 0.3, best 0.4 at step 2; its loss 1 - reward is lowest there too.
    assert rows["reward/mean last"] == ["0.3", "0.9"]
    assert rows["reward/mean best (max)"] == ["0.4 (step 2)", "0.9 (step 3)"]
    assert rows["loss/total best (min)"] == ["0.6 (step 2)", "0.1 (step 3)"]
    assert rows["eval/accuracy last"] == ["0.15", "0.45"]
    assert rows["status"] == ["FINISHED", "FINISHED"]
    assert plot.read_bytes().startswith(b"\x89PNG")

    missing = CliRunner().invoke(main, ["runs", "compare", first, "0" * 32, "--tracking-uri", mlflow_server])
    assert missing.exit_code == 1
    assert missing.output.strip() == f"error: unknown run id {'0' * 32} at {mlflow_server}"
