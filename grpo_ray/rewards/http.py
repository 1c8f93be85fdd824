"""A reward computed by a remote service: one JSON POST per call, retried on transient failures.

Example, against a service that answers ``{"rewards": [1.0, 0.0]}``::

    fn = load_reward_function("http", {"url": "http://127.0.0.1:8000/score", "timeout_s": 10})
    score_completions(fn, ["82", "81"], ["37+45=", "37+45="], ["82", "82"], {"level": [1, 1]})
    # -> [1.0, 0.0]

The wire format, both ways JSON::

    request:  {"completions": [str], "prompts": [str], "answers": [str],
               "row_fields": {name: [value, ...]}}          # every list has one entry per row
    response: {"rewards": [float | null, ...]}              # same length and order; null = unscored

Row-field values are made JSON-safe first: NumPy arrays and scalars become lists and numbers,
non-finite floats become null, and anything else JSON cannot hold becomes ``str(value)``.

Failures. Connection errors, timeouts, HTTP 5xx, 408 and 429 are transient: the call is tried
``retries + 1`` times in all, sleeping ``backoff_s * 2**k`` after the k-th failure (0, 1, ...).
408 (request timeout) and 429 (rate limited) are the two 4xx codes that ask the client to try
again later; every other 4xx is the request's own fault and is not retried. When no attempt
succeeds the call raises RuntimeError, and a 200 response of the wrong shape raises ValueError;
the reward pool turns either into failed (None) scores for the chunk. Both messages are one line
that names the url (its query string elided) and the last error, with header values that may
be secrets masked (those of auth/token/key/cookie headers, and any of 6+ characters), even where
the server echoed them back. A url with ``user:password@`` is refused: put credentials in headers.

``timeout_s`` bounds each blocking socket operation (connecting, and each read), as in
``urllib``; a server that trickles bytes slower than that is cut off, one that keeps sending
faster is not. Proxies follow the usual ``http_proxy`` / ``no_proxy`` environment variables.
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

# Status codes retried besides 5xx: "request timeout" and "too many requests" invite a retry.
_RETRYABLE_4XX = (408, 429)
# At most this much of an error response's body goes into the error message.
_BODY_SNIPPET_CHARS = 200
# Header values, and words inside them, at least this long are masked in error messages (so
# "Bearer <token>" is masked also where only "<token>" was echoed); shorter ones such as "1" or
# "en" are no secrets, and masking them would garble the message.
_MIN_SECRET_CHARS = 6
# Headers whose values are masked whatever their length.
_SECRET_HEADER_WORDS = ("auth", "token", "key", "secret", "password", "cookie", "session")


def _check_options(url: str, timeout_s: float, retries: int, backoff_s: float) -> str:
    """ValueError (one line) for options no request could use; the url as shown in messages."""
    if retries < 0 or timeout_s <= 0 or backoff_s < 0:
        raise ValueError(
            f"http reward: retries={retries}, timeout_s={timeout_s}, backoff_s={backoff_s}; "
            "need retries >= 0, timeout_s > 0, backoff_s >= 0"
        )
    where = _display_url(url)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"http reward: url {where!r} is not http(s)://host[:port]/path; fix the url")
    if "@" in parts.netloc:  # urllib would look the whole "user:password@host" up as a host name
        raise ValueError(
            f"http reward: url {where!r} holds credentials (user@host), which urllib "
            "does not send; pass them in headers, e.g. {'Authorization': ...}"
        )
    return where


def http_reward(
    completions: list[str],
    prompts: list[str],
    answers: list[str],
    *,
    url: str,
    timeout_s: float = 30.0,
    retries: int = 2,
    backoff_s: float = 0.5,
    headers: dict[str, str] | None = None,
    **row_fields: list,
) -> list[float | None]:
    """POST the batch to ``url`` and return its ``rewards``, one float or None per completion.

    Raises RuntimeError (one line) when every attempt failed or the server answered a
    non-retryable 4xx, and ValueError (one line) when a 200 response is not
    ``{"rewards": [number | null, ...]}`` with one entry per completion.
    """
    where = _check_options(url, timeout_s, retries, backoff_s)
    payload = {
        "completions": _json_safe(list(completions)),
        "prompts": _json_safe(list(prompts)),
        "answers": _json_safe(list(answers)),
        "row_fields": {str(name): _json_safe(values) for name, values in row_fields.items()},
    }
    body = json.dumps(payload, allow_nan=False).encode()
    request_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": "grpo-ray-http-reward",
    }
    request_headers.update(headers or {})
    secrets = _secrets(headers or {})

    last_error = "no attempt made"
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=body, headers=request_headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:  # before OSError: HTTPError is one
            last_error = f"HTTP {error.code} {error.reason}{_body_snippet(error)}"
            if not (error.code >= 500 or error.code in _RETRYABLE_4XX):
                raise RuntimeError(
                    _redact(
                        f"http reward {where}: {last_error} (not retried: the service refused this "
                        "request; check the url, the headers and the input it expects)",
                        secrets,
                    )
                ) from None
        except (OSError, http.client.HTTPException) as error:
            last_error = describe_transport_error(error, timeout_s)
        else:
            return _parse_rewards(raw, len(completions), where, secrets)
    raise RuntimeError(
        _redact(
            f"http reward {where}: failed after {retries + 1} attempt(s); last error: {last_error}",
            secrets,
        )
    )


def _parse_rewards(raw: bytes, expected: int, where: str, secrets: list[str]) -> list[float | None]:
    def bad(problem: str) -> ValueError:
        return ValueError(
            _redact(f'http reward {where}: {problem}; expected {{"rewards": [number | null, ...]}}', secrets)
        )

    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        text = _snippet(raw.decode("utf-8", "replace"))
        raise bad(f"response is not JSON ({_one_line(str(error))}): {text!r}") from None
    if not isinstance(data, dict) or "rewards" not in data:
        got = sorted(data)[:5] if isinstance(data, dict) else type(data).__name__
        raise bad(f"response has no 'rewards' key (got {got})")
    rewards = data["rewards"]
    if not isinstance(rewards, list):
        raise bad(f"'rewards' is a {type(rewards).__name__}, not a list")
    if len(rewards) != expected:
        raise bad(f"'rewards' has {len(rewards)} entries for {expected} completions")
    for index, value in enumerate(rewards):
        # bool is an int in Python but never a score; NaN and inf are left to score_completions.
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise bad(f"rewards[{index}] is {_snippet(repr(value))} ({type(value).__name__})")
    return [None if value is None else float(value) for value in rewards]


def _json_safe(value: Any) -> Any:
    """``value`` with everything JSON cannot hold replaced: see the module docstring."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # NumPy arrays and scalars
        try:
            converted = value.tolist()
        except Exception:
            return str(value)
        if not hasattr(converted, "tolist"):
            return _json_safe(converted)
    return str(value)


def describe_transport_error(error: BaseException, timeout_s: float) -> str:
    """One line for a request that failed in transport (a timeout, a refused connection, an HTTP
    error's reason), for the http reward and a url teacher (actors/http_teacher.py) alike."""
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(reason, TimeoutError):  # socket.timeout is TimeoutError since Python 3.10
        return f"timed out after {timeout_s:g} s (timeout_s)"
    if isinstance(reason, BaseException):
        return f"{type(reason).__name__}: {_one_line(str(reason))}".rstrip(": ")
    return _one_line(str(reason))


def _body_snippet(error: urllib.error.HTTPError) -> str:
    try:
        text = error.read(4 * _BODY_SNIPPET_CHARS).decode("utf-8", "replace")
    except Exception:
        return ""
    text = _snippet(text)
    return f": {text}" if text else ""


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _BODY_SNIPPET_CHARS else text[: _BODY_SNIPPET_CHARS - 3] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _display_url(url: str) -> str:
    """``url`` without user, password, query or fragment: those may hold credentials."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:
        return "<unparsable url>"
    if not parts.scheme or not host:
        return _snippet(url.split("?", 1)[0].split("@")[-1])
    return f"{parts.scheme}://{host}{parts.path}" + ("?..." if parts.query else "")


def _secrets(headers: dict[str, str]) -> list[str]:
    """What ``_redact`` masks: see ``_MIN_SECRET_CHARS`` and ``_SECRET_HEADER_WORDS``."""
    found: set[str] = set()
    for name, value in headers.items():
        value = str(value)
        if any(word in name.lower() for word in _SECRET_HEADER_WORDS) or len(value) >= _MIN_SECRET_CHARS:
            found.add(value)
        found.update(word for word in value.split() if len(word) >= _MIN_SECRET_CHARS)
    found.discard("")
    return sorted(found, key=len, reverse=True)  # longest first: whole values before their parts


def _redact(message: str, secrets: list[str]) -> str:
    for secret in secrets:
        message = message.replace(secret, "<redacted>")
    return message
