"""Reranking by a ``/rerank`` server (issue 35), against a real local HTTP server that implements
the protocol over the tests' tiny cross-encoder (no trained reranker weights exist offline), in
the text-embeddings-inference shape and the Cohere/Jina/llama.cpp one: the scores are the
cross-encoder's, recorded on the hits as the local reranker's are; a failing or slow server
leaves the hybrid order with a note and a counter, and never fails the query."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rag_assets.lib.index.endpoint import connect
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.rerank import Reranker, load_reranker
from rag_assets.lib.query.rerank_http import HttpReranker, rerank_endpoint, take_note
from rag_assets.lib.query.retrieve import Index
from rag_assets_tests.model_servers import (
    EmbeddingServer,
    RerankServer,
    direct_to_local_servers,  # noqa: F401 (autouse)
)

KEY = "sk-rerank-0123456789abcdef"
QUERY = "animal"
PASSAGES = ["mango peach apple", "eagle snake tiger", "flute melody piano", "grape lemon"]


@pytest.mark.parametrize("shape", ["cohere", "tei"])
def test_scores_are_the_cross_encoders_in_either_protocol(tiny_cross_encoder, shape):
    local = Reranker(str(tiny_cross_encoder))
    with RerankServer(str(tiny_cross_encoder), shape=shape, api_key=KEY) as srv:
        remote = HttpReranker(srv.url, api_key=KEY, model="tiny-ce", timeout=30)
        scores = remote.score(QUERY, PASSAGES)
        assert scores == pytest.approx(local.score(QUERY, PASSAGES), abs=1e-5)
        ranked = remote.rerank(QUERY, PASSAGES, text_of=str)
        assert ranked[0][0] == "eagle snake tiger" and take_note(remote) is None
        bodies = [r["body"] for r in srv.requests]
        assert all(r["auth"] == f"Bearer {KEY}" for r in srv.requests)
        if shape == "tei":  # asked for "documents" once, told "texts", remembered it
            assert [("texts" in b) for b in bodies] == [False, True, True]
        else:
            assert all(b["documents"] == PASSAGES and b["model"] == "tiny-ce" for b in bodies)
        assert remote.status()["fallbacks"] == 0 and remote.status()["requests"] == 2


def test_a_failing_or_slow_reranker_keeps_the_order_with_a_note_and_a_counter(
    tiny_cross_encoder,
):
    with RerankServer(str(tiny_cross_encoder), api_key=KEY) as srv:
        remote = HttpReranker(srv.url + "/rerank", api_key=KEY, timeout=1.0, retries=1)
        srv.fail.extend([("500", 0), ("500", 0)])
        kept = remote.rerank(QUERY, PASSAGES, text_of=str)
        assert kept == [(p, None) for p in PASSAGES]  # the order given, unscored
        note = take_note(remote)
        assert note and "rerank skipped, hybrid order kept" in note and "HTTP 500" in note
        assert take_note(remote) is None  # taken once
        srv.fail.append(("500", 0))  # once: the retry succeeds
        assert remote.rerank(QUERY, PASSAGES, text_of=str)[0][1] is not None
        srv.delay = 3.0  # slower than RAG_RERANK_TIMEOUT
        assert remote.rerank(QUERY, PASSAGES, text_of=str)[0] == (PASSAGES[0], None)
        assert "did not answer within RAG_RERANK_TIMEOUT=1 s" in (take_note(remote) or "")
        srv.delay = 0.0
        srv.api_key = "another"  # the server echoes the key it got: scrubbed from the note
        remote.rerank(QUERY, PASSAGES, text_of=str)
        note = take_note(remote) or ""
        assert "HTTP 401" in note and KEY not in note and "***" in note
        status = remote.status()
        assert status["fallbacks"] == 3 and status["retries"].get("500") == 2
        assert KEY not in str(status)


def test_the_setting_selects_the_server_and_its_depth():
    r = load_reranker("bge-reranker", rerank_url="http://127.0.0.1:9/v1", depth=7)
    assert isinstance(r, HttpReranker) and r.depth == 7 and r.model == "bge-reranker"
    assert rerank_endpoint("https://api.cohere.com/v2/rerank").endswith("/v2/rerank")
    assert rerank_endpoint("http://h:8/v1/") == "http://h:8/v1/rerank"
    with pytest.raises(ValueError, match="RAG_RERANK_TIMEOUT"):
        HttpReranker("http://127.0.0.1:9", timeout=0)


def test_search_records_remote_scores_and_degrades_to_the_hybrid_order(
    tiny_cross_encoder, tmp_path
):
    docs = tmp_path / "docs"
    docs.mkdir()
    topics = {
        "animals.md": "# Animals\n\neagle snake tiger\n",
        "fruit.md": "# Fruit\n\nmango peach apple\n",
        "music.md": "# Music\n\nflute melody piano\n",
    }
    for name, text in topics.items():
        (docs / name).write_text(text)
    with EmbeddingServer() as emb_srv, RerankServer(str(tiny_cross_encoder)) as srv:
        from rag_assets.lib.index.endpoint import EndpointConfig

        embedder = connect(replace(EndpointConfig(url=emb_srv.url + "/v1")))
        built = index_folder(docs, tmp_path / "index", strategy("E", 512), embedder)
        remote = HttpReranker(srv.url, depth=3, timeout=30)
        index = Index.open(tmp_path / "index", embedder=embedder, reranker=remote)
        hybrid = index.search("animal", "hybrid", k=3)
        hits = index.search("animal", "rerank", k=3)
        assert [h.retriever for h in hits] == ["rerank"] * 3
        local = Reranker(str(tiny_cross_encoder)).score("animal", [h.text for h in hits])
        assert [h.rerank_score for h in hits] == pytest.approx(local, abs=1e-5)
        assert local == sorted(local, reverse=True)  # in the server's order of its scores
        assert {h.chunk_id for h in hits} == {h.chunk_id for h in hybrid}  # the hybrid top 3
        srv.fail.extend([("500", 0)] * 2)
        degraded = index.search("animal", "rerank", k=3)
        assert [(h.chunk_id, h.retriever, h.rerank_score) for h in degraded] == [
            (h.chunk_id, "hybrid", None) for h in hybrid
        ]
        assert [h.score for h in degraded] == [h.score for h in hybrid]
        assert "HTTP 500" in (take_note(index.reranker) or "")
        ctx = index.ask("animal")  # ask goes on too
        assert ctx.citations or ctx.no_answer
        assert built.entry.stamps.revision == embedder.spec.revision


def test_a_bad_rerank_reply_names_what_is_wrong_with_it():
    """Issue 43: indices out of range are listed as such (the wrong passages were listed), and
    a NaN or Infinity score is a failed rerank, not a ranking."""
    from rag_assets.lib.query.rerank_http import RerankUnavailable

    r = HttpReranker("http://127.0.0.1:9")
    reply = {"results": [{"index": 0, "relevance_score": 1.0}, {"index": 5, "relevance_score": 2}]}
    with pytest.raises(RerankUnavailable, match=r"out of range: \[5\], missing: \[1, 2\]"):
        r._scores(reply, 3)
    for bad in (float("nan"), float("inf")):
        reply = {"results": [{"index": 0, "relevance_score": bad}, {"index": 1, "score": 0.5}]}
        with pytest.raises(RerankUnavailable, match="non-finite score"):
            r._scores(reply, 2)
