"""The service applies the CLI's query settings, and serves ONNX query vectors on request.

A second real ``rag-assets serve`` process runs with ``RAG_FUSION=dense`` and the answer check
(``RAG_ANSWER_CHECK=llm``) against a deterministic loopback chat server; its ``/ask`` JSON must
equal ``rag-assets ask --json`` under the same settings. The query rewriter and the ONNX query
encoder are checked in-process on the same published index.
"""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from urllib.parse import urlsplit

import httpx
import pytest

from rag_assets.lib.query.judge import PASSAGE_SYSTEM
from rag_assets.lib.query.rewrite import SYSTEM_PROMPT as REWRITE_SYSTEM
from rag_assets.settings import Settings
from rag_assets_tests.helpers import start_server
from rag_assets_tests.lib.fake_llm import fake_llm, user_text

pytestmark = pytest.mark.slow

QUESTION = "How do I roll back to the previous embedding model?"
REWRITE = "Roll back with rag-assets rollback: it points published.json at the previous table."


def _chat(body):
    """Judge: yes when the passage mentions rollback; rewriter: a fixed passage; else an answer."""
    system = body["messages"][0]["content"]
    if system == PASSAGE_SYSTEM:
        yes = 0.9 if "roll" in user_text(body).split("Passage:")[-1].lower() else 0.05
        return ("Yes" if yes > 0.5 else "No"), {"Yes": yes, "No": 1 - yes}
    if system == REWRITE_SYSTEM:
        return REWRITE, None
    return "Run `rag-assets rollback` [1].", None


def _cli(monkeypatch, capsys, env, *argv):
    from rag_assets.cli import main

    for var, value in env.items():
        if var.startswith("RAG_"):
            monkeypatch.setenv(var, value)
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _strip_urls(out):
    """The answer without what differs by where it was asked: the links (their host) and the
    query log entry's id (each ask is its own entry, issue 33)."""
    for c in out["citations"]:
        c.pop("url")
    assert out.pop("query_id")  # both logged
    return out


def _with_llm(served, llm_url: str, tmp_path, **settings: str) -> dict[str, str]:
    """The served index's environment with the fake LLM, ``settings`` and its own work folder
    (its own LLM cache)."""
    llm = {"RAG_LLM_URL": llm_url, "RAG_LLM_MODEL": "fake-model"}
    return served.env() | settings | llm | {"RAG_WORK_DIR": str(tmp_path / "work")}


def test_fusion_and_the_answer_check_apply_over_http_as_in_the_cli(
    served, tmp_path, monkeypatch, capsys
):
    with fake_llm(_chat) as (llm_url, seen):
        env = _with_llm(served, llm_url, tmp_path, RAG_FUSION="dense", RAG_ANSWER_CHECK="llm")
        env.pop("RAG_API_TOKEN", None)
        url, proc = start_server(served.index, env, tmp_path / "serve.log")
        try:
            with httpx.Client(base_url=url, timeout=120) as c:
                http_ask = c.post("/ask", json={"question": QUESTION}).json()
                hybrid = c.get("/search", params={"q": "stale assets", "k": 8}).json()
                dense = c.get("/search", params={"q": "stale assets", "retriever": "dense", "k": 8})
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        judged = sum(1 for b in seen if b["messages"][0]["content"] == PASSAGE_SYSTEM)
        cli_ask = _cli(monkeypatch, capsys, env, "ask", QUESTION, "--json")
    # RAG_FUSION=dense: "hybrid" is the dense ranking itself
    assert [h["chunk_id"] for h in hybrid] == [h["chunk_id"] for h in dense.json()]
    # RAG_ANSWER_CHECK=llm: the judge ran in the service (and answered yes)
    assert judged >= 1 and http_ask["judge"] is not None and http_ask["refused_by"] is None
    assert http_ask["answer"] is not None  # RAG_LLM_URL: the answer was generated
    assert _strip_urls(http_ask) == _strip_urls(cli_ask)


def test_rewriter_applies_in_the_service_as_in_the_cli(served, tmp_path, monkeypatch, capsys):
    from rag_assets.serve.service import Service

    with fake_llm(_chat) as (llm_url, seen):
        env = _with_llm(
            served, llm_url, tmp_path, RAG_FUSION="rrf:dense=2", RAG_QUERY_REWRITE="llm"
        )
        service = Service.open(Settings.from_env(env))
        index = service.index()
        _, svc = service.ask(QUESTION)
        rewrites = sum(1 for b in seen if b["messages"][0]["content"] == REWRITE_SYSTEM)
        cli = _cli(monkeypatch, capsys, env, "ask", QUESTION, "--json")
    assert index.rewriter is not None and index.last_rewrite.text == REWRITE
    assert index.fusion.weights["dense"] == 2
    assert rewrites == 1  # the CLI's run was answered from the shared rewrite cache
    assert _strip_urls(svc) == _strip_urls(cli)


def test_onnx_query_encoder_serves_the_same_rankings(served, tmp_path):
    from rag_assets.serve.service import Service

    settings = Settings.from_env(served.env() | {"RAG_WORK_DIR": str(tmp_path / "work")})
    onnx = Service.open(replace(settings, query_encoder="onnx"))
    assert onnx.health()["query_encoder"] == "onnx"
    index = onnx.index()
    assert index.embedder.query_encoder.manifest["check"]["min_cosine"] >= 0.9999
    assert index.exact_dense is True  # no vector index on the sample table: the numpy scan
    for q in ("stale assets", QUESTION):  # ...ranks as LanceDB's own scan does
        qvec = index.embedder.encode_query(q)
        index.exact_dense = False
        lance = index._dense(qvec, 20)
        index.exact_dense = True
        exact = index._dense(qvec, 20)
        assert [c for c, _ in exact] == [c for c, _ in lance]
        assert [d for _, d in exact] == pytest.approx([d for _, d in lance], abs=1e-6)
    # parity (issue 20: onnx is the default, torch the fallback): torch-embedded queries, and
    # the running server's own default, rank and measure alike
    torch = Service.open(replace(settings, query_encoder="torch"))
    assert torch.health()["query_encoder"] == "torch"
    assert torch.index().embedder.query_encoder is None
    with served.client() as c:
        for q in ("stale assets", QUESTION):
            _, want = torch.search(q, "hybrid", 10)
            served_hits = c.get("/search", params={"q": q, "k": 10}).json()
            _, got = onnx.search(q, "hybrid", 10)
            for other in (want, served_hits):
                assert [h["chunk_id"] for h in got] == [h["chunk_id"] for h in other]
                assert [h["cosine_distance"] for h in got] == pytest.approx(
                    [h["cosine_distance"] for h in other], abs=1e-4
                )


def test_a_url_too_long_for_the_parser_gets_the_json_400(served):
    """A 100 k-character ``GET /search?q=`` (httpx will not send it: a raw socket does)."""
    parts = urlsplit(served.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(
            b"GET /search?q=" + b"y" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer " + served.token.encode() + b"\r\n\r\n"
        )
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:  # the server closes while the rest is still in flight
            pass
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), data[:300]
    assert b"content-type: application/json" in head.lower()
    err = json.loads(body)
    assert set(err) == {"error"} and "POST /ask" in err["error"] and "\n" not in err["error"]
    assert served.proc.poll() is None  # the server is still up
