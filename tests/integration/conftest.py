"""A real local Ray for the tests in this folder, started once per module and always stopped."""

import importlib.util
import subprocess

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from grpo_ray.cluster.session import actor_env

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": actor_env()})
    try:
        yield ray
    finally:
        ray.shutdown()


def ray_processes() -> list[str]:
    """Command lines of Ray's own daemons still running on this machine."""
    # A zombie (state Z, "<defunct>") is a process that has already died and waits to be reaped by
    # its parent (init, for daemons that `ray stop` killed): it holds nothing.
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    return [line.split(None, 1)[1] for line in out.splitlines()
            if ("raylet" in line or "gcs_server" in line) and "grep" not in line and not line.lstrip().startswith("Z")]
