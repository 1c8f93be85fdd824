"""`grpo-ray train` joins a running cluster when RAY_ADDRESS is set, and leaves it as it found it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ray_head

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def head_node():
    # Every agent on a port of its own: with Ray's fixed defaults (the dashboard agent's 52365), a
    # node still shutting down from an earlier test can hold them, and the new head's actors are
    # then cancelled before they start (seen once in CI).
    with ray_head() as (address, _):
        yield address


def test_train_joins_the_cluster_named_by_ray_address(tmp_path, head_node):
    # The head runs without token authentication; so must its drivers. (An in-process ray.init of an
    # earlier test leaves RAY_AUTH_MODE=token in this process's environment: a driver that inherits
    # it had its actors cancelled before they started, which CI saw.)
    env = dict(os.environ, RAY_ADDRESS=head_node, RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_ray.cli",
            "train",
            "configs/tiny.yaml",
            "--set",
            f"output_dir={tmp_path}",
            "--set",
            "train.steps=2",
            "--set",
            "data.eval_limit=20",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"running on the Ray cluster at {head_node}" in out.stdout
    # The cluster is still up, and every CPU the run's actors held is free again.
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ray, time; ray.init(); time.sleep(2); print(ray.available_resources().get('CPU'))",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert check.stdout.strip().splitlines()[-1] == "2.0", check.stdout + check.stderr[-2000:]
