"""Issue 51: ``rag-assets bench --first-answer`` on something tiny (its figures are the lead's, on
a quiet machine): a fresh ``rag-assets index`` process on a fresh index, timed to its first
publish and its end, with the index's version and the exit status it saw."""

from __future__ import annotations

import pytest

from rag_assets.bench.first_answer import run_first_answer_bench
from rag_assets_tests.helpers import copy_docs

pytestmark = pytest.mark.slow


def test_the_bench_times_a_fresh_index_to_its_first_publish(tmp_path, monkeypatch):
    docs = copy_docs(tmp_path / "docs", "0[12]*.md")
    monkeypatch.setenv("RAG_ADAPT", "off")  # nothing to train: the first publish is the end
    monkeypatch.setenv("RAG_EVAL_DIR", str(tmp_path / "no-eval"))
    out, text = run_first_answer_bench(docs, files=[1])
    first, small = out["rows"]
    assert (first["files"], small["files"]) == (2, 1)
    for row in (first, small):
        assert row["exit"] == 0 and row["error"] == "" and row["versions"] == [1]
        assert 0 < row["first_publish_s"] == row["end_s"] and row["adapted_publish_s"] is None
    assert text.splitlines()[1].startswith(f"  {docs} (all 2 files): first publish ")
    assert "no adapted table (end " in text and "exit 0, versions [1]" in text
    assert list(tmp_path.iterdir()) == [docs]  # each case's index lived in a folder now gone
