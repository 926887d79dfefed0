"""Shared tier: the real course corpus and the real PDFs (needs ../shared; present in CI).

Every course-dev question's citations quote the file text at their offsets; the PDF needles'
citations point at the right page.
"""

from __future__ import annotations

import pytest

from rag_assets.lib.evaluate.questions import load_needle_set
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.retrieve import Index
from rag_assets.lib.types import normalize_ws
from rag_assets_tests.helpers import SHARED, needs_shared

pytestmark = [pytest.mark.shared, needs_shared]


@pytest.fixture(scope="module")
def course_index(tmp_path_factory, real_embedder):
    root = tmp_path_factory.mktemp("course")
    index_folder(SHARED / "corpus" / "course", root / "index", strategy("E"), real_embedder)
    return Index.open(root / "index", embedder=real_embedder, distance_cut=0.675)


def test_course_citations_quote_the_file_at_their_offsets(course_index):
    qset = load_needle_set(SHARED / "eval" / "course-dev")
    files = {
        p.name: p.read_text(encoding="utf-8") for p in (SHARED / "corpus" / "course").glob("*.md")
    }
    answered = found = 0
    for q in qset.questions:
        for text in q.queries.values():
            ctx = course_index.ask(text, rerank=False)
            answered += not ctx.no_answer
            for c in ctx.citations:
                assert files[c.document_id][c.start : c.end] == c.quote
                assert c.fragment == f"#char={c.start},{c.end}" and c.url.endswith(c.fragment)
            found += any(q.needle in c.quote for c in ctx.citations)
    assert answered >= 48 and found >= 40  # of 64 queries, at the default cut 0.675


def test_pdf_needles_cite_their_page(tmp_path, real_embedder):
    index_folder(SHARED / "corpus" / "pdf", tmp_path / "index", strategy("E"), real_embedder)
    index = Index.open(tmp_path / "index", embedder=real_embedder, distance_cut=2.0)
    qset = load_needle_set(SHARED / "eval" / "pdf-dev")
    from rag_assets.lib.evaluate.verify_eval import index_detection  # issue 50, on the PDFs

    det = index_detection(index, qset.questions)
    assert det["originals"]["total"] >= 10 and det["originals"]["rate"] >= 0.95
    assert det["changed"]["rate"] >= 0.9
    cited = 0
    for q in qset.questions:
        hits = index.search(q.queries["course"], "hybrid", k=20)
        needle = normalize_ws(q.needle)
        hit = next((h for h in hits if needle in normalize_ws(h.content)), None)
        if hit is None:
            continue
        assert hit.page == q.page, q.id
        ctx = index.ask(q.queries["course"], rerank=False)
        for c in ctx.citations:  # the folder's README.md is text: it cites #char=
            pdf = c.document_id.endswith(".pdf")
            assert c.fragment == (f"#page={c.page}" if pdf else f"#char={c.start},{c.end}")
            if c.document_id == q.document and needle in normalize_ws(c.quote):
                assert c.page == q.page
                cited += 1
    assert cited >= 6  # of 12 needles cited within the top 4


def test_the_answer_verifier_on_course_dev(course_index):
    """Issue 50: each course-dev needle cited with its chunk is supported; each change of it (a
    number, a negation, a swapped term, another document's needle) is flagged (the issue's goals:
    >= 95 % and >= 90 %; docs/measurements.md has the figures)."""
    from rag_assets.lib.evaluate.verify_eval import index_detection

    qset = load_needle_set(SHARED / "eval" / "course-dev")
    det = index_detection(course_index, qset.questions)
    assert det["originals"]["total"] >= 30 and det["originals"]["rate"] >= 0.95
    for kind in ("negation", "term", "elsewhere", "changed"):
        assert det[kind]["rate"] >= 0.9, (kind, det[kind])
    assert det["number"]["total"] >= 5 and det["number"]["rate"] >= 0.9
