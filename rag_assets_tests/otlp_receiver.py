"""A real OTLP/HTTP receiver for the tests (issue 52): ``POST /v1/traces`` with an
``ExportTraceServiceRequest`` in protobuf, decoded with ``opentelemetry-proto``, each span kept
as a plain dict (and every body's raw bytes, to search for what must never be exported).

Binds 127.0.0.1 on a free port and serves from a daemon thread (``with OtlpReceiver() as r``).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rag_assets_tests.helpers import serving_in_thread


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        owner: OtlpReceiver = self.server.owner
        if (
            self.path != "/v1/traces"
            or self.headers.get("Content-Type") != "application/x-protobuf"
        ):
            self.send_response(404)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    spans.append(
                        {
                            "name": sp.name,
                            "kind": sp.kind,
                            "trace_id": sp.trace_id.hex(),
                            "span_id": sp.span_id.hex(),
                            "parent_span_id": sp.parent_span_id.hex(),
                            "start_ns": sp.start_time_unix_nano,
                            "end_ns": sp.end_time_unix_nano,
                            "status": sp.status.code,
                            "attributes": {a.key: _value(a.value) for a in sp.attributes},
                            "resource": resource,
                        }
                    )
        with owner.lock:
            owner.bodies.append(body)
            owner.spans.extend(spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


class OtlpReceiver:
    """Collects the spans exported to it (``spans``) and the raw request bodies (``bodies``)."""

    def __init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.lock = threading.Lock()
        self.spans: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        self._serving: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._serving = serving_in_thread(self.httpd)
        self._serving.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.__exit__(*exc)

    def wait_for(self, check: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The spans once ``check(spans)`` is true (else AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                spans = list(self.spans)
            if check(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({s["name"] for s in spans})
                raise AssertionError(f"spans not exported within {timeout} s; got {names}")
            time.sleep(0.1)
