"""Operating the service (issue 52): metrics, readiness, traces and structured logs, hooked into
the app by :func:`install` (``create_app`` calls it last).

- ``GET /metrics`` (:mod:`rag_assets.serve.metrics`): Prometheus text format, every worker's
  series added up. With tokens configured (``RAG_API_TOKEN``, tokens of the index, or
  ``RAG_METRICS_TOKEN``) it needs the administrator's token or ``RAG_METRICS_TOKEN``: a group
  token is refused (403), no token or a wrong one 401, and neither answer holds a series.
  Without tokens it is open, as every route is on the loopback default. ``RAG_METRICS=off``:
  no series are kept and ``/metrics`` is a 404.
- ``GET /ready`` (:mod:`rag_assets.serve.ready`): 200 or 503 naming what is down; no token.
- Traces (:mod:`rag_assets.serve.tracing`) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.
- ``RAG_LOG_FORMAT=json`` (:mod:`rag_assets.serve.logs`): one access line per request.

One ASGI middleware, outside every other, times each request and labels it by its route
template (``scope["route"]``, or the route the path matches when an earlier layer answered:
a 401, a 421), never by its path; it keeps the request's
:class:`~rag_assets.serve.observe.RequestInfo` current and answers with its ``X-Request-ID``.
With metrics, traces and JSON logs all off, no middleware is added at all.
"""

from __future__ import annotations

import hmac
import re
import secrets
import time
from typing import Any

from fastapi import FastAPI, Request  # module level: FastAPI reads the route annotations
from fastapi.responses import JSONResponse, Response

from rag_assets.serve import observe
from rag_assets.serve.limits import client_text
from rag_assets.serve.observe import Observability, RequestInfo

REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
"""An ``X-Request-ID`` a client sent that is kept (anything else gets a new id)."""
UNMATCHED = "unmatched"
"""The route label of a path that no route serves (a 404 of an unknown path)."""


class ObserveMiddleware:
    """Pure ASGI (no extra task per request): times the request, keeps its
    :class:`RequestInfo` current, answers with its ``X-Request-ID``."""

    def __init__(self, app: Any, obs: Observability) -> None:
        self.app = app
        self.obs = obs

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        obs = self.obs
        started = time.perf_counter()
        info = RequestInfo(_request_id(scope["headers"]))
        token = observe.bind(info)
        span = obs.tracing.start(scope["method"], scope["headers"]) if obs.tracing else None
        status = 500  # what an exception that escapes the app becomes
        rid = info.id.encode("ascii")

        async def send_with_id(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message = {
                    **message,
                    "headers": [*message.get("headers", ()), (b"x-request-id", rid)],
                }
            await send(message)

        gauge = obs.metrics.in_progress if obs.metrics is not None else None
        if gauge is not None:
            gauge.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if gauge is not None:
                gauge.dec()
            try:
                seconds = time.perf_counter() - started
                obs.finished(scope["method"], route_of(scope), info, status, seconds, span)
            finally:
                observe.unbind(token)


def _request_id(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if REQUEST_ID.match(text):
                return text
            break
    return secrets.token_hex(8)


def route_of(scope: dict[str, Any]) -> str:
    """The template of the route that answered (or that the path matches), never the path."""
    route = scope.get("route")
    if route is None:
        from starlette.routing import Match

        app = scope.get("app")
        for candidate in getattr(getattr(app, "router", None), "routes", ()):
            if candidate.matches(scope)[0] != Match.NONE:
                route = candidate
                break
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(template) if template else UNMATCHED


def install(app: FastAPI, service: Any) -> Observability:
    """Hook metrics, ``/metrics``, ``/ready``, traces and access lines into ``app``."""
    obs = Observability(service.settings, service)
    observe.activate(obs)
    add_routes(app, service, obs)
    if obs.active:
        app.add_middleware(ObserveMiddleware, obs=obs)
    if service.holder is not None:
        observe.served(service.index())
    return obs


def shutdown() -> None:
    """The app is stopping: traces exported, this worker's live gauges dropped."""
    obs = observe.activate(None)
    if obs is not None:
        obs.close()


def metrics_refusal(request: Any, service: Any) -> tuple[int, str] | None:
    """Why ``request`` may not read ``/metrics`` (status, one line), or None when it may."""
    from rag_assets.serve.access import credential

    settings = service.settings
    access = service.access()
    if not (access.required() or settings.metrics_token):
        return None  # no token anywhere: open, as every route (loopback by default)
    given = credential(request)
    for secret in (settings.metrics_token, settings.api_token):
        if given and secret and hmac.compare_digest(given.encode(), secret.encode()):
            return None
    if given and access.resolve(given) is not None:
        return 403, "/metrics is for the administrator's token (RAG_API_TOKEN) or RAG_METRICS_TOKEN"
    return 401, (
        "missing or wrong bearer token: /metrics needs Authorization: Bearer <token> "
        "(RAG_API_TOKEN or RAG_METRICS_TOKEN)"
    )


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The service's one error shape (``rag_assets.serve.app.error``)."""
    return JSONResponse({"error": client_text(message)}, status_code=status, headers=headers)


def add_routes(app: FastAPI, service: Any, obs: Observability) -> None:
    """``GET /metrics`` and ``GET /ready`` on ``app``."""
    one_line = {"application/json": {"example": {"error": "<one line>"}}}

    @app.get(
        "/metrics",
        summary="Prometheus metrics of every worker (text format)",
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {}}, "description": "the series"},
            401: {"content": one_line, "description": "no or wrong bearer token"},
            403: {"content": one_line, "description": "a token not the administrator's"},
            404: {"content": one_line, "description": "metrics are off (RAG_METRICS=off)"},
        },
    )
    def metrics_route(request: Request) -> Response:
        refused = metrics_refusal(request, service)
        if refused is not None:
            headers = {"WWW-Authenticate": "Bearer"} if refused[0] == 401 else None
            return error(*refused, headers)
        if obs.metrics is None:
            return error(404, "metrics are off (RAG_METRICS=off): set RAG_METRICS=on")
        obs.metrics.ready.set(1 if obs.readiness.state().ready else 0)
        observe.served(service.index())
        body, kind = obs.metrics.render()
        return Response(body, media_type=kind)

    @app.get(
        "/ready",
        summary="readiness: 200 when the index, its table and the query encoder answer (no auth)",
        responses={503: {"content": one_line, "description": "what is down, in one line"}},
    )
    def ready() -> JSONResponse:
        state = obs.readiness.state()
        if obs.metrics is not None:
            obs.metrics.ready.set(1 if state.ready else 0)
        if state.ready:
            return JSONResponse({"ready": True})
        return JSONResponse({"ready": False, "error": state.down}, status_code=503)
