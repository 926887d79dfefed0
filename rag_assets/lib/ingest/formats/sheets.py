"""Spreadsheets: XLSX (openpyxl, read-only, cached values) and CSV (the standard library).

Canonical text: per sheet, a heading line with the sheet name (a level-2 :class:`Heading`, so
sheets are sections), then one paragraph per data row, rows separated by a blank line. A row's
paragraph is self-describing: ``"header: value; header: value"`` over its non-empty cells, the
headers being the sheet's first non-empty row (an empty header cell takes the name of the one to
its left, as a merged header does, else its column letter). Each data row becomes a ``"row"``
locator (sheet, row number, first/last non-empty column), so a chunk cites the A1 range of its
rows, e.g. ``Sheet1!A12:F19``.

* Formulas cite their values: the workbook is opened with ``data_only=True`` (the values Excel
  cached when it saved). A formula cell without a cached value (a workbook written by a library,
  never opened in a spreadsheet program) is empty, and the document is *partial*, naming how
  many such cells there are and the first ones (issue 25): open and save it in Excel or
  LibreOffice to store the values.
* Merged cells: read-only mode keeps the value on the top-left cell of a merged range only and
  does not read the ranges. They are read from the sheet's XML in one streaming pass
  (:func:`_merged_ranges`, memory bounded by the number of ranges, not of cells), and the
  top-left value is carried to every cell of its range while rows stream
  (:func:`_fill_merged`), so a row under a merged "region" cell names its region too.
* Bounded memory: rows are streamed; at most :data:`MAX_ROWS` data rows per sheet are read, and
  a longer sheet makes the document *partial* with the sheet and row where reading stopped.
* A CSV file is one sheet named after the file's stem.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rag_assets.lib.ingest.formats import (
    Extraction,
    FormatError,
    TextBuilder,
    check_budget,
    check_zip_expansion,
)
from rag_assets.lib.types import Heading, Locator


def get_column_letter(index: int) -> str:
    """openpyxl's column letters (1 = A, 27 = AA) without importing openpyxl: citations name
    cells on the query path, which must not pay for the spreadsheet reader (issue 20)."""
    letters = ""
    while index > 0:
        index, rem = divmod(index - 1, 26)
        letters = chr(65 + rem) + letters
    return letters


XLSX_SUFFIXES = (".xlsx", ".xlsm")
CSV_SUFFIXES = (".csv",)
#: Data rows read per sheet (about 100 MB of canonical text at 1 kB a row); beyond: partial.
MAX_ROWS = 100_000
ROW_SEPARATOR = "\n\n"
CELL_SEPARATOR = "; "


def extract_csv(text: str, path: Path) -> Extraction:
    """One sheet named after the file stem; rows from :mod:`csv` (dialect sniffed, else excel)."""
    try:
        dialect: Any = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    try:
        rows = list(csv.reader(io.StringIO(text), dialect))
    except csv.Error as exc:
        raise FormatError(f"malformed CSV: {exc}") from None
    return _build(path.stem, [(path.stem, iter(rows))])


def extract_xlsx(data: bytes, path: Path) -> Extraction:
    """Every worksheet, in workbook order, values as cached by the program that saved it."""
    from openpyxl import load_workbook  # here: importing it costs the query path ~2 s loaded

    try:  # issue 30: the declared expanded size first (openpyxl reads shared strings whole)
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            check_zip_expansion(zf, "XLSX workbook")
    except (zipfile.BadZipFile, ValueError) as exc:
        raise FormatError(f"corrupt XLSX workbook: {type(exc).__name__}: {exc}") from None
    try:
        wb = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise FormatError(f"corrupt XLSX workbook: {type(exc).__name__}: {exc}") from None
    try:
        sheets = []
        lost: list[str] = []
        n_lost = 0
        for ws in wb.worksheets:
            merges, uncached = _scan_sheet_xml(ws)
            n_lost += len(uncached)
            lost += [f"{ws.title}!{ref}" for ref in uncached[: MAX_NAMED - len(lost)]]
            sheets.append((ws.title, _fill_merged(ws.iter_rows(values_only=True), merges)))
        got = _build(path.stem, sheets)
    finally:
        wb.close()
    if n_lost:
        more = f" and {n_lost - len(lost)} more" if n_lost > len(lost) else ""
        why = (
            f"{n_lost} formula cell(s) have no cached value and are left out "
            f"({', '.join(lost)}{more}): open and save the workbook in a spreadsheet program"
        )
        got.partial = "; ".join(filter(None, [got.partial, why]))
    return got


MAX_NAMED = 5
"""Formula cells without a cached value named in a partial reason (the rest are counted)."""


Range = tuple[int, int, int, int]  # min_row, min_col, max_row, max_col (1-based, inclusive)


def _merged_ranges(ws: Any) -> list[Range]:
    """The merged ranges of a read-only worksheet (see :func:`_scan_sheet_xml`)."""
    return _scan_sheet_xml(ws)[0]


def _scan_sheet_xml(ws: Any) -> tuple[list[Range], list[str]]:
    """The merged ranges of a read-only worksheet, from its XML (``<mergeCell ref="A2:A4">``,
    after the rows), and the cells holding a formula without a cached value (``<c r="C2"><f>``
    with no ``<v>``), parsed as a stream: every row element is dropped once read."""
    from xml.etree.ElementTree import iterparse

    from openpyxl.utils.cell import range_boundaries

    out: list[Range] = []
    uncached: list[str] = []
    parents: list[Any] = []
    formula = cached = False  # of the cell being read (its children are dropped as read)
    with ws._get_source() as src:  # the worksheet part in the archive (openpyxl's own reader)
        for event, el in iterparse(src, events=("start", "end")):
            tag = el.tag.rsplit("}", 1)[-1]
            if event == "start":
                parents.append(el)
                if tag == "c":
                    formula = cached = False
                continue
            parents.pop()
            if tag == "mergeCell" and ":" in (el.get("ref") or ""):
                min_col, min_row, max_col, max_row = range_boundaries(el.get("ref"))
                out.append((min_row, min_col, max_row, max_col))
            elif tag == "f":
                formula = True
            elif tag == "v" and (el.text or ""):
                cached = True
            elif tag == "c" and formula and not cached:
                uncached.append(el.get("r") or "?")
            if parents:
                parents[-1].remove(el)  # nothing read stays in memory
    return sorted(out), uncached


def _fill_merged(rows: Iterator[Iterable[Any]], merges: list[Range]) -> Iterator[Iterable[Any]]:
    """``rows`` with the top-left value of each merged range in every cell of the range."""
    if not merges:
        yield from rows
        return
    active: list[Range] = []
    values: dict[Range, Any] = {}
    nxt = 0
    for number, row in enumerate(rows, start=1):
        while nxt < len(merges) and merges[nxt][0] <= number:
            active.append(merges[nxt])
            nxt += 1
        active = [m for m in active if m[2] >= number]
        if not active:
            yield row
            continue
        cells = list(row)
        for m in active:
            r0, c0, _, c1 = m
            if number == r0:
                values[m] = cells[c0 - 1] if c0 - 1 < len(cells) else None
            value = values.get(m)
            if value is None:
                continue
            cells += [None] * (c1 - len(cells))
            cells[c0 - 1 : c1] = [value] * (c1 - c0 + 1)
        for m in [m for m in values if m[2] <= number]:
            del values[m]  # the range ends here
        yield cells


def a1_range(sheet: str, first_row: int, last_row: int, col_first: int, col_last: int) -> str:
    """``Sheet1!A12:F19`` (sheet names that are not plain words are quoted, as Excel does)."""
    name = sheet if sheet.replace("_", "").isalnum() else "'" + sheet.replace("'", "''") + "'"
    a = f"{get_column_letter(col_first)}{first_row}"
    b = f"{get_column_letter(col_last)}{last_row}"
    return f"{name}!{a}" if a == b else f"{name}!{a}:{b}"


def _build(title: str, sheets: Iterable[tuple[str, Iterator[Iterable[Any]]]]) -> Extraction:
    builder = TextBuilder()
    headings: list[Heading] = []
    locators: list[Locator] = []
    cut: list[str] = []
    for name, rows in sheets:
        headers: list[str] | None = None
        count = 0
        opened = False
        for number, row in enumerate(rows, start=1):
            if number % 1000 == 0:
                check_budget(f"sheet {name!r} row {number}")
            cells = [_cell_text(v) for v in row]
            filled = [i for i, c in enumerate(cells) if c]
            if not filled:
                continue
            if headers is None:
                headers = _header_names(cells)
                continue
            if count == MAX_ROWS:
                cut.append(f"sheet {name!r}: rows from {number} on not read (limit {MAX_ROWS:,})")
                break
            if not opened:
                builder.add(ROW_SEPARATOR if builder.pos else "")
                start, end = builder.add(name)
                headings.append(Heading(2, name, start, end))
                opened = True
            pairs = [f"{_header(headers, i)}: {cells[i]}" for i in filled]
            builder.add(ROW_SEPARATOR)
            start, end = builder.add(CELL_SEPARATOR.join(pairs))
            locators.append(
                Locator(
                    start,
                    end,
                    "row",
                    sheet=name,
                    row=number,
                    col_first=filled[0] + 1,
                    col_last=filled[-1] + 1,
                )
            )
            count += 1
    if not locators:
        raise FormatError("spreadsheet has no data rows (only a header row, or empty)")
    return Extraction(
        text=builder.text(),
        title=title,
        headings=headings,
        locators=locators,
        partial="; ".join(cut) or None,
    )


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ") if value.time() != dt.time() else value.date().isoformat()
    return " ".join(str(value).split())


def _header_names(cells: list[str]) -> list[str]:
    names: list[str] = []
    for i, c in enumerate(cells):
        names.append(c or (names[-1] if names else get_column_letter(i + 1)))
    return names


def _header(headers: list[str], i: int) -> str:
    return headers[i] if i < len(headers) else get_column_letter(i + 1)
