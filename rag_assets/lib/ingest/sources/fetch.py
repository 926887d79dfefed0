"""HTTP for the website source (issue 49): links resolved as a browser resolves them, and one
deadline for the whole of each fetch.

- :func:`resolve` is the URL a browser opens for a link: WHATWG URL parsing's steps that
  ``httpx.URL`` does not take (leading and trailing C0 controls and spaces dropped, tabs and
  newlines inside removed, ``\\`` as ``/`` before the query in http(s), ``'`` percent-encoded in
  the query) and then ``httpx.URL``'s join (percent-encoding of spaces and non-ASCII as UTF-8,
  IDNA hosts, dot segments). ``<a href='/my page.html'>`` is ``/my%20page.html``, ``/café`` is
  ``/caf%C3%A9``: what a browser requests (the same results as ada-url, the WHATWG parser of
  Node.js, on the cases of ``rag_assets_tests/lib/ingest/test_sources_edges.py``).
- :class:`Fetcher` sends each GET with httpx (redirects not followed: the crawler follows them
  itself, on the same host; proxies from the environment, as urllib took them) and bounds the
  whole fetch, connection, headers and body, by ``timeout`` seconds: httpx's own timeouts bound
  each read (a server that sends one byte a second never trips them), so a timer shuts the
  connection's socket down at the deadline (httpcore's ``trace`` extension hands over the socket
  when it connects), and the fetch fails with ``timeout=…s``.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from dataclasses import dataclass
from typing import Any

import httpx

from rag_assets.lib.ingest.sources import LimitHit, SourceError
from rag_assets.lib.models.http import redact

USER_AGENT = "rag-assets"
_C0_AND_SPACE = "".join(chr(c) for c in range(0x21))
_TAB_NEWLINE = re.compile(r"[\t\n\r]")
_BEFORE_QUERY = re.compile(r"([^?#]*)(.*)", re.S)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def resolve(base: str, href: str) -> str | None:
    """The absolute http(s) URL (no fragment) a browser opens for ``href`` on page ``base``;
    None for another scheme (``mailto:``, ``javascript:``, ``data:``) or a link that cannot be
    parsed (see the module)."""
    href = _TAB_NEWLINE.sub("", href.strip(_C0_AND_SPACE))
    scheme = _SCHEME.match(href)
    if scheme and scheme.group(1).lower() not in ("http", "https"):
        return None
    path, rest = _BEFORE_QUERY.match(href).groups()  # type: ignore[union-attr]
    href = path.replace("\\", "/") + rest
    try:
        url = httpx.URL(base).join(href).copy_with(fragment=None)
    except (httpx.InvalidURL, ValueError, UnicodeError):
        return None
    if url.scheme not in ("http", "https") or not url.host:
        return None
    if url.query and b"'" in url.query:
        url = url.copy_with(query=url.query.replace(b"'", b"%27"))
    return str(url)


@dataclass
class Answer:
    """One HTTP answer: status, lower-cased headers, the body (only of a 2xx, at most
    ``max_bytes + 1`` bytes: more than that means over the limit)."""

    status: int
    headers: dict[str, str]
    body: bytes


class Fetcher:
    """GETs with one deadline each (see the module); ``fetched`` counts the requests sent,
    ``downloaded`` the body bytes received (a ``304`` is 0)."""

    def __init__(self, timeout: float, max_bytes: int):
        self.timeout = float(timeout)
        self.max_bytes = int(max_bytes)
        self.fetched = 0
        self.downloaded = 0
        self._client = httpx.Client(
            follow_redirects=False,
            timeout=httpx.Timeout(self.timeout),
            # a new connection per request: its socket is the one the deadline shuts down
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"User-Agent": USER_AGENT},
            trust_env=True,
        )

    def close(self) -> None:
        self._client.close()

    def get(self, url: str, headers: dict[str, str] | None = None) -> Answer:
        """One GET: its answer, :class:`LimitHit` past the deadline, :class:`SourceError` when
        it could not be sent or answered (one line, the URL's credentials and query redacted)."""
        self.fetched += 1
        deadline = _Deadline(self.timeout)
        body = bytearray()
        try:
            with (
                deadline,
                self._client.stream(
                    "GET", url, headers=headers or {}, extensions={"trace": deadline.trace}
                ) as resp,
            ):
                status, head = resp.status_code, {k.lower(): v for k, v in resp.headers.items()}
                if 200 <= status < 300:
                    for chunk in resp.iter_bytes():
                        body += chunk
                        if len(body) > self.max_bytes:
                            break
        except httpx.TimeoutException:
            raise LimitHit(self._late(url)) from None
        except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError, UnicodeError) as exc:
            if deadline.expired:
                raise LimitHit(self._late(url)) from None
            why = " ".join(str(exc).split()) or type(exc).__name__
            raise SourceError(f"{redact(url)}: {why}") from None
        if deadline.expired:  # a body cut short by the deadline (no length to tell it by)
            raise LimitHit(self._late(url))
        self.downloaded += len(body)
        return Answer(status, head, bytes(body))

    def _late(self, url: str) -> str:
        return f"{redact(url)}: no complete answer within timeout={self.timeout:g}s"


class _Deadline:
    """A timer that shuts the fetch's socket down when the fetch's time is up."""

    def __init__(self, seconds: float):
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, seconds), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's ``trace`` extension: the socket, once connected (or wrapped in TLS)."""
        if not event.endswith(("connect_tcp.complete", "start_tls.complete")):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shut()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):  # already closed
                self._sock.shutdown(socket.SHUT_RDWR)
