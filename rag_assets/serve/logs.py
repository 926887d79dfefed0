"""Structured logs (issue 52): ``RAG_LOG_FORMAT=json`` writes one JSON object a line.

Every line has ``time`` (UTC, ISO 8601 with milliseconds), ``level`` and ``message``. The
service adds one line per request (logger ``rag_assets.access``): ``request_id`` (the request's
``X-Request-ID`` when it sends a plain one, else a new id; echoed in the answer), ``method``,
``route`` (the template, never the raw path), ``status``, ``duration_ms``, ``query_id`` (an
answer or search recorded in the query log), ``trace_id`` when traces are on. Never the
question or a document name. uvicorn's own lines and every other log record come out the same
way, and so does whatever the command line writes to stderr (its warnings, errors and progress
lines, each a ``message``, with the run's ``run_id`` and ``command``), closed by one line per
run with ``status`` (the exit code) and ``duration_ms``.

The default (``text``) stays for people: the lines as they were, no access log.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from typing import IO, Any

ACCESS_LOGGER = "rag_assets.access"
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}


def stamp(at: float | None = None) -> str:
    """``2026-12-05T18:51:34.123Z``."""
    at = time.time() if at is None else at
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object (its ``extra`` fields included)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": stamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": " ".join(record.getMessage().split()),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def uvicorn_config(level: str = "warning") -> dict[str, Any]:
    """uvicorn's ``log_config`` in JSON (the workers of ``serve --workers`` apply it too); the
    access lines are the app's own (:data:`ACCESS_LOGGER`), uvicorn's are off."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"json": handler},
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
            "rag_assets": {"handlers": ["json"], "level": "INFO", "propagate": False},
        },
        "root": {"handlers": ["json"], "level": "WARNING"},
    }


def uvicorn_options(settings: Any) -> dict[str, Any]:
    """``uvicorn.run``'s logging options for ``RAG_LOG_FORMAT``: its warnings, as before, and
    with ``json`` every line (its own, the app's access lines) as JSON."""
    if settings.log_format == "json":
        return {"log_level": "warning", "log_config": uvicorn_config()}
    return {"log_level": "warning"}


def configure(fmt: str, **fields: Any) -> JsonLines | None:
    """``RAG_LOG_FORMAT`` for this process: ``json`` turns stderr into JSON lines (``fields`` on
    each) and formats every log record as JSON (a handler on the root logger, and the
    ``rag_assets`` loggers at INFO); returns the stream, whose :meth:`JsonLines.restore` undoes
    it. ``text`` changes nothing (None)."""
    if fmt != "json":
        return None
    stream = sys.stderr if isinstance(sys.stderr, JsonLines) else JsonLines(sys.stderr, fields)
    sys.stderr = stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root, ours = logging.getLogger(), logging.getLogger("rag_assets")
    saved = (list(root.handlers), list(ours.handlers), ours.level, ours.propagate)
    root.handlers, ours.handlers = [handler], []  # one line per record, through the root's
    ours.setLevel(logging.INFO)
    ours.propagate = True

    def restore() -> None:
        root.handlers, ours.handlers, ours.level, ours.propagate = saved
        if sys.stderr is stream:
            sys.stderr = stream.raw

    stream.restore = restore  # type: ignore[method-assign]
    return stream


class JsonLines(io.TextIOBase):
    """A text stream that writes each line it is given as a JSON object on ``raw`` (a line that
    is a JSON object already passes as it is). ``error:`` / ``warning:`` in a line set its
    level."""

    def __init__(self, raw: IO[str], fields: dict[str, Any] | None = None):
        self.raw = raw
        self.fields = dict(fields or {})
        self._buffer = ""

    def restore(self) -> None:
        """Undo :func:`configure` (stderr and the log handlers as they were)."""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # no bars or cursor moves: a log shipper reads this

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", "utf-8") or "utf-8"

    def write(self, text: str) -> int:
        self._buffer += text
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            self._line(line)
        return len(text)

    def flush(self) -> None:
        if self._buffer.strip():
            line, self._buffer = self._buffer, ""
            self._line(line)
        self.raw.flush()

    def record(self, message: str, level: str = "info", **fields: Any) -> None:
        """One line with ``fields`` besides the stream's own."""
        out = {"time": stamp(), "level": level, "message": message, **self.fields, **fields}
        self.raw.write(json.dumps(out, default=str) + "\n")
        self.raw.flush()

    def _line(self, line: str) -> None:
        text = line.rstrip("\r")
        if not text.strip():
            return
        if text.startswith("{") and text.endswith("}"):
            try:
                if isinstance(json.loads(text), dict):
                    self.raw.write(text + "\n")
                    self.raw.flush()
                    return
            except ValueError:
                pass
        head = text[:80].lower()
        level = "error" if "error:" in head else "warning" if "warning:" in head else "info"
        self.record(text, level)
