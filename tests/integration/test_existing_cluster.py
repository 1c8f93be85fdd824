"""`grpo-ray train` joins a running cluster when RAY_ADDRESS is set, and leaves it as it found it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_ray.transport.broadcast import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def head_node(tmp_path):
    port = free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    subprocess.run(
        [str(ray_bin), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats"],
        check=True, capture_output=True, env=env, timeout=120,
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True, env=env, timeout=120)


def test_train_joins_the_cluster_named_by_ray_address(tmp_path, head_node):
    env = dict(os.environ, RAY_ADDRESS=head_node, PYTHONUNBUFFERED="1")
    out = subprocess.run(
        [sys.executable, "-m", "grpo_ray.cli", "train", "configs/tiny.yaml", "--set", f"output_dir={tmp_path}",
         "--set", "train.steps=2", "--set", "data.eval_limit=20"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"running on the Ray cluster at {head_node}" in out.stdout
    # The cluster is still up, and every CPU the run's actors held is free again.
    check = subprocess.run(
        [sys.executable, "-c",
         "import ray, time; ray.init(); time.sleep(2); print(ray.available_resources().get('CPU'))"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert check.stdout.strip().splitlines()[-1] == "2.0", check.stdout + check.stderr[-2000:]
