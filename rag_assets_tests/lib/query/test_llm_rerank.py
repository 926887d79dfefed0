"""The LLM reranker: P(yes) per (question, passage) over the hybrid top RAG_RERANK_DEPTH, ties
and the rest in retrieval order; configured by RAG_RERANK_MODEL=llm with RAG_LLM_URL."""

from __future__ import annotations

import pytest

from rag_assets.lib.query.rerank import LLMReranker, RerankerLoadError, load_reranker
from rag_assets_tests.lib.fake_llm import fake_llm, user_text


def _by_keyword(body):
    passage = user_text(body).split("Passage:")[-1]
    p = 0.9 if "rollback" in passage else 0.6 if "publish" in passage else 0.1
    return ("Yes" if p > 0.5 else "No"), {"Yes": p, "No": 1 - p}


def test_orders_by_p_yes_and_keeps_retrieval_order_for_ties(tmp_path):
    items = ["a: unrelated", "b: publish step", "c: also unrelated", "d: the rollback command"]
    with fake_llm(_by_keyword) as (url, seen):
        rr = load_reranker("llm", llm_url=url, depth=4, cache_dir=tmp_path)
        assert isinstance(rr, LLMReranker) and rr.depth == 4
        ranked = rr.rerank("how do I roll back?", items, text_of=lambda s: s)
        assert [x for x, _ in ranked] == [items[3], items[1], items[0], items[2]]  # a before c
        assert [s for _, s in ranked] == pytest.approx([0.9, 0.6, 0.1, 0.1])
        assert len(seen) == 4
        rr.rerank("how do I roll back?", items, text_of=lambda s: s)
        assert len(seen) == 4  # cached on disk
        assert rr.model_name == "llm:fake-model"


def test_configuration_errors_name_the_settings():
    with pytest.raises(RerankerLoadError, match="RAG_LLM_URL"):
        load_reranker("llm")
    with pytest.raises(ValueError, match="RAG_RERANK_DEPTH"):
        LLMReranker(object(), depth=0)
    assert load_reranker("") is None


@pytest.mark.slow
def test_index_search_reranks_only_the_top_depth(tmp_path, real_embedder):
    """A real index of the sample corpus: the reranked shortlist is a permutation of the hybrid
    top ``depth`` and the tail is hybrid order unchanged (deterministic fake model)."""
    import shutil

    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.query.retrieve import Index
    from rag_assets_tests.helpers import SAMPLE_DOCS

    docs = tmp_path / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    index_folder(docs, tmp_path / "index", strategy("E"), real_embedder)

    def by_length(body):
        p = min(0.99, len(user_text(body).split("Passage:")[-1]) / 2000)
        return "Yes", {"Yes": p, "No": 1 - p}

    with fake_llm(by_length) as (url, seen):
        rr = load_reranker("llm", llm_url=url, depth=3, cache_dir=None)
        index = Index.open(tmp_path / "index", embedder=real_embedder, reranker=rr)
        q = "How are chunks cut at paragraph boundaries?"
        hybrid = [h.chunk_id for h in index.search(q, "hybrid", k=8)]
        hits = index.search(q, "rerank", k=8)
        assert len(seen) == 3
        assert sorted(h.chunk_id for h in hits[:3]) == sorted(hybrid[:3])
        assert [h.chunk_id for h in hits[3:]] == hybrid[3:]
        scores = [float(h.rerank_score or 0.0) for h in hits[:3]]
        assert all(h.rerank_score is not None for h in hits[:3])
        assert scores == sorted(scores, reverse=True) and "rerank" in index.timings.stages


@pytest.mark.slow
def test_real_model_puts_the_answering_passage_first(tmp_path, llama_server_small):
    passages = [
        "Bananas are rich in potassium and are often eaten at breakfast.",
        "To roll back, run `rag-assets rollback`; it points published.json at the previous "
        "entry of published-history.jsonl.",
        "The weather in spring is mild with occasional rain showers.",
    ]
    rr = load_reranker("llm", llm_url=llama_server_small, depth=3, cache_dir=tmp_path)
    assert rr is not None
    ranked = rr.rerank("How do I roll back to the previously published index?", passages, str)
    assert ranked[0][0] == passages[1], ranked
    assert ranked[0][1] > max(s for _, s in ranked[1:])
