"""The MCP tools through the SDK's own client: over stdio (`rag-assets mcp`) and over
streamable HTTP (``/mcp`` of the running service)."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import pytest

pytestmark = pytest.mark.slow

QUESTION = "How do I roll back to the previous embedding model?"
TOOLS = {"search", "ask", "get_document_span", "feedback"}


async def _exercise(client: Any) -> dict[str, Any]:
    """List the tools and call each one; return what came back."""
    tools = await client.list_tools()
    names = {t.name for t in tools.tools}
    hits = await client.call_tool("search", {"query": "stale assets", "k": 3})
    asked = await client.call_tool("ask", {"question": QUESTION})
    cit = asked.structured_content["citations"][0]
    span = await client.call_tool(
        "get_document_span",
        {"document_id": cit["document_id"], "start": cit["from"], "end": cit["to"]},
    )
    refused = await client.call_tool("ask", {"question": "What is the boiling point of tungsten?"})
    bad = await client.call_tool("search", {"query": "  ", "k": 3})
    outside = await client.call_tool(
        "get_document_span", {"document_id": "../../etc/passwd", "start": 0, "end": 10}
    )
    qid = asked.structured_content["query_id"]  # issue 33: a verdict through the tool
    judged = await client.call_tool(
        "feedback", {"query_id": qid, "verdict": "answered", "source": cit["index"]}
    )
    misjudged = await client.call_tool("feedback", {"query_id": qid, "verdict": "right_refusal"})
    unknown = await client.call_tool("feedback", {"query_id": "x" * 22, "verdict": "wrong"})
    return {
        "judged": judged,
        "misjudged": misjudged,
        "unknown": unknown,
        "names": names,
        "hits": hits,
        "asked": asked,
        "cit": cit,
        "span": span,
        "refused": refused,
        "bad": bad,
        "outside": outside,
    }


def _check(r: dict[str, Any]) -> None:
    assert r["names"] >= TOOLS
    sc = r["hits"].structured_content
    hits = sc["result"] if isinstance(sc, dict) else sc  # a list is wrapped on older protocols
    assert len(hits) == 3 and hits[0]["rank"] == 1 and "version" in hits[0]["stamps"]
    asked = r["asked"]
    assert not asked.is_error and asked.structured_content["no_answer"] is False
    assert json.loads(asked.content[0].text) == asked.structured_content  # same JSON as text
    span = r["span"].structured_content
    assert span["text"] == r["cit"]["quote"]  # the exact cited words
    assert span["published"]["version"] == asked.structured_content["published"]["version"]
    assert r["refused"].structured_content["no_answer"] is True
    assert r["bad"].is_error and "query is empty" in r["bad"].content[0].text
    assert r["outside"].is_error and "no document" in r["outside"].content[0].text
    qid = asked.structured_content["query_id"]
    assert len(qid) == 22 and {h["query_id"] for h in hits} != {None}  # search carries one
    assert r["judged"].structured_content["verdict"] == "answered"
    assert r["judged"].structured_content["query_id"] == qid
    assert r["misjudged"].is_error and "was answered, not refused" in r["misjudged"].content[0].text
    assert r["unknown"].is_error and "no query" in r["unknown"].content[0].text


def test_mcp_over_stdio(served):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "rag_assets.cli", "mcp", "--index", str(served.index)],
        env=served.env(),
    )

    async def main() -> dict[str, Any]:
        async with Client(params, read_timeout_seconds=120) as client:
            return await _exercise(client)

    result = anyio.run(main)
    _check(result)
    assert result["cit"]["url"].startswith("file://")  # no service to link to over stdio
    # issue 33: the server wrote its log's queue before it exited, with its verdict
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.index.store.querylog import QueryLog

    log = QueryLog(IndexStore(served.index))
    qid = result["asked"].structured_content["query_id"]
    assert log.entry(qid)["interface"] == "mcp/ask"
    assert log.reviews()[qid]["verdict"] == "answered"


def test_mcp_over_streamable_http(served):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def main() -> dict[str, Any]:
        http = create_mcp_http_client(headers=served.auth)
        async with http, Client(streamable_http_client(f"{served.url}/mcp", http_client=http)) as c:
            return await _exercise(c)

    result = anyio.run(main)
    _check(result)
    assert result["cit"]["url"].startswith(f"{served.url}/documents/")
