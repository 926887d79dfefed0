"""PDF page text on PDFs rendered here from known text: column reading order, tables as rows."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pymupdf

from rag_assets.lib.ingest.chunk import chunk_document, strategy
from rag_assets.lib.ingest.extract import extract_document
from rag_assets.lib.ingest.formats.pdf_page import page_text
from rag_assets_tests.lib import format_files as ff

LEFT = (
    "The left column tells how the walrus index keeps two copies of every vector on separate "
    "disks. A failed disk is rebuilt from the other copy in under an hour. Readers never wait "
    "for a rebuild because reads go to the healthy copy first."
)
RIGHT = (
    "The right column explains the pelican cache that sits in front of the index. It holds the "
    "answers to the most frequent questions for ten minutes. A stale entry is dropped as soon "
    "as a document it quotes changes."
)


def _collapse(s: str) -> str:
    return " ".join(s.split())


def _two_column_pdf(path: Path, interleaved: bool) -> Path:
    """A title across the page, then two columns; drawn line by line alternating columns
    (``interleaved``, as some producers write them) or one column after the other."""
    doc = pymupdf.open()
    page = doc.new_page()  # A4 portrait, 595 x 842
    page.insert_text((72, 60), "Storage notes for operators", fontsize=16)
    left, right = textwrap.wrap(LEFT, 42), textwrap.wrap(RIGHT, 42)
    y0, step = 100, 13
    if interleaved:
        for i in range(max(len(left), len(right))):
            if i < len(left):
                page.insert_text((50, y0 + i * step), left[i], fontsize=10)
            if i < len(right):
                page.insert_text((315, y0 + i * step), right[i], fontsize=10)
    else:
        for i, line in enumerate(left):
            page.insert_text((50, y0 + i * step), line, fontsize=10)
        for i, line in enumerate(right):
            page.insert_text((315, y0 + i * step), line, fontsize=10)
    doc.save(path)
    return path


def test_interleaved_columns_come_out_in_column_order(tmp_path: Path) -> None:
    path = _two_column_pdf(tmp_path / "cols.pdf", interleaved=True)
    with pymupdf.open(path) as pdf:
        plain = _collapse(pdf[0].get_text())
        got = page_text(pdf[0])
    assert _collapse(LEFT) not in plain  # what get_text() alone gives: lines interleaved
    assert got.segmented and got.tables == 0
    text = _collapse(got.text)
    assert _collapse(LEFT) in text and _collapse(RIGHT) in text
    assert text.index("Storage notes") < text.index("The left") < text.index("The right")
    doc = extract_document(path, tmp_path)
    assert doc.status == "ok" and _collapse(LEFT) in _collapse(doc.text)
    chunks = chunk_document(doc, strategy("E"))
    assert all(doc.text[c.start : c.end] == c.content for c in chunks)
    sentence = "A failed disk is rebuilt from the other copy in under an hour."
    assert any(sentence in _collapse(c.content) for c in chunks)


def test_page_already_in_column_order_is_left_as_get_text_gives_it(tmp_path: Path) -> None:
    path = _two_column_pdf(tmp_path / "cols.pdf", interleaved=False)
    with pymupdf.open(path) as pdf:
        got = page_text(pdf[0])
        assert got.text == pdf[0].get_text() and not got.segmented


HEADER = ff.TABLE_HEADER


def test_table_becomes_self_describing_rows_not_word_soup(tmp_path: Path) -> None:
    path = ff.write_table_pdf(tmp_path)
    with pymupdf.open(path) as pdf:
        assert "teapot" in pdf[0].get_text()  # the cells are text: one word per line
        got = page_text(pdf[0])
        assert got.tables == 1 and got.rows == 3
        assert got.last_headers == list(HEADER)
        lines = got.text.split("\n")
        assert lines[:4] == [
            "Price list of the gift shop.",
            "sku: A1; product: teapot; price: 12",
            "sku: B2; product: marmalade jar; price: 3.5",
            "sku: C3; product: walrus mug; price: 9",
        ]
        assert "Prices include the walrus tax." in lines
        assert got.text.count("teapot") == 1 and got.text.count("marmalade") == 1
        assert "\nsku\n" not in got.text and "\nproduct\n" not in got.text
        # the continuation on page 2 has no header row: it takes page 1's names
        nxt = page_text(pdf[1], got.last_headers)
        assert nxt.text.split("\n")[:2] == [
            "sku: D4; product: pelican scarf; price: 20",
            "sku: E5; product: tea towel; price: 4",
        ]
        alone = page_text(pdf[1])  # without it, the first row is the header (PyMuPDF's guess)
        assert alone.text.split("\n")[0] == "D4: E5; pelican scarf: tea towel; 20: 4"
    doc = extract_document(path, tmp_path)
    assert doc.status == "ok" and doc.pages == 2
    start = doc.text.index("sku: B2")
    assert doc.page_at(start) == 1
    start = doc.text.index("sku: E5; product: tea towel")
    assert doc.page_at(start) == 2
    chunks = chunk_document(doc, strategy("E"))
    assert all(doc.text[c.start : c.end] == c.content for c in chunks)
    assert any("sku: B2; product: marmalade jar; price: 3.5" in c.content for c in chunks)


def test_boxed_paragraph_is_not_taken_for_a_table(tmp_path: Path) -> None:
    doc = pymupdf.open()
    page = doc.new_page()
    para = "A framed note: always back up the walrus index before an upgrade of the server."
    page.insert_textbox(pymupdf.Rect(72, 72, 520, 140), para, fontsize=11)
    page.draw_rect(pymupdf.Rect(68, 68, 524, 144))
    page.draw_line((68, 106), (524, 106))  # a rule through the box makes a 2-row "grid"
    page.draw_line((296, 68), (296, 144))
    path = tmp_path / "note.pdf"
    doc.save(path)
    with pymupdf.open(path) as pdf:
        got = page_text(pdf[0])
        assert got.tables == 0 and got.text == pdf[0].get_text()
