"""DOCX: paragraphs and tables in body order, headings as sections, read by streaming the XML.

Canonical text: each non-empty paragraph's text, and each table row as its cells' texts joined
by :data:`CELL_SEPARATOR` (a cell spanning columns counts once; a vertically merged cell repeats
its text in every row it spans), blocks separated by a blank line. A table nested inside a cell
(at any depth) is read too (issue 30): its rows are blocks of their own, right after the row
that holds them. Text boxes' paragraphs follow the paragraph they are anchored in; footnotes and
endnotes come after the body. A paragraph in the ``Title`` style is a level-1 heading (the
document title); one in a ``Heading N`` style opens a section (a level-2 heading). The title is
the core property ``title``, else the first ``Title`` paragraph, else the stem. Headers,
footers and comments are not read (page furniture and annotations, as a PDF's running header).

How it reads (issue 30): the package parts are streamed through expat with handlers, never
built into a tree, so nesting depth costs neither the C stack nor libxml2's depth limit (a
table nested 3,000 deep is read), and memory is the text read plus one stack entry per open
element. The ZIP's declared sizes are checked before anything is decompressed
(:func:`~rag_assets.lib.ingest.formats.check_zip_expansion`), so a small file that expands to
gigabytes fails alone at once. Any text the reader met but could not place (a run outside a
paragraph) makes the document ``partial``, with the number of characters left out.

Linear time (issue 25): every element is seen once; styles are read once into a table.
"""

from __future__ import annotations

import posixpath
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.parsers import expat

from rag_assets.lib.ingest.formats import (
    Extraction,
    FormatError,
    TextBuilder,
    check_budget,
    check_zip_expansion,
)
from rag_assets.lib.types import Heading, Locator

VERSION = "docx-2"  # 2: nested tables, text boxes, runs in insertions/content controls, notes
DOCX_SUFFIXES = (".docx",)
CELL_SEPARATOR = " | "
BLOCK_SEPARATOR = "\n\n"
READ_CHUNK = 1 << 20
"""Bytes of a package part fed to the XML parser at a time."""

_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_MC = "http://schemas.openxmlformats.org/markup-compatibility/2006"
_REL = "http://schemas.openxmlformats.org/package/2006/relationships"
_DC = "http://purl.org/dc/elements/1.1/"
_RT = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"


def _w(name: str) -> str:
    return f"{_W} {name}"


P, R, T, TBL, TR, TC = _w("p"), _w("r"), _w("t"), _w("tbl"), _w("tr"), _w("tc")
TXBX = _w("txbxContent")
#: regions whose text is not the document's: deleted or moved-away text, and the fallback copy
#: of a text box (the same text as the mc:Choice read before it)
_SKIPPED = frozenset({_w("del"), _w("moveFrom"), f"{_MC} Fallback"})
_RUN_TEXT = {_w("tab"): "\t", _w("ptab"): "\t", _w("br"): "\n", _w("cr"): "\n"}
_RUN_TEXT[_w("noBreakHyphen")] = "-"
_VAL = _w("val")


def extract_docx(data: bytes, path: Path) -> Extraction:
    import io

    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise FormatError(f"corrupt DOCX: {type(exc).__name__}: {exc}") from None
    with zf:
        check_zip_expansion(zf, "DOCX")
        try:
            return _extract(zf, path)
        except (zipfile.BadZipFile, KeyError, ValueError, EOFError) as exc:
            raise FormatError(f"corrupt DOCX: {type(exc).__name__}: {exc}") from None
        except expat.ExpatError as exc:
            raise FormatError(f"corrupt DOCX: XML error: {exc}") from None


def _extract(zf: zipfile.ZipFile, path: Path) -> Extraction:
    names = set(zf.namelist())
    package = _relationships(zf, "", names)
    main = package.get("officeDocument", "word/document.xml")
    if main not in names:
        raise FormatError(f"corrupt DOCX: no main document part ({main})")
    parts = _relationships(zf, main, names)
    styles, default = _styles(zf, parts.get("styles"))
    body = _Body(styles, default, headings=True)
    _stream(zf, main, body)
    notes = _Body(styles, default, headings=False)
    for kind in ("footnotes", "endnotes"):
        if parts.get(kind):
            _stream(zf, parts[kind], notes)
    builder = TextBuilder()
    headings: list[Heading] = []
    locators: list[Locator] = []
    for block in body.ordered() + notes.ordered():
        if builder.pos:
            builder.add(BLOCK_SEPARATOR)
        start, end = builder.add(block.text)
        if block.level:
            headings.append(Heading(block.level, block.text, start, end))
        else:
            locators.append(Locator(start, end, "block"))
    if not locators:
        raise FormatError("DOCX has no text outside headings")
    core = " ".join(_core_title(zf, package.get("core-properties")).split())
    title = core or next((h.title for h in headings if h.level == 1), path.stem)
    lost = body.lost + notes.lost
    partial = (
        f"{lost:,} characters of text outside any paragraph were not read (the file's XML "
        "is unusual: re-save it from a word processor)"
        if lost
        else None
    )
    return Extraction(
        text=builder.text(), title=title, headings=headings, locators=locators, partial=partial
    )


# -- the document body -------------------------------------------------------------------------
@dataclass
class _Block:
    key: int  # the start-event number of its element: sorting by it gives reading order
    text: str
    level: int = 0  # 1: Title, 2: Heading N, 0: body text


@dataclass
class _Para:
    key: int
    parts: list[str] = field(default_factory=list)
    style: str | None = None
    runs: int = 0  # open w:r elements of this paragraph (tabs in pPr are tab stops, not text)


@dataclass
class _Table:
    above: dict[int, str] = field(default_factory=dict)  # grid column -> text of its cell


@dataclass
class _Row:
    key: int
    col: int = 0
    cells: list[str] = field(default_factory=list)


@dataclass
class _Cell:
    span: int = 1
    vmerge: str | None = None  # "restart" or "continue" (w:vMerge without a value)
    texts: list[str] = field(default_factory=list)


class _Box:
    """A text box's content: its paragraphs are blocks of their own."""


class _Body:
    """expat handlers over one part (document, footnotes, endnotes): an explicit stack of the
    open paragraphs, tables, rows, cells and text boxes, never a recursion."""

    def __init__(self, styles: dict[str, str], default: str, *, headings: bool) -> None:
        self.styles, self.default, self.headings = styles, default, headings
        self.blocks: list[_Block] = []
        self.stack: list[Any] = []
        self.events = 0
        self.skip = 0  # depth inside a skipped region (_SKIPPED)
        self.in_text = False
        self.lost = 0  # characters of w:t met outside any paragraph

    def ordered(self) -> list[_Block]:
        return sorted(self.blocks, key=lambda b: b.key)

    def start(self, name: str, attrs: dict[str, str]) -> None:
        self.events += 1
        if self.events % 20_000 == 1:
            check_budget(f"XML element {self.events:,}")
        if self.skip:
            self.skip += 1
            return
        if name in _SKIPPED:
            self.skip = 1
            return
        top = self.stack[-1] if self.stack else None
        if name == T:
            self.in_text = True
        elif name == P:
            self.stack.append(_Para(self.events))
        elif name == R:
            if isinstance(top, _Para):
                top.runs += 1
        elif name in _RUN_TEXT:
            if isinstance(top, _Para) and top.runs:
                top.parts.append(_RUN_TEXT[name])
        elif name == _w("pStyle"):
            if isinstance(top, _Para):
                top.style = attrs.get(_VAL)
        elif name == TBL:
            self.stack.append(_Table())
        elif name == TR:
            self.stack.append(_Row(self.events))
        elif name == TC:
            self.stack.append(_Cell())
        elif name == _w("gridBefore"):
            if isinstance(top, _Row):
                top.col += _int(attrs.get(_VAL), 0)
        elif name == _w("gridSpan"):
            if isinstance(top, _Cell):
                top.span = max(1, _int(attrs.get(_VAL), 1))
        elif name == _w("vMerge"):
            if isinstance(top, _Cell):
                top.vmerge = attrs.get(_VAL, "continue")
        elif name == TXBX:
            self.stack.append(_Box())

    def end(self, name: str) -> None:
        if self.skip:
            self.skip -= 1
            return
        if name == T:
            self.in_text = False
        elif name == P:
            self._end_paragraph()
        elif name == R:
            top = self.stack[-1] if self.stack else None
            if isinstance(top, _Para) and top.runs:
                top.runs -= 1
        elif name == TC:
            self._end_cell()
        elif name == TR:
            row = self._pop(_Row)
            if row is not None:
                block = CELL_SEPARATOR.join(c for c in row.cells if c)
                if block:
                    self._emit(_Block(row.key, block))
        elif name in (TBL, TXBX):
            self._pop(_Table if name == TBL else _Box)

    def text(self, data: str) -> None:
        if self.skip or not self.in_text:
            return
        top = self.stack[-1] if self.stack else None
        if isinstance(top, _Para):
            top.parts.append(data)
        else:
            self.lost += len(data.strip())

    def _pop(self, kind: type) -> Any:
        """Pop the innermost frame if it is a ``kind`` (malformed nesting: leave the stack)."""
        if self.stack and isinstance(self.stack[-1], kind):
            return self.stack.pop()
        return None

    def _emit(self, block: _Block) -> None:
        """A row or a paragraph outside any cell (a nested table's rows are blocks too: a
        cell's text is its own paragraphs only)."""
        self.blocks.append(block)

    def _end_paragraph(self) -> None:
        para = self._pop(_Para)
        if para is None:
            return
        text = " ".join("".join(para.parts).split())
        if not text:
            return
        top = self.stack[-1] if self.stack else None
        if isinstance(top, _Cell):
            top.texts.append(text)
            return
        level = 0
        if top is None and self.headings:  # a body paragraph (not in a table or a text box)
            style = self.styles.get(para.style, self.default) if para.style else self.default
            style = style.lower()
            level = 1 if style == "title" else 2 if style.startswith("heading") else 0
        self._emit(_Block(para.key, text, level))

    def _end_cell(self) -> None:
        cell = self._pop(_Cell)
        if cell is None:
            return
        own = " ".join(" ".join(cell.texts).split())
        row = self.stack[-1] if self.stack and isinstance(self.stack[-1], _Row) else None
        table = self.stack[-2] if row is not None and len(self.stack) > 1 else None
        if row is None or not isinstance(table, _Table):
            if own:  # a cell outside a row (malformed): its text still counts
                self.blocks.append(_Block(self.events, own))
            return
        if cell.vmerge == "continue" and row.col in table.above:
            text = " ".join(t for t in (table.above[row.col], own) if t)
        else:
            text = own
            for c in range(row.col, row.col + cell.span):
                table.above[c] = own
        row.cells.append(text)
        row.col += cell.span


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


# -- package parts -----------------------------------------------------------------------------
def _stream(zf: zipfile.ZipFile, name: str, body: _Body) -> None:
    _parse(zf, name, body.start, body.end, body.text)


def _parse(
    zf: zipfile.ZipFile,
    name: str,
    start: Callable[[str, dict[str, str]], None],
    end: Callable[[str], None] | None = None,
    text: Callable[[str], None] | None = None,
) -> None:
    """Stream one part through expat (namespaced names ``"uri local"``); a DTD is refused
    (a DOCX has none; refusing it rules out entity expansion)."""
    parser = expat.ParserCreate(namespace_separator=" ")
    parser.buffer_text = True
    parser.StartElementHandler = start
    if end is not None:
        parser.EndElementHandler = end
    if text is not None:
        parser.CharacterDataHandler = text

    def no_dtd(*_: Any) -> None:
        raise FormatError(f"corrupt DOCX: {name} declares a DTD, which a DOCX never has")

    parser.StartDoctypeDeclHandler = no_dtd
    with zf.open(name) as fh:
        while chunk := fh.read(READ_CHUNK):
            parser.Parse(chunk, False)
    parser.Parse(b"", True)


def _relationships(zf: zipfile.ZipFile, part: str, names: set[str]) -> dict[str, str]:
    """Relationship type (last path segment) -> target part name, of ``part`` ("" = package)."""
    folder, base = posixpath.split(part)
    rels = posixpath.join(folder, "_rels", f"{base}.rels")
    out: dict[str, str] = {}
    if rels not in names:
        return out

    def start(name: str, attrs: dict[str, str]) -> None:
        if name != f"{_REL} Relationship" or attrs.get("TargetMode") == "External":
            return
        kind = attrs.get("Type", "").rsplit("/", 1)[-1]
        target = attrs.get("Target", "")
        resolved = posixpath.normpath(
            target.lstrip("/") if target.startswith("/") else posixpath.join(folder, target)
        )
        out.setdefault(kind, resolved)

    _parse(zf, rels, start)
    return out


def _styles(zf: zipfile.ZipFile, part: str | None) -> tuple[dict[str, str], str]:
    """Paragraph style id -> name, and the default paragraph style's name (read once)."""
    names: dict[str, str] = {}
    default = [""]
    if not part or part not in zf.namelist():
        return names, ""
    current: dict[str, str] = {}

    def start(name: str, attrs: dict[str, str]) -> None:
        if name == _w("style"):
            current.clear()
            current.update(
                type=attrs.get(_w("type"), ""),
                id=attrs.get(_w("styleId"), ""),
                default=attrs.get(_w("default"), ""),
            )
        elif name == _w("name") and current.get("type") == "paragraph":
            names[current["id"]] = attrs.get(_VAL, "")
            if current.get("default") in ("1", "true", "on"):
                default[0] = names[current["id"]]

    _parse(zf, part, start)
    return names, default[0]


def _core_title(zf: zipfile.ZipFile, part: str | None) -> str:
    if not part or part not in zf.namelist():
        return ""
    title: list[str] = []
    inside = [False]

    def start(name: str, attrs: dict[str, str]) -> None:
        inside[0] = name == f"{_DC} title"

    def end(name: str) -> None:
        inside[0] = False

    def text(data: str) -> None:
        if inside[0]:
            title.append(data)

    _parse(zf, part, start, end, text)
    return "".join(title)
