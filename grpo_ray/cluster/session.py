"""Connect to Ray: an existing cluster when one is named, else a local Ray that we own and stop."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass

from grpo_ray.config import RayConfig
from grpo_ray.quiet import actor_noise_env, quiet_driver

# Environment of every actor process. OMP_WAIT_POLICY must be set before torch is imported:
# with OpenMP's default spinning, torch threads on a 2-core machine ran 10-35x slower.
ACTOR_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class RaySession:
    address: str
    started_local: bool
    dashboard_url: str | None
    metrics_url: str | None = None  # this node's Prometheus endpoint (Ray's and grpo-ray's metrics)


def actor_env() -> dict[str, str]:
    env = {**ACTOR_ENV, **actor_noise_env()}
    # Actors build or find the offline tiny model in the same cache as the driver, and put the
    # weight hand-off's files where the driver's user said (transport/handoff.py).
    for name in ("GRPO_RAY_CACHE", "GRPO_RAY_SHM_DIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


@contextlib.contextmanager
def ray_session(cfg: RayConfig) -> Iterator[RaySession]:
    """Join RAY_ADDRESS / cfg.address (as under `ray job submit`), or start and finally stop a local Ray."""
    import ray

    quiet_driver()
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    common = dict(logging_level="WARNING", log_to_driver=True, runtime_env={"env_vars": actor_env()})
    if address:
        context = ray.init(address=address, **common)
    else:
        with _local_node(cfg.node_ip) as node_ip:
            context = ray.init(
                address="local",
                num_cpus=cfg.num_cpus or os.cpu_count(),
                include_dashboard=cfg.dashboard,
                dashboard_host=cfg.dashboard_host,
                # A fixed port lets Prometheus scrape a local run (dashboards/grpo-ray.json); None: random.
                _metrics_export_port=cfg.metrics_export_port,
                _node_ip_address=node_ip,
                **common,
            )
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
