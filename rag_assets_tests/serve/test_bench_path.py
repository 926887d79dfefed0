"""``python -m rag_assets.bench.speed path`` (issue 40): where an in-process ``/search`` goes,
on the served sample index, with the citing caches swapped in and out of the same process."""

from __future__ import annotations

import pytest

from rag_assets.bench.speed import run_search_path
from rag_assets.lib.query import cite
from rag_assets.settings import Settings

pytestmark = pytest.mark.slow


def test_the_search_path_bench_times_each_stage_and_restores_the_caches(served):
    cite._stems.cache_clear()
    settings = Settings.from_env(served.env() | {"RAG_QUERY_LOG": "off"})
    out, text = run_search_path(settings, None, n=6)
    assert out["queries"] == 6
    assert out["search_ms"]["cached"]["n"] == out["search_ms"]["uncached"]["n"] == 6
    stages = out["stages_p50_ms"]
    assert {"embed", "dense", "bm25", "fuse", "citing, JSON (the rest)"} <= set(stages)
    assert all(v >= 0 for v in stages.values()) and stages["embed"] > 0
    # the process is left with the caches it had, and the cached side filled them
    assert hasattr(cite._stems, "cache_info") and hasattr(cite._file_uri, "cache_info")
    assert cite._stems.cache_info().currsize > 0
    assert "citing caches cached" in text and "uncached" in text


def test_cited_paths_and_stems_are_the_same_with_and_without_the_caches(tmp_path, monkeypatch):
    """The caches change nothing but the time: a relative path resolves against the working
    directory of the call (the cache is keyed by it), a sentence's stems are its stems."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = cite.document_url("x.md", None, "x.md")
    monkeypatch.chdir(tmp_path / "b")
    second = cite.document_url("x.md", None, "x.md")
    assert first.endswith("/a/x.md") and second.endswith("/b/x.md")
    assert second == cite._file_uri.__wrapped__("x.md", str(tmp_path / "b"))
    text = "Keepers keep the tokenizers' caches"
    assert (
        cite._stems(text)
        == cite._stems.__wrapped__(text)
        == ("keeper", "keep", "the", "tokenizer", "cache")
    )
