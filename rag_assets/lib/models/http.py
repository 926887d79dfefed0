"""HTTP plumbing shared by the clients of model servers (chat, embeddings, rerank).

Standard library only (``urllib``). What every endpoint client here gets from it:

- **Redaction.** ``user:password@`` in a URL becomes a Basic ``Authorization`` header and is
  never part of the request URL or of a message; query values (``?key=…``) are shown as
  ``***``; an API key is sent as a bearer token and never printed; a server's reply quoted in an
  error (at most 200 bytes) has every credential scrubbed, also base64-encoded ones.
- **One-line errors** (:class:`HttpError`) that name the setting holding the URL, with the kind
  of failure (``http`` with its status, ``timeout``, ``connect``, ``reset``, ``protocol``) and
  a server's ``Retry-After`` so a caller can decide what is worth retrying.
- **Retries** (:func:`with_retries`): exponential backoff with jitter on the transient failures
  (429, 5xx, timeouts, dropped connections), honouring ``Retry-After`` up to
  :data:`MAX_RETRY_AFTER_S`.
- A warning, once per endpoint and process, when a URL is plain ``http://`` to a host that is
  not loopback (:func:`warn_if_insecure`).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import http.client
import ipaddress
import json
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rag_assets.lib import observe

T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses worth another try: the server is busy, overloaded or restarting."""

MAX_RETRY_AFTER_S = 60.0
"""Longest ``Retry-After`` honoured (seconds); a server asking for more is waited this long."""

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
"""Backoff without ``Retry-After``: ``BACKOFF_BASE_S * 2**attempt`` capped at ``BACKOFF_CAP_S``,
times a random factor in [0.5, 1) (so that parallel requests do not retry in lock-step)."""

DETAIL_BYTES = 200  # at most this much of a server's reply appears in an error

_warned: set[str] = set()
_warn_lock = threading.Lock()


def redact(url: str) -> str:
    """``url`` with any ``user:password@`` and ``key=`` style query values replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = "&".join(f"{k}=***" for k, _ in pairs)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(text: str, *secrets: str | None) -> str:
    """``text`` with every non-empty secret (longest first) replaced by ``***``."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_insecure(url: str, setting: str, seen: set[str] | None = None) -> bool:
    """Warn once per endpoint (``seen``: the set remembering them, default this module's) when
    ``url`` is plain http to a non-loopback host; True if it is."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return False
    seen = _warned if seen is None else seen
    key = f"{setting}:{parts.hostname}:{parts.port}"
    with _warn_lock:
        if key in seen:
            return True
        seen.add(key)
    warnings.warn(
        f"{setting} {redact(url)} is plain http:// to a non-loopback host: what is sent (texts, "
        "questions) travels unencrypted; use https:// or a loopback address",
        stacklevel=3,
    )
    return True


@dataclass(frozen=True)
class Credentials:
    """A URL split into what is sent where: ``url`` without user info, the Basic credential
    (base64 ``user:password``, or None), the bearer key, and every secret to scrub."""

    url: str
    basic: str | None = None
    api_key: str | None = None
    secrets: tuple[str, ...] = ()

    def headers(self) -> dict[str, str]:
        if self.api_key:
            return {"Authorization": f"Bearer {self.api_key}"}
        if self.basic:
            return {"Authorization": f"Basic {self.basic}"}
        return {}


def credentials(url: str, api_key: str | None = None) -> Credentials:
    """Split ``url``: ``user:password@`` becomes a Basic credential (urllib cannot send it from
    the URL) and leaves the URL; the password, the key, the base64 form (a server echoing the
    header must not leak it) and query values of 4+ characters are the secrets to scrub."""
    parts = urllib.parse.urlsplit(url.strip())
    basic: str | None = None
    bare = url.strip()
    if parts.username is not None or parts.password is not None:
        user = urllib.parse.unquote(parts.username or "")
        password = urllib.parse.unquote(parts.password or "")
        basic = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        host = parts.netloc.rsplit("@", 1)[1]
        bare = urllib.parse.urlunsplit(
            (parts.scheme, host, parts.path, parts.query, parts.fragment)
        )
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    secrets = [
        v for v in (api_key, parts.password, urllib.parse.unquote(parts.password or ""), basic) if v
    ] + [v for _, v in query if len(v) >= 4]
    return Credentials(bare, basic, api_key or None, tuple(secrets))


class HttpError(RuntimeError):
    """A request that failed: one line naming the endpoint's setting (its URL redacted).

    ``kind``: ``http`` (the server answered ``status``), ``timeout``, ``connect`` (nothing
    listens, DNS), ``reset`` (the connection dropped mid-request) or ``protocol`` (not JSON, a
    malformed reply). ``retry_after``: the server's ``Retry-After`` in seconds, if it sent one.
    ``body``: the start of the reply (scrubbed), for callers that recognise a server's errors.
    """

    def __init__(
        self,
        message: str,
        kind: str,
        status: int | None = None,
        retry_after: float | None = None,
        body: str = "",
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after
        self.body = body

    @property
    def transient(self) -> bool:
        """Worth another try: a busy/restarting server, a timeout or a dropped connection."""
        if self.kind == "http":
            return self.status in RETRY_STATUSES
        return self.kind in ("timeout", "reset", "connect")


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header in seconds (delta-seconds or an HTTP date), else None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def send(
    url: str,
    body: Any = None,
    *,
    where: str,
    creds: Credentials | None = None,
    timeout: float = 60.0,
    method: str | None = None,
) -> bytes:
    """One request (JSON ``body`` → POST, None → GET); the reply's bytes, or :class:`HttpError`
    naming ``where`` (e.g. ``RAG_EMBED_URL=http://…``). A failure is reported to the installed
    observer (issue 52: the service's model-server error counter)."""
    try:
        return _send(url, body, where=where, creds=creds, timeout=timeout, method=method)
    except HttpError as exc:
        failed(where, exc.kind)
        raise


def failed(where: str, kind: str) -> None:
    """Report a failed request to the server ``where`` names (its setting, never its URL)."""
    observe.event("model_server_error", server=where.partition("=")[0], kind=kind)


def _send(
    url: str,
    body: Any,
    *,
    where: str,
    creds: Credentials | None,
    timeout: float,
    method: str | None,
) -> bytes:
    secrets = creds.secrets if creds else ()
    headers = {"Accept": "application/json", **(creds.headers() if creds else {})}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode("utf-8")
    request = urllib.request.Request(
        url, data=data, headers=headers, method=method or ("POST" if data is not None else "GET")
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = scrub(exc.read()[:DETAIL_BYTES].decode("utf-8", "replace"), *secrets)
        except OSError:
            detail = str(exc.reason)
        retry = retry_after_seconds(exc.headers.get("Retry-After") if exc.headers else None)
        raise HttpError(
            f"{where} answered HTTP {exc.code}: {detail}", "http", exc.code, retry, detail
        ) from exc
    except TimeoutError as exc:
        raise HttpError(f"{where} did not answer within {timeout:g} s", "timeout") from exc
    except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
        raise HttpError(f"{where} dropped the connection: {exc}", "reset") from exc
    except http.client.HTTPException as exc:  # IncompleteRead, a malformed status line
        raise HttpError(f"{where} broke off its reply: {type(exc).__name__}", "reset") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise HttpError(f"{where} did not answer within {timeout:g} s", "timeout") from exc
        if isinstance(reason, ConnectionResetError | ConnectionAbortedError):
            raise HttpError(f"{where} dropped the connection: {reason}", "reset") from exc
        if "RemoteDisconnected" in type(exc).__name__:
            raise HttpError(f"{where} dropped the connection: {exc}", "reset") from exc
        raise HttpError(f"cannot reach {where}: {reason}", "connect") from exc


def parse_json(payload: bytes, where: str) -> Any:
    """The reply as JSON, or :class:`HttpError` (``protocol``) quoting its start."""
    try:
        return json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        failed(where, "protocol")
        raise HttpError(
            f"{where} returned malformed JSON: {payload[:DETAIL_BYTES]!r}", "protocol"
        ) from exc


@dataclass
class RetryLog:
    """What :func:`with_retries` did, for reports and tests: retries by cause, seconds waited."""

    retries: dict[str, int] = field(default_factory=dict)
    waited_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, cause: str, wait: float) -> None:
        with self._lock:
            self.retries[cause] = self.retries.get(cause, 0) + 1
            self.waited_s += wait


def backoff_s(attempt: int, retry_after: float | None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): the server's ``Retry-After``
    (at most :data:`MAX_RETRY_AFTER_S`), else exponential backoff with jitter."""
    if retry_after is not None:
        return min(MAX_RETRY_AFTER_S, retry_after)
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt) * (0.5 + random.random() / 2)


def with_retries(
    call: Callable[[], T],
    *,
    retries: int,
    retryable: Callable[[HttpError], bool] = lambda e: e.transient,
    deadline: float | None = None,
    log: RetryLog | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, tried again up to ``retries`` times on a :class:`HttpError` that is
    ``retryable``, waiting :func:`backoff_s` between tries. ``deadline`` (a
    ``time.monotonic()`` value): no retry whose wait would pass it. The last error is raised
    with the number of tries added to its message."""
    attempt = 0
    while True:
        try:
            return call()
        except HttpError as exc:
            wait = backoff_s(attempt, exc.retry_after)
            late = deadline is not None and time.monotonic() + wait > deadline
            if attempt >= retries or not retryable(exc) or late:
                if attempt:
                    exc.args = (f"{exc.args[0]} (after {attempt + 1} tries)",)
                raise
            if log is not None:
                log.add(str(exc.status) if exc.kind == "http" else exc.kind, wait)
            sleep(wait)
            attempt += 1


_secrets: dict[str, str] = {}


def secret_ref(value: str) -> str:
    """A stand-in for an API key in configuration that is displayed (a Dagster resource's
    config shows in the UI): ``secret:<sha256 prefix>``, resolved by :func:`secret` in this
    process (the code location builds its resources, and so registers the key, in every
    process that runs them). "" stays ""."""
    if not value:
        return ""
    ref = "secret:" + hashlib.sha256(value.encode()).hexdigest()[:16]
    _secrets[ref] = value
    return ref


def secret(ref: str, setting: str) -> str:
    """The value :func:`secret_ref` stands for ("" for ""); one line naming ``setting`` when
    this process never saw it."""
    if not ref:
        return ""
    if ref in _secrets:
        return _secrets[ref]
    raise ValueError(f"{setting} is not known in this process: set it where the code loads")


@dataclass
class JsonEndpoint:
    """A JSON API under one base URL named by a setting (e.g. ``RAG_EMBED_URL``).

    ``url`` may carry ``user:password@`` (sent as Basic auth) and ``api_key`` is sent as a bearer
    token; neither ever appears in :attr:`where` or in an error."""

    url: str
    setting: str
    api_key: str | None = None
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if not self.url.strip():
            raise ValueError(f"{self.setting} is empty")
        parts = urllib.parse.urlsplit(self.url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"{self.setting}={redact(self.url)!r} is not an http(s) URL: give the server's "
                "base URL, e.g. http://127.0.0.1:8080/v1"
            )
        self.creds = credentials(self.url, self.api_key)
        self.base = self.creds.url.rstrip("/")
        warn_if_insecure(self.url, self.setting)

    @property
    def where(self) -> str:
        return f"{self.setting}={redact(self.url)}"

    def url_for(self, path: str) -> str:
        """``path`` under the base URL (an absolute http(s) URL is taken as it is)."""
        if path.startswith(("http://", "https://")):
            return path
        return self.base + "/" + path.lstrip("/") if path else self.base

    def request(self, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """POST ``body`` (GET when None) to ``path``; the reply parsed as JSON."""
        payload = send(
            self.url_for(path),
            body,
            where=self.where,
            creds=self.creds,
            timeout=self.timeout if timeout is None else timeout,
        )
        return parse_json(payload, self.where)

    def scrub(self, text: str) -> str:
        return scrub(text, *self.creds.secrets)
