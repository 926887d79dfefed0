"""Chunker on the real course corpus (../shared): span invariant, destroyed needles, speed."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rag_assets.lib.ingest.chunk import PRESETS, chunk_documents, strategy
from rag_assets.lib.types import Chunk, ExtractedDocument
from rag_assets_tests.lib.ingest.test_chunk import local_headings, make_doc

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared"
COURSE = SHARED / "corpus" / "course"
QUESTIONS = SHARED / "eval" / "course-dev" / "questions.jsonl"

pytestmark = [
    pytest.mark.shared,
    pytest.mark.skipif(not COURSE.is_dir(), reason="needs ../shared/corpus/course"),
]

try:  # the extractor's own heading finder when it is there, else the test's helper
    from rag_assets.lib.ingest.extract import markdown_headings as find_headings
except ImportError:  # pragma: no cover - extract.py is written in parallel
    find_headings = local_headings


def course_docs() -> list[ExtractedDocument]:
    """The course lessons as the Markdown extractor canonicalises them."""
    docs = []
    for path in sorted(COURSE.glob("*.md")):
        if path.name == "README.md":
            continue
        text = path.read_bytes().decode("utf-8").removeprefix("\ufeff")
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        doc = make_doc(text, path.name, find_headings(text))
        docs.append(replace(doc, title=doc.title or path.stem, path=str(path)))
    return docs


def destroyed_needles(chunks: list[Chunk], needles: list[dict]) -> list[str]:
    """Ids of needles contained whole in no chunk ``content`` of their document."""
    by_doc: dict[str, list[str]] = {}
    for c in chunks:
        by_doc.setdefault(c.document_id, []).append(c.content)
    return [
        q["id"]
        for q in needles
        if not any(q["needle"] in content for content in by_doc.get(q["document"], []))
    ]


def test_course_corpus_all_presets():
    docs = course_docs()
    assert len(docs) == 14
    assert all(local_headings(d.text) == d.headings for d in docs)  # helper == extractor here
    texts = {d.document_id: d.text for d in docs}
    needles = [json.loads(line) for line in QUESTIONS.read_text("utf-8").splitlines() if line]
    assert needles and all(q["needle"] in texts[q["document"]] for q in needles)
    rows = []
    for name in PRESETS:
        strat = strategy(name, 512)
        t0 = time.perf_counter()
        chunks = chunk_documents(docs, strat)
        seconds = time.perf_counter() - t0
        for c in chunks:
            assert c.content == texts[c.document_id][c.start : c.end]
            assert c.content == c.content.strip() != ""
            assert len(c.content) <= strat.target + strat.overlap
        assert len({c.chunk_id for c in chunks}) == len(chunks)
        destroyed = destroyed_needles(chunks, needles)
        rows.append((name, len(chunks), max(len(c.content) for c in chunks), destroyed, seconds))
        if name in "CE":
            assert destroyed == [], f"{name} destroyed {destroyed}"
    print(f"\n{'strategy':<9}{'chunks':>7}{'max chars':>10}{'destroyed':>10}{'ms':>8}  ids")
    for name, n, longest, destroyed, seconds in rows:
        ids = ",".join(destroyed)
        print(f"{name:<9}{n:>7}{longest:>10}{len(destroyed):>10}{seconds * 1000:>8.1f}  {ids}")
    # blind cutting at 512 does destroy needles on this corpus (what the comparison is about)
    assert len(dict((r[0], r[3]) for r in rows)["A"]) > 0


PDFS = SHARED / "corpus" / "pdf"
PDF_QUESTIONS = SHARED / "eval" / "pdf-dev" / "questions.jsonl"


@pytest.mark.skipif(not PDFS.is_dir(), reason="needs ../shared/corpus/pdf")
def test_pdf_corpus_pages_and_needles():
    extract = pytest.importorskip("rag_assets.lib.ingest.extract")
    docs = [extract.extract_document(p, PDFS) for p in sorted(PDFS.glob("*.pdf"))]
    assert len(docs) == 4 and all(d.ok and d.pages for d in docs)
    texts = {d.document_id: d for d in docs}
    needles = [json.loads(line) for line in PDF_QUESTIONS.read_text("utf-8").splitlines() if line]

    def squash(s: str) -> str:  # PDF lines break where the page did: compare modulo whitespace
        return " ".join(s.split())

    for name in PRESETS:
        chunks = chunk_documents(docs, strategy(name, 512))
        for c in chunks:
            doc = texts[c.document_id]
            assert c.content == doc.text[c.start : c.end] and c.content == c.content.strip()
            assert c.page == doc.page_at(c.start) == doc.page_at(c.end - 1)  # one page each
        if name in "CE":
            for q in needles:
                pages = {
                    c.page
                    for c in chunks
                    if c.document_id == q["document"] and squash(q["needle"]) in squash(c.content)
                }
                assert pages == {q["page"]}, (name, q["id"], pages)
