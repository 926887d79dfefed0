"""Build the sample PDFs of data/documents/ from data/pdf_source/glossary.md.

Run from anywhere: ``python data/make_sample_pdf.py``. Writes

* ``data/documents/glossary.pdf``: the glossary laid out by PyMuPDF's ``Story`` (HTML to PDF)
  with an outline (one entry per ``## `` section, via ``set_toc``) and fixed metadata, so
  rebuilding it gives the same text, pages and outline;
* ``data/documents/broken-scan.pdf``: the first 700 bytes of that PDF, a truncated file that
  MuPDF cannot recover any page from, so the demo shows a failed document.

The Markdown source is kept outside data/documents/ so the corpus does not hold the same text
twice. Only the Markdown this source uses is converted: ``# ``/``## `` headings, paragraphs
and ``**bold**``.
"""

from __future__ import annotations

import html
import io
import re
from pathlib import Path
from typing import Any

import pymupdf

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "pdf_source" / "glossary.md"
OUT = HERE / "documents" / "glossary.pdf"
BROKEN = HERE / "documents" / "broken-scan.pdf"
BROKEN_BYTES = 700
PAGE = pymupdf.paper_rect("a4")
BODY = PAGE + (72, 72, -72, -72)  # one-inch margins
CSS = "body {font-family: sans-serif; font-size: 12pt;} h1 {font-size: 20pt;} h2 {font-size: 15pt;}"
FIXED_DATE = "D:20250101000000Z"


def markdown_to_html(markdown: str) -> str:
    """Headings, paragraphs and bold of the restricted Markdown used in the source."""
    parts = []
    for block in re.split(r"\n\s*\n", markdown.strip()):
        text = html.escape(" ".join(block.split()))
        text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
        if text.startswith("## "):
            parts.append(f"<h2>{text[3:]}</h2>")
        elif text.startswith("# "):
            parts.append(f"<h1>{text[2:]}</h1>")
        else:
            parts.append(f"<p>{text}</p>")
    return "\n".join(parts)


def build_pdf(markdown: str) -> bytes:
    """Lay the Markdown out as A4 pages and add an outline of its ``## `` sections."""
    story = pymupdf.Story(html=markdown_to_html(markdown), user_css=CSS)
    buffer = io.BytesIO()
    writer = pymupdf.DocumentWriter(buffer)
    toc: list[list] = []

    def record(pos: Any) -> None:  # pymupdf.ElementPosition, attributes set at run time
        if pos.heading == 2 and pos.open_close & 1:
            toc.append([1, pos.text.strip(), pos.page_num])

    more, page_num = True, 0
    while more:
        page_num += 1
        device = writer.begin_page(PAGE)
        more, _ = story.place(BODY)
        story.element_positions(record, {"page_num": page_num})
        story.draw(device)
        writer.end_page()
    writer.close()

    doc = pymupdf.open("pdf", buffer.getvalue())
    title = markdown.splitlines()[0].removeprefix("# ").strip()
    doc.set_metadata(
        {
            "title": title,
            "author": "rag_assets sample corpus",
            "creator": "data/make_sample_pdf.py",
            "producer": f"PyMuPDF {pymupdf.VersionBind}",
            "creationDate": FIXED_DATE,
            "modDate": FIXED_DATE,
        }
    )
    doc.set_toc(toc)
    return doc.tobytes(garbage=3, deflate=True, no_new_id=True)


def main() -> None:
    data = build_pdf(SOURCE.read_text(encoding="utf-8"))
    OUT.write_bytes(data)
    BROKEN.write_bytes(data[:BROKEN_BYTES])
    with pymupdf.open(OUT) as doc:
        print(f"wrote {OUT} ({len(data)} bytes, {doc.page_count} pages, {len(doc.get_toc())} toc)")
    print(f"wrote {BROKEN} ({BROKEN_BYTES} bytes, truncated)")


if __name__ == "__main__":
    main()
