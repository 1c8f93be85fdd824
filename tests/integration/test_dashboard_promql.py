"""Every query of dashboards/grpo-ray.json, evaluated by a real Prometheus scraping a real Ray head
during a run, returns the run's series.

test_ray_metrics_scrape.py checks that the names appear on the endpoint; this one checks that the
dashboard's PromQL (label names, aggregations, rate windows) finds them. Debian's `prometheus` is
installed when missing (CI runs as root: apt-get adds about 30 s) or the test is skipped, saying why.
The head is this test's own, on 127.0.0.1, and only its processes are stopped afterwards.
"""

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from grpo_ray.transport.broadcast import free_port

from .conftest import ROOT, TINY, free_ports, ray_head, run_cli, set_args

DASHBOARD = ROOT / "dashboards" / "grpo-ray.json"
# Panels a CPU-only head cannot fill: Ray exports no GPU gauges without a GPU.
NEEDS_GPU = {"avg by (instance) (ray_node_gpus_utilization)"}

pytestmark = pytest.mark.slow


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("prometheus is not installed and cannot be here (apt-get as root): apt-get install -y prometheus")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"could not install Debian's prometheus ({' '.join(command)}: {last})")
    return shutil.which("prometheus") or pytest.skip("apt-get installed prometheus but it is not on PATH")


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


@pytest.fixture()
def metrics_head():
    """A head of this test's own whose metrics endpoint Prometheus scrapes; every server on 127.0.0.1."""
    (metrics_port,) = free_ports(1)
    with ray_head(metrics_port, loopback_only=True) as (address, _):
        yield address, metrics_port


@pytest.fixture()
def prometheus(tmp_path, metrics_head):
    binary = prometheus_binary()
    _, metrics_port = metrics_head
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: ray, static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]}}]\n"
    )
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=2).close()
            break
        except OSError:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Prometheus was not ready within 60 s"
            time.sleep(0.5)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def query(url: str, expr: str) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_every_dashboard_query_returns_the_runs_series(tmp_path, metrics_head, prometheus):
    address, _ = metrics_head
    settings = [f"output_dir={tmp_path / 'run'}", "train.steps=4", "data.eval_limit=20", f"ray.address={address}"]
    out = run_cli(
        "train",
        str(TINY),
        *set_args(*settings),
        timeout=400,
        RAY_AUTH_MODE="disabled",
        # The driver too keeps 127.0.0.1 as it is: Ray would otherwise resolve it to this
        # machine's network address, where the head does not listen.
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_id = out.stdout.strip().splitlines()[-1].split()[2].rstrip(":")  # "MLflow run <id>: <uri>"
    queries = [expr for expr in dashboard_queries() if expr not in NEEDS_GPU]
    assert len(queries) >= 15, queries
    # Grafana's variables as a user picking this run would get them.
    concrete = {expr: expr.replace("$run", run_id).replace("$__rate_interval", "1m") for expr in queries}
    # The driver's last values reach the endpoint at its shutdown and stay two report intervals
    # (Ray's metrics agent, 10 s each): poll until every query has answered once.
    answered: dict[str, list[dict]] = {}
    deadline = time.monotonic() + 90
    while len(answered) < len(concrete) and time.monotonic() < deadline:
        for expr, promql in concrete.items():
            if expr in answered:
                continue
            series = query(prometheus, promql)
            per_run = "$run" in expr
            if any(s["metric"].get("run") == run_id for s in series) if per_run else series:
                answered[expr] = series
        time.sleep(1)
    missing = [expr for expr in concrete if expr not in answered]
    assert not missing, f"no series for run {run_id} from: {missing}"
