"""MCP over stdio where every line gets an answer (issue 30).

The SDK's stdio transport hands a line it cannot validate to the server as an exception, which
the server only logs: a line that is not JSON, or a request whose text holds a lone surrogate
(``"\\ud800"``: valid JSON, but not Unicode, which pydantic refuses), got no response at all,
and the caller waited forever. Over HTTP the same call gets -32700.

:func:`run_stdio` keeps the SDK's transport (and its stdout handling) but reads stdin through
:class:`GuardedLines`, which checks each line the way the SDK would parse it and, for one it
would drop, writes a one-line JSON-RPC error through the transport's own writer:

* not JSON (or nested too deeply to parse): -32700 *Parse error*, ``id: null`` (the id cannot
  be read);
* JSON with a lone surrogate in a request's ``params``: -32602 *Invalid params* with the
  request's id, naming where the bad text is; anywhere else in a request: -32600;
* JSON that is not a JSON-RPC message: -32600 *Invalid Request*, with the id when one can be
  read.

Notifications (no id) that fail the same checks get nothing back, as JSON-RPC says; they are
reported on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import suppress
from io import TextIOWrapper
from typing import Any

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

#: characters of an offending value shown in an error (errors are one short line)
SHOWN = 60


def line_error(line: str) -> types.JSONRPCError | bool | None:
    """What to do with one stdin line: ``None``: pass it to the SDK; ``False``: drop it
    silently (blank, or a bad notification); else the error response to send."""
    if not line.strip():
        return False
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as exc:
        what = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        return _error(None, types.PARSE_ERROR, f"Parse error: the line is not JSON ({what})")
    if not isinstance(message, dict):
        kind = "a batch (array)" if isinstance(message, list) else type(message).__name__
        return _error(
            None, types.INVALID_REQUEST, f"Invalid Request: {kind}: send one JSON-RPC object a line"
        )
    raw_id = message.get("id")
    rid = raw_id if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else None
    where = _surrogate_at(message)
    if where is not None:
        if rid is None or "method" not in message:
            _note(f"dropped a message without an id: {where} holds a lone surrogate")
            return False
        code = types.INVALID_PARAMS if where.startswith("params") else types.INVALID_REQUEST
        label = "Invalid params" if code == types.INVALID_PARAMS else "Invalid Request"
        return _error(
            rid,
            code,
            f"{label}: {where} holds a lone surrogate (text that is not valid Unicode, e.g. "
            '"\\ud800"): send UTF-8 text',
        )
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception:  # noqa: BLE001 - any refusal of the SDK's parser gets the same answer
        if rid is None and "method" in message and "id" not in message:
            _note(f"dropped a notification that is not valid JSON-RPC: {line[:SHOWN]!r}")
            return False
        return _error(
            rid,
            types.INVALID_REQUEST,
            "Invalid Request: not a JSON-RPC 2.0 request, notification or response "
            '(jsonrpc "2.0", a method string, an id string or integer)',
        )
    return None


def _error(rid: str | int | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=rid,
        error=types.ErrorData(code=code, message=" ".join(message.split())),
    )


def _surrogate_at(message: Any) -> str | None:
    """The path (``params.arguments.query``) of the first string or key holding a lone
    surrogate, walked with an explicit stack (a deep message cannot exhaust Python's)."""
    stack: list[tuple[str, Any]] = [("", message)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _has_surrogate(value):
                return path or "the message"
        elif isinstance(value, dict):
            for key, item in value.items():
                sub = f"{path}.{key}" if path else str(key)
                if _has_surrogate(str(key)):
                    return f"a key of {path or 'the message'}"
                stack.append((sub, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _note(text: str) -> None:
    print(f"rag-assets mcp: {text}", file=sys.stderr, flush=True)


class GuardedLines:
    """stdin's lines as the SDK's transport reads them, minus the ones it would drop, whose
    error responses go out through the transport's writer (:meth:`attach`)."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self._out: Any = None
        self._ready = anyio.Event()

    def attach(self, write_stream: Any) -> None:
        self._out = write_stream
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self._source:
            verdict = line_error(line)
            if verdict is None:
                yield line
            elif isinstance(verdict, types.JSONRPCError):
                await self._ready.wait()
                with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await self._out.send(SessionMessage(verdict))


async def serve_stdio(mcp: Any) -> None:
    """Run ``mcp`` (an ``MCPServer``) over stdio with :class:`GuardedLines` on stdin."""
    stdin = anyio.wrap_file(TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace"))
    guard = GuardedLines(stdin)
    server = mcp._lowlevel_server
    async with stdio_server(stdin=guard) as (read_stream, write_stream):  # type: ignore[arg-type]
        guard.attach(write_stream)
        await server.run(read_stream, write_stream, server.create_initialization_options())


def run_stdio(mcp: Any) -> None:
    """Serve until the client closes stdin."""
    anyio.run(serve_stdio, mcp)
