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
TOOLS = {"search", "ask", "get_document_span", "feedback", "verify_answer"}


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
    said = " ".join(cit["span"]["text"].split())  # issue 50: an answer checked before replying
    verified = await client.call_tool(
        "verify_answer",
        {"question": QUESTION, "answer": f"{said} [1] It takes 999 days on Mars [1]."},
    )
    unverifiable = await client.call_tool(
        "verify_answer", {"question": QUESTION, "answer": "No marker anywhere."}
    )
    return {
        "verified": verified,
        "unverifiable": unverifiable,
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
    verified = r["verified"].structured_content
    assert [s["verdict"] for s in verified["sentences"]] == ["supported", "unsupported"]
    assert verified["sentences"][0]["evidence"]["source"] == 1
    assert verified["sentences"][1]["reason"]
    assert (verified["supported"], verified["total"]) == (1, 2)
    bad = r["unverifiable"]
    assert bad.is_error and "has no [n] marker" in bad.content[0].text


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


class _RawStdio:
    """``rag-assets mcp`` as a subprocess spoken to in raw JSON lines (no SDK client, which
    would never send a broken line)."""

    def __init__(self, served: Any) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rag_assets.cli", "mcp", "--index", str(served.index)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=served.env(),
        )

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode("utf-8", "surrogatepass") + b"\n")
        self.proc.stdin.flush()

    def call(self, rid: int, method: str, params: dict[str, Any]) -> None:
        self.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))

    def answer(self) -> str:
        """The next line the server writes (a hang guard only: a server that never answers
        fails the test instead of blocking it forever)."""
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], HANG_GUARD_S)
        assert ready, f"no answer within {HANG_GUARD_S} s: the server dropped the line"
        return self.proc.stdout.readline().decode()

    def close(self) -> None:
        from rag_assets_tests.helpers import stop_process

        assert self.proc.stdin is not None
        self.proc.stdin.close()
        stop_process(self.proc)


HANG_GUARD_S = 300  # never reached by a server that answers; model load on 2 busy cores


def test_mcp_over_stdio_answers_every_request_in_one_line(served):
    """Issue 30: a line that is not JSON gets -32700, a lone surrogate in an argument -32602
    with the request's id, bad arguments a one-line tool error without a pydantic dump or URL,
    and a reversed span is called reversed. Each answer is one line; every id is answered."""
    mcp = _RawStdio(served)
    try:
        mcp.call(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                   "clientInfo": {"name": "probe", "version": "1"}})  # fmt: skip
        assert json.loads(mcp.answer())["id"] == 1
        mcp.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

        def error_of(line: str) -> dict[str, Any]:
            mcp.send(line)
            raw = mcp.answer()
            assert raw.endswith("\n") and "\n" not in raw[:-1]
            return json.loads(raw)

        got = error_of("this is not json")
        assert got["id"] is None and got["error"]["code"] == -32700
        got = error_of("[" * 100_000)  # deeper than any parser's recursion
        assert got["id"] is None and got["error"]["code"] == -32700
        call = '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search",'
        got = error_of(call + '"arguments":{"query":"\\ud800 stale","k":3}}}')
        assert got["id"] == 2 and got["error"]["code"] == -32602
        assert "params.arguments.query" in got["error"]["message"]
        got = error_of('[{"jsonrpc":"2.0","id":3,"method":"ping"}]')  # a batch
        assert got["id"] is None and got["error"]["code"] == -32600
        got = error_of('{"jsonrpc":"2.0","id":4,"method":5}')
        assert got["id"] == 4 and got["error"]["code"] == -32600

        def tool_error(rid: int, name: str, arguments: dict[str, Any]) -> str:
            params = {"name": name, "arguments": arguments}
            got = error_of(
                json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})
            )
            assert got["id"] == rid and got["result"]["isError"] is True
            text = got["result"]["content"][0]["text"]
            assert "\n" not in text and "http" not in text and "pydantic" not in text
            return str(text)

        assert "argument k:" in tool_error(5, "search", {"query": "stale", "k": "abc"})
        assert "argument query is required" in tool_error(6, "search", {"k": 3})
        assert "argument start:" in tool_error(
            7, "get_document_span", {"document_id": "x.md", "start": "x", "end": 4}
        )
        doc = sorted(p.name for p in served.docs.glob("*.md"))[0]
        text = tool_error(8, "get_document_span", {"document_id": doc, "start": 50, "end": 10})
        assert "reversed" in text and "outside" not in text
        mcp.call(9, "ping", {})  # still serving after all of that
        assert json.loads(mcp.answer()) == {"jsonrpc": "2.0", "id": 9, "result": {}}
    finally:
        mcp.close()
