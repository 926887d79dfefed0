"""The service over real HTTP: a real uvicorn process on a real sample index."""

from __future__ import annotations

import html
import http.client
import json
import re
from urllib.parse import urlsplit

import httpx
import pytest

pytestmark = pytest.mark.slow

QUESTION = "How do I roll back to the previous embedding model?"


def _words(text: str) -> str:
    """Text without Markdown punctuation, entities or line breaks, for comparing quotes."""
    return " ".join(re.sub(r"[`*_#>|-]+", " ", html.unescape(text)).split())


def test_search_ask_status_healthz_openapi(served):
    with served.client() as c:
        health = httpx.get(f"{served.url}/healthz", timeout=10)  # no token needed
        assert health.status_code == 200 and health.json()["ok"] is True
        version = health.json()["version"]
        # issue 51: the index's own version for people; LanceDB's under its own name
        assert (
            isinstance(health.json()["index_version"], int) and health.json()["index_version"] >= 1
        )
        assert health.json()["lancedb_version"] == version

        r = c.get("/search", params={"q": "stale assets", "retriever": "bm25", "k": 3})
        assert r.status_code == 200
        hits = r.json()
        assert len(hits) == 3 and [h["rank"] for h in hits] == [1, 2, 3]
        assert r.headers["X-RAG-Version"] == str(hits[0]["stamps"]["version"])
        assert hits[0]["stamps"]["table"] == r.headers["X-RAG-Table"]
        assert int(r.headers["X-RAG-Version"]) >= version  # a swap may have happened since

        r = c.post("/ask", json={"question": QUESTION})
        assert r.status_code == 200
        out = r.json()
        assert not out["no_answer"] and out["citations"]
        assert out["published"]["version"] == int(r.headers["X-RAG-Version"])
        assert out["published"]["index_version"] >= health.json()["index_version"]
        for cit in out["citations"]:  # links point at this service's document view
            assert cit["url"].startswith(f"{served.url}/documents/{cit['document_id']}#")

        refused = c.post("/ask", json={"question": "What is the boiling point of tungsten?"})
        assert refused.status_code == 200 and refused.json()["no_answer"] is True
        assert refused.json()["citations"] == []

        status = c.get("/status").json()
        assert status["published"]["table"] == out["published"]["table"]

        spec = c.get("/openapi.json").json()
        for path in ("/search", "/ask", "/status", "/healthz", "/documents/{document_id}"):
            assert path in spec["paths"], path


def test_ask_and_search_json_equal_the_cli(served, monkeypatch, capsys):
    """One serializer: the service returns what `ask --json` / `search --json` print."""
    from rag_assets.cli import main

    with served.client() as c:
        http_ask = c.post("/ask", json={"question": QUESTION}).json()
        http_search = c.get("/search", params={"q": "stale assets", "k": 5}).json()
    for var, value in served.env().items():
        if var.startswith("RAG_"):
            monkeypatch.setenv(var, value)
    for var in ("RAG_BASE_URL", "RAG_LLM_URL", "RAG_RERANK_MODEL", "RAG_DISTANCE_CUT"):
        monkeypatch.delenv(var, raising=False)
    assert main(["ask", QUESTION, "--json"]) == 0
    cli_ask = json.loads(capsys.readouterr().out)
    assert main(["search", "stale assets", "-k", "5", "--json"]) == 0
    cli_search = json.loads(capsys.readouterr().out)
    assert set(cli_ask) == set(http_ask)
    # issue 33: each answer has its own query id (both logged), everything else is equal
    cli_id = cli_ask.pop("query_id")
    assert cli_id != http_ask.pop("query_id")
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.index.store.querylog import QueryLog

    logged = QueryLog(IndexStore(served.index)).entry(cli_id)  # written before main() returned
    assert logged["interface"] == "cli/ask" and logged["question"] == QUESTION
    for a, b in zip(cli_ask["citations"], http_ask["citations"], strict=True):
        assert a["url"].startswith("file://") and b["url"].startswith(served.url)
        a.pop("url"), b.pop("url")
    assert cli_ask == http_ask
    for a, b in zip(cli_search, http_search, strict=True):  # issue 21: hits are cited too
        assert a["url"].startswith("file://") and b["url"].startswith(served.url)
        a.pop("url"), b.pop("url")
    assert cli_search == http_search


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "needle"),
    [
        ("POST", "/ask", {"question": ""}, 400, "question is empty"),
        ("POST", "/ask", {"question": "   \n\t "}, 400, "question is empty"),
        ("POST", "/ask", {"question": "x" * 100_000}, 400, "100000 characters"),
        ("POST", "/ask", {}, 400, "question: Field required"),
        ("POST", "/ask", "not json", 400, "not valid JSON"),
        ("GET", "/search?q=stale&k=0", None, 400, "k=0 is out of range"),
        ("GET", "/search?q=stale&k=101", None, 400, "k=101 is out of range"),
        ("GET", "/search?q=stale&k=many", None, 400, "k: "),
        ("GET", "/search?q=stale&retriever=magic", None, 400, "unknown retriever 'magic'"),
        ("GET", "/search?q=stale&retriever=rerank", None, 400, "no model configured"),
        ("GET", "/search?q=%20", None, 400, "query is empty"),
        ("GET", "/search", None, 400, "q: Field required"),
        ("GET", "/search?q=" + "y" * 10_000, None, 400, "10000 characters"),
        ("GET", "/documents/01-pipeline-overview.md?char=9,2", None, 400, "char=9,2 is reversed"),
        ("GET", "/documents/01-pipeline-overview.md?char=a-b", None, 400, "is not 'from,to'"),
        ("GET", "/nowhere", None, 404, "Not Found"),
        ("PUT", "/ask", None, 405, "Method Not Allowed"),
    ],
)
def test_bad_requests_get_4xx_with_one_line_json(served, method, path, body, status, needle):
    with served.client() as c:
        if isinstance(body, str):
            r = c.request(method, path, content=body, headers={"Content-Type": "application/json"})
        else:
            r = c.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()
    assert set(err) == {"error"} and "\n" not in err["error"] and "Traceback" not in r.text
    assert needle in err["error"]


def test_bearer_token_guards_everything_but_healthz(served):
    for path in ("/search?q=stale", "/status", "/", "/documents/01-pipeline-overview.md"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": served.token}):
            r = httpx.get(served.url + path, headers=headers, timeout=30)
            assert r.status_code == 401, (path, headers)
            assert r.headers["WWW-Authenticate"] == "Bearer"
            if path == "/":  # the page asks for the token (issue 25): a form, not JSON
                assert (
                    r.headers["content-type"].startswith("text/html") and 'name="token"' in r.text
                )
            else:
                assert "bearer token" in r.json()["error"]
    assert httpx.post(f"{served.url}/mcp", json={}, timeout=30).status_code == 401
    assert httpx.get(f"{served.url}/healthz", timeout=30).status_code == 200
    assert httpx.get(f"{served.url}/status", headers=served.auth, timeout=30).status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/documents/../../etc/passwd",
        "/documents/..%2F..%2Fetc%2Fpasswd",
        "/documents/%2Fetc%2Fpasswd",
        "/documents//etc/passwd",
        "/documents/../pyproject.toml",
        "/documents/not-in-the-index.md",
    ],
)
def test_document_ids_not_in_the_index_are_404(served, path):
    """The raw path goes out unnormalised (http.client), so the server sees the dots."""
    parts = urlsplit(served.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", path, headers=served.auth)
    r = conn.getresponse()
    body = r.read().decode()
    assert r.status == 404, (path, body)
    assert "root:" not in body and "[project]" not in body
    assert "\n" not in json.loads(body)["error"]


def test_document_view_highlights_the_cited_span(served):
    with served.client() as c:
        cit = c.post("/ask", json={"question": QUESTION}).json()["citations"][0]
        page = c.get(
            f"/documents/{cit['document_id']}", params={"char": f"{cit['from']},{cit['to']}"}
        )
        plain = c.get(f"/documents/{cit['document_id']}")
        pdf = c.get("/documents/glossary.pdf")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    marked = re.findall(r"<mark class=\"cite\"[^>]*>(.*?)</mark>", page.text, flags=re.S)
    assert marked and 'id="cite"' in page.text
    words = _words(" ".join(re.sub(r"<[^>]+>", "", m) for m in marked))
    quote_words = _words(cit["quote"])
    assert words[:60] in quote_words and quote_words[-30:] in words  # all of the quote, no more
    assert "<mark" not in plain.text and "<h1>" in plain.text  # rendered Markdown
    assert pdf.status_code == 200 and pdf.headers["content-type"] == "application/pdf"
    assert pdf.content.startswith(b"%PDF")
