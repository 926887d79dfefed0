"""Small real files of every format, built by the libraries that write them (tests only)."""

from __future__ import annotations

import csv
import io
import re
import zipfile
from pathlib import Path

import docx
import openpyxl
import pymupdf

VTT = """WEBVTT

00:00:01.000 --> 00:00:04.500
Welcome to the lecture on vector indexes.

00:02:12.400 --> 00:02:15.000
<v Ann>The walrus index stores every embedding twice, once per disk.</v>

00:02:15.000 --> 00:02:38.900
That doubles the storage bill of the walrus index.
"""
SRT = """1
00:00:01,000 --> 00:00:02,500
Hello and welcome to the scheduling talk.

2
00:01:03,250 --> 00:01:07,000
The pelican scheduler starts every batch job at dawn.
"""
HTML = """<!doctype html><html><head><title>Garden guide</title>
<script>var tomatoes = "never indexed";</script><style>p { color: green }</style></head>
<body><nav>Home | About | Tomatoes</nav>
<h1>Garden guide</h1>
<h2>Tomatoes</h2>
<p>Tomatoes need <b>six hours</b> of direct sun every day
   to ripen well on the vine.</p>
<h2>Roses</h2>
<p>Prune the roses in late winter,<br>just before the new growth starts.</p>
<table><tr><th>plant</th><th>water</th></tr><tr><td>fern</td><td>daily</td></tr></table>
<footer>(c) the garden club</footer></body></html>
"""
OCR_SENTENCE = "The lighthouse keeper logs the fog horn hours every night."
HEADER = "ACME Internal Report - Confidential"


def write_vtt(folder: Path, with_media: bool = True) -> Path:
    (folder / "lecture.vtt").write_text(VTT, encoding="utf-8")
    if with_media:  # not a playable video: only its presence matters for the citation link
        (folder / "lecture.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00")
    return folder / "lecture.vtt"


def write_srt(folder: Path) -> Path:
    (folder / "talk.srt").write_text(SRT, encoding="utf-8")
    return folder / "talk.srt"


def write_csv(folder: Path) -> Path:
    path = folder / "prices.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["sku", "product", "price"])
        w.writerow(["A1", "teapot", 12])
        w.writerow(["B2", "marmalade jar", 3.5])
        w.writerow(["C3", "copper kettle", 41])
    return path


def write_xlsx(folder: Path, rows: int = 0) -> Path:
    """Sheet ``Budget`` (a merged header, a formula with its cached value), sheet ``Notes``.

    openpyxl writes formulas without the value Excel would cache, so the cached value of
    ``Budget!D3`` (``=C3*2``) is put into the sheet XML the way Excel stores it.
    """
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Budget"
    ws.append(["item", "owner", "cost", "doubled"])
    ws.append(["servers", "ops team", 1200, None])
    ws.append(["walrus licences", "legal", 300, "=C3*2"])
    for i in range(rows):
        ws.append([f"filler {i}", "nobody", i, None])
    notes = wb.create_sheet("Notes")
    notes.append(["topic", "note", None])
    notes.merge_cells("B1:C1")  # a merged header: C takes the name "note"
    notes.append(["audit", "the auditors visit in March", "room 4"])
    buf = io.BytesIO()
    wb.save(buf)
    path = folder / "budget.xlsx"
    path.write_bytes(_cache_formula_value(buf.getvalue(), "D3", "600"))
    return path


def _cache_formula_value(xlsx: bytes, cell: str, value: str) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(xlsx))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "xl/worksheets/sheet1.xml":
                xml = data.decode("utf-8")
                xml, n = re.subn(
                    rf'(<c r="{cell}"[^>]*>\s*<f>[^<]*</f>)\s*(<v\s*/>|<v></v>)?',
                    rf"\1<v>{value}</v>",
                    xml,
                )
                assert n == 1, "formula cell not found in the sheet XML"
                data = xml.encode("utf-8")
            dst.writestr(item, data)
    return out.getvalue()


def write_html(folder: Path) -> Path:
    (folder / "garden.html").write_text(HTML, encoding="utf-8")
    return folder / "garden.html"


def write_docx(folder: Path) -> Path:
    d = docx.Document()
    d.add_heading("Onboarding handbook", 0)
    d.add_heading("Laptops", 1)
    d.add_paragraph("Every new hire receives a laptop on the first morning from the IT desk.")
    d.add_heading("Badges", 1)
    table = d.add_table(rows=3, cols=2)
    for r, (a, b) in enumerate([("badge", "colour"), ("visitor", "orange"), ("staff", "teal")]):
        table.cell(r, 0).text, table.cell(r, 1).text = a, b
    path = folder / "handbook.docx"
    d.save(str(path))
    return path


def write_report_pdf(folder: Path, pages: int = 4) -> Path:
    """A PDF with a running header and a page number on every page."""
    pdf = pymupdf.open()
    for i in range(pages):
        page = pdf.new_page()
        page.insert_text((72, 40), HEADER, fontsize=9)
        page.insert_textbox(
            pymupdf.Rect(72, 100, 520, 700),
            f"Finding {i + 1}. The quarterly audit found {i + 3} unlabelled cable drums in "
            f"warehouse {i + 1}, which the night shift moved without a ticket.",
            fontsize=11,
        )
        page.insert_text((290, 810), f"{i + 1}", fontsize=9)
    path = folder / "report.pdf"
    pdf.save(path)
    return path


def render_text_png(text: str, dpi: int = 150, fontsize: float = 14) -> bytes:
    """``text`` typeset by PyMuPDF on a page strip and rendered to a PNG (a 'scan')."""
    src = pymupdf.open()
    page = src.new_page(width=595, height=60 + 22 * (1 + len(text) // 60))
    page.insert_textbox(pymupdf.Rect(36, 20, 560, page.rect.height - 10), text, fontsize=fontsize)
    return page.get_pixmap(dpi=dpi).tobytes("png")


def write_scan_pdf(folder: Path, name: str = "scan.pdf", text: str = OCR_SENTENCE) -> Path:
    """Page 1: a text layer; page 2: only an image of ``text`` (no text layer)."""
    pdf = pymupdf.open()
    first = pdf.new_page()
    first.insert_textbox(
        pymupdf.Rect(72, 72, 520, 300), "Harbour log, typed part: tides and moorings.", fontsize=11
    )
    png = render_text_png(text)
    second = pdf.new_page()
    strip = pymupdf.Pixmap(png)
    h = second.rect.width * strip.height / strip.width
    second.insert_image(pymupdf.Rect(0, 72, second.rect.width, 72 + h), stream=png)
    path = folder / name
    pdf.save(path)
    return path


TABLE_HEADER = ("sku", "product", "price")
TABLE_ROWS = (("A1", "teapot", "12"), ("B2", "marmalade jar", "3.5"), ("C3", "walrus mug", "9"))


def _ruled_table(page: pymupdf.Page, top: float, rows: tuple, header: tuple | None) -> float:
    """Draw a ruled 3-column table at ``top`` (text, then its grid lines); return its bottom."""
    x = (72, 172, 372, 472)
    body = ([header] if header else []) + list(rows)
    h = 20
    for r, row in enumerate(body):
        for c, cell in enumerate(row):
            page.insert_text((x[c] + 4, top + r * h + 14), cell, fontsize=10)
    bottom = top + len(body) * h
    for r in range(len(body) + 1):
        page.draw_line((x[0], top + r * h), (x[-1], top + r * h))
    for xc in x:
        page.draw_line((xc, top), (xc, bottom))
    return bottom


def write_table_pdf(folder: Path, name: str = "shop.pdf") -> Path:
    """Page 1: a line, a ruled table with a header row, a line; page 2: the table goes on
    without repeating its header."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 80), "Price list of the gift shop.", fontsize=11)
    bottom = _ruled_table(page, 100, TABLE_ROWS, TABLE_HEADER)
    page.insert_text((72, bottom + 30), "Prices include the walrus tax.", fontsize=11)
    page2 = doc.new_page()
    _ruled_table(page2, 72, (("D4", "pelican scarf", "20"), ("E5", "tea towel", "4")), None)
    path = folder / name
    doc.save(path)
    return path
