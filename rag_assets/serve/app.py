"""``rag-assets serve``: the published index over HTTP (FastAPI on uvicorn).

Endpoints (``/openapi.json`` documents them): ``GET /search``, ``POST /ask``, ``POST /verify``
(issue 50), ``GET /status``,
``GET /healthz``, ``GET /documents/{document_id}`` (the source with the cited span highlighted),
``POST /feedback`` and ``GET /log`` (issue 33, :mod:`rag_assets.serve.feedback`), ``GET /ready``
and ``GET /metrics`` (issue 52, :mod:`rag_assets.serve.operate`),
``/`` (a small search page, static files, no CDN), and ``/mcp`` (the MCP tools over streamable
HTTP). ``/search`` and ``/ask`` return exactly what ``search --json`` / ``ask --json`` print;
every answer names the table version that produced it (JSON and ``X-RAG-Table`` /
``X-RAG-Version`` headers). Errors are 4xx with ``{"error": "<one line>"}``. With an API token
configured every endpoint but ``/healthz`` and ``/ready`` needs ``Authorization: Bearer <token>``
(or the signed session cookie that ``POST /login`` sets for the search page, issue 30);
``/metrics`` checks its own (the administrator's token or ``RAG_METRICS_TOKEN``).

Limits (issue 25): every request body is counted as it streams (chunked ones included) and cut
at :data:`MAX_BODY_BYTES` with 413; questions with lone surrogates or control characters are a
400; only the hosts in :func:`allowed_hosts` are answered (421 otherwise), so a DNS-rebinding
page cannot read a local index and citation URLs never take an unknown ``Host``. ``/docs`` is
left out: Swagger UI loads from a CDN, which an offline service cannot reach; ``/openapi.json``
describes every route with the errors it really returns.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag_assets.lib.query.retrieve import Index
from rag_assets.serve import access as access_rules
from rag_assets.serve.bounds import MAX_K
from rag_assets.serve.documents import original_pdf, parse_char_span, render_view
from rag_assets.serve.limits import RequestLimits, client_text, shorten
from rag_assets.serve.service import (
    MAX_QUERY_CHARS,
    BadRequest,
    NotFound,
    Service,
    parse_filter,
)
from rag_assets.serve.session import COOKIE as SESSION_COOKIE

STATIC = Path(__file__).parent / "static"
MAX_BODY_BYTES = 1_000_000
"""Largest request body accepted (bytes), counted as it streams (a chunked body included); a
longer question is refused by length first."""

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Host names answered by default; ``RAG_ALLOWED_HOSTS`` adds more (and the bind address)."""

OPEN_PATHS = ("/healthz", "/login", "/ready", "/metrics")
"""Paths the token middleware lets through: liveness, the page's login form, readiness (a
probe sends no token) and ``/metrics``, which checks its own tokens (issue 52:
:func:`rag_assets.serve.operate.metrics_refusal`)."""

TOKEN_COOKIE = access_rules.TOKEN_COOKIE
"""The cookie that held the raw token before issue 30: no longer accepted; ``/login`` clears it
(the page's login is now a signed session, :mod:`rag_assets.serve.session`)."""


class ErrorBody(BaseModel):
    """Every error: one line naming the cause and what to change."""

    error: str


class Health(BaseModel):
    """``GET /healthz``: the version being served."""

    model_config = ConfigDict(extra="allow")
    ok: bool


class Answer(BaseModel):
    """``POST /ask``: the same JSON as ``rag-assets ask --json`` (fields beyond these vary)."""

    model_config = ConfigDict(extra="allow")


class Hit(BaseModel):
    """One ``GET /search`` hit: the same JSON as ``rag-assets search --json``."""

    model_config = ConfigDict(extra="allow")


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "bad input (one line naming it)",
        401: "missing or wrong bearer token",
        403: "not for this token (the query log is the administrator's)",
        404: "no such document in the published version (or query id in the log)",
        408: "request body not received within RAG_BODY_TIMEOUT_S",
        413: "request body over MAX_BODY_BYTES",
        421: "Host not served here (RAG_ALLOWED_HOSTS)",
        503: "the model server (RAG_EMBED_URL) is down or serves another model than the table's",
    }
    return {c: {"model": ErrorBody, "description": what[c]} for c in codes}


class _AnyPath(Convertor):  # type: ignore[type-arg]
    """A document id: any characters, newlines included (``%0A`` in a file name)."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return str(value)


register_url_convertor("docpath", _AnyPath())


def allowed_hosts(extra: list[str], bind: str) -> set[str]:
    """Loopback names, ``RAG_ALLOWED_HOSTS`` and the bind address (unless a wildcard)."""
    out = set(LOOPBACK_HOSTS) | {h.lower() for h in extra}
    if bind not in ("0.0.0.0", "::", ""):
        out.add(bind.lower().strip("[]"))
    return out


def host_name(header: str) -> str:
    """The name of a ``Host`` header without its port (``[::1]:8000`` -> ``::1``)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class AskBody(BaseModel):
    question: str = Field(description=f"the question (1..{MAX_QUERY_CHARS} characters)")
    rerank: bool = Field(True, description="use the cross-encoder when one is configured")
    show_nearest: bool = Field(
        False,
        description="also list the closest sources below the bar under `nearest` (never an "
        "answer, never sent to the model)",
    )
    filter: dict[str, Any] | None = Field(
        None,
        description='document metadata to search within (issue 34): {"key": "value" or '
        '["v1", "v2"]} (several values of a key: any of them; several keys: all), e.g. '
        '{"folder": "hr", "tags": ["policy", "howto"]}; size and modified also as '
        '{"modified>=": "2025-01-01"}',
    )


class VerifyBody(BaseModel):
    """``POST /verify`` (issue 50): an answer to check against the question's sources."""

    question: str = Field(description=f"the question (1..{MAX_QUERY_CHARS} characters)")
    answer: str = Field(
        description="the answer, each sentence ending with [n], n a source number of `ask` for "
        "this question (at most 10,000 characters)"
    )
    rerank: bool = Field(True, description="use the cross-encoder when one is configured")
    filter: dict[str, Any] | None = Field(
        None, description="document metadata to search within, as for /ask"
    )


def caller(request: Request) -> Any:
    """The caller the middleware resolved for this request (issue 34; None: not resolved)."""
    return getattr(request.state, "caller", None)


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape: ``{"error": "<one line>"}`` (issue 30: no file system paths, at
    most :data:`~rag_assets.serve.limits.MAX_ERROR_CHARS` characters)."""
    return JSONResponse({"error": client_text(message)}, status_code=status, headers=headers)


def _version_headers(index: Index) -> dict[str, str]:
    return {"X-RAG-Table": index.published.table, "X-RAG-Version": str(index.published.version)}


def create_app(
    service: Service, *, host: str = "127.0.0.1", public_url: str | None = None
) -> FastAPI:
    """The ASGI app over one warm :class:`Service` (models loaded, version held).

    ``public_url`` (e.g. ``http://127.0.0.1:8000``) is where MCP tool citations link; HTTP
    answers link to the URL the request came in on. ``RAG_BASE_URL`` overrides both.
    """
    from rag_assets.serve import operate
    from rag_assets.serve.feedback import add_routes, log_name, scoped_status
    from rag_assets.serve.tools import build_mcp

    mcp = build_mcp(service, f"{public_url.rstrip('/')}/documents" if public_url else None)
    mcp_app = mcp.streamable_http_app(streamable_http_path="/mcp", host=host)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with mcp.session_manager.run():
            yield
        if service.log is not None:  # issue 33: the query log's queued entries are written
            service.log.close()
        operate.shutdown()  # issue 52: traces exported, this worker's gauges dropped

    app = FastAPI(
        title="rag_assets",
        description="Cited retrieval over the published LanceDB index.",
        version="1",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI loads from a CDN: not offline (see the module docstring)
        redoc_url=None,
    )
    hosts = allowed_hosts(service.settings.allowed_host_list, host)
    # issue 30: every body capped and timed as it streams (chunked too), before any route
    app.add_middleware(
        RequestLimits,
        max_body_bytes=MAX_BODY_BYTES,
        body_timeout_s=service.settings.body_timeout_s,
    )
    sessions = service.sessions()  # the page's signed logins (issue 30)

    def authorised(request: Request) -> bool:
        """Issue 34: RAG_API_TOKEN (the administrator), a token kept with the index, or the
        page's signed session of one (issue 30), checked on every request (a revoked token, and
        its sessions, are refused at once); the caller it stands for is what every route then
        applies (rag_assets/serve/access.py)."""
        who = service.caller_of(request)
        request.state.caller = who
        return who is not None

    @app.middleware("http")
    async def auth_and_limits(request: Request, call_next: Any) -> Response:
        name = host_name(request.headers.get("host", ""))
        if name not in hosts:
            return error(
                421,
                f"Host {shorten(name)} is not served here: add it to RAG_ALLOWED_HOSTS "
                "(comma-separated) to allow it",
            )
        path = request.url.path
        # the token events are read per request: off the event loop (a bucket is a round trip);
        # issue 52: /ready is a probe's (no token), /metrics checks its own tokens
        if path not in OPEN_PATHS and not await run_in_threadpool(authorised, request):
            if path == "/":  # the page asks for the token (POST /login sets the cookie)
                return HTMLResponse(
                    LOGIN_PAGE, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
            return error(
                401,
                "missing or wrong bearer token: send Authorization: Bearer <token> "
                "(RAG_API_TOKEN or a token from `rag-assets token add`)",
                {"WWW-Authenticate": "Bearer"},
            )
        response: Response = await call_next(request)
        return response

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        """The page's token form: sets the signed session cookie when the token is right."""
        from urllib.parse import parse_qs

        given = parse_qs((await request.body()).decode("utf-8", "replace")).get("token", [""])[0]
        access = service.access()  # issue 34: RAG_API_TOKEN or a token of the index
        login = access.session_of(given) if access.required() else None
        if login is None:
            return HTMLResponse(LOGIN_PAGE.replace("<!--error-->", "wrong token"), 401)
        out = RedirectResponse("/", status_code=303)
        out.set_cookie(
            SESSION_COOKIE,
            sessions.issue(*login),
            max_age=int(sessions.ttl_s),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        out.delete_cookie(TOKEN_COOKIE, path="/")  # the raw token of older versions
        return out

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request, all: bool = Query(False)) -> Response:  # noqa: A002
        """End the page's session (``?all=1``: every session, by a new secret: the
        administrator's only, issue 43); the token stays valid. Needs the token or a session,
        as every route."""
        if all and not getattr(caller(request), "admin", False):
            return error(
                403,
                "logout?all=1 ends every user's session: only the administrator's token "
                "(RAG_API_TOKEN) may; POST /logout ends your own session",
            )
        cookie = request.cookies.get(SESSION_COOKIE, "")
        session = sessions.check(cookie, service.access().session_hash) if cookie else None
        if all:
            sessions.revoke_all()
        elif session is not None:
            sessions.revoke(session)
        out = JSONResponse({"ok": True, "ended": "every session" if all else "this session"})
        out.delete_cookie(SESSION_COOKIE, path="/")
        return out

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return error(400, 'request body is not valid JSON: send {"question": "..."}')
        loc = [str(x) for x in first.get("loc", ()) if x not in ("query", "body", "path")]
        where = ".".join(loc) or "request"
        return error(400, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (408, 413):  # RequestLimits: the body is left unread, so close
            return error(exc.status_code, str(exc.detail), {"Connection": "close"})
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest) -> JSONResponse:
        return error(400, str(exc))

    @app.exception_handler(NotFound)
    async def _missing(_: Request, exc: NotFound) -> JSONResponse:
        return error(404, str(exc))

    from rag_assets.lib.index.endpoint import EndpointChanged, EndpointError

    @app.exception_handler(EndpointError)
    @app.exception_handler(EndpointChanged)
    async def _endpoint(_: Request, exc: Exception) -> JSONResponse:  # issue 35
        return error(503, str(exc))  # the model server is down, or serves another model

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:  # never a traceback
        # issue 30: the full text (a LanceDB error names its Rust source files and the index's
        # paths) goes to the server log under a reference; the client gets it without paths
        import logging
        import secrets

        ref = secrets.token_hex(4)
        logging.getLogger("uvicorn.error").error(
            "ref %s: %s %s failed", ref, request.method, request.url.path, exc_info=exc
        )
        shown = client_text(str(exc), 160, relative=True)  # issue 43: relative paths too
        return error(500, f"{type(exc).__name__}: {shown} (ref {ref})")

    @app.get(
        "/healthz",
        summary="liveness and the version being served (no auth)",
        response_model=Health,
        responses=_errors(421),
    )
    def healthz() -> dict[str, Any]:
        return service.health()

    @app.get(
        "/status",
        summary="same JSON as `rag-assets status --json`",
        responses=_errors(401, 421),
    )
    def status(request: Request) -> dict[str, Any]:
        # a token: its documents only (issue 34); the query log's counts for the
        # administrator only (issue 33)
        c = caller(request)
        return scoped_status(service.status(c), service.settings, log_name(c))

    @app.get(
        "/filters",
        summary="the folders and metadata keys (with values) of the documents the caller sees",
        responses=_errors(401, 421),
    )
    def filters(request: Request) -> dict[str, Any]:
        return service.facets(caller(request))

    @app.get(
        "/search",
        summary="ranked hits of one retriever (same JSON as `search --json`)",
        responses={200: {"model": list[Hit]}, **_errors(400, 401, 421, 503)},
    )
    def search(
        request: Request,
        q: str = Query(description="the query"),
        retriever: str = Query("hybrid", description="dense, bm25, hybrid or rerank"),
        k: int = Query(20, description=f"how many hits, 1..{MAX_K}"),
        filter: list[str] | None = Query(  # noqa: B008 - FastAPI's declaration style
            None,
            description="key=value over document metadata, repeatable (several values of a key: "
            "any; several keys: all); size and modified also take >=, <=, >, <",
        ),
        document: str | None = Query(None, description="one document id"),
        folder: str | None = Query(None, description="a folder and everything below it"),
        log: bool = Query(
            True,
            description="false: not recorded in the query log (the page's own search for the "
            "passage a verdict names is not a question)",
        ),
    ) -> JSONResponse:
        flt = parse_filter(filter, document=document, folder=folder)
        base = str(request.base_url) + "documents"
        if log:
            index, hits, qid = service.logged_search(
                q,
                retriever,
                k,
                base_url=base,
                interface="http/search",
                caller=caller(request),
                filter=flt,
            )
        else:  # issue 43: no entry, no query id, nothing in the review queue or the drift
            index, hits = service.search(
                q, retriever, k, base_url=base, caller=caller(request), filter=flt
            )
            qid = None
        from rag_assets.lib.query.rerank_http import take_note

        headers = _version_headers(index) | ({"X-RAG-Query-Id": qid} if qid else {})
        note = take_note(index.reranker)  # issue 35: a /rerank server failed: hybrid order
        if note:
            headers["X-RAG-Note"] = note.encode("ascii", "replace").decode("ascii")
        return JSONResponse(hits, headers=headers)

    @app.post(
        "/ask",
        summary="cited sources or NO ANSWER (same JSON as `ask --json`)",
        responses={200: {"model": Answer}, **_errors(400, 401, 413, 421, 503)},
    )
    def ask(body: AskBody, request: Request) -> JSONResponse:
        index, out = service.ask(
            body.question,
            rerank=body.rerank,
            base_url=str(request.base_url) + "documents",
            show_nearest=body.show_nearest,  # issue 31
            interface="http/ask",
            caller=caller(request),
            filter=parse_filter(mapping=body.filter) if body.filter is not None else None,
        )
        return JSONResponse(out, headers=_version_headers(index))

    @app.post(
        "/verify",
        summary="every sentence of an answer checked against the sources `ask` cites for the "
        "question (same JSON as `rag-assets verify --json`)",
        responses={200: {"model": Answer}, **_errors(400, 401, 413, 421, 503)},
    )
    def verify(body: VerifyBody, request: Request) -> JSONResponse:  # issue 50
        index, out = service.verify(
            body.question,
            body.answer,
            rerank=body.rerank,
            base_url=str(request.base_url) + "documents",
            caller=caller(request),
            filter=parse_filter(mapping=body.filter) if body.filter is not None else None,
        )
        return JSONResponse(out, headers=_version_headers(index))

    @app.get(
        "/documents/{document_id:docpath}",
        summary="a published document as HTML with ?char=a,b highlighted (a sheet's rows, a "
        "transcript's cues, a PDF's page and span); a PDF without ?char= as the file",
        response_class=HTMLResponse,
        responses=_errors(400, 401, 404, 421),
    )
    def document(
        document_id: str,
        request: Request,
        char: str | None = Query(None, description="span to highlight: from,to"),
    ) -> Response:
        try:
            index, doc = service.document(document_id, caller(request))
        except NotFound:  # a transcript's media file, which its citations link to (issue 21)
            media = service.media_file(document_id, caller(request))
            if media is None:
                raise
            return FileResponse(media, headers=_version_headers(service.index()))
        headers = _version_headers(index)
        if doc["kind"] == "pdf" and not char:  # with ?char=: the page and the span's text
            found = original_pdf(document_id, doc, service.settings.work_dir)  # issue 49
            if found is None:
                raise NotFound(f"the PDF of {document_id!r} cannot be read here ({doc['path']})")
            if isinstance(found, bytes):  # a Git file at its commit, an object: read again
                return Response(found, media_type="application/pdf", headers=headers)
            if isinstance(found, str):  # a website's PDF, a `link`: its web address
                return RedirectResponse(found, status_code=307, headers=headers)
            return FileResponse(found, media_type="application/pdf", headers=headers)
        try:
            span = parse_char_span(char, len(doc["text"]))
        except ValueError as e:
            raise BadRequest(str(e)) from e
        root = request.scope.get("root_path", "") + "/"
        page = render_view(doc, document_id, span, root)  # one view per locator kind
        return HTMLResponse(page, headers=headers)

    @app.get("/", include_in_schema=False)
    def home() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    # issue 33: POST /feedback, GET /log (the administrator: RAG_API_TOKEN)
    add_routes(app, service, service.settings.api_token)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.router.routes.extend(mcp_app.routes)  # /mcp (its session manager runs in lifespan)
    operate.install(app, service)  # issue 52: /metrics, /ready, traces, JSON access lines
    _openapi_without_422(app)
    return app


def _openapi_without_422(app: FastAPI) -> None:
    """Validation errors are answered 400 ``{"error": ...}`` (see ``_invalid``): the schema
    says so instead of FastAPI's default 422 ``HTTPValidationError``."""
    from fastapi.openapi.utils import get_openapi

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            for ops in spec.get("paths", {}).values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                spec.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]


LOGIN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>rag_assets: token</title></head><body>
<h1>rag_assets</h1><p>This service needs its API token (RAG_API_TOKEN).</p>
<form method="post" action="/login"><label>Token <input type="password" name="token"
autocomplete="current-password" autofocus></label> <button>Open</button></form>
<p role="alert"><!--error--></p></body></html>"""
"""What ``/`` shows without a token: one form; the cookie it sets lets the page's requests
through (same origin, SameSite=Strict, HttpOnly: scripts never see the token)."""


PARSE_ERROR = (
    "the HTTP request line or headers could not be parsed (for example a URL of 64 KiB or "
    "more): send long questions with POST /ask"
)
"""The error of a request uvicorn's parser rejects before the app sees it: httptools accepts a
URL (path + query) of at most 65,535 bytes (measured); httpx will not even send a longer one."""

BODY_PARSE_ERROR = (
    "the request body could not be parsed: its chunked encoding is broken (a chunk cut short, "
    "or a chunk size that does not match the data sent): send the whole body again"
)
"""Issue 30: the same parser error met after the headers were read is about the body (a large
chunked body cut mid-stream and followed by other bytes), not the request line."""


class _Json400:
    """Mixin over uvicorn's HTTP protocol: its parser-level 400 becomes the app's one-line JSON
    error instead of ``text/plain`` "Invalid HTTP request received." (the connection closes, as
    uvicorn's own does)."""

    transport: Any
    server_state: Any

    def send_400_response(self, msg: str) -> None:
        cycle = getattr(self, "cycle", None)
        in_body = cycle is not None and cycle.more_body and not cycle.response_complete
        if cycle is not None and cycle.response_complete and cycle.more_body:
            self.transport.close()  # already answered (413, 408): the rest of its body is junk
            return
        body = json.dumps({"error": BODY_PARSE_ERROR if in_body else PARSE_ERROR}).encode()
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:  # date, server
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def http_protocol() -> type:
    """uvicorn's own HTTP protocol class (httptools when installed, else h11) with JSON 400s."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return type("Json400HTTPProtocol", (_Json400, AutoHTTPProtocol), {})


def serve(service: Service, host: str, port: int) -> None:
    """Run the app under uvicorn until interrupted."""
    import sys

    import uvicorn

    open_to_all = not service.access().required()  # issue 34: group tokens switch auth on
    if host_name(host) not in LOOPBACK_HOSTS and open_to_all:
        print(
            f"rag-assets: warning: serving on {host}:{port} without a token: anyone who can "
            "reach it can read the index (set RAG_API_TOKEN)",
            file=sys.stderr,
        )
    restricted = access_rules.restricted_documents(service.index()) if open_to_all else 0
    if restricted:
        print(
            f"rag-assets: warning: {restricted} document(s) have an `access` key but the service "
            "has no token, so every request sees them (set RAG_API_TOKEN, add tokens with "
            "`rag-assets token add NAME --groups ...`)",
            file=sys.stderr,
        )
    from rag_assets.serve.logs import uvicorn_options
    from rag_assets.serve.metrics import prepare_workers

    prepare_workers(os.environ, make=False)  # issue 52: an operator's folder, emptied first
    app = create_app(service, host=host, public_url=f"http://{host}:{port}")

    uvicorn.run(
        app, host=host, port=port, http=http_protocol(), **uvicorn_options(service.settings)
    )
