"""Extraction measurements for issue 14 (``python -m rag_assets.bench.formats pdf|ocr``).

* ``pdf``: on a PDF folder with a needle set (``../shared/corpus/pdf`` + ``../shared/eval/
  pdf-dev``), strategy-E chunks *before* (pages as plain ``get_text()``, no furniture locators:
  running headers and page numbers inside chunks, as the first extractor did),
  *furniture_only* (plain pages, furniture kept out of chunks) and *after* (+ reading order of
  interleaved columns and tables as rows, :mod:`.lib.formats.pdf_page`): needles found whole in a
  chunk (whitespace collapsed), destroyed answers (needle in the canonical text but in no chunk
  whole), chunks that contain a running header/footer line.
* ``ocr``: paragraphs of known text (from Markdown files) typeset by PyMuPDF, rendered to an
  image at ``--dpi`` (a scan), put on an image-only PDF page and recognised as the extractor
  does (:func:`.lib.formats.ocr.ocr_pdf_page`, clipped to the page's image), twice side by
  side: *before* (the recogniser's text) and *after* (word spaces restored): characters/s of
  OCR and the character error rate (Levenshtein distance / reference length, whitespace runs
  collapsed on both sides), also without spaces.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


def _collapse(s: str) -> str:
    return " ".join(s.split())


def pdf_report(corpus: Path, questions: Path) -> dict[str, Any]:
    from rag_assets.lib.ingest.chunk import chunk_document, strategy
    from rag_assets.lib.ingest.extract import extract_folder
    from rag_assets.lib.ingest.formats import pdf as pdf_mod
    from rag_assets.lib.ingest.formats.pdf_page import PageText

    def plain(page: Any, carried: Any = None) -> PageText:
        return PageText(page.get_text(), False, 0, 0)

    timings: dict[str, float] = {}
    t, cpu = time.perf_counter(), time.process_time()
    docs = {d.document_id: d for d in extract_folder(corpus).documents if d.ok}
    timings["extract_s"] = round(time.perf_counter() - t, 1)
    timings["extract_cpu_s"] = round(time.process_time() - cpu, 1)
    real = pdf_mod.read_page
    pdf_mod.read_page = plain  # type: ignore[assignment]
    try:
        t, cpu = time.perf_counter(), time.process_time()
        plain_docs = {d.document_id: d for d in extract_folder(corpus).documents if d.ok}
        timings["extract_plain_pages_s"] = round(time.perf_counter() - t, 1)
        timings["extract_plain_pages_cpu_s"] = round(time.process_time() - cpu, 1)
    finally:
        pdf_mod.read_page = real
    needles = [json.loads(line) for line in (questions / "questions.jsonl").open()]
    out: dict[str, Any] = {}
    runs = (
        ("before", plain_docs, True),  # get_text() pages, no furniture locators
        ("furniture_only", plain_docs, False),  # get_text() pages, furniture kept out
        ("after", docs, False),  # + reading order of interleaved columns, tables as rows
    )
    for label, source, strip in runs:
        found = destroyed = chunks_total = with_header = 0
        for doc in source.values():
            d = replace(doc, locators=[]) if strip else doc
            chunks = chunk_document(d, strategy("E"))
            chunks_total += len(chunks)
            running = {
                doc.text[loc.start : loc.end].strip()
                for loc in doc.locators
                if loc.kind == "furniture"
                and not re.fullmatch(r"[\divxlcIVXLC]+", doc.text[loc.start : loc.end].strip())
            }
            with_header += sum(any(r in c.content for r in running) for c in chunks)
            for q in (q for q in needles if q["document"] == doc.document_id):
                needle = _collapse(q["needle"])
                whole = any(needle in _collapse(c.content) for c in chunks)
                found += whole
                destroyed += (not whole) and needle in _collapse(doc.text)
        out[label] = {
            "needles": len(needles),
            "found_whole": found,
            "destroyed": destroyed,
            "chunks": chunks_total,
            "chunks_with_running_header": with_header,
        }
    out["timings_2_shared_busy_cores"] = timings
    out["table_row_lines"] = {
        d: sum(1 for line in doc.text.split("\n") if ": " in line and "; " in line)
        - sum(1 for line in plain_docs[d].text.split("\n") if ": " in line and "; " in line)
        for d, doc in docs.items()
    }
    out["furniture_lines"] = {
        d: sum(1 for loc in doc.locators if loc.kind == "furniture") for d, doc in docs.items()
    }
    return out


def _levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _paragraphs(source: Path, n: int, chars: int) -> list[str]:
    """``n`` texts of about ``chars`` characters of prose from the Markdown files of a folder."""
    paras: list[str] = []
    for path in sorted(source.glob("*.md")):
        for block in path.read_text(encoding="utf-8").split("\n\n"):
            block = block.strip()
            if block and block[0].isalpha() and "`" not in block and "|" not in block:
                paras.append(_collapse(block))
    texts, cur = [], ""
    for p in paras:
        cur = f"{cur}\n{p}" if cur else p
        if len(cur) >= chars:
            texts.append(cur)
            cur = ""
            if len(texts) == n:
                break
    return texts


def ocr_report(source: Path, pages: int, dpi: int, chars: int = 1500) -> dict[str, Any]:
    import pymupdf

    from rag_assets.lib.ingest.formats.ocr import _engine, ocr_pdf_page
    from rag_assets.lib.ingest.formats.pdf import _image_area

    _engine()  # model load is not part of the per-page speed
    rows: list[dict[str, Any]] = []
    for i, text in enumerate(_paragraphs(source, pages, chars)):
        src = pymupdf.open()
        page = src.new_page()
        page.insert_textbox(pymupdf.Rect(54, 54, 541, 800), text, fontsize=10)
        png = page.get_pixmap(dpi=dpi).tobytes("png")
        scan = pymupdf.open()
        scan.new_page().insert_image(pymupdf.Rect(0, 0, 595, 842), stream=png)
        scan = pymupdf.open(stream=scan.tobytes(), filetype="pdf")
        ref = _collapse(page.get_text())  # what PyMuPDF typeset (the textbox may cut)
        row: dict[str, Any] = {"page": i + 1, "ref_chars": len(ref)}
        # side by side on the same page: the recogniser's text as before, then spaces restored
        for label, restore in (("before", False), ("after", True)):
            t = time.perf_counter()
            got = ocr_pdf_page(scan[0], clip=_image_area(scan[0]), restore_spaces=restore)
            seconds = time.perf_counter() - t
            hyp = _collapse(got.text)
            row[label] = {
                "seconds": round(seconds, 2),
                "chars_per_s": round(len(hyp) / seconds, 1),
                "cer": round(_levenshtein(ref, hyp) / len(ref), 4),
                # the same without spaces: PP-OCRv4 drops word spaces in small print
                "cer_no_spaces": round(
                    _levenshtein(ref.replace(" ", ""), hyp.replace(" ", ""))
                    / len(ref.replace(" ", "")),
                    4,
                ),
                "confidence": got.confidence,
                "spaces_restored": got.spaces_restored,
            }
        rows.append(row)
    total_ref = sum(r["ref_chars"] for r in rows)
    out: dict[str, Any] = {"dpi": dpi, "pages": rows}
    for label in ("before", "after"):
        out[label] = {
            "cer_overall": round(
                sum(r[label]["cer"] * r["ref_chars"] for r in rows) / total_ref, 4
            ),
            "cer_no_spaces_overall": round(
                sum(r[label]["cer_no_spaces"] * r["ref_chars"] for r in rows) / total_ref, 4
            ),
            "chars_per_s_overall": round(
                sum(r[label]["chars_per_s"] * r[label]["seconds"] for r in rows)
                / sum(r[label]["seconds"] for r in rows),
                1,
            ),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag_assets.bench.formats")
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pdf")
    p.add_argument("--corpus", default="../shared/corpus/pdf")
    p.add_argument("--questions", default="../shared/eval/pdf-dev")
    o = sub.add_parser("ocr")
    o.add_argument("--source", default="../shared/corpus/course")
    o.add_argument("--pages", type=int, default=3)
    o.add_argument("--dpi", type=int, default=150, help="resolution of the 'scan' image")
    args = ap.parse_args(argv)
    if args.what == "pdf":
        report = pdf_report(Path(args.corpus), Path(args.questions))
    else:
        report = ocr_report(Path(args.source), args.pages, args.dpi)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
