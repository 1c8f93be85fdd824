"""requirements/gpu.lock, what scripts/setup_gpu.sh installs on a GPU machine with `pip install --no-deps`,
is whole and consistent for the GPU machine's Python and platform, checked here without a GPU and without
downloading a CUDA wheel: uv resolves pyproject.toml and requirements/gpu.in again, exactly as the lock's
"# Resolved by:" line says (Python 3.12, manylinux_2_28 x86_64), with the lock itself as constraints, from
the packages' metadata. Every package that resolution needs must be pinned in the lock at the version it
picked, and the lock may pin nothing else; pins that contradict each other (vLLM 0.26.0 beside torch
2.13.0) leave no resolution at all.

NEEDS THE NETWORK (PyPI): uv is installed once into /tmp/grpo-ray-uv (GRPO_RAY_UV_TOOLS; the version the
lock names, as scripts/lock_gpu.sh does: ~20 MB), then resolves from PyPI's index pages and the wheels'
metadata (~115 MB a run, the index pages fetched again each time; measured on 2 cores: 11 s for this file
the first time, 4 s after). A network error is retried once, a resolution error never; either fails in one line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "gpu.lock"
TOOLS = Path(os.environ.get("GRPO_RAY_UV_TOOLS", "/tmp/grpo-ray-uv"))
ATTEMPT_TIMEOUT_S = 90
RESOLVED_BY = re.compile(r"^# Resolved by: uv (\S+) pip compile (.+)$", re.M)
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+)", re.M)
# uv's words for a failed request (after its own retries), as opposed to "No solution found".
NETWORK_ERROR = re.compile(r"Request failed|Failed to fetch|error sending request|dns error|timed out|Connect", re.I)


class NetworkError(Exception):
    """uv (or pip, installing uv) could not reach the package index."""


@dataclass
class Check:
    problems: list[str]
    resolved: dict[str, str] = field(default_factory=dict)
    attempts: int = 0


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """name (normalized) -> version, for every `name==version` line of a lock or of uv's output."""
    return {normalize(name): version for name, version in PIN.findall(text)}


def resolved_by(lock_text: str) -> tuple[str, list[str]] | None:
    """The uv version and `uv pip compile` arguments that made the lock (its "# Resolved by:" line)."""
    match = RESOLVED_BY.search(lock_text)
    return (match.group(1), shlex.split(match.group(2))) if match else None


def compare(locked: dict[str, str], resolved: dict[str, str]) -> list[str]:
    """What differs between the lock's pins and the resolution's, one short line each."""
    problems = [f"{name}=={v} is needed but not pinned" for name, v in sorted(resolved.items()) if name not in locked]
    problems += [
        f"{name} is pinned at {locked[name]} but resolves to {v}"
        for name, v in sorted(resolved.items())
        if name in locked and locked[name] != v
    ]
    problems += [
        f"{name}=={v} is pinned but nothing needs it" for name, v in sorted(locked.items()) if name not in resolved
    ]
    return problems


def first_error(stderr: str) -> str:
    """uv's error and its last cause, on one line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]
    start = errors[0] if errors else 0
    tail = lines[start + 1 :]
    return " / ".join([lines[start]] + tail[-2:]) if lines else "(no message)"


def run_once(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=ATTEMPT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise NetworkError(f"{Path(cmd[0]).name} took over {ATTEMPT_TIMEOUT_S} s") from exc


def with_one_retry(cmd: list[str], env: dict[str, str], is_network_error) -> tuple[subprocess.CompletedProcess, int]:
    """Runs cmd; a network error (timeout, or is_network_error(result)) is retried once, nothing else."""
    for attempt in (1, 2):
        try:
            result = run_once(cmd, env)
            if result.returncode == 0 or not is_network_error(result):
                return result, attempt
            error = NetworkError(first_error(result.stderr))
        except NetworkError as exc:
            error = exc
        if attempt == 2:
            raise error
        time.sleep(5)
    raise AssertionError("unreachable")


def ensure_uv(version: str) -> Path:
    """uv==version in TOOLS (the folder scripts/lock_gpu.sh uses), installed there if it is not."""
    uv = TOOLS / "bin" / "uv"
    probe = subprocess.run([uv, "--version"], capture_output=True, text=True) if uv.exists() else None
    if probe and probe.returncode == 0 and probe.stdout.split()[1:2] == [version]:
        return uv
    subprocess.run([sys.executable, "-m", "venv", "--clear", TOOLS], check=True, capture_output=True)
    result, _ = with_one_retry(
        [str(TOOLS / "bin" / "pip"), "install", "-q", "--timeout", "30", "--retries", "1", f"uv=={version}"],
        dict(os.environ),
        lambda r: bool(NETWORK_ERROR.search(r.stderr)) or "No matching distribution" in r.stderr,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pip could not install uv=={version}: {first_error(result.stderr)}")
    return uv


def check_gpu_lock(lock: Path, uv: Path, args: list[str]) -> Check:
    """Resolves `args` (the lock's own "Resolved by" arguments) with `lock` as constraints and compares.
    Raises NetworkError when the index cannot be reached (after one retry)."""
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_HTTP_TIMEOUT="30", UV_NO_PROGRESS="1")
    cmd = [str(uv), "pip", "compile", "--quiet", "--no-header", "--no-annotate", *args, "-c", str(lock)]
    result, attempts = with_one_retry(
        cmd, env, lambda r: "No solution found" not in r.stderr and bool(NETWORK_ERROR.search(r.stderr))
    )
    if result.returncode != 0:
        return Check([f"no resolution: {first_error(result.stderr)}"], attempts=attempts)
    resolved = pins(result.stdout)
    return Check(compare(pins(lock.read_text()), resolved), resolved, attempts)


def checked(lock: Path, uv: Path, args: list[str]) -> Check:
    try:
        return check_gpu_lock(lock, uv, args)
    except NetworkError as exc:
        error = str(exc)  # failed outside the except block: one line, no chained traceback
    name = lock.relative_to(ROOT) if lock.is_relative_to(ROOT) else lock
    pytest.fail(f"could not check {name} (this test needs PyPI, tried twice): {error}", pytrace=False)


@pytest.fixture(scope="module")
def uv_and_args() -> tuple[Path, list[str]]:
    made_by = resolved_by(LOCK.read_text())
    if made_by is None:
        pytest.fail(
            "requirements/gpu.lock has no '# Resolved by: uv X pip compile ...' line: regenerate it with"
            " bash scripts/lock_gpu.sh",
            pytrace=False,
        )
    version, args = made_by
    try:
        return ensure_uv(version), args
    except (NetworkError, RuntimeError, subprocess.CalledProcessError) as exc:
        error = str(exc)
    pytest.fail(f"could not install uv=={version} into {TOOLS} (this test needs PyPI): {error}", pytrace=False)


@pytest.fixture(scope="module")
def lock_check(uv_and_args) -> Check:
    return checked(LOCK, *uv_and_args)


@pytest.mark.timeout(400)
def test_the_gpu_lock_pins_exactly_what_its_resolution_for_the_gpu_machine_needs(lock_check):
    if lock_check.problems:
        more = f" (and {len(lock_check.problems) - 3} more)" if len(lock_check.problems) > 3 else ""
        pytest.fail(
            "requirements/gpu.lock is out of date, rerun bash scripts/lock_gpu.sh: "
            + "; ".join(lock_check.problems[:3])
            + more,
            pytrace=False,
        )
    assert {name: lock_check.resolved[name] for name in ("torch", "vllm", "ray", "deepspeed", "transformers")} == {
        "torch": "2.11.0",
        "vllm": "0.26.0",
        "ray": "2.60.0",
        "deepspeed": "0.19.8",
        "transformers": "5.17.0",
    }


def test_a_pin_missing_from_the_lock_or_one_nothing_needs_is_named(lock_check):
    """Reuses the lock's resolution: no second one."""
    planted = pins(LOCK.read_text())
    del planted["triton"]
    planted["left-pad"] = "1.0"
    planted["numba"] = "0.64.0"
    assert compare(planted, lock_check.resolved) == [
        f"triton=={lock_check.resolved['triton']} is needed but not pinned",
        f"numba is pinned at 0.64.0 but resolves to {lock_check.resolved['numba']}",
        "left-pad==1.0 is pinned but nothing needs it",
    ]


@pytest.mark.timeout(400)
def test_a_lock_pinning_torch_2_13_beside_vllm_0_26_has_no_resolution_and_is_not_retried(uv_and_args, tmp_path):
    """A second resolution (1-5 s after the first one): vLLM 0.26.0's wheel pins torch==2.11.0."""
    broken = tmp_path / "gpu.lock"
    text = LOCK.read_text()
    assert "\ntorch==2.11.0\n" in text and "\nvllm==0.26.0\n" in text
    broken.write_text(text.replace("\ntorch==2.11.0\n", "\ntorch==2.13.0\n"))
    result = checked(broken, *uv_and_args)
    assert result.attempts == 1
    assert len(result.problems) == 1 and result.problems[0].startswith("no resolution: error: No solution found")
    assert "torch==2.13.0" in result.problems[0]


def test_setup_gpu_stops_before_installing_anything_where_nvidia_smi_finds_no_gpu(tmp_path):
    """Offline. A copy of the script in an empty tree, with an nvidia-smi that finds nothing first on PATH."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "setup_gpu.sh"
    script.write_text((ROOT / "scripts" / "setup_gpu.sh").read_text())
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GRPO_RAY_FORCE_GPU_SETUP"}
    env["PATH"] = f"{fake.parent}:/usr/bin:/bin"
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert result.stdout + result.stderr == (
        "error: scripts/setup_gpu.sh installs CUDA builds of torch and vLLM for an NVIDIA GPU (nvidia-smi found none);"
        " on a CPU machine run bash scripts/setup.sh\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "scripts"]
