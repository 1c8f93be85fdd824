"""The http reward against a real HTTP server on 127.0.0.1 (port 0, one thread, stopped after)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from grpo_ray.rewards import BUILTIN_REWARDS, http_reward, load_reward_function, score_completions

# Fast retries: the backoff sleeps 0.01 s, then 0.02 s.
FAST = {"backoff_s": 0.01, "timeout_s": 5.0}
TOKEN = "s3cret-token-value"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # shutdown never waits on a handler that is still sleeping


class Service:
    """Answers each POST with the next scripted reply; the last one repeats. Records requests.

    A reply is (status, body) with body a dict (sent as JSON) or str (sent as is), or
    ("sleep", seconds): wait that long (or until the test ends), then answer nothing.
    """

    def __init__(self):
        self.replies: list = [(200, {"rewards": []})]
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.release = threading.Event()

    @property
    def attempts(self) -> int:
        return len(self.requests)

    def handler(self):
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                service.requests.append(payload)
                service.headers.append(dict(self.headers))
                reply = service.replies[min(len(service.requests), len(service.replies)) - 1]
                if reply[0] == "sleep":
                    service.release.wait(reply[1])
                    return
                status, body = reply
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep pytest's output clean
                pass

        return Handler


@pytest.fixture
def service(monkeypatch):
    # Straight to 127.0.0.1, whatever proxy the environment names.
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    service = Service()
    server = _Server(("127.0.0.1", 0), service.handler())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    service.url = f"http://127.0.0.1:{server.server_address[1]}/score"
    yield service
    service.release.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _call(service, completions=("a", "b", "c"), **options):
    n = len(completions)
    return http_reward(list(completions), ["p"] * n, ["x"] * n, url=service.url, **options)


def test_scores_come_back_in_order_with_the_batch_sent(service):
    service.replies = [(200, {"rewards": [0.5, None, -2]})]
    scores = http_reward(
        ["c0", "c1", "c2"],
        ["p0", "p1", "p2"],
        ["a0", "a1", "a2"],
        url=service.url,
        level=[1, 2, 3],
        tags=[np.int64(7), float("nan"), object()],
    )
    # The server's order is kept; null is "could not score", the int -2 becomes a float.
    assert scores == [0.5, None, -2.0]
    (sent,) = service.requests
    assert sent["completions"] == ["c0", "c1", "c2"]
    assert sent["prompts"] == ["p0", "p1", "p2"] and sent["answers"] == ["a0", "a1", "a2"]
    assert sent["row_fields"]["level"] == [1, 2, 3]
    # np.int64 -> 7, NaN -> null (JSON has no NaN), an arbitrary object -> its str().
    tags = sent["row_fields"]["tags"]
    assert tags[:2] == [7, None] and tags[2].startswith("<object object at")


def test_registered_as_http_and_callable_through_the_registry(service):
    assert BUILTIN_REWARDS["http"] is http_reward
    service.replies = [(200, {"rewards": [1, 0]})]
    fn = load_reward_function("http", {"url": service.url, "retries": 0})
    assert score_completions(fn, ["82", "81"], ["37+45="] * 2, ["82"] * 2, {"level": [1, 1]}) == [1.0, 0.0]


def test_two_500s_then_200_succeeds_with_two_retries(service):
    service.replies = [(500, "boom"), (500, "boom"), (200, {"rewards": [1.0, 2.0, 3.0]})]
    assert _call(service, retries=2, **FAST) == [1.0, 2.0, 3.0]
    assert service.attempts == 3


def test_always_500_raises_after_retries_plus_one_attempts(service):
    service.replies = [(503, "down for maintenance")]
    with pytest.raises(RuntimeError) as caught:
        _call(service, retries=2, **FAST)
    assert service.attempts == 3
    message = str(caught.value)
    assert "\n" not in message and service.url in message
    assert "3 attempt" in message and "HTTP 503" in message and "down for maintenance" in message


def test_a_slow_server_times_out(service):
    service.replies = [("sleep", 5.0)]
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"timed out after 0.3 s") as caught:
        _call(service, timeout_s=0.3, retries=1, backoff_s=0.01)
    # Two attempts of 0.3 s each and a 0.01 s backoff, not the server's 5 s.
    assert time.perf_counter() - started < 2.0
    assert service.attempts == 2 and "\n" not in str(caught.value)


def test_400_is_not_retried(service):
    service.replies = [(400, {"error": "completions missing"})]
    with pytest.raises(RuntimeError, match=r"HTTP 400.*completions missing.*not retried"):
        _call(service, retries=3, **FAST)
    assert service.attempts == 1


def test_429_is_retried(service):
    service.replies = [(429, "slow down"), (200, {"rewards": [0.0, 0.0, 0.0]})]
    assert _call(service, retries=1, **FAST) == [0.0, 0.0, 0.0]
    assert service.attempts == 2


def test_connection_refused_is_retried_then_raises(service):
    # A port nothing listens on: bind one, remember it, close it.
    probe = _Server(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = probe.server_address[1]
    probe.server_close()
    with pytest.raises(RuntimeError, match=r"2 attempt.*ConnectionRefusedError"):
        http_reward(["a"], ["p"], ["x"], url=f"http://127.0.0.1:{port}/", retries=1, **FAST)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("{not json", "not JSON"),
        ({"scores": [1, 2, 3]}, "no 'rewards' key"),
        ({"rewards": [1, 2]}, "2 entries for 3 completions"),
        ({"rewards": [1, "2", 3]}, r"rewards\[1\] is '2' \(str\)"),
        ({"rewards": [1, True, 3]}, r"rewards\[1\] is True \(bool\)"),
    ],
)
def test_a_response_of_the_wrong_shape_is_a_one_line_value_error(service, body, problem):
    service.replies = [(200, body)]
    with pytest.raises(ValueError, match=problem) as caught:
        _call(service, retries=2, **FAST)
    assert "\n" not in str(caught.value)
    assert service.attempts == 1  # a bad answer is not retried: asking again gives the same


def test_secret_header_values_never_reach_error_messages(service):
    # The server echoes the token (alone, without "Bearer ") in its error body.
    service.replies = [(401, f"invalid token {TOKEN}")]
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": "k1"}
    with pytest.raises(RuntimeError) as caught:
        _call(service, headers=headers, retries=0)
    assert service.headers[0]["Authorization"] == f"Bearer {TOKEN}"  # it was sent
    message = str(caught.value)
    assert TOKEN not in message and "<redacted>" in message and "HTTP 401" in message
    # Nor credentials or a query in the url: a query is elided, user:password@ refused at once.
    service.replies = [(500, "down")]
    with pytest.raises(RuntimeError) as caught:
        http_reward(["a"], ["p"], ["x"], url=f"{service.url}?key={TOKEN}", retries=0)
    assert TOKEN not in str(caught.value) and "/score?..." in str(caught.value)
    with pytest.raises(ValueError, match="holds credentials") as caught:
        http_reward(["a"], ["p"], ["x"], url=service.url.replace("//", f"//user:{TOKEN}@"))
    assert TOKEN not in str(caught.value)
    assert service.attempts == 2


def test_bad_options_fail_before_any_request(service):
    with pytest.raises(ValueError, match="not http"):
        http_reward(["a"], ["p"], ["x"], url="127.0.0.1:8000/score")
    with pytest.raises(ValueError, match="retries=-1"):
        _call(service, retries=-1)
    assert service.attempts == 0
