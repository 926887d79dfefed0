"""The MCP tools (official ``mcp`` SDK, ``MCPServer``): ``search``, ``ask``, ``get_document_span``,
``feedback`` (issue 33: a verdict on an answer, by its ``query_id``), ``verify_answer`` (issue 50:
an assistant's answer checked against the sources before it replies).

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
from pydantic import Field, ValidationError

from rag_assets import __version__
from rag_assets.lib.query.feedback import VERDICTS
from rag_assets.serve.bounds import MAX_K
from rag_assets.serve.service import (
    MAX_QUERY_CHARS,
    RETRIEVER_NAMES,
    BadRequest,
    NotFound,
    Service,
    parse_filter,
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
        from rag_assets.serve.limits import client_text  # the lazy load fails in a tool call;

        raise ToolError(client_text(str(e))) from e  # issue 30: no paths, one short line


INSTRUCTIONS = (
    "Cited retrieval over a published document index. Call `ask` with a question: it returns "
    "numbered sources (document, section or page, cosine distance, verified quote, URL) or "
    "no_answer=true when nothing is close enough (with the cut and the nearest distance); answer "
    "only from those quotes and cite [n]. With show_nearest, `nearest` lists sources below the "
    "bar for the user to judge: never answer from them or cite them. "
    "Before replying, call `verify_answer` with the question and your answer: it says which "
    "sentences the cited sources do not support, and why. "
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
ShowNearest = Annotated[
    bool,
    Field(
        description="also list the closest sources below the bar under `nearest` (issue 31): "
        "for the user to judge, never to answer from, never cited"
    ),
]
DocumentId = Annotated[
    str, Field(description="a citation's document_id (the document's path in the corpus)")
]
MetadataFilter = Annotated[
    dict[str, str | list[str]] | None,
    Field(
        description="search only documents whose metadata match (issue 34): {key: value or "
        "[values]}; several values of a key mean any of them, several keys all of them. Keys: "
        "folder (that folder and below), document (one document id), format (markdown, pdf, "
        "...), title, tags, and any key the documents' front matter or .ragmeta files set; "
        'size and modified also as ranges: {"modified>=": "2025-01-01"}. An unknown key is '
        "an error naming the keys there are.",
        json_schema_extra={
            "examples": [{"folder": "hr"}, {"tags": ["policy", "howto"], "format": "markdown"}]
        },
    ),
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
AnswerText = Annotated[
    str,
    Field(
        description="your answer, each sentence ending with [n]: the number of the `ask` source "
        "it comes from (at most 10,000 characters)"
    ),
]


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


class _OneLineErrors(MCPServer):
    """Every tool error in one line (issue 30): an argument the schema refuses is named with
    pydantic's reason, without its multi-line dump and documentation URL."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                raise ToolError(f"Error executing tool {name}: {argument_errors(cause)}") from cause
            if "\n" in str(exc):
                raise type(exc)(" ".join(str(exc).split())) from cause
            raise


def argument_errors(exc: ValidationError) -> str:
    """A tool's argument validation error as one line: each bad argument named with why (the
    value it got, cut short), no URL."""
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        if err.get("type") == "missing":
            parts.append(f"argument {where} is required")
            continue
        got = repr(err.get("input"))
        got = got if len(got) <= 40 else got[:39] + "…"
        parts.append(f"argument {where}: {err.get('msg', 'invalid')} (got {got})")
    return " ".join("; ".join(parts).split())


def build_mcp(service: Service, base_url: str | None = None) -> MCPServer:
    """An ``MCPServer`` whose tools answer from ``service``'s current published version.

    ``base_url`` is where citation links point (``RAG_BASE_URL`` still wins); without either
    they are ``file://`` URIs.
    """
    mcp: MCPServer = _OneLineErrors("rag-assets", instructions=INSTRUCTIONS, version=__version__)
    _load_after_handshake(mcp, service)

    def who(ctx: Context | None) -> Any:
        """The caller of a tool call (issue 34): the bearer token of the HTTP request, or over
        stdio the local operator (or the token ``rag-assets mcp`` was given)."""
        request = None
        if ctx is not None:
            try:
                request = ctx.request_context.request
            except ValueError:  # no request context (a direct call)
                request = None
        found = service.caller_of(request)
        if found is None:
            raise BadRequest("missing or wrong bearer token")
        return found

    @mcp.tool()
    async def search(
        query: Query,
        retriever: Retriever = "hybrid",
        k: K = 10,
        filter: MetadataFilter = None,
        ctx: Context | None = None,
    ) -> list[dict[str, Any]]:
        """Ranked chunks for a query. retriever: dense, bm25, hybrid (default) or rerank;
        k: 1..100. Each hit is cited as `ask` cites: document_id, section, from/to, fragment,
        locator_label, url, cosine_distance, the quote once, and the span (from, to, text,
        fragment, label) that best answers inside the chunk; plus the stamps of the table
        version that answered, and the search's query_id (for the feedback tool)."""

        def run() -> list[dict[str, Any]]:
            flt = parse_filter(mapping=filter)
            _, hits, qid = service.logged_search(
                query,
                retriever,
                k,
                base_url=base_url,
                interface="mcp/search",
                caller=who(ctx),
                filter=flt,
            )
            return [h | {"query_id": qid} for h in hits]

        return await _call(run)

    @mcp.tool()
    async def ask(
        question: Question,
        show_nearest: ShowNearest = False,
        filter: MetadataFilter = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Cited sources for a question, or no_answer=true with the cut (`threshold`; null for
        a group token), the nearest source's distance (`nearest_distance`) and whether it was a
        near miss. Same JSON as `rag-assets ask --json`, with its query_id (for the feedback
        tool). Answer only from `citations`; `nearest` (show_nearest) is below the bar and is
        never an answer. A non-empty `cut_note` says the index's refusal cut is not yet checked
        against questions close to its documents: pass it on with the answer."""

        def run() -> dict[str, Any]:
            flt = parse_filter(mapping=filter)
            return service.ask(
                question,
                base_url=base_url,
                show_nearest=show_nearest,
                interface="mcp/ask",
                caller=who(ctx),
                filter=flt,
            )[1]

        return await _call(run)

    @mcp.tool()
    async def verify_answer(
        question: Question,
        answer: AnswerText,
        filter: MetadataFilter = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Check an answer before you reply: the question's sources are retrieved as `ask`
        retrieves them (the same numbering), and every sentence of `answer` gets a verdict:
        supported (with the evidence: the source's words that state it), unsupported (the
        cited source does not state it: a changed number, a negation, a swapped name or term,
        a statement from elsewhere; `reason` says which) or uncited (no [n]). Rewrite or drop
        the unsupported sentences. Same JSON as `rag-assets verify --json`."""

        def run() -> dict[str, Any]:
            flt = parse_filter(mapping=filter)
            return service.verify(question, answer, base_url=base_url, caller=who(ctx), filter=flt)[
                1
            ]

        return await _call(run)

    @mcp.tool()
    async def feedback(
        query_id: QueryId,
        verdict: Verdict,
        source: Source = None,
        document: FeedbackDocument = None,
        quote: Quote = None,
        note: Note = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Say whether an answer was right, so that the index learns from it: answered (with
        source: the citation number that answers), missed (with document and quote: the exact
        text where the answer is; find it with `search`), should_refuse (it answered but the
        documents cannot), right_refusal (NO ANSWER was right) or wrong (none of the sources
        answers, place unknown). A second verdict on the same query replaces the first."""
        if service.log is None:
            raise ToolError("the query log is off (RAG_QUERY_LOG=off): no feedback is kept")
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
            return service.feedback(body, who(ctx), interface="mcp")

        return await _call(run)

    @mcp.tool()
    async def get_document_span(
        document_id: DocumentId, start: Offset, end: Offset, ctx: Context | None = None
    ) -> dict[str, Any]:
        """The exact text of a published document from character offset `start` to `end`
        (a citation's `from` and `to`)."""

        def run() -> dict[str, Any]:
            return service.span(document_id, start, end, who(ctx))

        return await _call(run)

    return mcp


def run_stdio(service: Service) -> None:
    """Serve the tools over stdio until the client closes the pipe (every line answered:
    :mod:`rag_assets.serve.stdio`)."""
    from rag_assets.serve import stdio

    stdio.run_stdio(build_mcp(service))
