"""The query side on a real index of the sample corpus with the real model."""

from __future__ import annotations

import json

import pytest

from rag_assets.lib.evaluate.questions import load_needle_set
from rag_assets.lib.index.embed import Embedder, resolve_model
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore, StampMismatch
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.retrieve import Index
from rag_assets_tests.helpers import SAMPLE_EVAL


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory, real_embedder):
    import shutil

    from rag_assets_tests.helpers import SAMPLE_DOCS

    root = tmp_path_factory.mktemp("retrieve")
    docs = root / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    index_folder(docs, root / "index", strategy("E"), real_embedder)
    return Index.open(root / "index", embedder=real_embedder)


@pytest.fixture(scope="module")
def qset():
    return load_needle_set(SAMPLE_EVAL)


def _rank(hits, needle):
    return next((h.rank for h in hits if needle in h.content), None)


@pytest.mark.parametrize("retriever", ["dense", "bm25", "hybrid"])
def test_each_retriever_finds_most_needles(sample_index, qset, retriever):
    ranks = [
        _rank(sample_index.search(q.queries["course"], retriever, k=8), q.needle)
        for q in qset.questions
    ]
    found = sum(r is not None for r in ranks)
    assert found >= 0.6 * len(ranks), ranks


def test_hits_carry_distances_stamps_and_exact_offsets(sample_index):
    hits = sample_index.search("How are chunks cut at paragraph boundaries?", "hybrid", k=10)
    assert [h.rank for h in hits] == list(range(1, 11))
    docs = sample_index.documents
    for h in hits:
        assert 0.0 <= h.cosine_distance <= 2.0
        assert docs[h.document_id]["text"][h.start : h.end] == h.content
        assert h.stamps["model"] == "sentence-transformers/all-MiniLM-L6-v2"
        assert h.stamps["table"] == sample_index.published.table
    dense = sample_index.search("How are chunks cut at paragraph boundaries?", "dense", k=10)
    assert [h.cosine_distance for h in dense] == sorted(h.cosine_distance for h in dense)


def test_search_is_deterministic(sample_index):
    q = "what happens when a document fails extraction"
    a = [h.chunk_id for h in sample_index.search(q, "hybrid")]
    assert a == [h.chunk_id for h in sample_index.search(q, "hybrid")]


def test_ask_cites_verified_quotes_and_refuses_off_topic(sample_index, qset):
    q = qset.questions[0]
    ctx = sample_index.ask(q.queries["course"], rerank=False)
    assert not ctx.no_answer and 1 <= len(ctx.citations) <= 4
    docs = sample_index.documents
    for c in ctx.citations:
        assert c.quote == docs[c.document_id]["text"][c.start : c.end]
        assert c.url.startswith("file://") and c.url.endswith(c.fragment)
        assert c.cosine_distance < ctx.threshold
    off = sample_index.ask("What is a good recipe for sourdough bread with a crispy crust?")
    assert off.no_answer and off.citations == [] and off.prompt == ""
    assert "NO ANSWER" in off.message


def test_query_model_must_match_the_tables_stamps(sample_index, second_model_dir):
    other = Embedder(resolve_model(str(second_model_dir)))
    with pytest.raises(StampMismatch) as err:
        Index(sample_index.store, sample_index.published, other)
    msg = str(err.value)
    assert "all-MiniLM-L6-v2" in msg and "minilm-maxpool" in msg


def test_rerank_without_model_says_so(sample_index):
    assert sample_index.reranker is None
    with pytest.raises(RuntimeError, match="rerank: no model configured"):
        sample_index.search("anything", "rerank")


def test_open_without_published_index_is_a_clear_error(tmp_path):
    IndexStore(tmp_path)
    with pytest.raises(FileNotFoundError, match="rag-assets index"):
        Index.open(tmp_path)


def test_eval_json_shape(sample_index, qset):
    from rag_assets.lib.evaluate.evaluate import evaluate_needles

    res, refusal = evaluate_needles(sample_index, qset, strategy="E")  # rerank asked, absent
    json.dumps(res)
    assert res["needles"] == len(qset.questions) and res["destroyed"] == 0
    for name in ("dense", "bm25", "hybrid"):
        r = res["retrievers"][name]
        assert set(r) >= {"recall@1", "recall@4", "recall@8", "recall@20", "mrr", "ranks"}
        lo, hi = r["recall@4"]["ci95"]
        assert lo <= r["recall@4"]["value"] <= hi
        assert len(r["ranks"]) == 2 * len(qset.questions)
    assert {(p["a"], p["b"]) for p in res["paired"]} == {
        ("dense", "bm25"),
        ("dense", "hybrid"),
        ("bm25", "hybrid"),
    }
    assert refusal is not None and res["refusal"]["out_of_domain"] == len(qset.out_of_domain)
    assert "rerank: no model configured" in res["notes"]


def test_rerank_reorders_the_shortlist_with_a_trained_cross_encoder(
    tmp_path, real_embedder, tiny_cross_encoder
):
    from rag_assets.lib.query.rerank import Reranker
    from rag_assets_tests.lib.tiny_cross_encoder import TOPICS

    docs = tmp_path / "docs"
    docs.mkdir()
    paras = [" ".join(words[6:] + words[:1]) for words in TOPICS.values()]
    paras += [f"no {topic} here" for topic in TOPICS]  # lexical decoys: hybrid ranks them first
    (docs / "topics.md").write_text("# Topics\n\n" + "\n\n".join(paras) + "\n")
    index_folder(docs, tmp_path / "index", strategy("C", 20), real_embedder)
    index = Index.open(
        tmp_path / "index", embedder=real_embedder, reranker=Reranker(str(tiny_cross_encoder))
    )
    for topic, words in TOPICS.items():
        assert index.search(topic, "hybrid", k=1)[0].content == f"no {topic} here"
        hits = index.search(topic, "rerank", k=5)
        assert hits[0].content == " ".join(words[6:] + words[:1]), topic
        scores = [h.rerank_score for h in hits]
        assert all(s is not None for s in scores) and scores == sorted(scores, reverse=True)
    ctx = index.ask("music", rerank=True)
    assert ctx.citations and ctx.citations[0].rerank_score is not None
