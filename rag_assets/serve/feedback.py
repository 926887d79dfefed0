"""The query log and feedback in the service (issue 33): :class:`ServiceLog`, the routes
``POST /feedback``, ``GET /log`` and ``GET /log/{query_id}``, and who is asking.

Every ``/ask`` and ``/search`` (and the MCP tools) is recorded by :class:`ServiceLog` through a
background writer (:class:`~rag_assets.lib.query.log.LogWriter`): the entry is queued, the
answer goes out, the batch is written a moment later. Its id comes back with the answer
(``"query_id"`` in ``/ask``, the ``X-RAG-Query-Id`` header of ``/search``, ``query_id`` in the
MCP results) and is what ``POST /feedback`` takes.

Who may see what: answering and feedback follow the service's token (every route but
``/healthz`` needs it when ``RAG_API_TOKEN`` is set); reading the log (``/log``) is for the
administrator only, and only when a token is configured at all: without ``RAG_API_TOKEN`` no
route shows the log (``rag-assets review`` reads it on the index's machine). Who asked is
resolved once per request by the service (issue 34: ``RAG_API_TOKEN``, a token of the index or
a page session of one): a token's name is recorded with its queries, it may judge only those,
and a ``missed`` verdict may name only a document it sees.
"""

from __future__ import annotations

import atexit
import math
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request  # module level: FastAPI reads the annotations
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from rag_assets.lib.query.feedback import (
    FeedbackError,
    TooManyVerdicts,
    UnknownQuery,
    check_feedback,
    parse_feedback,
)
from rag_assets.lib.query.log import (
    FLUSH_S,
    LogWriter,
    ask_entry,
    new_query_id,
    search_entry,
    valid_query_id,
)
from rag_assets.serve.access import log_name
from rag_assets.serve.bounds import log_enabled, redacting  # the names callers use
from rag_assets.serve.rate import LIMIT_FILE, VerdictLimit

if TYPE_CHECKING:
    from rag_assets.lib.query.retrieve import Index
    from rag_assets.settings import Settings

LOOKUP_WAIT_S = 3 * FLUSH_S + 1.0
"""Seconds ``POST /feedback`` waits for an id it does not find yet: the entry may still be in
another worker's queue (written every :data:`~rag_assets.lib.query.log.FLUSH_S` seconds)."""

LOG_PAGE = 50
"""Entries ``GET /log`` returns at most per page (``?limit=`` up to :data:`LOG_MAX`)."""
LOG_MAX = 500


def resolve_caller(request: Request | None) -> str | None:
    """Who sent ``request``, as the log records it: the name of the token it carried, or None
    for the administrator (``RAG_API_TOKEN``) and on a service without tokens (issue 34's
    caller, resolved for every request by the service's middleware)."""
    return log_name(getattr(request.state, "caller", None)) if request is not None else None


def sees_log(settings: Settings, caller: str | None) -> bool:
    """Whether a caller may see what the log holds (entries, questions, counts): the
    administrator, and only on a service with a token (without one, nobody is known)."""
    return bool(settings.api_token) and caller is None


def scoped_status(report: dict[str, Any], settings: Settings, caller: str | None) -> dict[str, Any]:
    """``/status`` for ``caller``: the query log's counts only for :func:`sees_log`."""
    q = report.get("query_log")
    if q is not None and not sees_log(settings, caller):
        report = report | {"query_log": {"enabled": q.get("enabled")}}
    return report


class ServiceLog:
    """The query log of one service process: entries queued to a :class:`LogWriter`, feedback
    checked and stored; entries not written yet are held in memory for feedback that comes
    before their batch."""

    RECENT = 20_000  # entries of this process held for feedback until their batch is written

    def __init__(self, settings: Settings, *, warn: Any = None):
        self.settings = settings
        self.redacting = redacting(settings)
        self.retention_days = settings.query_log_days
        self._warn = warn or (lambda m: print(f"rag-assets: warning: {m}", file=sys.stderr))
        self._log: Any = None
        self._writer: LogWriter | None = None
        self._lock = threading.Lock()
        self._recent: dict[str, dict[str, Any]] = {}
        self.limit = VerdictLimit(  # issue 43: one bucket per token for every worker
            settings.feedback_per_minute,
            Path(settings.work_dir).expanduser() / LIMIT_FILE,
            scope=str(settings.index_uri),
            warn=self._warn,
        )

    @classmethod
    def open(cls, settings: Settings) -> ServiceLog | None:
        """The log of ``settings.index_uri``, or None with ``RAG_QUERY_LOG=off``. Nothing is
        opened until the first entry (``rag-assets mcp`` answers its handshake first)."""
        return cls(settings) if log_enabled(settings) else None

    @property
    def log(self) -> Any:
        """The :class:`~rag_assets.lib.index.store.querylog.QueryLog` (opened once)."""
        if self._log is None:
            with self._lock:
                if self._log is None:
                    from rag_assets.lib.index.store import IndexStore
                    from rag_assets.lib.index.store.querylog import QueryLog

                    log = QueryLog(IndexStore(self.settings.index_uri), warn=self._warn)
                    log.ensure()
                    self._log = log
        return self._log

    @property
    def writer(self) -> LogWriter:
        if self._writer is None:
            with self._lock:
                if self._writer is None:
                    from rag_assets.lib.index.store import shown_uri

                    self._writer = LogWriter(
                        _LazyLog(self),
                        warn=self._warn,
                        where=shown_uri(self.settings.index_uri),
                        maintain=self.maintain,
                        on_written=self._written,
                    )
                    atexit.register(self.close)  # a process that ends writes its queue
        return self._writer

    def maintain(self) -> None:
        """Retention (RAG_QUERY_LOG_DAYS) and compaction, from the writer thread once a day."""
        self.log.expire(self.retention_days)
        self.log.compact()

    def _written(self, rows: list[dict[str, Any]]) -> None:
        """Entries in the table now: looked up there from here on (a purge then removes them)."""
        with self._lock:
            for r in rows:
                self._recent.pop(r["id"], None)

    # -- recording ------------------------------------------------------------------------
    def _submit(self, row: dict[str, Any]) -> str:
        with self._lock:
            self._recent[row["id"]] = row
            while len(self._recent) > self.RECENT:
                self._recent.pop(next(iter(self._recent)))
        self.writer.submit(row)
        return str(row["id"])

    def record_ask(
        self,
        question: str,
        ctx: Any,
        hits: list[Any],
        index: Index,
        *,
        interface: str,
        caller: str | None,
        started: float,
    ) -> str:
        row = ask_entry(
            new_query_id(),
            question,
            ctx,
            hits,
            index.published,
            interface=interface,
            caller=caller,
            fusion=index.fusion.label,
            latency_ms=(time.perf_counter() - started) * 1000,
            redacting=self.redacting,
        )
        return self._submit(row)

    def record_search(
        self,
        query: str,
        hits: list[dict[str, Any]],
        index: Index,
        *,
        retriever: str,
        k: int,
        interface: str,
        caller: str | None,
        started: float,
    ) -> str:
        row = search_entry(
            new_query_id(),
            query,
            hits,
            index.published,
            retriever=retriever,
            k=k,
            interface=interface,
            caller=caller,
            fusion=index.fusion.label,
            latency_ms=(time.perf_counter() - started) * 1000,
            redacting=self.redacting,
        )
        return self._submit(row)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    # -- feedback -------------------------------------------------------------------------
    def entry(self, query_id: str, wait_s: float = LOOKUP_WAIT_S) -> dict[str, Any] | None:
        """A logged entry: this process's recent ones first, then the table (waiting up to
        ``wait_s`` for one another worker may not have written yet)."""
        if not valid_query_id(query_id):
            return None
        with self._lock:
            row = self._recent.get(query_id)
        if row is not None:
            return row
        deadline = time.monotonic() + wait_s
        while True:
            row = self.log.entry(query_id)
            if row is not None or time.monotonic() >= deadline:
                return row
            time.sleep(0.25)

    async def entry_for(
        self, query_id: str, caller: str | None, wait_s: float = LOOKUP_WAIT_S
    ) -> dict[str, Any] | None:
        """Issue 43: the entry ``caller`` may judge, waited for as :meth:`entry` waits, but
        between looks no worker thread is held, and another caller's id is waited for as long
        as an unknown one (the answer and its timing do not tell that it exists)."""
        from anyio import sleep, to_thread

        if not valid_query_id(query_id):
            return None
        deadline = time.monotonic() + wait_s
        while True:
            row = await to_thread.run_sync(self.entry, query_id, 0.0)
            if row is not None and (caller is None or row.get("caller") == caller):
                return row
            if time.monotonic() >= deadline:
                return None
            await sleep(0.25)

    def feedback(
        self,
        body: Any,
        documents: Any,
        *,
        caller: str | None,
        interface: str,
        entry: dict[str, Any] | None | bool = False,
    ) -> dict[str, Any]:
        """Check and store one verdict; the answer of ``POST /feedback``: the verdict, the one
        it replaced and, for the administrator of a service with a token (:func:`sees_log`),
        how many more reviews calibration needs (counts of the whole log: nobody else's).
        ``entry``: looked up already by :meth:`entry_for` (the limit taken too), else False."""
        if entry is False:
            self.limit.take(caller)  # issue 43: per token, before any lookup or write
        fb = parse_feedback(body)
        if entry is False:
            entry = self.entry(fb.query_id)
        assert entry is None or isinstance(entry, dict)
        row = check_feedback(
            fb, entry, documents, caller=caller, interface=interface, redacting=self.redacting
        )
        previous = self.log.reviews_of(fb.query_id)
        self.log.add_feedback(row)  # replaces this caller's earlier verdict on the query
        others = [p for p in previous if p.get("caller") != caller]
        out = {
            "query_id": fb.query_id,
            "verdict": row["verdict"],
            "source": row["source"],
            "document": row["document"],
            "replaced": previous[-1]["verdict"] if previous else None,
            "history": len(others) + 1,
            "at": row["at"],
        }
        if sees_log(self.settings, caller):
            from rag_assets.lib.evaluate.traffic import review_progress

            if self._writer is not None:
                self._writer.flush(5.0)  # the entry itself may still be queued
            out["calibration"] = review_progress(self.log)
        return out


class _LazyLog:
    """The writer's view of the log: opened in the writer thread on the first batch."""

    def __init__(self, owner: ServiceLog):
        self.owner = owner

    @property
    def uri(self) -> str:
        return self.owner.settings.index_uri

    def add_entries(self, rows: list[dict[str, Any]]) -> None:
        self.owner.log.add_entries(rows)


class _ErrorBody(BaseModel):
    """Every error: one line naming the cause and what to change."""

    error: str


_WHAT = {
    400: "bad input (one line naming it)",
    401: "missing or wrong bearer token",
    403: "the query log is the administrator's (and needs RAG_API_TOKEN)",
    404: "no such query id in the log, or the log is off",
    421: "Host not served here (RAG_ALLOWED_HOSTS)",
    429: "too many verdicts from this token (RAG_FEEDBACK_PER_MINUTE)",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": _ErrorBody, "description": _WHAT[c]} for c in codes}


def error(status: int, message: str) -> JSONResponse:
    """The service's one error shape: ``{"error": "<one line>"}``."""
    from rag_assets.serve.limits import client_text

    return JSONResponse({"error": client_text(message)}, status_code=status)


def add_routes(app: FastAPI, service: Any, token: str) -> None:
    """``POST /feedback``, ``GET /log`` and ``GET /log/{query_id}`` on ``app``."""

    def log_or_403(request: Request) -> ServiceLog | JSONResponse:
        if not token:
            return error(
                403,
                "the query log is served only when RAG_API_TOKEN is set (it holds users' "
                "questions): set it, or read the log with `rag-assets review` where the index is",
            )
        if not sees_log(service.settings, resolve_caller(request)):
            return error(403, "the query log is for the administrator's token (RAG_API_TOKEN)")
        if service.log is None:
            return error(404, "the query log is off (RAG_QUERY_LOG=off)")
        return service.log  # type: ignore[no-any-return]

    @app.post(
        "/feedback",
        summary="a verdict on an answer: answered (source n), missed (document, quote), "
        "should_refuse, right_refusal or wrong",
        responses=_errors(400, 401, 404, 421, 429),
    )
    async def feedback(request: Request) -> JSONResponse:
        import json

        from anyio import to_thread

        if service.log is None:
            return error(404, "the query log is off (RAG_QUERY_LOG=off): no feedback is kept")
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            return error(
                400, 'request body is not valid JSON: send {"query_id": ..., "verdict": ...}'
            )
        who = getattr(request.state, "caller", None)
        owner: ServiceLog = service.log

        try:
            # issue 43: before any lookup; a short SQLite transaction shared by the workers
            await to_thread.run_sync(owner.limit.take, log_name(who))
            fb = parse_feedback(body)
            entry = await owner.entry_for(fb.query_id, log_name(who))  # no thread held

            def run() -> dict[str, Any]:
                out: dict[str, Any] = service.feedback(body, who, interface="http", entry=entry)
                return out

            out = await to_thread.run_sync(run)
        except TooManyVerdicts as exc:
            response = error(429, str(exc))
            response.headers["Retry-After"] = str(math.ceil(exc.retry_after_s))
            return response
        except FeedbackError as exc:
            return error(400, str(exc))
        except UnknownQuery as exc:
            return error(404, str(exc))
        return JSONResponse(out)

    @app.get(
        "/log",
        summary="the query log, newest first (administrator's token only)",
        responses=_errors(401, 403, 421),
    )
    def log_page(
        request: Request,
        unreviewed: bool = Query(False, description="only entries without a verdict"),
        limit: int = Query(LOG_PAGE, description=f"entries, 1..{LOG_MAX}"),
    ) -> Any:
        owner = log_or_403(request)
        if not isinstance(owner, ServiceLog):
            return owner
        if not 1 <= limit <= LOG_MAX:
            return error(400, f"limit={limit} is out of range: use 1..{LOG_MAX}")
        owner.writer.flush(5.0)
        from rag_assets.lib.evaluate.traffic import entries_for_review

        return JSONResponse(entries_for_review(owner.log, unreviewed=unreviewed, limit=limit))

    @app.get(
        "/log/{query_id}",
        summary="one logged query with its verdict history (administrator's token only)",
        responses=_errors(401, 403, 404, 421),
    )
    def log_entry(query_id: str, request: Request) -> Any:
        owner = log_or_403(request)
        if not isinstance(owner, ServiceLog):
            return owner
        row = owner.entry(query_id, wait_s=0.0) if valid_query_id(query_id) else None
        if row is None:
            return error(404, f"no query {query_id[:40]!r} in the query log")
        from rag_assets.lib.evaluate.traffic import shown_entry

        return JSONResponse(shown_entry(row, owner.log.reviews_of(query_id)))
