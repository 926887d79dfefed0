"""The MCP tools (official ``mcp`` SDK, ``MCPServer``): ``search``, ``ask``, ``get_document_span``.

The same :class:`~rag_assets.serve.service.Service` operations as the HTTP endpoints, returning
the same JSON (as structured content and as its text). Served over stdio by ``rag-assets mcp``
and over streamable HTTP at ``/mcp`` of ``rag-assets serve``. A bad argument comes back as a
tool error whose text is the one-line reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from rag_assets.serve.service import BadRequest, NotFound, Service

T = TypeVar("T")


async def _call(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking service call off the event loop; a bad argument becomes a ToolError
    (the caller sees its one-line reason, not a generic failure)."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except (BadRequest, NotFound) as e:
        raise ToolError(str(e)) from e


INSTRUCTIONS = (
    "Cited retrieval over a published document index. Call `ask` with a question: it returns "
    "numbered sources (document, section or page, cosine distance, verified quote, URL) or "
    "no_answer=true when nothing is close enough; answer only from those quotes and cite [n]. "
    "`search` ranks chunks of one retriever; `get_document_span` returns the exact text of a "
    "document between two character offsets (a citation's from/to)."
)


def build_mcp(service: Service, base_url: str | None = None) -> MCPServer:
    """An ``MCPServer`` whose tools answer from ``service``'s current published version.

    ``base_url`` is where citation links point (``RAG_BASE_URL`` still wins); without either
    they are ``file://`` URIs.
    """
    mcp: MCPServer = MCPServer("rag-assets", instructions=INSTRUCTIONS)

    @mcp.tool()
    async def search(query: str, retriever: str = "hybrid", k: int = 10) -> list[dict[str, Any]]:
        """Ranked chunks for a query. retriever: dense, bm25, hybrid (default) or rerank;
        k: 1..100. Each hit is cited as `ask` cites: document_id, section, from/to, fragment,
        locator_label, url, cosine_distance, the quote once, and the span (from, to, text,
        fragment, label) that best answers inside the chunk; plus the stamps of the table
        version that answered."""

        def run() -> list[dict[str, Any]]:
            return service.search(query, retriever, k, base_url=base_url)[1]

        return await _call(run)

    @mcp.tool()
    async def ask(question: str) -> dict[str, Any]:
        """Cited sources for a question, or no_answer=true (with the distance threshold that
        refused it). Same JSON as `rag-assets ask --json`."""

        def run() -> dict[str, Any]:
            return service.ask(question, base_url=base_url)[1]

        return await _call(run)

    @mcp.tool()
    async def get_document_span(document_id: str, start: int, end: int) -> dict[str, Any]:
        """The exact text of a published document from character offset `start` to `end`
        (a citation's `from` and `to`)."""
        return await _call(service.span, document_id, start, end)

    return mcp


def run_stdio(service: Service) -> None:
    """Serve the tools over stdio until the client closes the pipe."""
    build_mcp(service).run("stdio")
