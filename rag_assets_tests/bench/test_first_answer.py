"""Issue 51: ``rag-assets bench --first-answer`` on something tiny (its figures are the lead's, on
a quiet machine): a fresh ``rag-assets index`` process on a fresh index, timed to its first
publish and its end, with the index's version and the exit status it saw; the small case is the
folder's first N files, copied."""

from __future__ import annotations

import pytest

from rag_assets.bench.first_answer import cases, run_first_answer_bench
from rag_assets_tests.helpers import copy_docs


def test_the_cases_are_the_folder_and_its_first_n_files(tmp_path):
    docs = copy_docs(tmp_path / "docs", "0[123]*.md")
    listed = cases(docs, [2, 5])  # 5 is not fewer than the folder's 3: no such case
    assert [(label, None if s is None else [p.name for p in s]) for label, s in listed] == [
        (f"{docs} (all 3 files)", None),
        (f"{docs} (first 2 files)", ["01-pipeline-overview.md", "02-chunking-strategies.md"]),
    ]


@pytest.mark.slow
def test_the_bench_times_a_fresh_index_to_its_first_publish(tmp_path, monkeypatch):
    docs = copy_docs(tmp_path / "docs", "0[12]*.md")
    monkeypatch.setenv("RAG_ADAPT", "off")  # nothing to train: the first publish is the end
    monkeypatch.setenv("RAG_EVAL_DIR", str(tmp_path / "no-eval"))
    out, text = run_first_answer_bench(docs, files=[])  # one case: one fresh process
    (row,) = out["rows"]
    assert row["files"] == 2 and row["exit"] == 0 and row["error"] == ""
    assert row["versions"] == [1] and row["adapted_publish_s"] is None
    assert 0 < row["first_publish_s"] == row["end_s"]
    assert text.splitlines()[1].startswith(f"  {docs} (all 2 files): first publish ")
    assert "no adapted table (end " in text and "exit 0, versions [1]" in text
    assert list(tmp_path.iterdir()) == [docs]  # the case's index lived in a folder now gone
