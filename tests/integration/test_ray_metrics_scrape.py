"""A running job's metrics on the Prometheus endpoint of a real Ray head (`ray start --head`).

Ray's metrics agent serves what the driver reports every `metrics_report_interval_ms` (10 s) and
on ray.shutdown, and drops a gauge two intervals after the driver stops reporting it, so the
endpoint is polled (in a thread) from before the run starts until every name has been seen.
"""

import re
import threading
import time
import urllib.request

import pytest

from grpo_ray.cluster.ray_metrics import EXPORTED_NAMES
from grpo_ray.transport.broadcast import free_port

from .conftest import TINY, ray_head, run_cli, set_args

# Ray's own metrics the dashboard queries that a CPU-only head serves too.
RAY_OWN = {"ray_node_cpu_utilization", "ray_node_mem_used_host", "ray_node_mem_total_host"}


@pytest.fixture()
def metrics_head():
    metrics_port = free_port()
    with ray_head(metrics_port=metrics_port) as (address, _):  # its own Ray, stopped alone
        yield address, metrics_port


def scrape(port: int) -> set[str]:
    """Names of the metric samples the endpoint serves now."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return set()
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.MULTILINE)}


class Scraper(threading.Thread):
    """Polls the endpoint every half second and keeps every name it has ever seen."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.seen, self.stop = port, set(), threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.seen |= scrape(self.port)
            self.stop.wait(0.5)


def test_a_running_job_exports_every_metric(tmp_path, metrics_head):
    # The driver runs in its own process, as under `ray job submit`: Ray reads its auth mode once
    # per process, and a driver in this one would leave it "disabled" for every later test here.
    address, metrics_port = metrics_head
    wanted = EXPORTED_NAMES | RAY_OWN
    scraper = Scraper(metrics_port)
    scraper.start()
    try:
        settings = [f"output_dir={tmp_path}", "train.steps=3", "data.eval_limit=20", f"ray.address={address}"]
        out = run_cli("train", str(TINY), *set_args(*settings), timeout=400, RAY_AUTH_MODE="disabled")
        assert out.returncode == 0, out.stderr[-2000:]
        # The last step's values are flushed at ray.shutdown and served for two report intervals.
        deadline = time.monotonic() + 60
        while not wanted <= scraper.seen and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        scraper.stop.set()
        scraper.join()
    assert "step 3/3" in out.stdout
    assert not wanted - scraper.seen, f"never scraped: {sorted(wanted - scraper.seen)}"
