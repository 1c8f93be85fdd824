"""Connect to Ray: an existing cluster when one is named, else a local Ray that we own and stop."""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import psutil

from grpo_ray.cluster.address import check_cluster_answers
from grpo_ray.config import RayConfig
from grpo_ray.errors import ClusterError, first_line
from grpo_ray.quiet import actor_noise_env, quiet_driver

# Environment of every actor process. OMP_WAIT_POLICY must be set before torch is imported:
# with OpenMP's default spinning, torch threads on a 2-core machine ran 10-35x slower.
ACTOR_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}

# Ray gives a local node's raylet 30 s (fixed in ray._private.node) to register with its GCS; a
# 2-core machine busy with other work can take longer, and Ray then raises this with its
# processes still running. A second try after they are stopped usually starts; any other failure
# is no slow start and is said at once.
SLOW_START = "timed out during startup"
# Fault drill (tests only): "1" stops the first try's raylet, a real slow start.
STALLED_RAYLET_DRILL = "GRPO_RAY_DRILL_STALL_FIRST_RAYLET"

T = TypeVar("T")


@dataclass(frozen=True)
class RaySession:
    address: str
    started_local: bool
    dashboard_url: str | None
    metrics_url: str | None = None  # this node's Prometheus endpoint (Ray's and grpo-ray's metrics)


def _nothing() -> None:
    pass


def actor_env() -> dict[str, str]:
    env = {**ACTOR_ENV, **actor_noise_env()}
    # Actors build or find the offline tiny model in the same cache as the driver, and put the
    # weight hand-off's files where the driver's user said (transport/handoff.py).
    for name in ("GRPO_RAY_CACHE", "GRPO_RAY_SHM_DIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


@contextlib.contextmanager
def ray_session(cfg: RayConfig, notice: Callable[[str], None] = print) -> Iterator[RaySession]:
    """Join RAY_ADDRESS / cfg.address (as under `ray job submit`), or start and finally stop a local
    Ray; `notice` hears of a second try at starting one."""
    import ray

    quiet_driver()
    address = joins_cluster(cfg)
    common = dict(logging_level="WARNING", log_to_driver=True, runtime_env={"env_vars": actor_env()})
    if address:
        check_cluster_answers(address, "ray.address" if cfg.address else "RAY_ADDRESS")
        context = ray.init(address=address, **common)
    else:
        context = _start_local(cfg, common, notice)
    dashboard = getattr(context, "dashboard_url", None) or None
    try:
        yield RaySession(
            # The address the user named (RAY_ADDRESS or ray.address) reads better than Ray's node IP.
            address=address or context.address_info.get("address", "local"),
            started_local=not address,
            dashboard_url=f"http://{dashboard}" if dashboard else None,
            metrics_url=_metrics_url(ray),
        )
    finally:
        # Stops a local Ray's processes; on a cluster, ends this job's actors (they die with the driver).
        ray.shutdown()


@contextlib.contextmanager
def ray_session_beside(
    cfg: RayConfig, work: Callable[[], T], notice: Callable[[str], None] = print, started: Callable[[], None] = _nothing
) -> Iterator[tuple[RaySession, T]]:
    """ray_session of a local Ray, with `work` run in a thread while Ray starts on this one (ray.init
    belongs on the main thread; its start mostly waits on Ray's own processes, which leaves the
    interpreter to `work`; a cluster, joined, has no start to overlap: training/launch.py). Yields
    the session and work's result; `started` is called once Ray is up. work's error comes first,
    whether Ray started or not (a bad input explains more than what it made Ray do), and the Ray
    started here is stopped on the way out."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="beside-ray") as pool, contextlib.ExitStack() as stack:
        working = pool.submit(work)
        try:
            session = stack.enter_context(ray_session(cfg, notice))
        except Exception:
            working.result()
            raise
        started()
        yield session, working.result()


def joins_cluster(cfg: RayConfig) -> str | None:
    """The cluster a run joins (ray.address, else RAY_ADDRESS, as under `ray job submit`); None: it
    starts a local Ray."""
    return cfg.address or os.environ.get("RAY_ADDRESS")


def cluster_tags() -> dict[str, str]:
    """The MLflow tags of the cluster the run's actors started on: its nodes and CPUs."""
    import ray

    return {"cluster.nodes": str(len(ray.nodes())), "cluster.cpus": f"{ray.cluster_resources().get('CPU', 0):g}"}


def _start_local(cfg: RayConfig, common: dict, notice: Callable[[str], None]):
    """ray.init of a local Ray, tried twice where the first try was a slow start; ClusterError (one
    line) when it does not start. Whatever a failed try started is stopped before the next."""
    import ray

    for attempt in (1, 2):
        before = _descendants()
        if attempt == 1 and os.environ.get(STALLED_RAYLET_DRILL) == "1":
            _stall_the_raylet_soon(before)
        try:
            with _local_node(cfg.node_ip) as node_ip:
                return ray.init(
                    address="local",
                    num_cpus=cfg.num_cpus or os.cpu_count(),
                    include_dashboard=cfg.dashboard,
                    dashboard_host=cfg.dashboard_host,
                    # A fixed port lets Prometheus scrape a local run (dashboards/grpo-ray.json); None: random.
                    _metrics_export_port=cfg.metrics_export_port,
                    _node_ip_address=node_ip,
                    **common,
                )
        except KeyboardInterrupt:  # Ctrl-C while it starts: what it started goes with the command
            _stop_new(before)
            raise
        except Exception as err:  # noqa: BLE001 - Ray raises bare Exception for a start that timed out
            ray.shutdown()
            _stop_new(before)
            # The failed try's GCS client stays in Ray's internal KV; once its GCS is gone it would
            # end this process 60 s later ("Failed to connect to GCS within 60 seconds").
            ray.experimental.internal_kv._internal_kv_reset()
            gc.collect()
            slow = SLOW_START in str(err)
            if slow and attempt == 1:
                notice(f"the local Ray was slow to start ({first_line(err)}); starting it once more")
                continue
            raise ClusterError(
                f"the local Ray did not start ({first_line(err)})"
                + ("; twice: free the machine's CPUs (other jobs?) and try again" if slow else "")
                + "; `ray start --head` shows Ray's own report"
            ) from None
    raise AssertionError("unreachable")


def _descendants() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _stop_new(before: set[int]) -> None:
    """Kill the processes a failed start left (Ray's GCS, raylet, dashboard: they outlive its error)."""
    started = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
    for child in started:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(started, timeout=10)


def _stall_the_raylet_soon(before: set[int]) -> None:
    """Fault drill (tests only): stop the raylet the first try starts (SIGSTOP), as a machine too busy
    to run it would, so that Ray's own start-up deadline passes for real."""

    def stall() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.pid not in before and child.name() == "raylet":
                        child.send_signal(signal.SIGSTOP)
                        return
            time.sleep(0.05)

    threading.Thread(target=stall, name="grpo-ray-drill-stall-raylet", daemon=True).start()


@contextlib.contextmanager
def _local_node(node_ip: str | None) -> Iterator[str]:
    """The address a local Ray is started on: 127.0.0.1 unless ray.node_ip names another.

    Ray turns a loopback node address into the machine's network address wherever it allows
    clusters (Linux): its servers would then listen on the network. On macOS and Windows it keeps
    the loopback address instead, and every server (GCS, raylet, object manager, agents, metrics)
    binds 127.0.0.1; ENABLE_RAY_CLUSTER off for the start gives Linux that same behaviour.
    tests/integration/test_local_ray_loopback.py proves it on every listening socket of a run.
    """
    from ray._private import ray_constants

    loopback = node_ip is None or ipaddress.ip_address(node_ip).is_loopback
    saved = ray_constants.ENABLE_RAY_CLUSTER
    if loopback:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield "127.0.0.1" if loopback else node_ip
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def _metrics_url(ray) -> str | None:
    """The Prometheus endpoint of the node this driver runs on, from Ray's node table."""
    here = ray.util.get_node_ip_address()
    for node in ray.nodes():
        if node.get("Alive") and node.get("NodeManagerAddress") == here and node.get("MetricsExportPort"):
            return f"http://{here}:{node['MetricsExportPort']}/metrics"
    return None
