"""A real local Ray for the tests in this folder, started once per module and always stopped."""

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

HAS_VLLM = importlib.util.find_spec("vllm") is not None
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"


def set_args(*settings: str) -> list[str]:
    """The command line's words for `settings` ("key=value" each): `--set` before each."""
    return [arg for setting in settings for arg in ("--set", setting)]


def train_recipe(recipe: Path, settings: list[str], timeout: float = 900) -> str:
    """`grpo-ray train recipe --set ...` (each of `settings`) as a user's shell runs it; its console
    (standard output and error together), after checking that it succeeded."""
    done = subprocess.run(
        [sys.executable, "-m", "grpo_ray.cli", "train", str(recipe), *set_args(*settings)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert done.returncode == 0, done.stdout[-4000:]
    return done.stdout


def run_cli(*args: str, timeout: float = 300, cwd: Path = ROOT, **env_vars: str) -> subprocess.CompletedProcess:
    """`python -m grpo_ray.cli *args` in a process of its own, as a user's shell runs it (unbuffered,
    this environment plus `env_vars`); what it printed, as text."""
    return subprocess.run(
        [sys.executable, "-m", "grpo_ray.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **env_vars),
        cwd=cwd,
    )


@contextlib.contextmanager
def ray_started(**env: str):
    """A local Ray whose actors get `env` beside the platform's own actor environment."""
    import ray

    from grpo_ray.cluster.session import actor_env

    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        logging_level="WARNING",
        runtime_env={"env_vars": {**actor_env(), **env}},
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def local_ray():
    with ray_started() as ray:
        yield ray


def ray_processes() -> list[str]:
    """Command lines of Ray's own daemons of this checkout's Ray still running on this machine
    (another checkout's, e.g. a developer's run in the main tree beside a fresh clone's tests, is not
    these tests' to count: three "nothing left behind" checks failed on one)."""
    # A zombie (state Z, "<defunct>") is a process that has already died and waits to be reaped by
    # its parent (init, for daemons that `ray stop` killed): it holds nothing.
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    ours = str(Path(sys.prefix).resolve())
    return [
        line.split(None, 1)[1]
        for line in out.splitlines()
        if ("raylet" in line or "gcs_server" in line)
        and "grep" not in line
        and not line.lstrip().startswith("Z")
        and ours in line
    ]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each socket stays bound until all are chosen (free_port() twice
    in a row can return the same port, and ray start then fails on the clash; seen here)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def own_ports(metrics: int | None = None) -> list[str]:
    """Ports a node's agents take: fixed defaults would clash between two nodes on one machine."""
    agent, agent_grpc, runtime_env, free_metrics = free_ports(4)
    metrics = metrics or free_metrics
    return [
        "--num-cpus=2",
        "--disable-usage-stats",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--metrics-export-port={metrics}",
    ]


@contextlib.contextmanager
def ray_head(metrics_port: int | None = None, loopback_only: bool = False, head_args: tuple[str, ...] = ()):
    """`ray start --head` on 127.0.0.1 with its own temp dir and ports, so that its processes (and
    only they: not another test's Ray, nor a developer's) are found and stopped afterwards, with
    those of every node started into it. Yields the head's GCS address and its temp dir. (`ray stop`
    stops every Ray on the machine: a developer's training run beside the tests lost its raylet.)
    head_args: more options of `ray start --head` (a later --include-dashboard wins).

    loopback_only: every server binds 127.0.0.1 (see cluster/session.py: _local_node); its drivers
    then need RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 too, or they look for the GCS on the network address."""
    temp_dir = tempfile.mkdtemp(prefix="grr-")  # short: Ray's socket paths live under it
    (port,) = free_ports(1)
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    if loopback_only:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        started = subprocess.run(
            [
                str(Path(sys.executable).with_name("ray")),
                "start",
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={port}",
                "--include-dashboard=false",
                f"--temp-dir={temp_dir}",
                *own_ports(metrics_port),
                *head_args,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert started.returncode == 0, f"ray start failed: {started.stdout[-1500:]}{started.stderr[-1500:]}"
        yield f"127.0.0.1:{port}", temp_dir
    finally:
        stop_tree(
            [p for p in psutil.process_iter(["cmdline"]) if any(temp_dir in part for part in p.info["cmdline"] or ())]
        )
        shutil.rmtree(temp_dir, ignore_errors=True)


def stop_tree(processes: list[psutil.Process]) -> None:
    """SIGTERM, then SIGKILL whatever is left after 20 s. A Ray node's processes go in the order
    `ray stop` uses: its workers and helpers, then the raylet, then the GCS. Stopped all at once,
    the raylet and GCS each waited for the other and held every teardown for the full 20 s."""
    for group in _by_shutdown_order(processes):
        for process in group:
            try:
                process.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(group, timeout=20)
        for process in alive:
            process.kill()


def _by_shutdown_order(processes: list[psutil.Process]) -> list[list[psutil.Process]]:
    def rank(process: psutil.Process) -> int:
        try:
            program = Path((process.cmdline() or [""])[0]).name
        except psutil.Error:
            return 0
        return {"raylet": 1, "gcs_server": 2}.get(program, 0)

    ranked = [(rank(process), process) for process in processes]
    return [[process for r, process in ranked if r == order] for order in (0, 1, 2)]


def kill_child_titled(parent: psutil.Process, title: str) -> int | None:
    """SIGKILL the first descendant of `parent` whose process title is `title` (Ray renames a worker
    `ray::Class.method` while it runs a call; vLLM's engine core is `VLLM::EngineCore`); its pid,
    or None when none has that title now."""
    return kill_titled(parent.children(recursive=True), title)


def titled_like(parent: psutil.Process, prefix: str) -> list[psutil.Process]:
    """The descendants of `parent` whose process title starts with `prefix`."""
    found = []
    for child in parent.children(recursive=True):
        try:
            if child.cmdline()[:1] and child.cmdline()[0].startswith(prefix):
                found.append(child)
        except psutil.Error:
            continue
    return found


def kill_titled(processes: list[psutil.Process], title: str) -> int | None:
    """SIGKILL the first of `processes` titled `title` now; its pid, or None."""
    for process in processes:
        try:
            if process.cmdline()[:1] == [title]:
                process.send_signal(signal.SIGKILL)
                return process.pid
        except psutil.Error:
            continue
    return None


def assert_same_weights(want: Path, got: Path) -> None:
    """The two saved models hold the same tensors, bit for bit."""
    expected, found = load_file(want / "model.safetensors"), load_file(got / "model.safetensors")
    assert sorted(found) == sorted(expected)
    differ = [name for name in expected if not torch.equal(found[name], expected[name])]
    if differ:
        gap = float((found[differ[0]] - expected[differ[0]]).abs().max())
        raise AssertionError(f"{len(differ)} tensors differ, {differ[0]} by up to {gap:.3g}")


def run_metrics(output_dir: Path) -> dict[str, list[float]]:
    """{metric: its values in step order} of the run's top-level MLflow run (the last value of a step)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{output_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("grpo-ray").experiment_id
    (run,) = [r for r in client.search_runs([experiment]) if "mlflow.parentRunId" not in r.data.tags]
    found = {}
    for key in run.data.metrics:
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp))
        found[key] = list({m.step: m.value for m in history}.values())
    return found


def assert_resume_remakes_step_two(out: Path, resumed: Path, train_again: Callable[[Path], str]) -> None:
    """A copy of the finished two-step run in `out` as it stood after step 1 (its saved model, step 2's
    checkpoint and logs left out), trained again by `train_again` (the run's own command) into
    `resumed`: it says it resumes, its step 2 has the first run's loss, reward, entropy and prompts,
    and it saves the first run's weights bit for bit."""
    shutil.copytree(out, resumed, ignore=shutil.ignore_patterns("model", "step_000002", "logs"))
    console = train_again(resumed)
    assert "resuming from" in console.lower(), console[-2000:]
    first, again = run_metrics(out), run_metrics(resumed)
    for key in ("loss/total", "reward/mean", "actor/entropy", "batch/prompt_digest"):
        assert again[key][-1] == first[key][-1], key
    assert_same_weights(out / "model", resumed / "model")
