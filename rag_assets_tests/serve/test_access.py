"""Who may see what (issue 34), on the real service, a real index and real HTTP.

One index holds public documents, an ``hr`` folder and a ``finance`` folder (``.ragmeta``:
``access=hr`` / ``access=finance``), each restricted document with a phrase no other document
has. Three tokens: ``hr`` and ``fin`` (made with ``rag-assets token add``) and the administrator
(``RAG_API_TOKEN``). For every (token, route) pair the test asserts what is visible, that a
hidden document's phrase is never found by dense, BM25, hybrid, ``ask`` or the MCP tools, and
**non-interference**: what a token gets from the full index is what the same request gets from
an index built without the documents it may not see (the same hits, ranks, scores, distances,
spans, counts, facets and error lines; only the table name and version differ). A hidden
document answers exactly like a missing one, a revoked token is refused by the very next
request, and ``search --as`` / ``mcp`` with ``RAG_TOKEN`` see what the token sees. The query
log (issue 33) records which token asked; a token judges its own queries only, names only its
own documents in a verdict, and never reads the log.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.output import ask_json, search_json
from rag_assets.lib.query.retrieve import Index
from rag_assets_tests.helpers import SAMPLE_DOCS, cli_here, start_server, stop_process

pytestmark = pytest.mark.slow

ADMIN = "admin-token-34"
PHRASES = {  # a phrase only this document has, and the question that finds it
    "hr/salaries.md": "quokka salary bands",
    "finance/forecast.md": "wombat revenue forecast",
    "public/notice.md": "lighthouse cafeteria",
}
DOCS = {
    "hr/salaries.md": "---\nband: senior\ntags: [pay]\n---\n# Salary bands\n\nThe quokka salary "
    "bands for engineers are reviewed every spring by the compensation committee.\n\n## Senior "
    "band\n\nSenior quokka salary bands start at level five and need two reviewers.\n",
    "finance/forecast.md": "---\ntags: [plan]\n---\n# Revenue forecast\n\nThe wombat revenue "
    "forecast predicts a steady rise next quarter.\n\n## Risks\n\nThe wombat revenue forecast "
    "assumes no new competitor enters the market.\n",
    "public/notice.md": "---\ntags: [plan, howto]\n---\n# Notice\n\nThe lighthouse cafeteria "
    "opens at eight for everyone and serves soup at noon.\n",
}
RAGMETA = "hr/** access=hr\nfinance/** access=finance\n"
SEES = {
    "hr": {"public", "hr"},
    "fin": {"public", "finance"},
    "admin": {"public", "hr", "finance"},
}


def _write(root: Path, folders: set[str]) -> Path:
    """The corpus restricted to ``folders`` (a reference index omits the others)."""
    root.mkdir(parents=True)
    for name in sorted(p.name for p in SAMPLE_DOCS.glob("*.md")):
        (root / "public").mkdir(exist_ok=True)
        shutil.copy2(SAMPLE_DOCS / name, root / "public" / name)
    for doc, text in DOCS.items():
        if doc.split("/")[0] in folders:
            (root / doc).parent.mkdir(parents=True, exist_ok=True)
            (root / doc).write_text(text)
            os.utime(root / doc, (1_750_000_000, 1_750_000_000))
    (root / ".ragmeta").write_text(RAGMETA)
    return root


@dataclass
class Matrix:
    url: str
    index: Path
    env: dict[str, str]
    tokens: dict[str, str]
    refs: dict[str, Index]  # token name -> an in-process index of what it may see
    proc: subprocess.Popen[bytes]

    def get(self, who: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return httpx.get(self.url + path, headers=headers, timeout=120, **kw)

    def post(self, who: str, path: str, body: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return httpx.post(self.url + path, headers=headers, json=body, timeout=120)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``rag-assets ARGS`` through its entry point in this process (MCP over stdio and the
    service are processes of their own)."""
    return cli_here(env, *args, check=False)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, real_embedder) -> Iterator[Matrix]:
    root = tmp_path_factory.mktemp("access")
    built = index_folder(
        _write(root / "docs", {"public", "hr", "finance"}),
        root / "index",
        strategy("E"),
        real_embedder,
    )
    assert built.sync.rows > 20
    refs: dict[str, Index] = {}
    for who, folders in SEES.items():  # what each token may see, indexed alone
        ref = root / f"ref-{who}"
        index_folder(_write(ref / "docs", folders), ref / "index", strategy("E"), real_embedder)
        refs[who] = Index.open(ref / "index", embedder=real_embedder)
        refs[who].exact_dense = True  # as the service ranks a table without a vector index
    env = dict(os.environ)
    env.update(
        RAG_INDEX_URI=str(root / "index"),
        RAG_WORK_DIR=str(root / "work"),
        RAG_QUERY_ENCODER="torch",  # the reference indexes embed with the same torch model
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    for var in ("RAG_BASE_URL", "RAG_LLM_URL", "RAG_RERANK_MODEL", "RAG_DISTANCE_CUT", "RAG_TOKEN"):
        env.pop(var, None)
    tokens = {"admin": ADMIN}
    for who, groups in (("hr", "hr"), ("fin", "finance")):
        made = _cli(env, "token", "add", who, "--groups", groups)
        assert made.returncode == 0, made.stderr
        tokens[who] = made.stdout.strip()  # the token alone on stdout, shown once
        assert "shown once" in made.stderr and tokens[who] not in made.stderr
    url, proc = start_server(root / "index", env | {"RAG_API_TOKEN": ADMIN}, root / "serve.log")
    try:
        yield Matrix(url, root / "index", env, tokens, refs, proc)
    finally:
        stop_process(proc)


# -- comparing a response with its reference ----------------------------------------------------
VERSIONED = {"table", "version", "documents_version", "published", "query_id"}  # query_id: random


def _same(got: Any, want: Any, where: str = "") -> None:
    """Equal JSON, floats to 1e-6 (two processes embed the query), table versions aside."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) - VERSIONED == set(want) - VERSIONED, where
        for key in set(want) - VERSIONED:
            _same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got} != {want}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, float):
        assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6), f"{where}: {got} != {want}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def _ref_search(m: Matrix, who: str, q: str, retriever: str, k: int = 20) -> list[dict]:
    index = m.refs[who]
    hits = index.search(q, retriever=retriever, k=k)
    return search_json(hits, index, q, f"{m.url}/documents")


def _ref_ask(m: Matrix, who: str, q: str) -> dict:
    from rag_assets.serve.access import without_cut

    index = m.refs[who]
    out = ask_json(index.ask(q, base_url=f"{m.url}/documents"), None, index.published)
    return out if who == "admin" else without_cut(out)  # issue 43: the cut is the admin's


def _folders(docs: Any) -> set[str]:
    return {str(d).split("/")[0] for d in docs}


QUESTIONS = [*PHRASES.values(), "How do I roll back to the previous embedding model?"]


@pytest.mark.parametrize("who", ["hr", "fin", "admin"])
@pytest.mark.parametrize("retriever", ["dense", "bm25", "hybrid"])
def test_search_sees_only_its_documents_and_equals_an_index_without_the_others(
    matrix, who, retriever
):
    for q in QUESTIONS:
        r = matrix.get(who, "/search", params={"q": q, "retriever": retriever, "k": 20})
        assert r.status_code == 200, r.text
        hits = r.json()
        assert _folders(h["document_id"] for h in hits) <= SEES[who]
        for doc, phrase in PHRASES.items():
            if doc.split("/")[0] not in SEES[who]:
                assert phrase.split()[0] not in json.dumps(hits)  # never its words, anywhere
        _same(hits, _ref_search(matrix, who, q, retriever), f"{who} {retriever} {q!r}")
    own = {d for d in PHRASES if d.split("/")[0] in SEES[who]}
    for doc in own:  # and each document it may see is found by its own phrase
        hits = matrix.get(who, "/search", params={"q": PHRASES[doc], "retriever": retriever}).json()
        assert hits[0]["document_id"] == doc


@pytest.mark.parametrize("who", ["hr", "fin", "admin"])
def test_ask_cites_only_its_documents_and_equals_an_index_without_the_others(matrix, who):
    for q in QUESTIONS:
        r = matrix.post(who, "/ask", {"question": q})
        assert r.status_code == 200, r.text
        out = r.json()
        assert _folders(c["document_id"] for c in out["citations"]) <= SEES[who]
        for doc, phrase in PHRASES.items():
            if doc.split("/")[0] not in SEES[who]:
                assert phrase.split()[0] not in out["prompt"] + json.dumps(out["citations"])
        _same(out, _ref_ask(matrix, who, q), f"{who} ask {q!r}")


# -- issue 50: verification sees what the caller sees -----------------------------------------
def _answers(m: Matrix, q: str) -> list[str]:
    """Answers to ``q`` written from what the administrator sees: each of its sources' span
    with its number (a token's [n] is its own n-th source, or none), a marker past them all,
    and the same words without markers."""
    cites = m.post("admin", "/ask", {"question": q}).json()["citations"]
    said = [f"{' '.join(c['span']['text'].split())} [{c['index']}]" for c in cites]
    return [" ".join(said), f"{said[0]} The rest is elsewhere [{len(cites) + 1}].", said[-1]]


def _ref_verify(m: Matrix, who: str, q: str, answer: str) -> tuple[int, dict[str, Any]]:
    from rag_assets.lib.query.verify import VerifyInputError, verify_question

    try:
        return 200, verify_question(m.refs[who], q, answer, base_url=f"{m.url}/documents")
    except VerifyInputError as e:
        return 400, {"error": str(e)}


@pytest.mark.parametrize("who", ["hr", "fin", "admin"])
def test_verify_sees_only_its_documents_and_equals_an_index_without_the_others(matrix, who):
    """``POST /verify`` for every token: the sources are the token's own (a hidden document is
    never a source, so a marker that named one for the administrator names the token's n-th
    source or none); verdicts, evidence, reasons and errors are exactly those of an index
    built without the documents it may not see; no hidden word is in any evidence or reason."""
    for q in QUESTIONS:
        for answer in _answers(matrix, q):
            r = matrix.post(who, "/verify", {"question": q, "answer": answer})
            status, want = _ref_verify(matrix, who, q, answer)
            assert r.status_code == status, r.text
            _same(r.json(), want, f"{who} verify {q!r} {answer[:40]!r}")
            if status != 200:
                continue
            out = r.json()
            assert _folders(s["document_id"] for s in out["sources"]) <= SEES[who]
            shown = json.dumps(
                [(s["evidence"], s["reason"]) for s in out["sentences"]] + [out["sources"]]
            )
            for doc, phrase in PHRASES.items():
                if doc.split("/")[0] not in SEES[who]:
                    assert phrase.split()[0] not in shown


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"question": "lighthouse cafeteria", "answer": ""}, "answer is empty"),
        ({"question": "lighthouse cafeteria", "answer": "No marker."}, "has no [n] marker"),
        ({"question": "lighthouse cafeteria", "answer": "x [1] " * 20_000}, "at most 10000"),
        ({"question": "lighthouse cafeteria", "answer": "It opens at eight [7]."}, "source(s)"),
        ({"question": "lighthouse cafeteria"}, "answer: Field required"),
        ({"question": " ", "answer": "x [1]"}, "question is empty"),
        ('{"question": "lighthouse cafeteria", "answer": "a \\ud800 b [1]"}', "lone surrogate"),
        ("{not json", "not valid JSON"),
    ],
)
def test_verify_bad_input_is_one_line_400(matrix, body, words):
    headers = {"Authorization": f"Bearer {matrix.tokens['hr']}"}
    if isinstance(body, str):
        headers["Content-Type"] = "application/json"
        r = httpx.post(matrix.url + "/verify", headers=headers, content=body, timeout=120)
    else:
        r = httpx.post(matrix.url + "/verify", headers=headers, json=body, timeout=120)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error and "\n" not in error and set(r.json()) == {"error"}
    ok = matrix.post("hr", "/verify", {"question": "lighthouse cafeteria", "answer": "x [1]."})
    assert ok.status_code == 200  # nothing else affected


def test_verification_reads_no_document_the_caller_may_not_see(matrix, real_embedder):
    """No timing difference because no work: verifying as a token reads the canonical text of
    visible documents only, whatever the answer cites (every number up to the administrator's
    sources and past them)."""
    from rag_assets.lib.query.filters import Filter, Scope
    from rag_assets.lib.query.verify import VerifyInputError, verify_question

    index = Index.open(matrix.index, embedder=real_embedder)
    index.exact_dense = True
    read: list[str] = []

    class Recording(dict):  # the published documents, each read noted
        def __getitem__(self, key: str) -> Any:
            read.append(key)
            return super().__getitem__(key)

    index._docs = Recording(index._docs)
    for who, groups in (("hr", {"hr"}), ("fin", {"finance"})):
        for q in QUESTIONS:
            for answer in _answers(matrix, q):
                read.clear()
                with contextlib.suppress(VerifyInputError):
                    verify_question(index, q, answer, scope=Scope(Filter(), frozenset(groups)))
                assert _folders(read) <= SEES[who], (who, q, sorted(set(read)))


@pytest.mark.parametrize("who", ["hr", "fin", "admin"])
def test_documents_status_and_filters_routes(matrix, who):
    missing = matrix.get(who, "/documents/nowhere/else.md")
    for doc in PHRASES:
        for query in ("", "?char=9,2", "?char=0,5"):
            r = matrix.get(who, f"/documents/{doc}{query}")
            if doc.split("/")[0] in SEES[who]:
                assert r.status_code in (200, 400), r.text  # 400: the reversed span, named
                assert (r.status_code == 400) == (query == "?char=9,2")
            else:  # exactly what a missing document gets: status, headers, one line
                assert r.status_code == 404 == missing.status_code
                assert r.json() == {"error": f"no document {doc!r} in the published index"}
                assert missing.json() == {
                    "error": "no document 'nowhere/else.md' in the published index"
                }
                assert dict(r.headers).keys() == dict(missing.headers).keys()
    status = matrix.get(who, "/status")
    assert status.status_code == 200
    report = status.json()
    listed = {d["document"] for d in report["documents"]["list"]}
    assert _folders(listed) == SEES[who]
    if who == "admin":  # the administrator's /status is `status --json`
        assert "rollback_stack" in report and report["published"]["rows"] == sum(
            d["chunks"] for d in report["documents"]["list"]
        )
    else:
        assert set(report) == {"caller", "published", "documents", "metadata", "rerank"}
        assert report["caller"] == {"name": who, "groups": [{"fin": "finance"}.get(who, who)]}
        ref = m_ref = matrix.refs[who]
        assert (
            report["published"]["rows"]
            == ref.published.rows
            == sum(d["chunks"] for d in report["documents"]["list"])
        )
        assert listed == set(m_ref.documents)
        _same(report["metadata"], ref.facets(None), f"{who} status metadata")
    facets = matrix.get(who, "/filters").json()
    _same(facets, matrix.refs[who].facets(None), f"{who} /filters")
    assert set(facets["folders"]) == SEES[who]
    page = matrix.get(who, "/")
    assert page.status_code == 200 and 'id="folder"' in page.text


@pytest.mark.parametrize("who", ["hr", "fin"])
def test_filters_over_http_and_their_errors_leak_nothing(matrix, who):
    # a key only hidden documents have is unknown, with the same line the reference gives
    hidden_key = "band=senior" if who == "fin" else None
    cases: list[tuple[dict[str, Any], str]] = [
        ({"filter": ["folder=hr"]}, "folder"),
        ({"filter": ["tags=plan"]}, "tags"),
        ({"folder": "finance"}, "folder"),
        ({"document": "hr/salaries.md"}, "document"),
        ({"filter": ["colour=red"]}, "unknown"),
    ]
    if hidden_key:
        cases.append(({"filter": [hidden_key]}, "unknown"))
    for params, kind in cases:
        r = matrix.get(who, "/search", params={"q": "salary forecast cafeteria", **params})
        if kind == "unknown":
            assert r.status_code == 400
            err = r.json()["error"]
            assert err.startswith("unknown filter key")
            assert ("band" in err.split(":", 1)[1]) == (who == "hr")  # hr sees the key
            with pytest.raises(ValueError) as ref_err:  # the reference says the same line
                from rag_assets.lib.query.filters import Filter, Scope

                key = params["filter"][0]
                matrix.refs[who].search("x", scope=Scope(Filter.parse([key])))
            assert str(ref_err.value) == err
            continue
        assert r.status_code == 200, r.text
        hits = r.json()
        assert _folders(h["document_id"] for h in hits) <= SEES[who]
        from rag_assets.lib.query.filters import Filter, Scope

        flt = Filter.parse(
            params.get("filter", []), document=params.get("document"), folder=params.get("folder")
        )
        ref = matrix.refs[who]
        want = search_json(
            ref.search("salary forecast cafeteria", k=20, scope=Scope(flt)),
            ref,
            "salary forecast cafeteria",
            f"{matrix.url}/documents",
        )
        _same(hits, want, f"{who} {params}")
    # malformed: one line, 400
    bad = matrix.get(who, "/search", params={"q": "x", "filter": "tags"})
    assert bad.status_code == 400 and "is not key=value" in bad.json()["error"]
    body = {"question": "When are salary bands reviewed?", "filter": {"folder": ["hr", "finance"]}}
    out = matrix.post(who, "/ask", body).json()
    assert _folders(c["document_id"] for c in out["citations"]) <= SEES[who] - {"public"}
    assert matrix.post(who, "/ask", {"question": "x", "filter": ["a"]}).status_code == 400


def test_admin_filters_reach_everything(matrix):
    hits = matrix.get("admin", "/search", params={"q": "salary", "filter": "band=senior"}).json()
    assert {h["document_id"] for h in hits} == {"hr/salaries.md"}
    hits = matrix.get(
        "admin", "/search", params=[("q", "plan"), ("filter", "tags=plan"), ("filter", "tags=pay")]
    ).json()
    assert {h["document_id"] for h in hits} == set(PHRASES)  # a key twice: any of its values


def test_mcp_over_http_answers_as_the_bearer(matrix):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def call(who: str) -> dict[str, Any]:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {matrix.tokens[who]}"})
        async with (
            http,
            Client(streamable_http_client(f"{matrix.url}/mcp", http_client=http)) as c,
        ):
            tools = await c.list_tools()
            hits = await c.call_tool("search", {"query": "quokka salary bands", "k": 20})
            asked = await c.call_tool("ask", {"question": "When are quokka salary bands reviewed?"})
            span = await c.call_tool(
                "get_document_span", {"document_id": "hr/salaries.md", "start": 0, "end": 20}
            )
            nowhere = await c.call_tool(
                "get_document_span", {"document_id": "hr/nowhere.md", "start": 0, "end": 20}
            )
            filtered = await c.call_tool(
                "search", {"query": "plan", "k": 20, "filter": {"tags": ["plan", "pay"]}}
            )
            unknown = await c.call_tool("search", {"query": "x", "filter": {"colour": "red"}})
            return {
                "schema": {t.name: t.input_schema for t in tools.tools},
                "hits": hits,
                "asked": asked,
                "span": span,
                "nowhere": nowhere,
                "filtered": filtered,
                "unknown": unknown,
            }

    for who in ("hr", "fin"):
        r = anyio.run(call, who)
        sc = r["hits"].structured_content
        hits = sc["result"] if isinstance(sc, dict) and "result" in sc else sc
        assert _folders(h["document_id"] for h in hits) <= SEES[who]
        _same(hits, _ref_search(matrix, who, "quokka salary bands", "hybrid"), f"mcp {who}")
        asked = r["asked"].structured_content
        assert _folders(c["document_id"] for c in asked["citations"]) <= SEES[who]
        if who == "fin":  # hidden: the error a missing document gets
            assert r["span"].is_error and r["nowhere"].is_error
            assert r["span"].content[0].text.replace("salaries", "nowhere") == (
                r["nowhere"].content[0].text
            )
        else:  # the canonical text: the body, its front matter is metadata
            body = DOCS["hr/salaries.md"].split("---\n", 2)[2]
            assert r["span"].structured_content["text"] == body[:20]
        fsc = r["filtered"].structured_content
        fhits = fsc["result"] if isinstance(fsc, dict) and "result" in fsc else fsc
        want = {"public/notice.md"} | ({"hr/salaries.md"} if who == "hr" else set())
        want |= {"finance/forecast.md"} if who == "fin" else set()
        assert {h["document_id"] for h in fhits} == want
        assert (
            r["unknown"].is_error and "unknown filter key 'colour'" in r["unknown"].content[0].text
        )
        schema = r["schema"]["search"]["properties"]["filter"]
        assert (
            "folder" in schema["description"] and "ctx" not in r["schema"]["search"]["properties"]
        )


def test_cli_as_and_mcp_over_stdio_with_a_token(matrix):
    out = _cli(matrix.env, "search", "quokka salary bands", "--as", "fin", "--json", "-k", "20")
    assert out.returncode == 0, out.stderr
    hits = json.loads(out.stdout)
    assert _folders(h["document_id"] for h in hits) <= SEES["fin"]
    ref = matrix.refs["fin"]
    want = search_json(ref.search("quokka salary bands", k=20), ref, "quokka salary bands", None)
    for h in [*hits, *want]:  # file URIs: the two indexes' folders differ
        h.pop("url")
    _same(hits, want, "cli --as fin")
    bad = _cli(matrix.env, "search", "x", "--filter", "colour=red")
    assert bad.returncode == 2 and bad.stderr.startswith("rag-assets search: error: unknown filter")
    assert "\n" not in bad.stderr.strip()
    malformed = _cli(matrix.env, "search", "x", "--filter", "colour")
    assert malformed.returncode == 2 and "is not key=value" in malformed.stderr
    folder = _cli(matrix.env, "search", "salary", "--folder", "hr", "--json")
    assert {h["document_id"] for h in json.loads(folder.stdout)} == {"hr/salaries.md"}
    nobody = _cli(matrix.env, "ask", "salary", "--as", "nobody")
    assert nobody.returncode == 1 and "no active token" in nobody.stderr

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def stdio(env: dict[str, str]) -> Any:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "rag_assets.cli", "mcp"], env=env
        )
        async with Client(params, read_timeout_seconds=300) as client:
            return await client.call_tool("search", {"query": "quokka salary bands", "k": 20})

    as_fin = anyio.run(stdio, matrix.env | {"RAG_TOKEN": matrix.tokens["fin"]})
    sc = as_fin.structured_content
    hits = sc["result"] if isinstance(sc, dict) and "result" in sc else sc
    assert hits and _folders(h["document_id"] for h in hits) <= SEES["fin"]
    operator = anyio.run(stdio, matrix.env)  # no token: the local operator sees everything
    sc = operator.structured_content
    hits = sc["result"] if isinstance(sc, dict) and "result" in sc else sc
    assert hits[0]["document_id"] == "hr/salaries.md"


def test_a_revoked_token_is_refused_by_the_next_request(matrix):
    made = _cli(matrix.env, "token", "add", "temp", "--groups", "hr")
    temp = made.stdout.strip()
    matrix.tokens["temp"] = temp
    assert matrix.get("temp", "/status").status_code == 200  # a new token works at once
    page = httpx.Client(base_url=matrix.url, timeout=60)  # the page's signed session of it
    assert page.post("/login", data={"token": temp}).status_code == 303
    assert matrix.tokens["temp"] not in page.cookies["rag_session"]  # never the token itself
    assert page.get("/filters").status_code == 200
    revoked = _cli(matrix.env, "token", "revoke", "temp")
    assert revoked.returncode == 0, revoked.stderr
    assert page.get("/filters").status_code == 401  # its session ends with it, at once
    page.close()
    for path in ("/status", "/search?q=salary", "/filters", "/documents/public/notice.md", "/"):
        r = matrix.get("temp", path)
        assert r.status_code == 401, (path, r.text)
    r = matrix.post("temp", "/ask", {"question": "salary"})
    assert r.status_code == 401 and "bearer token" in r.json()["error"]
    login = httpx.post(f"{matrix.url}/login", data={"token": temp}, timeout=30)
    assert login.status_code == 401
    listed = _cli(matrix.env, "token", "list", "--json")
    assert {r["name"]: bool(r["revoked"]) for r in json.loads(listed.stdout)} == {
        "hr": False,
        "fin": False,
        "temp": True,
    }
    # the page's login takes a group token too, and its cookie carries that token's groups
    with httpx.Client(base_url=matrix.url, timeout=60) as c:
        assert c.post("/login", data={"token": matrix.tokens["fin"]}).status_code == 303
        facets = c.get("/filters").json()
        assert set(facets["folders"]) == SEES["fin"]


def test_the_page_offers_the_tokens_folders_and_keys_and_asks_within_them(matrix, tmp_path):
    """A real Chromium: the page's folder list and key suggestions are the token's, a question
    asked within a folder cites that folder only, and the deep link keeps the folder."""
    from rag_assets_tests.serve.test_browser import CHROMIUM_ARGS, _browser

    sync_api, exe, shots = _browser(tmp_path)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            auth = {"Authorization": f"Bearer {matrix.tokens['fin']}"}
            page = browser.new_context(extra_http_headers=auth).new_page()
            page.goto(matrix.url + "/")
            page.wait_for_function("document.querySelectorAll('#folder option').length > 1")
            folders = page.locator("#folder option").evaluate_all("os => os.map(o => o.value)")
            assert folders == ["", "finance", "public"]  # not hr: the token's folders only
            keys = page.locator("#filter-keys option").evaluate_all("os => os.map(o => o.value)")
            assert "tags=plan" in keys and not any(k.startswith("band") for k in keys)
            page.select_option("#folder", "finance")
            page.fill("#question", "What does the revenue forecast predict?")
            page.press("#question", "Enter")
            page.wait_for_selector(".card", timeout=120_000)
            docs = page.locator(".card-doc").all_inner_texts()
            assert docs and set(docs) == {"forecast.md"}
            assert "folder=finance" in page.url
            page.screenshot(path=str(shots / "access-folder.png"), full_page=True)
            page.goto(matrix.url + "/?q=salary+bands&filter=tags%3Dplan")
            page.wait_for_selector(".card, .no-answer", timeout=120_000)
            assert page.input_value("#filter") == "tags=plan"
            cited = set(page.locator(".card-doc").all_inner_texts())
            assert cited <= {"forecast.md", "notice.md"}
        finally:
            browser.close()


def test_the_query_log_and_feedback_are_scoped_to_the_token(matrix):
    """Issue 33 under issue 34: group tokens never read the log (no entry, question or count),
    another token's query id and a document a token may not see answer exactly as ones that do
    not exist, and the administrator reads every entry with the name of the token that asked."""
    from rag_assets.lib.query.log import new_query_id

    asked = {
        who: matrix.post(who, "/ask", {"question": f"What about the {PHRASES[doc]}?"}).json()
        for who, doc in (("hr", "hr/salaries.md"), ("fin", "finance/forecast.md"))
    }
    hr_id, fin_id, unknown = asked["hr"]["query_id"], asked["fin"]["query_id"], new_query_id()
    assert hr_id and fin_id and hr_id != fin_id
    for who in ("hr", "fin"):
        for path in ("/log", "/log?unreviewed=true", f"/log/{hr_id}", f"/log/{fin_id}"):
            r = matrix.get(who, path)
            assert r.status_code == 403, r.text
            assert not {"quokka", "wombat", hr_id, fin_id} & set(r.text.replace('"', " ").split())
        assert "query_log" not in matrix.get(who, "/status").json()

    def feedback(who: str, qid: str, **kw: Any) -> httpx.Response:
        return matrix.post(who, "/feedback", {"query_id": qid, **kw})

    # another token's query: exactly an unknown id's answer (status, one line, the id aside)
    theirs, nobody = (
        feedback("hr", fin_id, verdict="wrong"),
        feedback("hr", unknown, verdict="wrong"),
    )
    assert theirs.status_code == nobody.status_code == 404
    assert theirs.json()["error"].replace(fin_id, "ID") == nobody.json()["error"].replace(
        unknown, "ID"
    )
    # a document the token may not see: exactly a missing document's answer
    quote = "wombat revenue forecast predicts a steady rise"
    hidden = feedback("hr", hr_id, verdict="missed", document="finance/forecast.md", quote=quote)
    missing = feedback("hr", hr_id, verdict="missed", document="finance/nowhere.md", quote=quote)
    assert hidden.status_code == missing.status_code == 400
    assert hidden.json()["error"].replace("forecast.md", "X") == missing.json()["error"].replace(
        "nowhere.md", "X"
    )
    assert "calibration" not in hidden.text
    # its own query and document: recorded, without the log's counts
    own = feedback(
        "hr", hr_id, verdict="missed", document="hr/salaries.md", quote="quokka salary bands"
    )
    assert own.status_code == 200, own.text
    assert own.json()["document"] == "hr/salaries.md" and "calibration" not in own.json()
    assert feedback("admin", fin_id, verdict="wrong").status_code == 200  # the admin judges all
    entry = matrix.get("admin", f"/log/{hr_id}")
    assert entry.status_code == 200, entry.text
    assert entry.json()["caller"] == "hr"
    assert [h["verdict"] for h in entry.json()["history"]] == ["missed"]
    log = {e["id"]: e for e in matrix.get("admin", "/log?limit=500").json()}
    assert log[hr_id]["caller"] == "hr" and log[fin_id]["caller"] == "fin"
    assert "query_log" in matrix.get("admin", "/status").json()


def test_a_group_token_cannot_end_sessions_flood_feedback_or_move_the_cut(matrix):
    """Issue 43 on the running service: `POST /logout?all=1` is the administrator's (a group
    token's answered 200 "every session"); a token's verdicts on one query keep one row, are
    limited per minute (RAG_FEEDBACK_PER_MINUTE, 429), and do not count toward calibration."""
    with httpx.Client(base_url=matrix.url, timeout=60) as admin_page:
        assert admin_page.post("/login", data={"token": ADMIN}).status_code == 303
        r = matrix.post("hr", "/logout?all=1", None)
        assert r.status_code == 403 and "RAG_API_TOKEN" in r.json()["error"], r.text
        assert admin_page.get("/status").status_code == 200  # the admin's session lives on
    made = _cli(matrix.env, "token", "add", "flood", "--groups", "hr")
    assert made.returncode == 0, made.stderr
    matrix.tokens["flood"] = made.stdout.strip()
    before = matrix.get("admin", "/status").json()["query_log"]["calibration"]
    asked = matrix.post(
        "flood", "/ask", {"question": f"What about the {PHRASES['hr/salaries.md']}?"}
    )
    qid = asked.json()["query_id"]
    verdicts = (
        ["right_refusal"] if asked.json()["no_answer"] else ["should_refuse", "wrong", "answered"]
    )
    passed = 0
    for i in range(90):  # a minute's worth passes at once, then the bucket refills at 1 per 2 s
        v = verdicts[i % len(verdicts)]
        body = {"query_id": qid, "verdict": v} | ({"source": 1} if v == "answered" else {})
        r = matrix.post("flood", "/feedback", body)
        if r.status_code != 200:
            break
        passed, last = passed + 1, v
    assert passed >= 30, r.text
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"].startswith("too many verdicts: at most RAG_FEEDBACK_PER_MINUTE=30")
    entry = matrix.get("admin", f"/log/{qid}").json()
    assert [(h["caller"], h["verdict"]) for h in entry["history"]] == [("flood", last)]
    after = matrix.get("admin", "/status").json()["query_log"]["calibration"]
    assert after == before  # recorded, shown for review, but no weight on the shared cut


def test_a_tokens_status_never_names_a_hidden_link_target(tmp_path, real_embedder):
    """Issue 43: skip reasons of links named the hidden file or folder they point to
    (`symbolic link to secret/target.md, which is indexed as secret/target.md`)."""
    from rag_assets.serve.access import LINK_REASON, Caller, restricted_status
    from rag_assets.serve.status import status_report
    from rag_assets.settings import Settings

    docs = tmp_path / "docs"
    (docs / "secret").mkdir(parents=True)
    (docs / "public").mkdir()
    (docs / ".ragmeta").write_text("secret/** access=secret\n")
    (docs / "secret" / "target.md").write_text("# Target\n\nThe walrus budget is hidden.\n")
    (docs / "public" / "notice.md").write_text("# Notice\n\nThe cafeteria opens at eight.\n")
    (docs / "public" / "link.md").symlink_to("../secret/target.md")
    (docs / "public" / "folder").symlink_to("../secret", target_is_directory=True)
    index_folder(docs, tmp_path / "index", strategy("E"), real_embedder)
    report = status_report(Settings.from_env({"RAG_INDEX_URI": str(tmp_path / "index")}))
    reasons = {r["document"]: r["reason"] for r in report["documents"]["skipped"]}
    assert "secret/target.md" in reasons["public/link.md"]  # the administrator sees it all
    index = Index.open(tmp_path / "index", embedder=real_embedder)
    shown = restricted_status(report, index, Caller("t", frozenset({"other"})))
    text = json.dumps(shown)
    assert "secret" not in text and "walrus" not in text, text
    assert {r["document"]: r["reason"] for r in shown["documents"]["skipped"]} == {
        "public/folder": LINK_REASON,
        "public/link.md": LINK_REASON,
    }
    listed = {r["document"]: r["reason"] for r in shown["documents"]["list"]}
    assert listed["public/link.md"] == LINK_REASON


def test_healthz_without_a_token_shows_no_refusal_cut(matrix):
    """Issue 43: the cut is calibrated on every document, hidden ones included."""
    health = httpx.get(matrix.url + "/healthz", timeout=60).json()
    assert health["ok"] and "threshold" not in health
    assert "threshold" in matrix.get("admin", "/status").json()["published"]


def test_group_tokens_answers_and_status_show_no_refusal_cut(matrix):
    """Issue 43's weak case: the cut is calibrated on every document, hidden ones included; a
    group token's /ask (answered or refused) and /status do not show its number, the
    administrator's do."""
    refused_q = "What is the boiling point of tungsten in kelvin?"
    cut = matrix.post("admin", "/ask", {"question": refused_q}).json()["threshold"]
    shown = f"{cut:g}"  # the published cut, or the default one of an index never evaluated
    for who in ("hr", "admin"):
        answered = matrix.post(
            who, "/ask", {"question": f"What about the {PHRASES['public/notice.md']}?"}
        )
        refused = matrix.post(who, "/ask", {"question": refused_q, "show_nearest": True})
        status = matrix.get(who, "/status").json()
        assert answered.json()["no_answer"] is False and refused.json()["no_answer"] is True
        texts = [refused.json()[k] for k in ("reason", "message", "closeness")]
        if who == "admin":
            assert answered.json()["threshold"] == cut == refused.json()["threshold"]
            assert all(shown in t for t in texts) and "threshold" in status["published"]
        else:
            assert answered.json()["threshold"] is None and refused.json()["threshold"] is None
            assert not any(shown in t for t in texts), texts
            assert all(n["over_cut"] is None for n in refused.json()["nearest"])
            assert not any(k.startswith("threshold") for k in status["published"]), status


def test_log_gaps_counts_refusals_caused_by_access_apart(matrix):
    """Issue 43: a group token's question refused because the answer is in documents it may not
    see is no content gap: `log gaps` (the administrator's, offline) asks the published index
    again without the token's access filter and counts those apart; a question nobody's
    documents answer stays a gap."""
    hidden_q = "What does the wombat revenue forecast predict for next quarter?"
    gap_q = "How many moons does the planet Neptune have?"
    asked = matrix.post("hr", "/ask", {"question": hidden_q}).json()
    assert asked["no_answer"] is True  # hr may not see finance/forecast.md
    assert matrix.post("fin", "/ask", {"question": gap_q}).json()["no_answer"] is True
    assert matrix.post("admin", "/ask", {"question": hidden_q}).json()["no_answer"] is False
    env = matrix.env | {"RAG_API_TOKEN": ADMIN}
    deadline = 30.0
    start = time.monotonic()
    while True:  # the service's writer lands the entries within a second or two
        out = _cli(env, "log", "gaps", "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        listed = [q["question"] for g in report["groups"] for q in g["questions"]]
        if gap_q in listed or time.monotonic() - start > deadline:
            break
        time.sleep(1)
    assert gap_q in listed, listed
    assert hidden_q not in listed and report["refused_for_access"] >= 1, report
    md = _cli(env, "log", "gaps")
    assert md.returncode == 0 and "Refused for access: " in md.stdout
    assert hidden_q not in md.stdout and gap_q in md.stdout
