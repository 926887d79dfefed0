"""The canonical text of one PDF page: reading order of multi-column pages, tables as rows.

A page's text is MuPDF's ``page.get_text()`` unchanged, unless one of two things holds:

* **Interleaved columns.** The content stream draws side-by-side columns line by line (left
  line, right line, next left line ...), which ``get_text()`` reproduces as alternating lines.
  The page counts as interleaved when its lines, in stream order, contain at least
  :data:`INTERLEAVE_MIN_PAIRS` consecutive pairs that sit side by side (overlapping vertically,
  the second starting right of the first's end) and are both at least :data:`COLUMN_MIN_SHARE`
  of the page width (prose columns, not a label and its value). Such a page is read in MuPDF's
  own page segmentation order (``TEXT_SEGMENT``: regions, i.e. columns, one after the other).
  A page already in column order (LaTeX two-column output, as in ``../shared/corpus/pdf``) is
  left as it is: segmenting it would also split tables of contents and label/value lists.
* **Tables.** ``page.find_tables()`` (PyMuPDF's line-based finder) finds ruled tables. A table
  is kept when it is a real grid of text: at least 2 rows and 2 columns, at least
  :data:`TABLE_MIN_FILL` of its cells filled, header names at most :data:`TABLE_MAX_HEADER_CHARS`
  characters (a longer one is a line of prose caught in a box), and its cells holding the same
  characters as the page lines inside its area (:data:`TABLE_MIN_COVERAGE`, so nothing is lost
  or doubled). Its lines are then replaced, where its first line stood, by one line per data
  row, self-describing like a spreadsheet row: ``header: value; header: value`` over the
  non-empty cells (see :mod:`.sheets`). Cell text is MuPDF's words in the cell (which keep
  their spaces). A table continued on the next page without its header keeps the header
  names; a header row of bare numbers is data (:func:`_tables`).

When either applies, the page text is rebuilt from ``page.get_text("dict")`` lines (each line
ending with LF, as ``get_text()`` writes them), so the canonical text is what the chunker and
every locator see; offsets into it stay true by construction.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pymupdf

from rag_assets.lib.ingest.formats.pdf_layout import MARGIN_BAND

#: Side-by-side wide line pairs (in content-stream order) that make a page "interleaved".
INTERLEAVE_MIN_PAIRS = 3
#: Both lines of a side-by-side pair must be at least this share of the page width.
COLUMN_MIN_SHARE = 0.25
#: A found table is kept as rows only with at least this share of its cells non-empty.
TABLE_MIN_FILL = 0.5
#: ... and header names no longer than this (characters, whitespace collapsed).
TABLE_MAX_HEADER_CHARS = 40
#: ... and its cells' non-space characters matching those of the page lines in its area to this
#: share (multiset overlap / the larger of the two counts).
TABLE_MIN_COVERAGE = 0.95
#: A drawn line or thin rectangle at least this long (points) is a rule a table may be made of.
RULE_MIN_LENGTH = 3.0
#: Horizontal and vertical rules a page must draw (each) before the table finder runs on it:
#: a fully ruled table of 2 x 2 cells has 3 of each.
RULES_MIN = 3
#: Joins the ``header: value`` pairs of one table row (as :data:`.sheets.CELL_SEPARATOR`).
CELL_SEPARATOR = "; "
#: Joins the cells of a row of a table without header names.
PLAIN_SEPARATOR = " | "

_NUMBER = re.compile(r"[-+]?[0-9a-fA-F]+(?:[.,][0-9a-fA-F]+)*")


@dataclass(frozen=True)
class PageText:
    text: str
    segmented: bool  # read in MuPDF's segmentation (column) order
    tables: int  # tables replaced by rows
    rows: int  # data rows written
    #: header names of the page's last table (a table that starts the next page with as many
    #: columns and no header of its own continues it); None when the page has no table
    last_headers: list[str] | None = None


def page_text(page: Any, carried: list[str] | None = None) -> PageText:
    """The canonical text of ``page`` (see the module doc); ``carried``: the previous page's
    :attr:`PageText.last_headers`."""
    lines = _lines(page, pymupdf.TEXTFLAGS_TEXT)
    tables, last_headers = _tables(page, lines, carried)
    segmented = _interleaved([ln for ln in lines if _table_of(ln, tables) is None], page.rect)
    if not tables and not segmented:
        return PageText(page.get_text(), False, 0, 0, last_headers)
    if segmented:
        lines = _lines(page, pymupdf.TEXTFLAGS_TEXT | pymupdf.TEXT_SEGMENT)
    out: list[str] = []
    written: set[int] = set()
    rows = 0
    for line in lines:
        t = _table_of(line, tables)
        if t is None:
            out.append(line[1] + "\n")
        elif t not in written:
            written.add(t)
            table_rows = tables[t][1]
            out += [r + "\n" for r in table_rows]
            rows += len(table_rows)
    return PageText("".join(out), segmented, len(tables), rows, last_headers)


Line = tuple[tuple[float, float, float, float], str]


def _lines(page: Any, flags: int) -> list[Line]:
    """Text lines in ``dict`` order; segmentation nests text blocks in structure blocks."""
    out: list[Line] = []

    def walk(blocks: list[dict[str, Any]]) -> None:
        for block in blocks:
            if block.get("type") == 0:
                for line in block["lines"]:
                    text = "".join(s["text"] for s in line["spans"])
                    out.append((tuple(line["bbox"]), text))
            elif "blocks" in block:
                walk(block["blocks"])

    walk(page.get_text("dict", flags=flags)["blocks"])
    return out


def _interleaved(lines: list[Line], rect: Any) -> bool:
    wide = COLUMN_MIN_SHARE * rect.width
    pairs = 0
    for (a, ta), (b, tb) in zip(lines, lines[1:], strict=False):
        if not (ta.strip() and tb.strip()):
            continue
        side_by_side = b[0] >= a[2] and min(a[3], b[3]) > max(a[1], b[1])
        if side_by_side and a[2] - a[0] >= wide and b[2] - b[0] >= wide:
            pairs += 1
    return pairs >= INTERLEAVE_MIN_PAIRS


def _table_of(line: Line, tables: list[tuple[Any, list[str]]]) -> int | None:
    (x0, y0, x1, y1), _ = line
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    for i, (bbox, _) in enumerate(tables):
        if bbox[0] <= cx <= bbox[2] and bbox[1] <= cy <= bbox[3]:
            return i
    return None


def _tables(
    page: Any, lines: list[Line], carried: list[str] | None
) -> tuple[list[tuple[Any, list[str]]], list[str] | None]:
    """``(bbox, row lines)`` of the tables kept (see the module doc), in finder order, and the
    header names of the last one.

    Header names are PyMuPDF's (``table.header``), an empty one taking its left neighbour's
    name (a merged header). Two exceptions: a table that starts the page (no text above it but
    the top margin) with the column count of ``carried`` continues the previous page's table,
    so all its rows are data under ``carried``; and a header row of bare numbers (hex or
    decimal, e.g. a matrix of bytes) is data too, each row then written as its cells joined
    with :data:`PLAIN_SEPARATOR`.
    """
    if not _has_rules(page):
        return [], None
    # use_layout=False: the ML layout gate costs ~1.4 s a page on 2 shared cores (0.4 s without)
    found = page.find_tables(use_layout=False).tables
    words = page.get_text("words")  # MuPDF's words keep the spaces table.extract() can lose
    kept: list[tuple[Any, list[str]]] = []
    last: list[str] | None = None
    for table in found:
        if table.row_count < 2 or table.col_count < 2:
            continue
        cells = [[_cell_text(words, c) for c in row.cells] for row in table.rows]
        filled = sum(1 for row in cells for c in row if c)
        if filled < TABLE_MIN_FILL * table.row_count * table.col_count:
            continue
        if table.header.external:
            names = [_cell_text(words, c) for c in table.header.cells]
        else:
            names = cells[0]
        if any(len(n) > TABLE_MAX_HEADER_CHARS for n in names):
            continue
        bbox = tuple(table.bbox)
        inside = "".join(t for ln in lines if _table_of(ln, [(bbox, [])]) == 0 for t in ln[1])
        if _coverage(inside, "".join(c for row in cells for c in row)) < TABLE_MIN_COVERAGE:
            continue
        headers: list[str] | None
        if (
            not kept
            and carried
            and len(carried) == table.col_count
            and _starts_page(page, lines, bbox)
        ):
            headers, data = carried, cells
        elif all(_NUMBER.fullmatch(n) for n in names if n):
            headers, data = None, cells
        else:
            headers = _header_names(names)
            data = cells if table.header.external else cells[1:]
        rows = []
        for row in data:
            if headers is None:
                line = PLAIN_SEPARATOR.join(c for c in row if c)
            else:
                line = CELL_SEPARATOR.join(
                    f"{_name(headers, i)}: {c}" for i, c in enumerate(row) if c
                )
            if line:
                rows.append(line)
        if rows:
            kept.append((bbox, rows))
            last = headers
    return kept, last


def _cell_text(words: list[Any], cell: Any) -> str:
    """The words whose centre lies in ``cell`` (a bbox; None for a spanned slot), in order."""
    if cell is None:
        return ""
    x0, y0, x1, y1 = cell
    return " ".join(
        w[4] for w in words if x0 <= (w[0] + w[2]) / 2 < x1 and y0 <= (w[1] + w[3]) / 2 < y1
    )


def _starts_page(page: Any, lines: list[Line], bbox: Any) -> bool:
    top = MARGIN_BAND * page.rect.height
    return not any(
        (ln[0][1] + ln[0][3]) / 2 < bbox[1] and ln[0][3] > top and ln[1].strip() for ln in lines
    )


def _has_rules(page: Any) -> bool:
    """Whether the page draws :data:`RULES_MIN` horizontal and vertical rules (a table's edges;
    a box counts as both, a page-sized background not at all). Cheap (a few ms), it spares
    the finder (0.4-2 s a page on 2 busy cores) the pages of math, whose fraction bars are
    horizontal only. (``get_cdrawings`` coordinates are not page coordinates, e.g. y is not
    flipped, so they serve to count rules here, not to clip the finder.)"""
    horizontal = vertical = 0
    page_area = abs(page.rect)
    for path in page.get_cdrawings():
        for item in path["items"]:
            if item[0] == "re":
                x0, y0, x1, y1 = item[1]
            elif item[0] == "l":
                (x0, y0), (x1, y1) = item[1], item[2]
            else:
                continue
            w, h = abs(x1 - x0), abs(y1 - y0)
            if item[0] == "re" and w * h >= 0.9 * page_area:
                continue  # the page's background
            if w >= RULE_MIN_LENGTH and h >= RULE_MIN_LENGTH and item[0] == "re":
                horizontal, vertical = horizontal + 2, vertical + 2
            elif h < 1 and w >= RULE_MIN_LENGTH:
                horizontal += 1
            elif w < 1 and h >= RULE_MIN_LENGTH:
                vertical += 1
            if horizontal >= RULES_MIN and vertical >= RULES_MIN:
                return True
    return False


def _coverage(a: str, b: str) -> float:
    ca, cb = Counter(a.replace(" ", "")), Counter(b.replace(" ", ""))
    most = max(sum(ca.values()), sum(cb.values()))
    return sum((ca & cb).values()) / most if most else 0.0


def _header_names(names: list[str]) -> list[str]:
    out: list[str] = []
    for i, n in enumerate(names):
        out.append(n or (out[-1] if out else f"column {i + 1}"))
    return out


def _name(headers: list[str], i: int) -> str:
    return headers[i] if i < len(headers) else f"column {i + 1}"
