"""Query rewriting: cached per question, fused beside the original with the original ahead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag_assets.lib.models.llm import LLMClient
from rag_assets.lib.query.rewrite import REWRITE_WEIGHT, QueryRewriter, fuse_with_rewrite
from rag_assets_tests.lib.fake_llm import fake_llm, user_text


def _doc_writer(body: dict[str, Any]) -> tuple[str, None]:
    q = user_text(body).split("Question: ", 1)[1].split("\n", 1)[0]
    return f"  The documentation explains {q.lower()}\n in detail. ", None


def test_rewrite_is_cached_per_question(tmp_path: Path) -> None:
    with fake_llm(_doc_writer) as (url, seen):
        rw = QueryRewriter(LLMClient(url, "fake-model"), tmp_path)
        a = rw.rewrite("Why is X slow?")
        assert a.text == "The documentation explains why is x slow? in detail."
        assert not a.cached and len(seen) == 1
        # same question again, even from a new rewriter (a new process): no model call
        b = QueryRewriter(LLMClient(url, "fake-model"), tmp_path).rewrite("Why is X slow?")
        assert b.cached and b.text == a.text and len(seen) == 1
        rw.rewrite("Another question?")
        assert len(seen) == 2
        # another model is another cache entry
        QueryRewriter(LLMClient(url, "other-model"), tmp_path).rewrite("Why is X slow?")
        assert len(seen) == 3
    assert seen[0]["max_tokens"] > 0 and seen[0]["temperature"] == 0.0


def test_original_outranks_the_rewrite() -> None:
    """A chunk first for the original beats one first for the rewrite; agreement wins."""
    original = [["a", "b", "c"], ["a", "c", "b"]]
    rewritten = [["x", "b", "a"], ["x", "b", "a"]]
    fused = fuse_with_rewrite(original, rewritten)
    assert REWRITE_WEIGHT < 1
    assert [c for c, _ in fused] == ["a", "b", "c", "x"]  # x: first only for the rewrite
    # at equal weight x (first twice for the rewrite) climbs above c
    eq = [c for c, _ in fuse_with_rewrite(original, rewritten, weight=1.0)]
    assert eq.index("x") < eq.index("c")
    # dense side only: the rewrite's BM25 ranking is dropped
    dense_only = fuse_with_rewrite(original, [["x"], ["y"]], weight=(0.5, 0.0))
    assert "y" not in {c for c, _ in dense_only} and "x" in {c for c, _ in dense_only}
    with pytest.raises(ValueError):
        fuse_with_rewrite(original, rewritten[:1])


def test_rewriter_off_by_default_and_bad_values_name_the_setting() -> None:
    from rag_assets.defs.expansion import query_rewriter
    from rag_assets.settings import Settings

    assert query_rewriter(Settings()) is None
    with pytest.raises(ValueError, match="RAG_QUERY_REWRITE"):
        query_rewriter(Settings(query_rewrite="magic"))
    with pytest.raises(ValueError, match="RAG_LLM_URL"):
        query_rewriter(Settings(query_rewrite="llm"))


@pytest.mark.slow
def test_real_model_rewrites_into_documentation_terms(
    tmp_path: Path, llama_server_small: str
) -> None:
    rw = QueryRewriter(LLMClient(llama_server_small, timeout=600), tmp_path)
    q = "my script downloads the weights again every time I restart it, why?"
    first = rw.rewrite(q)
    assert len(first.text.split()) >= 5 and first.seconds > 0 and not first.cached
    again = rw.rewrite(q)
    assert again.cached and again.text == first.text
