"""Traces of the service (issue 52): OpenTelemetry spans exported over OTLP/HTTP.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set: each
worker process has its own tracer provider, a batch processor and the OTLP/HTTP (protobuf)
exporter, which read the standard ``OTEL_*`` variables themselves (headers, timeout, batch
delay; ``OTEL_SERVICE_NAME``, default ``rag-assets``). Each request is one ``SERVER`` span named
``<METHOD> <route template>`` (a W3C ``traceparent`` it carries is its parent), with one child
span per stage (embed, dense, bm25, fuse, rerank, cite, generate, ...) timed where the stage
ran. Attributes: ``http.request.method``, ``http.route``, ``http.response.status_code``,
``rag.request_id`` and what the route noted: ``rag.retriever``, ``rag.k``, ``rag.hits``,
``rag.refused``, ``rag.gate``, ``rag.table``, ``rag.table_version``, ``rag.query_id``. Never
the path, the query string or the question, unless ``RAG_TRACE_QUERIES=on`` adds the question
as ``rag.query``.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
DEFAULT_SERVICE_NAME = "rag-assets"


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    return any(env.get(v, "").strip() for v in ENDPOINT_VARS)


class Tracing:
    """One process's tracer provider and the spans of its requests."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: DEFAULT_SERVICE_NAME}
        self.provider = TracerProvider(resource=Resource.create(attrs))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        from rag_assets import __version__

        self.tracer = self.provider.get_tracer("rag_assets.serve", __version__)
        self._stages: queue.SimpleQueue[tuple[Any, str, int, int] | None] = queue.SimpleQueue()
        self._stage_maker = threading.Thread(
            target=self._make_stages, name="rag-trace-stages", daemon=True
        )
        self._stage_maker.start()

    def start(self, method: str, headers: list[tuple[bytes, bytes]]) -> tuple[Any, Any]:
        """The request's span (named by its route once known) and the context token that makes
        it current; a ``traceparent`` header makes it a child of the caller's span."""
        from opentelemetry import context, propagate, trace

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
        parent = propagate.extract(carrier) if "traceparent" in carrier else None
        span = self.tracer.start_span(
            method,
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method},
        )
        return span, context.attach(trace.set_span_in_context(span))

    def end(self, span: Any, token: Any, route: str, status: int, attrs: Mapping[str, Any]) -> None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        span.update_name(f"{span.name} {route}")
        span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        for key, value in attrs.items():
            if value is not None:
                span.set_attribute(f"rag.{key}", value)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        context.detach(token)

    def stage(self, name: str, seconds: float) -> None:
        """A child span of the current request's for a stage that just ended: its times are
        taken here, the span is made by :meth:`_make_stages` off the request's path."""
        from opentelemetry import trace

        parent = trace.get_current_span().get_span_context()
        if not parent.is_valid or not parent.trace_flags.sampled:
            return  # not within a (sampled) request: a background thread
        end = time.time_ns()
        self._stages.put((parent, name, end - int(seconds * 1e9), end))

    def _make_stages(self) -> None:
        """The stage spans, made in a thread of their own (the SDK's span bookkeeping costs a
        request tens of microseconds per span; a request only queues its stages' times)."""
        from opentelemetry import trace

        while True:
            item = self._stages.get()
            if item is None:
                return
            parent, name, start, end = item
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
            self.tracer.start_span(name, context=context, start_time=start).end(end_time=end)

    def shutdown(self) -> None:
        """Make the queued stage spans, export everything, then stop (a worker's shutdown)."""
        self._stages.put(None)
        self._stage_maker.join(10)
        self.provider.shutdown()
