"""What a request carries for metrics, traces and access lines (issue 52), and the
:class:`Observability` of an app: its series, its tracer, its JSON access log and the observer
the core's stages report to (:mod:`rag_assets.lib.observe`).

Routes and the service add what a request's span and access line carry with :func:`note`
(retriever, k, hits, refused, gate, table version, query id; the question only for a span and
only with ``RAG_TRACE_QUERIES=on``) and count answers and verdicts with :func:`outcome` and
:func:`verdict`. Outside a request, or with nothing observing, each is a no-op. How these are
hooked into the app (the middleware, ``/metrics``, ``/ready``) is
:mod:`rag_assets.serve.operate`.

Importing this module is cheap (the service imports it): prometheus-client and OpenTelemetry
are imported when an :class:`Observability` is made.
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass, field
from typing import Any

from rag_assets.lib import observe as core_observe
from rag_assets.serve.metrics import STAGES
from rag_assets.settings import Settings, is_on


@dataclass
class RequestInfo:
    """What one request's span and access line carry besides its route and status."""

    id: str
    attrs: dict[str, Any] = field(default_factory=dict)


_request: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
    "rag_request", default=None
)
_active: Observability | None = None


def note(**attrs: Any) -> None:
    """Add attributes to the current request's span and access line (outside a request, or
    with nothing observing, nothing). ``query`` (the question) reaches a span only with
    ``RAG_TRACE_QUERIES=on`` and never a log line."""
    info = _request.get()
    if info is not None:
        info.attrs.update(attrs)


def outcome(refused_by: str | None) -> None:
    """Count an answer (``refused_by`` None) or a refusal by its gate (``distance``, ``judge``,
    ``verification``): ``rag_ask_outcomes_total``."""
    obs = _active
    if obs is not None and obs.metrics is not None:
        obs.metrics.outcome(refused_by)


def verdict(name: str) -> None:
    """Count a verdict received: ``rag_feedback_total``."""
    obs = _active
    if obs is not None and obs.metrics is not None:
        obs.metrics.verdict(name)


def served(index: Any) -> None:
    """``rag_index_info`` of the version ``index`` is (cheap when it did not change)."""
    obs = _active
    if obs is not None and obs.metrics is not None:
        pub = index.published
        obs.metrics.serving(pub.table, pub.version, pub.stamps.model)


class Observability:
    """What one app observes, and the observer the core's stages report to."""

    def __init__(self, settings: Settings, service: Any) -> None:
        from rag_assets.serve import tracing
        from rag_assets.serve.metrics import metrics
        from rag_assets.serve.ready import Readiness

        self.settings = settings
        self.metrics = metrics() if is_on("RAG_METRICS", settings.metrics, empty=True) else None
        self.tracing = tracing.Tracing() if tracing.enabled() else None
        self.trace_queries = is_on("RAG_TRACE_QUERIES", settings.trace_queries)
        self.json_logs = settings.log_format == "json"
        self.access_log = logging.getLogger("rag_assets.access")
        self.readiness = Readiness(service)

    @property
    def active(self) -> bool:
        """Whether requests are observed at all (else no middleware is added)."""
        return self.metrics is not None or self.tracing is not None or self.json_logs

    # -- rag_assets.lib.observe.Observer ------------------------------------------------------
    def stage(self, name: str, seconds: float) -> None:
        name = STAGES.get(name, name)  # one spelling for the label and the span
        if self.metrics is not None:
            self.metrics.stage(name, seconds)
        if self.tracing is not None:
            self.tracing.stage(name, seconds)

    def event(self, name: str, value: float, labels: dict[str, str]) -> None:
        if self.metrics is not None:
            self.metrics.event(name, value, labels)

    # -- a request, from the middleware -----------------------------------------------------
    def finished(
        self, method: str, route: str, info: RequestInfo, status: int, seconds: float, span: Any
    ) -> None:
        """Record one answered request (``route``: its template)."""
        if self.metrics is not None:
            self.metrics.request(route, status, seconds)
        attrs = {k: v for k, v in info.attrs.items() if k != "query" or self.trace_queries}
        if self.tracing is not None and span is not None:
            self.tracing.end(span[0], span[1], route, status, {"request_id": info.id, **attrs})
        if self.json_logs:
            extra = {
                "request_id": info.id,
                "method": method,
                "route": route,
                "status": status,
                "duration_ms": round(seconds * 1000, 3),
                "query_id": info.attrs.get("query_id"),
            }
            if span is not None:
                extra["trace_id"] = f"{span[0].get_span_context().trace_id:032x}"
            self.access_log.info(f"{method} {route} {status}", extra=extra)

    def close(self) -> None:
        from rag_assets.serve.metrics import worker_exit

        if self.tracing is not None:
            self.tracing.shutdown()
        if self.metrics is not None:
            worker_exit()


def activate(obs: Observability | None) -> Observability | None:
    """Make ``obs`` what :func:`outcome`, :func:`verdict`, :func:`served` and the core's stages
    report to (None: nothing); returns the one it replaces."""
    global _active
    previous, _active = _active, obs
    core_observe.install(obs if obs is not None and (obs.metrics or obs.tracing) else None)
    return previous


def bind(info: RequestInfo) -> contextvars.Token[RequestInfo | None]:
    """Make ``info`` the current request's (what :func:`note` adds to)."""
    return _request.set(info)


def unbind(token: contextvars.Token[RequestInfo | None]) -> None:
    _request.reset(token)
