"""The MCP tools (official ``mcp`` SDK, ``MCPServer``): ``search``, ``ask``, ``get_document_span``,
``feedback`` (issue 33: a verdict on an answer, by its ``query_id``).

The same :class:`~rag_assets.serve.service.Service` operations as the HTTP endpoints, returning
the same JSON (as structured content and as its text). Served over stdio by ``rag-assets mcp``
and over streamable HTTP at ``/mcp`` of ``rag-assets serve``. A bad argument comes back as a
tool error whose text is the one-line reason.

Issue 20: the server answers ``initialize`` at once. Over stdio the service is opened lazily; it
starts loading (index, query encoder) in a background thread when the client's
``notifications/initialized`` arrives, right after the handshake, and a tool call that comes
before it is ready waits for it. The tool schemas carry a description of every argument,
``retriever`` as an enum and ``k`` with its bounds (checked by the service, which refuses with
the same one line as HTTP and the CLI), and the server reports the package version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from rag_assets import __version__
from rag_assets.lib.query.feedback import VERDICTS
from rag_assets.serve.service import (
    MAX_K,
    MAX_QUERY_CHARS,
    RETRIEVER_NAMES,
    BadRequest,
    NotFound,
    Service,
)

T = TypeVar("T")


async def _call(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking service call off the event loop; a bad argument becomes a ToolError
    (the caller sees its one-line reason, not a generic failure)."""
    from rag_assets.lib.query.feedback import FeedbackError, UnknownQuery

    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except (BadRequest, NotFound, FeedbackError, UnknownQuery) as e:
        raise ToolError(str(e)) from e
    except (OSError, RuntimeError, ValueError) as e:  # e.g. nothing published yet (issue 20:
        raise ToolError(" ".join(str(e).split())) from e  # the lazy load fails in a tool call)


INSTRUCTIONS = (
    "Cited retrieval over a published document index. Call `ask` with a question: it returns "
    "numbered sources (document, section or page, cosine distance, verified quote, URL) or "
    "no_answer=true when nothing is close enough; answer only from those quotes and cite [n]. "
    "`search` ranks chunks of one retriever; `get_document_span` returns the exact text of a "
    "document between two character offsets (a citation's from/to). When the user says an answer "
    "was right or wrong, call `feedback` with the answer's query_id."
)


# argument schemas: the bounds are in the schema for clients; the service checks them (so a bad
# value gets the service's one-line reason, not a validation dump)
Query = Annotated[
    str,
    Field(
        description=f"what to look for: a question or keywords (1..{MAX_QUERY_CHARS} characters)"
    ),
]
Question = Annotated[
    str,
    Field(description=f"the question, in plain words (1..{MAX_QUERY_CHARS} characters)"),
]
Retriever = Annotated[
    str,
    Field(
        description="hybrid (dense and BM25 fused, the default), dense (meaning), bm25 "
        "(exact words) or rerank (hybrid reordered by the cross-encoder, when configured)",
        json_schema_extra={"enum": list(RETRIEVER_NAMES)},
    ),
]
K = Annotated[
    int,
    Field(
        description=f"how many hits to return, 1..{MAX_K}",
        json_schema_extra={"minimum": 1, "maximum": MAX_K},
    ),
]
DocumentId = Annotated[
    str, Field(description="a citation's document_id (the document's path in the corpus)")
]
Offset = Annotated[
    int,
    Field(
        description="character offset into the document's canonical text (a citation's from or to)",
        json_schema_extra={"minimum": 0},
    ),
]


QueryId = Annotated[str, Field(description="the query_id of an `ask` answer or a `search` result")]
Verdict = Annotated[
    str,
    Field(
        description="answered, missed, should_refuse, right_refusal or wrong",
        json_schema_extra={"enum": list(VERDICTS)},
    ),
]
Source = Annotated[int | None, Field(description="answered: the citation number [n] that answers")]
FeedbackDocument = Annotated[
    str | None, Field(description="missed: the document_id of the document that answers")
]
Quote = Annotated[
    str | None,
    Field(description="missed: exact text of that document where the answer is (3+ words)"),
]
Note = Annotated[str | None, Field(description="optional remark for the reviewers")]


def _caller(ctx: Any) -> str | None:
    """Who calls (the token name; None: the administrator, or stdio) from the HTTP request
    the tool call came in, through the service's one resolver."""
    from rag_assets.serve.feedback import resolve_caller

    try:
        request = ctx.request_context.request
    except (AttributeError, ValueError):
        request = None
    return resolve_caller(request) if request is not None else None


def _load_after_handshake(mcp: MCPServer, service: Service) -> None:
    """Start loading the service when ``notifications/initialized`` arrives (after the
    ``initialize`` answer went out): the first tool call then finds it loaded or loading."""
    server = getattr(mcp, "_lowlevel_server", None)
    if server is None or service.holder is not None:
        return  # no such hook in this SDK (the first tool call loads) or already loaded
    previous = server.get_notification_handler("notifications/initialized")

    async def initialized(ctx: Any, params: Any) -> None:
        if service.holder is None:
            service.load_in_background()
        if previous is not None:
            await previous.handler(ctx, params)

    server.add_notification_handler(
        "notifications/initialized", types.NotificationParams, initialized
    )


def build_mcp(service: Service, base_url: str | None = None) -> MCPServer:
    """An ``MCPServer`` whose tools answer from ``service``'s current published version.

    ``base_url`` is where citation links point (``RAG_BASE_URL`` still wins); without either
    they are ``file://`` URIs.
    """
    mcp: MCPServer = MCPServer("rag-assets", instructions=INSTRUCTIONS, version=__version__)
    _load_after_handshake(mcp, service)

    @mcp.tool()
    async def search(
        query: Query, ctx: Context, retriever: Retriever = "hybrid", k: K = 10
    ) -> list[dict[str, Any]]:
        """Ranked chunks for a query. retriever: dense, bm25, hybrid (default) or rerank;
        k: 1..100. Each hit is cited as `ask` cites: document_id, section, from/to, fragment,
        locator_label, url, cosine_distance, the quote once, and the span (from, to, text,
        fragment, label) that best answers inside the chunk; plus the stamps of the table
        version that answered, and the search's query_id (for the feedback tool)."""
        caller = _caller(ctx)

        def run() -> list[dict[str, Any]]:
            _, hits, qid = service.logged_search(
                query, retriever, k, base_url=base_url, interface="mcp/search", caller=caller
            )
            return [h | {"query_id": qid} for h in hits]

        return await _call(run)

    @mcp.tool()
    async def ask(question: Question, ctx: Context) -> dict[str, Any]:
        """Cited sources for a question, or no_answer=true (with the distance threshold that
        refused it). Same JSON as `rag-assets ask --json`, with its query_id (for the
        feedback tool)."""
        caller = _caller(ctx)

        def run() -> dict[str, Any]:
            return service.ask(question, base_url=base_url, interface="mcp/ask", caller=caller)[1]

        return await _call(run)

    @mcp.tool()
    async def feedback(
        query_id: QueryId,
        verdict: Verdict,
        ctx: Context,
        source: Source = None,
        document: FeedbackDocument = None,
        quote: Quote = None,
        note: Note = None,
    ) -> dict[str, Any]:
        """Say whether an answer was right, so that the index learns from it: answered (with
        source: the citation number that answers), missed (with document and quote: the exact
        text where the answer is; find it with `search`), should_refuse (it answered but the
        documents cannot), right_refusal (NO ANSWER was right) or wrong (none of the sources
        answers, place unknown). A second verdict on the same query replaces the first."""
        if service.log is None:
            raise ToolError("the query log is off (RAG_QUERY_LOG=off): no feedback is kept")
        caller = _caller(ctx)
        body = {
            k: v
            for k, v in {
                "query_id": query_id,
                "verdict": verdict,
                "source": source,
                "document": document,
                "quote": quote,
                "note": note,
            }.items()
            if v is not None
        }

        def run() -> dict[str, Any]:
            return service.log.feedback(  # type: ignore[no-any-return]
                body, service.index().documents, caller=caller, interface="mcp"
            )

        return await _call(run)

    @mcp.tool()
    async def get_document_span(
        document_id: DocumentId, start: Offset, end: Offset
    ) -> dict[str, Any]:
        """The exact text of a published document from character offset `start` to `end`
        (a citation's `from` and `to`)."""
        return await _call(service.span, document_id, start, end)

    return mcp


def run_stdio(service: Service) -> None:
    """Serve the tools over stdio until the client closes the pipe."""
    build_mcp(service).run("stdio")
