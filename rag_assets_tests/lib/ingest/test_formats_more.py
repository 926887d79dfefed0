"""Issue 14's remaining pieces: merged XLSX data cells, OCR word spaces, the reuse key of a
transcript whose media file appears, and the run summary's partial/skipped counts."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import openpyxl
import pymupdf
import pytest

from rag_assets.defs.run import Outcome
from rag_assets.lib.ingest.extract import extract_document, extract_folder
from rag_assets.lib.ingest.formats import ocr as ocr_mod
from rag_assets.lib.ingest.formats import sheets
from rag_assets.lib.ingest.formats.locate import locate
from rag_assets_tests.lib import format_files as ff


def _merged_xlsx(folder: Path) -> Path:
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Stock"
    ws.append(["region", "product", "units", "note"])
    ws.append(["North", "teapot", 12, "reorder in May"])
    ws.append([None, "walrus mug", 9, None])
    ws.append([None, "tea towel", 4, None])
    ws.append(["South", "pelican scarf", 20, "discontinued"])
    ws.merge_cells("A2:A4")  # one region cell for three rows (a merged *data* cell)
    ws.merge_cells("D2:D4")
    ws.merge_cells("B5:C5")  # merged across columns: both take the value
    buf = io.BytesIO()
    wb.save(buf)
    path = folder / "stock.xlsx"
    path.write_bytes(buf.getvalue())
    return path


def test_xlsx_merged_data_cells_carry_their_value(tmp_path: Path) -> None:
    doc = extract_document(_merged_xlsx(tmp_path), tmp_path)
    assert doc.status == "ok", doc.reason
    rows = [doc.text[r.start : r.end] for r in doc.locators if r.kind == "row"]
    assert rows == [
        "region: North; product: teapot; units: 12; note: reorder in May",
        "region: North; product: walrus mug; units: 9; note: reorder in May",
        "region: North; product: tea towel; units: 4; note: reorder in May",
        "region: South; product: pelican scarf; units: pelican scarf; note: discontinued",
    ]
    mug = next(r for r in doc.locators if r.kind == "row" and r.row == 3)
    assert locate(doc.kind, doc.locators, mug.start, mug.end, "").label == "Stock!A3:D3"


def test_merged_ranges_are_read_from_the_sheet_xml(tmp_path: Path) -> None:
    wb = openpyxl.load_workbook(_merged_xlsx(tmp_path), read_only=True)
    try:
        ws = wb["Stock"]
        assert not hasattr(ws, "merged_cells")  # read-only mode does not read them itself
        assert sheets._merged_ranges(ws) == [(2, 1, 4, 1), (2, 4, 4, 4), (5, 2, 5, 3)]
    finally:
        wb.close()


def test_fill_merged_streams_and_forgets_finished_ranges() -> None:
    rows = iter([("a", "x"), (None, "y"), ("b", None), (None, None)])
    out = list(sheets._fill_merged(rows, [(1, 1, 2, 1), (3, 1, 4, 2)]))
    assert out == [["a", "x"], ["a", "y"], ["b", "b"], ["b", "b"]]


def test_media_file_added_beside_an_unchanged_transcript_is_picked_up(tmp_path: Path) -> None:
    ff.write_vtt(tmp_path, with_media=False)
    first = extract_folder(tmp_path)
    doc = next(d for d in first.documents if d.document_id == "lecture.vtt")
    assert not [loc for loc in doc.locators if loc.kind == "media"]
    previous = {d.document_id: d for d in first.documents}
    (tmp_path / "lecture.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00")
    second = extract_folder(tmp_path, previous)
    assert "lecture.vtt" not in second.reused  # same bytes, but its citations change
    doc = next(d for d in second.documents if d.document_id == "lecture.vtt")
    assert [loc.target for loc in doc.locators if loc.kind == "media"] == ["lecture.mp4"]
    third = extract_folder(tmp_path, {d.document_id: d for d in second.documents})
    assert "lecture.vtt" in third.reused  # nothing changed since
    (tmp_path / "lecture.mp4").unlink()  # and back: the link to the media file goes
    fourth = extract_folder(tmp_path, {d.document_id: d for d in third.documents})
    assert "lecture.vtt" not in fourth.reused
    doc = next(d for d in fourth.documents if d.document_id == "lecture.vtt")
    assert not [loc for loc in doc.locators if loc.kind == "media"]


def test_summary_counts_partial_and_skipped_documents() -> None:
    outcome = Outcome(
        success=True,
        metadata={
            "extracted_documents": {
                "documents": 6,
                "ok": 4,  # ok + partial, as the asset records it
                "partial": 1,
                "skipped": 1,
                "failed": 1,
                "reused": 2,
                "partial_list": [{"document": "scan.pdf", "reason": "p. 2 (OCR 0.41)"}],
            }
        },
    )
    text = outcome.summary()
    assert "documents: 6 (3 ok, 1 partial, 1 skipped, 1 failed)" in text
    assert "  PARTIAL scan.pdf: p. 2 (OCR 0.41)" in text


def _ink_line(gaps: list[int], glyph: int = 6, height: int = 40) -> tuple[np.ndarray, list]:
    """A white strip with black glyph bars separated by ``gaps`` pixels; char boxes centred."""
    width = 20 + sum(gaps) + glyph * (len(gaps) + 1) + 20
    gray = np.full((height, width), 255, np.uint8)
    boxes, x = [], 20
    for i in range(len(gaps) + 1):
        gray[8:32, x : x + glyph] = 0
        boxes.append([[x, 0], [x + glyph, 0], [x + glyph, height], [x, height]])
        x += glyph + (gaps[i] if i < len(gaps) else 0)
    return gray, boxes


def test_restore_spaces_puts_back_wide_blank_runs_only() -> None:
    # letters 2 px apart; one word space of 12 px the recogniser dropped (between c and d)
    gray, boxes = _ink_line([2, 2, 12, 2])
    box = [[0, 0], [gray.shape[1], 0], [gray.shape[1], 40], [0, 40]]
    text, added = ocr_mod._restore_spaces("abcde", box, [boxes, list("abcde"), []], gray)
    assert (text, added) == ("abc de", 1)
    # with no char boxes (an engine without word boxes) the text is left as it is
    assert ocr_mod._restore_spaces("abcde", box, [], gray) == ("abcde", 0)


@pytest.mark.slow
def test_ocr_restores_dropped_word_spaces_on_a_rendered_page() -> None:
    text = (
        "Every chunk records where it came from so that citations stay true. The index keeps "
        "a stamp for each row, and a query that finds nothing is refused rather than answered "
        "with a guess. Small print at ten points is where the recogniser tends to drop word "
        "spaces between words."
    )
    src = pymupdf.open()
    page = src.new_page(width=595, height=140)
    page.insert_textbox(pymupdf.Rect(20, 20, 575, 130), text, fontsize=10)
    got = ocr_mod.ocr_image(page.get_pixmap(dpi=150).tobytes("png"))
    assert got.spaces_restored >= 1  # PP-OCRv4 dropped some (e.g. "wordspacesbetweenwords.")
    assert " ".join(got.raw_text.split()) != " ".join(text.split())
    assert " ".join(got.text.split()) == " ".join(text.split())
