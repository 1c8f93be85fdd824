"""What an operator sees of a local `grpo-ray train`: a quiet console, no Python warning from
grpo-ray's own code, and a Ray that listens on 127.0.0.1 only."""

import ipaddress
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
# probe_every=1: the weight-sync probe (arrays from Ray's object store into torch) runs every step;
# eval_limit: evaluation at steps 0 and 4 with few prompts; checkpoint_every=2: a checkpoint pause.
SHORT = [
    "train.steps=4",
    "train.eval_every=4",
    "data.eval_limit=20",
    "weight_sync.probe_every=1",
    "train.checkpoint_every=2",
]

# A Python warning as warnings.showwarning prints it, in the driver or forwarded from an actor:
# "/path/grpo_ray/actors/hf_engine.py:109: UserWarning: ..."
_WARNING = re.compile(r"(\S+\.py):(\d+): (\w*Warning): (.*)")

# Notices every start printed before (issue 23), which a default run must not show.
_NOISE = (
    "Setting accelerator to CPU",
    "Token authentication is enabled",
    "generation flags are not valid",
    "NumPy array is not writable",
    "Creating initial MLflow database tables",
    "Loading weights",
    "Writing model shards",
)


def start_run(output_dir: Path, *extra: str) -> subprocess.Popen:
    sets = [arg for item in [f"output_dir={output_dir}", *SHORT] for arg in ("--set", item)]
    # PYTHONWARNINGS=default: every warning shows once per place, DeprecationWarnings included.
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="default")
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_ray.cli", "train", str(TINY), *sets, *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def listening(tree_root: int) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening socket of a process and its descendants:
    a local Ray's GCS, raylet, agents and workers are all children of the driver that started it."""
    root = psutil.Process(tree_root)
    found = []
    for process in [root, *root.children(recursive=True)]:
        try:
            name = process.name()
            sockets = process.net_connections(kind="inet")
        except psutil.Error:  # ended in between
            continue
        found += [(name, s.laddr.ip, s.laddr.port) for s in sockets if s.status == psutil.CONN_LISTEN]
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # "::ffff:127.0.0.1"
    return (mapped or ip).is_loopback


def test_a_local_run_is_quiet_and_listens_on_loopback_only(tmp_path):
    proc = start_run(tmp_path)
    lines, sockets = [], []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            # Once steps run, every actor, the weight-sync group and the learners' world are up.
            if line.startswith("step 2/4") and not sockets:
                sockets = listening(proc.pid)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "\n".join(lines)
    assert proc.returncode == 0, output[-3000:]
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, f"the run's Ray processes were not found: {names}"
    exposed = [entry for entry in sockets if not is_loopback(entry[1])]
    assert not exposed, f"listening beyond 127.0.0.1: {exposed}"
    assert re.search(r"metrics http://127\.0\.0\.1:\d+/metrics", output)
    shown = [notice for notice in _NOISE if notice in output]
    assert not shown, f"library notices on a default console: {shown}\n{output[-3000:]}"
    # The console says what it does between steps, and each step line carries its numbers.
    assert "step 0: evaluating 20 held-out prompts, 1 sample each" in output
    assert "step 2: writing checkpoint" in output
    assert re.search(r"^step 4/4  reward \S+  acc \S+  loss \S+  s/step \S+  eta 0s$", output, re.M), output[-2000:]


def test_grpo_ray_code_raises_no_python_warning(tmp_path):
    started = time.monotonic()
    proc = start_run(tmp_path, "--verbose")
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    ours = [
        m.group(0) for m in map(_WARNING.search, output.splitlines()) if m and f"{os.sep}grpo_ray{os.sep}" in m.group(1)
    ]
    assert not ours, "Python warnings from grpo_ray:\n" + "\n".join(ours)
    # --verbose shows the libraries' notices again: the filter above had something to read.
    assert "Creating initial MLflow database tables" in output, (
        f"after {time.monotonic() - started:.0f} s:\n{output[-2000:]}"
    )


def test_a_local_ray_slow_to_start_is_started_once_more_and_its_first_try_leaves_nothing():
    # The drill SIGSTOPs the first try's raylet: Ray's own 30 s start-up deadline passes for real and
    # it raises "The current node timed out during startup", as on a machine too busy to start it.
    script = (
        "import ray\n"
        "from grpo_ray.cluster.session import ray_session\n"
        "from grpo_ray.config import RayConfig\n"
        "with ray_session(RayConfig(num_cpus=1, dashboard=False), notice=lambda line: print('notice:', line)):\n"
        "    print('nodes', len([n for n in ray.nodes() if n['Alive']]), flush=True)\n"
    )
    child, stdout, stderr = _in_a_session_of_its_own(script, 300, GRPO_RAY_DRILL_STALL_FIRST_RAYLET="1")
    assert child.returncode == 0, stderr[-3000:]
    notices = [line for line in stdout.splitlines() if line.startswith("notice:")]
    assert notices == [
        "notice: the local Ray was slow to start (The current node timed out during startup. This could happen "
        "because some of the raylet failed to startup or the GCS has become overloaded.); starting it once more"
    ], stdout
    assert "nodes 1" in stdout and "Traceback" not in stderr
    # Both tries' processes are gone: the stopped raylet and its GCS too.
    assert _left_in_session(child.pid) == []


def test_checks_beside_a_starting_ray_give_their_result_or_their_error_and_the_ray_is_stopped():
    # train's slow checks run in a thread while ray.init starts the local Ray on the main thread.
    script = (
        "import threading, ray\n"
        "from grpo_ray.cluster.session import ray_session_beside\n"
        "from grpo_ray.config import RayConfig\n"
        "cfg = RayConfig(num_cpus=1, dashboard=False)\n"
        "def checks():\n"
        "    return threading.current_thread().name\n"
        "def bad_input():\n"
        "    raise ValueError('data.train_files: a bad input')\n"
        "with ray_session_beside(cfg, checks, started=lambda: print('up', ray.is_initialized())) as (session, name):\n"
        "    print('beside', name.startswith('beside-ray'), session.started_local, flush=True)\n"
        "try:\n"
        "    with ray_session_beside(cfg, bad_input):\n"
        "        print('the body ran')\n"
        "except ValueError as err:\n"
        "    print('raised', err, ray.is_initialized(), flush=True)\n"
    )
    child, stdout, stderr = _in_a_session_of_its_own(script, 180)
    assert child.returncode == 0, stderr[-3000:]
    assert stdout.splitlines() == ["up True", "beside True True", "raised data.train_files: a bad input False"]
    assert _left_in_session(child.pid) == []


def _in_a_session_of_its_own(script: str, timeout: float, **env: str) -> tuple[subprocess.Popen, str, str]:
    """Python `script` run to its end in a process session of its own: the child, its stdout and stderr."""
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **env),
        start_new_session=True,
    )
    stdout, stderr = child.communicate(timeout=timeout)
    return child, stdout, stderr


def _left_in_session(session: int, within_s: float = 10.0) -> list[str]:
    """The processes of `session` still alive `within_s` seconds on (none, once they all ended)."""
    deadline = time.monotonic() + within_s
    while (left := _alive_in_session(session)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _alive_in_session(session: int) -> list[str]:
    alive = []
    for process in psutil.process_iter(["status", "name"]):
        try:
            if os.getsid(process.pid) == session and process.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(process.info["name"])
        except OSError:
            pass
    return alive
