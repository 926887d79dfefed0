"""Recording the questions people ask (issue 33): log entries and the writer that stores them.

Every ``/ask``, ``/search``, MCP tool call and ``rag-assets ask`` becomes one entry of the
index's query log (:mod:`rag_assets.lib.index.store.querylog`): the question, which published
version answered it with its stamps, the retriever and fusion, the top hits (chunk ids, ranks,
distances), the gate's cut and decision, the citations shown, and the latency.

Entries are written off the request path: :class:`LogWriter` queues them and a background thread
appends them in batches (every :data:`FLUSH_ROWS` entries or :data:`FLUSH_S` seconds, and on
close), so logging never slows or fails a query. A write that fails is reported once (one line
naming the index and the cause); the query has answered already.

Query ids are random (``secrets.token_urlsafe``: 128 bits), not derived from content: they are
the capability a user holds to give feedback on their own question, so nobody can guess another
user's. ``RAG_QUERY_LOG_REDACT=on`` masks e-mail addresses and long digit runs in the stored
question (:func:`redact`).
"""

from __future__ import annotations

import json
import math
import queue
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rag_assets.lib import observe

if TYPE_CHECKING:
    from rag_assets.lib.index.store import Published
    from rag_assets.lib.index.store.querylog import QueryLog
    from rag_assets.lib.query.cite import Context
    from rag_assets.lib.types import Hit

ID_BYTES = 16
"""Random bytes of a query id (22 URL-safe characters)."""

ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{22}")
"""What a query id looks like; anything else is refused before any lookup."""

HITS_KEPT = 10
"""Top hits stored per entry (rank, chunk id, document, span, distance): the gate keeps at most
4, the replay compares the top 4; 10 shows what was just below."""

SEARCH_CITED = 4
"""Hits of a search stored with their shown text, so that feedback can name one as the answer
(``answered`` with ``source`` = its rank), as it names an ``ask`` citation."""

FLUSH_ROWS = 64
"""Entries that trigger a write at once (one LanceDB commit each batch)."""

FLUSH_S = 1.0
"""Seconds an entry may wait in the queue before its batch is written."""

MAX_QUEUE = 10_000
"""Entries held while the store cannot be written; beyond, new entries are dropped (counted)."""

INTERFACES = ("http/ask", "http/search", "mcp/ask", "mcp/search", "cli/ask")

EMAIL = re.compile(r"[\w.%+-]+[@\uff20\ufe6b][\w-]+(?:\.[\w-]+)*\.[^\W\d_]{2,}")
"""An e-mail address, Unicode ones too (``jöe@exämple.de``), with a full-width ``＠`` or a small
``﹫`` as well (issue 43)."""
LONG_DIGITS = re.compile(r"(?<!\d)\+?\d(?:[ -]?\d){6,}|(?<![\d.])\d{3,}(?:\.\d{3,}){2,}(?!\d)")
"""Seven or more digits, single spaces or hyphens allowed between them (phone, card, account
and ID numbers), or three or more groups of 3+ digits joined by dots (``4111.1111.1111.1111``,
issue 43); version numbers and dates with dots and short numbers are left alone."""


def new_query_id() -> str:
    """A random id that never starts with ``-``: on a command line ``--id -x…`` reads as an
    option (1 id in 64 did, and ``log purge --id`` refused it)."""
    while (qid := secrets.token_urlsafe(ID_BYTES)).startswith("-"):
        pass
    return qid


def valid_query_id(text: Any) -> bool:
    return isinstance(text, str) and ID_PATTERN.fullmatch(text) is not None


def redact(text: str) -> str:
    """``text`` with e-mail addresses as ``[email]`` and runs of 7+ digits as ``[number]``."""
    return LONG_DIGITS.sub("[number]", EMAIL.sub("[email]", text))


def now() -> tuple[str, int]:
    """(ISO 8601 UTC to the millisecond, nanoseconds since the epoch) of this instant."""
    ns = time.time_ns()
    at = datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="milliseconds")
    return at.replace("+00:00", "Z"), ns


def _base(
    query_id: str,
    question: str,
    published: Published,
    *,
    interface: str,
    caller: str | None,
    retriever: str,
    fusion: str,
    latency_ms: float,
    redacting: bool,
) -> dict[str, Any]:
    at, at_ns = now()
    st = published.stamps
    text = redact(question) if redacting else question
    return {
        "id": query_id,
        "at": at,
        "at_ns": at_ns,
        "interface": interface,
        "caller": caller,
        "question": text,
        "redacted": redacting and text != question,
        "table": published.table,
        "version": int(published.version),
        "documents_version": int(published.documents_version),
        "model": st.model,
        "model_revision": st.revision,
        "dims": int(st.dims),
        "pipeline": st.pipeline,
        "extractor": st.extractor,
        "retriever": retriever,
        "fusion": fusion,
        "latency_ms": float(latency_ms),
    }


def hits_record(hits: Sequence[Hit]) -> list[dict[str, Any]]:
    """The stored form of the top hits."""
    return [
        {
            "rank": h.rank,
            "chunk_id": h.chunk_id,
            "document_id": h.document_id,
            "from": h.start,
            "to": h.end,
            "distance": _num(h.cosine_distance),
        }
        for h in hits[:HITS_KEPT]
    ]


def nearest(hits: Sequence[Any]) -> float | None:
    """The smallest cosine distance among hits (:class:`Hit` objects or JSON hits), or None."""
    ds = []
    for h in hits:
        d = h.get("cosine_distance") if isinstance(h, dict) else h.cosine_distance
        if isinstance(d, int | float) and math.isfinite(d):
            ds.append(float(d))
    return min(ds) if ds else None


def ask_entry(
    query_id: str,
    question: str,
    ctx: Context,
    hits: Sequence[Hit],
    published: Published,
    *,
    interface: str,
    caller: str | None,
    fusion: str,
    latency_ms: float,
    redacting: bool = False,
) -> dict[str, Any]:
    """The log entry of one ``ask``: ``hits`` are the ranked hits the gate saw."""
    retriever = hits[0].retriever if hits else "hybrid"
    row = _base(
        query_id,
        question,
        published,
        interface=interface,
        caller=caller,
        retriever=retriever,
        fusion=fusion,
        latency_ms=latency_ms,
        redacting=redacting,
    )
    citations = []
    for c in ctx.citations:
        span = c.span
        citations.append(
            {
                "n": c.index,
                "chunk_id": c.chunk_id,
                "document_id": c.document_id,
                "document_name": c.document_name,
                "locator": c.locator_label,
                "from": c.start,
                "to": c.end,
                "span_from": span.start if span else c.start,
                "span_to": span.end if span else c.end,
                "text": span.text if span else c.quote,  # what the user was shown as the answer
                "distance": _num(c.cosine_distance),
            }
        )
    row |= {
        "k": len(hits),
        "cut": _num(ctx.threshold),
        "decision": "refused" if ctx.no_answer else "answered",
        "refused_by": ctx.refused_by,
        "nearest_distance": nearest(hits),
        "hits": json.dumps(hits_record(hits)),
        "citations": json.dumps(citations, ensure_ascii=False),
    }
    return row


def search_entry(
    query_id: str,
    query: str,
    hits: Sequence[dict[str, Any]],
    published: Published,
    *,
    retriever: str,
    k: int,
    interface: str,
    caller: str | None,
    fusion: str,
    latency_ms: float,
    redacting: bool = False,
) -> dict[str, Any]:
    """The log entry of one ``search`` (``hits``: the JSON hits it returned)."""
    row = _base(
        query_id,
        query,
        published,
        interface=interface,
        caller=caller,
        retriever=retriever,
        fusion=fusion,
        latency_ms=latency_ms,
        redacting=redacting,
    )
    top = [
        {
            "rank": h.get("rank"),
            "chunk_id": h.get("chunk_id"),
            "document_id": h.get("document_id"),
            "from": h.get("from"),
            "to": h.get("to"),
            "distance": _num(h.get("cosine_distance")),
        }
        for h in hits[:HITS_KEPT]
    ]
    shown = []  # the first SEARCH_CITED hits, as an answer's citations (feedback numbers them)
    for h in hits[:SEARCH_CITED]:
        span = h.get("span") or {}
        shown.append(
            {
                "n": h.get("rank"),
                "chunk_id": h.get("chunk_id"),
                "document_id": h.get("document_id"),
                "document_name": h.get("document_name"),
                "locator": h.get("locator_label"),
                "from": h.get("from"),
                "to": h.get("to"),
                "span_from": span.get("from", h.get("from")),
                "span_to": span.get("to", h.get("to")),
                "text": span.get("text") or h.get("quote") or "",
                "distance": _num(h.get("cosine_distance")),
            }
        )
    row |= {
        "k": int(k),
        "cut": None,
        "decision": "",
        "refused_by": None,
        "nearest_distance": nearest(hits),
        "hits": json.dumps(top),
        "citations": json.dumps(shown, ensure_ascii=False),
    }
    return row


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(float(x)) else None


class LogWriter:
    """Appends entries to a :class:`QueryLog` from a background thread, in batches.

    :meth:`submit` never blocks and never raises. A batch that cannot be written is retried once
    with the next batch, then dropped and counted; the first failure of a streak is reported
    through ``warn`` (one line), the next report comes only after a write succeeded again.
    ``maintain`` (retention, compaction) runs in the same thread every ``maintain_every_s``;
    ``on_written`` sees each batch once it is stored."""

    def __init__(
        self,
        log: QueryLog | Any,  # anything with add_entries(rows) and uri
        *,
        warn: Callable[[str], None] | None = None,
        where: str = "",
        flush_rows: int = FLUSH_ROWS,
        flush_s: float = FLUSH_S,
        max_queue: int = MAX_QUEUE,
        maintain: Callable[[], None] | None = None,
        maintain_every_s: float = 86_400.0,
        maintain_first_s: float = 60.0,
        on_written: Callable[[list[dict[str, Any]]], None] | None = None,
    ):
        self.log = log
        self.warn = warn or (lambda _m: None)
        self.where = where or log.uri
        self.flush_rows, self.flush_s = flush_rows, flush_s
        self.maintain, self.maintain_every_s = maintain, maintain_every_s
        self.on_written = on_written
        self._next_maintenance = time.monotonic() + maintain_first_s
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(max_queue)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending: list[dict[str, Any]] = []  # a failed batch, retried once
        self._flushed = threading.Condition()
        self._submitted = self._done = 0
        self.written = self.dropped = 0
        self.last_error: str | None = None
        self._reported = False
        self._closed = False

    # -- the request side -----------------------------------------------------------------
    def submit(self, row: dict[str, Any]) -> None:
        """Queue one entry (never blocks: a full queue drops it and counts it)."""
        if self._closed:
            self.dropped += 1
            observe.event("query_log_dropped")
            return
        self._start()
        try:
            self._queue.put_nowait(row)
        except queue.Full:
            self.dropped += 1
            observe.event("query_log_dropped")
            self._report(f"{MAX_QUEUE} entries already waiting")
            return
        with self._flushed:
            self._submitted += 1

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything submitted so far was written (or dropped); False on timeout."""
        with self._flushed:
            target = self._submitted
        if self._thread is None:
            return True
        self._queue.put(None)  # wake the writer: write what is there now
        deadline = time.monotonic() + timeout
        with self._flushed:
            while self._done < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._flushed.wait(left)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop the thread (a service's shutdown, the CLI's exit)."""
        self.flush(timeout)
        self._closed = True
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "dropped": self.dropped,
            "queued": self._queue.qsize(),
            "last_error": self.last_error,
        }

    # -- the writer thread ----------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rag-query-log", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            batch: list[dict[str, Any]] = []
            wake = False
            try:
                item = self._queue.get(timeout=self.flush_s)
                if item is None:
                    wake = True
                else:
                    batch.append(item)
            except queue.Empty:
                pass
            deadline = time.monotonic() + self.flush_s
            while not wake and batch and len(batch) < self.flush_rows:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
                if item is None:
                    wake = True
                else:
                    batch.append(item)
            while True:  # everything already queued goes into this batch too
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    batch.append(item)
            self._write(batch)
            self._maybe_maintain()
            if self._closed and self._queue.empty():
                return

    def _write(self, batch: list[dict[str, Any]]) -> None:
        rows = self._pending + batch
        if rows:
            try:
                self.log.add_entries(rows)
            except Exception as exc:  # noqa: BLE001 - the query has answered: report once
                observe.event("query_log_write_failed")  # issue 52: the service's counter
                if self._pending:  # this was its second try: drop it
                    self.dropped += len(self._pending)
                    observe.event("query_log_dropped", len(self._pending))
                    self._pending = list(batch)
                else:
                    self._pending = rows
                self._report(" ".join(str(exc).split())[:300] or type(exc).__name__)
            else:
                self.written += len(rows)
                self._pending = []
                if self.on_written is not None:
                    self.on_written(rows)
                self._reported = False
                self.last_error = None
        with self._flushed:
            self._done += len(batch)
            self._flushed.notify_all()

    def _report(self, why: str) -> None:
        self.last_error = why
        if self._reported:
            return
        self._reported = True
        self.warn(
            f"query log: entries could not be written to {self.where} ({why}); queries still "
            "answer; not reported again until a write succeeds (RAG_QUERY_LOG=off: no log)"
        )

    def _maybe_maintain(self) -> None:
        if self.maintain is None or time.monotonic() < self._next_maintenance:
            return
        self._next_maintenance = time.monotonic() + self.maintain_every_s
        try:
            self.maintain()
        except Exception as exc:  # noqa: BLE001 - retention is retried on the next round
            self.warn(f"query log: retention/compaction of {self.where} failed: {exc}")
