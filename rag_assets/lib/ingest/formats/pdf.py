"""PDF via PyMuPDF: page text, OCR for pages without a text layer, running furniture, outline.

Canonical text: each page's text (:func:`.pdf_page.page_text`: ``page.get_text()`` as PyMuPDF
returns it, except that interleaved columns are read in column order and ruled tables become
one self-describing line per row), pages joined with ``PAGE_SEPARATOR``; ``page_starts[i]`` is
where page ``i + 1`` starts. A page with no text but
with images is rendered (clipped to its images) and recognised by :mod:`.ocr`; its recognised
text becomes the page text and an ``"ocr"`` locator records the page and its confidence. A page
recognised below the confidence floor is left empty (not indexed) and the document is
*partial*, naming the page and its confidence; so is a PDF that MuPDF had to repair.
Running headers, footers and page numbers (:mod:`.pdf_layout`) become ``"furniture"``
locators. Outline (``get_toc``) entries become level-2 headings spanning the title where it is
found on its page (whitespace- and case-insensitive), else an empty span at the page start.
"""

from __future__ import annotations

import re
from typing import Any

import pymupdf

from rag_assets.lib.ingest.formats import (
    Extraction,
    FormatError,
    check_budget,
    sort_locators,
)
from rag_assets.lib.ingest.formats.ocr import ocr_pdf_page
from rag_assets.lib.ingest.formats.pdf_layout import furniture_spans
from rag_assets.lib.ingest.formats.pdf_page import page_text as read_page
from rag_assets.lib.types import Heading, Locator

#: Joins the text of consecutive PDF pages. A form feed on its own line: it never occurs in
#: prose, so no needle or sentence can straddle a page boundary by accident.
PAGE_SEPARATOR = "\n\f\n"

_JUNK_TITLE = re.compile(
    r"^(untitled.*|title|document\d*|microsoft word - .*|.*\.(pdf|docx?|tex|dvi|ps|indd))$",
    re.IGNORECASE,
)


def extract_pdf(data: bytes, stem: str, ocr_min_confidence: float) -> Extraction:
    """Canonical text, page starts, headings, title and locators of a PDF (see module doc)."""
    try:
        pdf = pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:  # noqa: BLE001 - pymupdf raises several types here
        raise FormatError(f"corrupt PDF: cannot be opened ({exc})") from None
    with pdf:
        if pdf.needs_pass:
            raise FormatError("encrypted PDF: needs a password to open")
        if pdf.page_count == 0:
            raise FormatError("corrupt PDF: no readable pages (damaged or truncated file)")
        pages: list[str] = []
        carried: list[str] | None = None  # header names a table on the next page may continue
        for number in range(pdf.page_count):
            check_budget(f"page {number + 1} of {pdf.page_count}")  # issue 25
            try:
                got = read_page(pdf[number], carried)
                pages.append(got.text)
                carried = got.last_headers
            except Exception as exc:  # noqa: BLE001
                raise FormatError(f"corrupt PDF: page {number + 1} unreadable ({exc})") from None
        if not any(p.strip() for p in pages) and pdf.is_repaired:
            raise FormatError(
                f"corrupt PDF: damaged or truncated file ({len(pages)} page(s) recovered by "
                "repair, none with readable content)"
            )
        ocr: dict[int, float] = {}  # page index -> confidence of the OCR text kept
        low: list[str] = []
        blank = [i for i, p in enumerate(pages) if not p.strip()]
        for i in blank:
            clip = _image_area(pdf[i])
            if clip is None:
                continue
            result = ocr_pdf_page(pdf[i], clip=clip)
            if not result.text.strip():
                continue
            if result.confidence < ocr_min_confidence:
                low.append(f"p. {i + 1} (OCR confidence {result.confidence:.2f})")
                continue
            pages[i] = result.text + "\n"  # like get_text(): every line ends with LF
            ocr[i] = result.confidence
        if not any(p.strip() for p in pages):
            detail = (
                f"; OCR below the confidence floor {ocr_min_confidence:g} on " + ", ".join(low)
                if low
                else "; OCR recognised no text"
            )
            raise FormatError(
                f"no text layer (scanned?): {len(pages)} page(s) without extractable text" + detail
            )
        starts: list[int] = []
        pos = 0
        for page_text in pages:
            starts.append(pos)
            pos += len(page_text) + len(PAGE_SEPARATOR)
        locators = [
            Locator(starts[i], starts[i] + len(pages[i]), "ocr", page=i + 1, ocr_confidence=c)
            for i, c in ocr.items()
        ]
        text_pages = [p if i not in ocr else "" for i, p in enumerate(pages)]
        for i, spans in enumerate(furniture_spans(pdf, text_pages)):
            locators += [
                Locator(starts[i] + a, starts[i] + b, "furniture", page=i + 1) for a, b in spans
            ]
        headings = _outline_headings(pdf.get_toc(simple=True), pages, starts)
        meta_title = " ".join(((pdf.metadata or {}).get("title") or "").split())
        partial = []
        if low:
            partial.append(
                f"not indexed, OCR below the confidence floor {ocr_min_confidence:g}: "
                + ", ".join(low)
            )
        if pdf.is_repaired:
            partial.append("damaged PDF repaired by MuPDF: text may be incomplete")
    if meta_title and not _JUNK_TITLE.match(meta_title) and re.search(r"\w\w", meta_title):
        title = meta_title
    else:  # the first line with a word character that is not a running header
        text = PAGE_SEPARATOR.join(pages)
        for loc in reversed([loc for loc in locators if loc.kind == "furniture"]):
            text = text[: loc.start] + " " * (loc.end - loc.start) + text[loc.end :]
        first = (line.strip() for line in text.split("\n"))
        title = next((line for line in first if re.search(r"\w", line)), stem)
    return Extraction(
        text=PAGE_SEPARATOR.join(pages),
        title=title,
        headings=headings,
        locators=sort_locators(locators),
        page_starts=starts,
        partial="; ".join(partial) or None,
    )


def _image_area(page: Any) -> Any:
    """Union of the page's image rectangles, clipped to the page; None when it has none."""
    area = None
    for info in page.get_image_info():
        rect = pymupdf.Rect(info["bbox"]) & page.rect
        if not rect.is_empty:
            area = rect if area is None else area | rect
    return area


def _outline_headings(toc: list, pages: list[str], starts: list[int]) -> list[Heading]:
    """Level-2 headings from outline entries, located on their page, sorted by start."""
    found: list[tuple[int, int, Heading]] = []
    cursor: dict[int, int] = {}  # page index -> where the previous entry on it ended
    for order, entry in enumerate(toc):
        title, page_no = " ".join(str(entry[1]).split()), int(entry[2])
        if not title or not 1 <= page_no <= len(pages):
            continue
        index = page_no - 1
        span = _find_loose(pages[index], title, cursor.get(index, 0))
        if span is None:
            start = end = starts[index]
        else:
            start, end = starts[index] + span[0], starts[index] + span[1]
            cursor[index] = span[1]
        found.append((start, order, Heading(2, title, start, end)))
    return [h for _, _, h in sorted(found, key=lambda t: t[:2])]


def _find_loose(page: str, title: str, begin: int) -> tuple[int, int] | None:
    """Span of ``title`` in ``page[begin:]`` ignoring case and whitespace-run differences."""
    chars: list[str] = []
    where: list[int] = []  # collapsed index -> page index
    for i in range(begin, len(page)):
        c = page[i]
        if c.isspace():
            if chars and chars[-1] == " ":
                continue
            c = " "
        low = c.lower()
        chars.append(low if len(low) == 1 else c)
        where.append(i)
    needle = "".join(low if len(low := c.lower()) == 1 else c for c in title)
    hit = "".join(chars).find(needle)
    if hit < 0:
        return None
    return where[hit], where[hit + len(needle) - 1] + 1
