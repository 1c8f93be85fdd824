"""A teacher served by vLLM's OpenAI-compatible server (distillation.teachers[].url): each row's
log-probs of its own tokens, asked over HTTP.

    server = ServerTeacher(ServerSettings("http://127.0.0.1:8000/v1", "qwen", ...))  # asks GET /models
    scores = server.score(input_ids, attention_mask)   # RowScores: [N, T] log-probs, failed rows NaN

One request per row, `max_concurrent_requests` at once: POST {url}/completions with the row's
token ids up to its last real token as the prompt (a list of ints: no tokenizer runs on either side),
`max_tokens: 1` and `prompt_logprobs: 0`. vLLM answers (0.26 to 0.32 alike)

    {"choices": [{"prompt_logprobs": [null, {"17": {"logprob": -8.99, "rank": 13, "decoded_token": "="}},
                                      ...], ...}], ...}

one entry per prompt token: the first null (it has no context), then the log-prob of token t given
the tokens before it, keyed by its id (with prompt_logprobs 0 the entry holds that token alone).
vLLM computes these from the raw logits, whatever the request's temperature (its model runner:
"prompt tokens skip sampling processors"): they are the teacher's log-probs at temperature 1, and
none is sent. The server must hold a row and the one token it generates: --max-model-len at least
the recipe's longest sequence + 1 (checked at start against what GET {url}/models reports).

Failures are the row's, never silent: a connection error, a timeout (timeout_s, per socket
operation), HTTP 5xx, 408 or 429, and a malformed answer (no prompt_logprobs, an entry count other
than the row's tokens, a token's log-prob missing or not finite) are tried again, `max_retries`
times after the first, sleeping backoff_s x 2^k; another 4xx is the request's fault and is not
retried. A row that fails stays NaN in `logprobs` (untaught: it keeps its GRPO advantage) and its
error line is kept; what the run does about a teacher that fails often is the driver's
(distillation.teachers[].max_failure_rate, algo/distill.teacher_failure).
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from grpo_ray.rewards.http import describe_transport_error

# Status codes retried besides 5xx: "request timeout" and "too many requests" invite a retry.
_RETRYABLE_4XX = (408, 429)
_SNIPPET_CHARS = 200  # at most this much of a server's error body goes into an error line


class TeacherServerError(RuntimeError):
    """A url teacher's server cannot serve the run (it does not answer, or serves another model or
    too short a context); one line naming the teacher, its url and what to change."""


@dataclass(frozen=True)
class ServerSettings:
    field: str  # the teacher's recipe entry, "distillation.teachers.0": error lines name it
    name: str  # the teacher's name
    url: str  # the server's base url, "http://host:8000/v1"
    model: str | None  # the served model's name; None: the server's only model
    timeout_s: float
    max_retries: int
    max_concurrent_requests: int
    context_tokens: int = 0  # the longest row + 1 the server must hold (checked at start; 0: not checked)
    backoff_s: float = 0.5


@dataclass(frozen=True)
class RowScores:
    """A teacher's scoring of some rows."""

    logprobs: np.ndarray  # [N, T] float32: log-prob of token t given the tokens before; 0 at column 0 and
    # past the row's last real token; NaN on a failed row
    failed: np.ndarray  # [N] bool: the rows whose request failed after its retries
    first_error: str = ""  # the first failed row's error line ("" when none failed)

    @staticmethod
    def complete(logprobs: np.ndarray) -> RowScores:
        """Scores of a teacher that scored every row (a model run here)."""
        return RowScores(logprobs.astype(np.float32), np.zeros(len(logprobs), dtype=bool))


class MalformedAnswer(ValueError):
    """A 200 answer whose log-probs cannot be the row's (tried again, like a transport error)."""


class _Refused(Exception):
    """An answer that says the request itself is wrong (a 4xx other than 408 and 429): not retried."""


class _Retry(Exception):
    """An HTTP status that invites another attempt (5xx, 408, 429)."""


class _GaveUp(Exception):
    """Every attempt failed; the message is one line: how many, and the last error."""


def row_logprobs(answer: object, ids: list[int]) -> np.ndarray:
    """[L] float32 the log-prob of each of the row's L tokens given those before it (0 for the first),
    from a completions answer; MalformedAnswer (one line) when it does not hold them all, finite."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedAnswer(f"the answer has no choices (got {_snippet(answer)})")
    entries = choices[0].get("prompt_logprobs")
    if not isinstance(entries, list):
        raise MalformedAnswer(
            "the answer has no prompt_logprobs (a vLLM server answers them to prompt_logprobs: 0; "
            f"got {_snippet(entries)})"
        )
    if len(entries) != len(ids):
        raise MalformedAnswer(f"prompt_logprobs has {len(entries)} entries for a row of {len(ids)} tokens")
    out = np.zeros(len(ids), dtype=np.float32)
    for t in range(1, len(ids)):
        entry = entries[t].get(str(ids[t])) if isinstance(entries[t], dict) else None
        value = entry.get("logprob") if isinstance(entry, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MalformedAnswer(
                f"prompt_logprobs[{t}] holds no log-prob of token {ids[t]} (got {_snippet(entries[t])})"
            )
        if not math.isfinite(value):
            raise MalformedAnswer(f"prompt_logprobs[{t}]: the log-prob of token {ids[t]} is {value}, not finite")
        out[t] = value
    return out


class ServerTeacher:
    def __init__(self, settings: ServerSettings):
        """Asks the server which models it serves: one that does not answer, or serves no such
        model, or too short a context, is a TeacherServerError now rather than failed rows later."""
        self.settings = settings
        self.model = self._served_model()
        self._pool = ThreadPoolExecutor(settings.max_concurrent_requests, thread_name_prefix=f"teacher-{settings.name}")

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> RowScores:
        """The rows' log-probs (RowScores), one request per row, max_concurrent_requests at once."""
        rows = [input_ids[i, : _row_length(attention_mask[i])].tolist() for i in range(len(input_ids))]
        out = np.zeros(input_ids.shape, dtype=np.float32)
        failed = np.zeros(len(rows), dtype=bool)
        first_error = ""
        for i, result in enumerate(self._pool.map(self._row, rows)):
            if isinstance(result, str):
                failed[i], out[i] = True, np.nan
                first_error = first_error or result
            else:
                out[i, : len(result)] = result
        return RowScores(out, failed, first_error)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _row(self, ids: list[int]) -> np.ndarray | str:
        """One row's log-probs, or its error line once every attempt failed."""
        if len(ids) < 2:  # no token has a context to be scored in
            return np.zeros(len(ids), dtype=np.float32)
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
        try:
            return self._with_retries(lambda: row_logprobs(self._request("completions", body), ids))
        except (_Refused, _GaveUp) as err:
            return str(err)

    def _served_model(self) -> str:
        """The model the requests name: settings.model, checked against GET {url}/models (the only
        one served when not named), whose max_model_len must hold settings.context_tokens."""
        s = self.settings
        try:
            answer = self._with_retries(lambda: self._request("models", None))
        except (_Refused, _GaveUp) as err:
            raise TeacherServerError(
                f"{self._where()}: GET /models: {err}; start the server or fix {s.field}.url (a vLLM server's base url, http://host:8000/v1)"
            )
        served = (
            {m.get("id"): m for m in answer.get("data", []) if isinstance(m, dict)} if isinstance(answer, dict) else {}
        )
        names = ", ".join(str(name) for name in served) or "none"
        if s.model is None and len(served) != 1:
            raise TeacherServerError(f"{self._where()} serves {names}: name the teacher's model in {s.field}.model")
        model = s.model if s.model is not None else next(iter(served))
        if model not in served:
            raise TeacherServerError(f"{self._where()} serves {names}, not {model}: fix {s.field}.model")
        length = served[model].get("max_model_len")
        if s.context_tokens and isinstance(length, int) and length < s.context_tokens:
            raise TeacherServerError(
                f"{self._where()}: its --max-model-len {length} cannot hold the recipe's longest sequence and the "
                f"token a request generates ({s.context_tokens}); start the server with --max-model-len "
                f"{s.context_tokens} or more"
            )
        return str(model)

    def _with_retries(self, attempt):
        """attempt() until it returns, max_retries times more after the first failure; _GaveUp when
        none did. _Refused is not retried."""
        s, last = self.settings, ""
        for k in range(s.max_retries + 1):
            if k:
                time.sleep(s.backoff_s * 2 ** (k - 1))
            try:
                return attempt()
            except (OSError, http.client.HTTPException, MalformedAnswer, _Retry) as err:
                last = _describe(err, s.timeout_s)
        raise _GaveUp(f"failed after {s.max_retries + 1} attempt(s); last error: {last}")

    def _request(self, path: str, body: dict | None) -> object:
        """The JSON answer of GET {url}/{path} (body None) or a POST of `body`."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.settings.url}/{path}",
            data=data,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
            method="GET" if body is None else "POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:  # before OSError: HTTPError is one
            line = f"HTTP {err.code} {err.reason}{_error_body(err)}"
            raise (_Retry(line) if err.code >= 500 or err.code in _RETRYABLE_4XX else _Refused(line)) from None
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise MalformedAnswer(f"the answer is not JSON: {_snippet(raw.decode('utf-8', 'replace'))}") from None

    def _where(self) -> str:
        return f"teacher {self.settings.name} ({self.settings.url})"


def _row_length(mask: np.ndarray) -> int:
    """Tokens up to the row's last real one."""
    real = np.flatnonzero(mask)
    return int(real[-1]) + 1 if len(real) else 0


def _describe(err: BaseException, timeout_s: float) -> str:
    if isinstance(err, (MalformedAnswer, _Retry)):
        return str(err)
    return describe_transport_error(err, timeout_s)


def _error_body(err: urllib.error.HTTPError) -> str:
    """': <what the server said>': vLLM's (OpenAI's) error.message, else the start of the body; or ''."""
    try:
        text = err.read(4 * _SNIPPET_CHARS).decode("utf-8", "replace")
    except OSError:
        return ""
    try:
        text = json.loads(text)["error"]["message"]
    except (ValueError, TypeError, KeyError):
        pass
    return f": {_snippet(text)}" if str(text).strip() else ""


def _snippet(value: object) -> str:
    text = " ".join((value if isinstance(value, str) else repr(value)).split())
    return text if len(text) <= _SNIPPET_CHARS else text[: _SNIPPET_CHARS - 3] + "..."
