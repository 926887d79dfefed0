"""Request limits and error texts of the HTTP service (issue 30).

:class:`RequestLimits` is an ASGI middleware in front of every route (``/mcp`` included):

* a ``Content-Length`` over :data:`~rag_assets.serve.app.MAX_BODY_BYTES` (or not a number) is
  answered at once with the service's JSON error shape, 413 (400), before any body is read;
* every body is counted as it streams (a chunked one included) and cut at the cap with 413
  (what the client is still sending is read and dropped for a moment first, so it reads the
  413 rather than a reset connection);
* the body must arrive within ``RAG_BODY_TIMEOUT_S`` seconds of the first read: one that stops
  arriving (a client that sent half and went quiet) is answered 408 and the connection closed,
  so it cannot hold a worker for ever. uvicorn (and h11) have no body timeout of their own:
  ``timeout_keep_alive`` covers only idle connections between requests.

:func:`client_text` is what an error may show a client: one line, no file system paths (the
index's, or the Rust source paths LanceDB puts in its errors, ``/root/.cargo/registry/…``),
no longer than :data:`MAX_ERROR_CHARS`. The full text goes to the server log.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
from starlette.exceptions import HTTPException

MAX_ERROR_CHARS = 300
"""Longest error text sent to a client (ids and values in it are cut shorter still)."""

MAX_SHOWN_ID = 80
"""Characters of a client-supplied id or value echoed in an error (then ``…``)."""

_SOURCE = re.compile(r"(?:[A-Za-z]:)?(?:/[^\s'\"`,;()<>\[\]{}]+)+\.rs(?::\d+)*")
_PATH = re.compile(
    r"(?<![\w:/.])(?:file://)?(?:~|/)(?:[^\s'\"`,;()<>\[\]{}]+/)+[^\s'\"`,;()<>\[\]{}]*"
)


def shorten(value: Any, limit: int = MAX_SHOWN_ID) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 60,000-character id is not echoed)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_RELATIVE_PATH = re.compile(r"(?<![\w:/.~<>-])(?:\.{1,2}/)?(?:[\w.-]+/)+[\w.-]+")
"""A path without a leading ``/`` (``tmp/index/_rag_queries.lance/data/…``): scrubbed from
unexpected errors only (issue 43), where no document id is meant."""


def client_text(text: str, limit: int = MAX_ERROR_CHARS, *, relative: bool = False) -> str:
    """``text`` as a client may see it: one line, source locations and paths replaced (with
    ``relative``, also paths without a leading ``/``: for unexpected errors), cut."""
    line = " ".join(str(text).split())
    line = _SOURCE.sub("<source>", line)
    line = _PATH.sub("<path>", line)
    if relative:
        line = _RELATIVE_PATH.sub("<path>", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def json_error(status: int, message: str, close: bool = False) -> tuple[dict[str, Any], bytes]:
    """The ``http.response.start`` message and body of the one error shape."""
    body = json.dumps({"error": " ".join(message.split())}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    return {"type": "http.response.start", "status": status, "headers": headers}, body


class RequestLimits:
    """ASGI middleware: the body cap and the body timeout (see the module docstring)."""

    def __init__(self, app: Any, max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None:
            why = None
            if not length.isdigit():
                why = (400, f"Content-Length {shorten(length, 24)} is not a number of bytes")
            elif int(length) > self.max_body_bytes:
                why = (413, f"request body of {length} bytes; at most {self.max_body_bytes}")
            if why is not None:
                start, body = json_error(*why, close=True)
                await send(start)
                await send({"type": "http.response.body", "body": body})
                return
        cap, timeout = self.max_body_bytes, self.body_timeout_s
        received = 0
        done = False
        deadline: float | None = None

        async def limited() -> dict[str, Any]:
            nonlocal received, done, deadline
            if done:  # the body is complete: later reads wait for a disconnect, unbounded
                message: dict[str, Any] = await receive()
                return message
            if deadline is None:
                deadline = anyio.current_time() + timeout
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as waited:
                message = await receive()
            if waited.cancelled_caught:
                raise HTTPException(
                    408,
                    f"request body not received within {timeout:g} s (RAG_BODY_TIMEOUT_S): "
                    "send the whole body without pausing",
                )
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    if message.get("more_body", False):
                        await _linger(receive)
                    raise HTTPException(413, f"request body over {cap} bytes; at most {cap}")
                done = not message.get("more_body", False)
            else:
                done = True
            return message

        await self.app(scope, limited, send)


LINGER_BYTES = 16 << 20
"""Body bytes read and discarded after the cap is passed, before the 413 is sent (with
:data:`LINGER_SECONDS`): a client still sending would otherwise meet a closed connection
(a reset) instead of reading the answer; nginx's *lingering close* does the same."""

LINGER_SECONDS = 2.0


async def _linger(receive: Any) -> None:
    """Read and drop the rest of an over-cap body, within :data:`LINGER_BYTES` and
    :data:`LINGER_SECONDS`; what is left after that meets the closed connection."""
    drained = 0
    with anyio.move_on_after(LINGER_SECONDS):
        while drained < LINGER_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1").strip())
    return None
