"""Per-format extraction on small real files: canonical text, offsets, locators, states."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_assets.lib.ingest.chunk import chunk_document, strategy
from rag_assets.lib.ingest.extract import extract_document, extract_folder
from rag_assets.lib.ingest.formats import locate as locate_mod
from rag_assets.lib.ingest.formats import sheets
from rag_assets.lib.ingest.formats.locate import locate, text_fragment
from rag_assets.lib.types import (
    ExtractedDocument,
    Locator,
    locators_from_json,
    locators_to_json,
)
from rag_assets_tests.lib import format_files as ff


def _chunks(doc: ExtractedDocument):
    chunks = chunk_document(doc, strategy("E"))
    for c in chunks:
        assert doc.text[c.start : c.end] == c.content
    return chunks


def _chunk_with(doc: ExtractedDocument, words: str):
    return next(c for c in _chunks(doc) if words in c.content)


def test_vtt_cues_offsets_and_media_fragment(tmp_path: Path) -> None:
    ff.write_vtt(tmp_path)
    result = extract_folder(tmp_path)
    by_id = {d.document_id: d for d in result.documents}
    media = by_id["lecture.mp4"]
    assert media.status == "skipped" and "transcript lecture.vtt" in (media.reason or "")
    doc = by_id["lecture.vtt"]
    assert doc.status == "ok" and doc.kind == "vtt"
    cues = [loc for loc in doc.locators if loc.kind == "cue"]
    assert [doc.text[c.start : c.end] for c in cues] == [
        "Welcome to the lecture on vector indexes.",
        "The walrus index stores every embedding twice, once per disk.",  # <v> tag removed
        "That doubles the storage bill of the walrus index.",
    ]
    assert [(c.t_start, c.t_end) for c in cues] == [(1.0, 4.5), (132.4, 135.0), (135.0, 158.9)]
    start = doc.text.index("The walrus")
    end = start + len("The walrus index stores every embedding twice")
    where = locate(doc.kind, doc.locators, start, end, doc.text[start:end])
    assert where.fragment == "#t=132.4,135" and where.target == "lecture.mp4"
    where = locate(doc.kind, doc.locators, start, len(doc.text), doc.text[start:])
    assert where.fragment == "#t=132.4,158.9" and where.label == "2:12.4–2:38.9"


def test_srt_without_media_links_the_transcript(tmp_path: Path) -> None:
    doc = extract_document(ff.write_srt(tmp_path), tmp_path)
    assert doc.status == "ok" and doc.kind == "srt"
    c = _chunk_with(doc, "pelican")
    where = locate(doc.kind, doc.locators, c.start, c.end, c.content)
    assert where.target is None and where.fragment == "#t=1,67"  # both cues are in the chunk


def test_malformed_vtt_fails_with_reason(tmp_path: Path) -> None:
    (tmp_path / "bad.vtt").write_text("not a transcript\n")
    doc = extract_document(tmp_path / "bad.vtt", tmp_path)
    assert doc.status == "failed" and doc.reason and doc.reason.startswith("malformed VTT")


def test_csv_rows_are_self_describing_with_a1_ranges(tmp_path: Path) -> None:
    doc = extract_document(ff.write_csv(tmp_path), tmp_path)
    assert doc.status == "ok" and [h.title for h in doc.headings] == ["prices"]
    rows = [loc for loc in doc.locators if loc.kind == "row"]
    assert doc.text[rows[1].start : rows[1].end] == "sku: B2; product: marmalade jar; price: 3.5"
    assert [(r.row, r.col_first, r.col_last) for r in rows] == [(2, 1, 3), (3, 1, 3), (4, 1, 3)]
    c = _chunk_with(doc, "marmalade")
    assert "prices\n" not in c.content  # the sheet heading line is not chunk content
    where = locate(doc.kind, doc.locators, c.start, c.end, c.content)
    assert where.fragment == "#prices!A2:C4" and where.label == "prices!A2:C4"
    one = locate(doc.kind, doc.locators, rows[1].start, rows[1].end, "")
    assert one.label == "prices!A3:C3"


def test_xlsx_sheets_formula_values_and_merged_header(tmp_path: Path) -> None:
    doc = extract_document(ff.write_xlsx(tmp_path), tmp_path)
    assert doc.status == "ok", doc.reason
    assert [h.title for h in doc.headings] == ["Budget", "Notes"]
    assert "item: walrus licences; owner: legal; cost: 300; doubled: 600" in doc.text
    assert "topic: audit; note: the auditors visit in March; note: room 4" in doc.text
    rows = {doc.text[r.start : r.end].split(";")[0]: r for r in doc.locators if r.kind == "row"}
    audit = rows["topic: audit"]
    where = locate(doc.kind, doc.locators, audit.start, audit.end, "")
    assert where.label == "Notes!A2:C2"
    walrus = rows["item: walrus licences"]
    assert locate(doc.kind, doc.locators, walrus.start, walrus.end, "").label == "Budget!A3:D3"
    for c in _chunks(doc):  # sheets are sections: no chunk spans two sheets
        assert len({r.sheet for r in doc.locators_at(c.start, c.end, "row")}) == 1


def test_xlsx_over_the_row_limit_is_partial(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sheets, "MAX_ROWS", 3)
    doc = extract_document(ff.write_xlsx(tmp_path, rows=5), tmp_path)
    assert doc.status == "partial" and doc.ok
    assert doc.reason == "sheet 'Budget': rows from 5 on not read (limit 3)"
    assert "filler 0" in doc.text and "filler 1" not in doc.text
    assert "auditors" in doc.text  # the next sheet is still read


def test_a1_range_quotes_sheet_names() -> None:
    assert sheets.a1_range("Sheet1", 12, 19, 1, 6) == "Sheet1!A12:F19"
    assert sheets.a1_range("Q1 plan", 2, 2, 3, 3) == "'Q1 plan'!C2"


def test_html_blocks_sections_and_text_fragment(tmp_path: Path) -> None:
    doc = extract_document(ff.write_html(tmp_path), tmp_path)
    assert doc.status == "ok" and doc.title == "Garden guide"
    assert [(h.level, h.title) for h in doc.headings] == [
        (1, "Garden guide"), (2, "Tomatoes"), (2, "Roses")
    ]  # fmt: skip
    assert "never indexed" not in doc.text and "Home | About" not in doc.text  # script, nav
    assert "garden club" not in doc.text  # footer
    c = _chunk_with(doc, "six hours")
    assert c.section == "Tomatoes"
    assert c.content == "Tomatoes need six hours of direct sun every day to ripen well on the vine."
    frag = locate(doc.kind, doc.locators, c.start, c.end, c.content).fragment
    assert frag == "#:~:text=Tomatoes%20need%20six%20hours,well%20on%20the%20vine."
    assert text_fragment("a-b, c & d") == "#:~:text=a%2Db%2C%20c%20%26%20d"
    assert "late winter,\njust before" in doc.text  # issue 31: <br> is a line break
    rows = _chunk_with(doc, "fern")
    assert "plant | water" in rows.content


def test_docx_headings_and_table_rows(tmp_path: Path) -> None:
    doc = extract_document(ff.write_docx(tmp_path), tmp_path)
    assert doc.status == "ok" and doc.title == "Onboarding handbook"
    assert [(h.level, h.title) for h in doc.headings] == [
        (1, "Onboarding handbook"), (2, "Laptops"), (2, "Badges")
    ]  # fmt: skip
    c = _chunk_with(doc, "orange")
    assert (
        c.section == "Badges" and c.content == "badge | colour\n\nvisitor | orange\n\nstaff | teal"
    )


def test_pdf_running_header_and_page_numbers_stay_out_of_chunks(tmp_path: Path) -> None:
    doc = extract_document(ff.write_report_pdf(tmp_path), tmp_path)
    assert doc.status == "ok"
    furniture = [loc for loc in doc.locators if loc.kind == "furniture"]
    texts = sorted({doc.text[f.start : f.end] for f in furniture})
    assert texts == ["1", "2", "3", "4", ff.HEADER]
    assert doc.text.count(ff.HEADER) == 4  # still in the canonical text
    assert doc.title.startswith("Finding 1.")  # not the running header
    chunks = _chunks(doc)
    assert len(chunks) == 4
    for c in chunks:
        assert ff.HEADER not in c.content and c.content.startswith("Finding ")
        assert c.page is not None and c.content.startswith(f"Finding {c.page}.")


def test_single_page_pdf_keeps_its_first_line(tmp_path: Path) -> None:
    doc = extract_document(ff.write_report_pdf(tmp_path, pages=1), tmp_path)
    assert not [loc for loc in doc.locators if loc.kind == "furniture"]


def test_locators_round_trip_json() -> None:
    doc = ExtractedDocument("a", "/a", "vtt", "ok", None, "webvtt", "webvtt-1", "h", text="x")
    items = [Locator(0, 1, "cue", t_start=1.5, t_end=2.0), Locator(0, 1, "media", target="a.mp4")]
    assert locators_from_json(locators_to_json(items)) == items
    assert locators_from_json(None) == [] and doc.locators == []
    assert locate_mod.FRAGMENT_WORDS == 4


@pytest.mark.slow
def test_ocr_page_is_flagged_with_its_confidence(tmp_path: Path) -> None:
    doc = extract_document(ff.write_scan_pdf(tmp_path), tmp_path)
    assert doc.status == "ok", doc.reason
    ocr = [loc for loc in doc.locators if loc.kind == "ocr"]
    assert [o.page for o in ocr] == [2] and ocr[0].ocr_confidence and ocr[0].ocr_confidence > 0.8
    assert ff.OCR_SENTENCE in " ".join(doc.text.split())
    c = _chunk_with(doc, "lighthouse")
    assert c.page == 2
    where = locate(doc.kind, doc.locators, c.start, c.end, c.content)
    assert where.ocr and where.ocr_confidence == ocr[0].ocr_confidence
    typed = _chunk_with(doc, "Harbour log")
    assert not locate(doc.kind, doc.locators, typed.start, typed.end, typed.content).ocr


@pytest.mark.slow
def test_ocr_below_the_floor_is_partial_and_not_indexed(tmp_path: Path) -> None:
    path = ff.write_scan_pdf(tmp_path)
    doc = extract_document(path, tmp_path, ocr_min_confidence=0.9999)
    assert doc.status == "partial" and doc.ok
    assert doc.reason and doc.reason.startswith(
        "not indexed, OCR below the confidence floor 0.9999: p. 2 (OCR confidence 0."
    )
    assert "lighthouse" not in doc.text and "Harbour log" in doc.text
    assert doc.extractor_version.endswith("/ocr-floor-0.9999")
    # a folder run with another floor does not reuse it
    again = extract_folder(tmp_path, {doc.document_id: doc})
    assert again.reused == [] and again.documents[0].status == "ok"


def test_build_context_links_a_transcript_to_its_media_file(tmp_path: Path) -> None:
    from rag_assets.lib.query.cite import build_context
    from rag_assets.lib.types import Hit

    ff.write_vtt(tmp_path)
    doc = {d.document_id: d for d in extract_folder(tmp_path).documents}["lecture.vtt"]
    c = _chunk_with(doc, "walrus")
    hit = Hit(c.chunk_id, doc.document_id, c.section, c.start, c.end, c.content, c.text, None,
              1.0, 1, "hybrid", cosine_distance=0.1, title=doc.title)  # fmt: skip
    kw = {
        "threshold": 0.5,
        "canonical_text": lambda d: doc.text,
        "document_path": lambda d: doc.path,
        "document_locators": lambda d: (doc.kind, doc.locators),
    }
    cited = build_context("q", [hit], **kw).citations[0]  # type: ignore[arg-type]
    assert cited.fragment == "#t=1,158.9" and cited.locator_label == "lecture, 0:01.0–2:38.9"
    assert cited.url == (tmp_path / "lecture.mp4").resolve().as_uri() + "#t=1,158.9"
    assert not cited.ocr and cited.to_dict()["ocr_confidence"] is None
    web = build_context("q", [hit], base_url="https://media.example/", **kw)  # type: ignore[arg-type]
    assert web.citations[0].url == "https://media.example/lecture.mp4#t=1,158.9"
