"""HTML via selectolax (the Lexbor HTML5 parser): visible text in blocks, headings as sections.

Canonical text: the page's text as a browser lays it out in blocks, blocks separated by a blank
line (:data:`BLOCK_SEPARATOR`), in document order:

* Every block-level element (:data:`BLOCK_LEVEL`: ``p``, ``div``, ``li``, ``dt``, ``dd``,
  ``td`` of a layout table, ...) starts and ends a block; the inline text between two block
  boundaries is one block (so ``<li>Fruit<ul><li>apple</li></ul></li>`` gives "Fruit" and
  "apple", and text directly inside a ``<div>`` or a table cell is not lost).
* Inside a block, white space runs collapse to one space, as a browser renders them, but a
  ``<br>`` is a line break, and a line that is empty (``&nbsp;<br>``) is a paragraph break: a
  docstring rendered with ``<br>`` line ends (``python -m pydoc -w``) keeps its lines and
  paragraphs, so the chunker can cut it at a paragraph or a sentence instead of reading one
  long line.
* ``<pre>`` keeps its lines and indentation (trailing blanks and blank edges dropped).
* A table row whose cells hold only inline content is a data row: its cells joined by
  :data:`CELL_SEPARATOR`, one block. A row whose cells hold blocks (a layout table, as pydoc's)
  is read cell by cell like any other container. A row whose one non-empty cell is short and
  all bold (``<strong>``/``<b>``: pydoc's "Functions", "Classes", "Data") opens a section.
* Nothing inside :data:`SKIPPED` (scripts, styles, navigation, page header/footer, asides,
  forms) is kept, nor are comments.

``<h1>`` is the document title (a level-1 heading) and ``<h2>``-``<h6>`` open sections
(level-2 headings); the title is ``<title>``, else the first ``<h1>``, else the file stem.
Citations carry a text fragment (``#:~:text=start,end``) built from the chunk's first and last
words, which a browser scrolls to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from selectolax.lexbor import LexborHTMLParser, LexborNode

from rag_assets.lib.ingest.formats import Extraction, FormatError, TextBuilder, check_budget
from rag_assets.lib.types import Heading, Locator

VERSION = "html-selectolax-2"  # 2: <br> lines, paragraphs, <pre> lines, layout tables (issue 31)
HTML_SUFFIXES = (".html", ".htm")
HEADINGS = frozenset(["h1", "h2", "h3", "h4", "h5", "h6"])
BLOCK_LEVEL = frozenset(
    [
        *HEADINGS,
        "address",
        "article",
        "blockquote",
        "body",
        "caption",
        "center",
        "dd",
        "details",
        "dialog",
        "dir",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "hgroup",
        "hr",
        "html",
        "legend",
        "li",
        "main",
        "menu",
        "ol",
        "p",
        "pre",
        "section",
        "summary",
        "table",
        "tbody",
        "td",
        "tfoot",
        "th",
        "thead",
        "tr",
        "ul",
    ]
)
"""Elements that start and end a block (their inline content is never joined to what is
outside them)."""
SKIPPED = frozenset(
    ["script", "style", "noscript", "template", "nav", "header", "footer", "aside", "form"]
)
BOLD = frozenset(["strong", "b"])
MAX_CAPTION_CHARS = 80
"""Longest all-bold one-cell table row read as a section title (a longer one is text)."""
CELL_SEPARATOR = " | "
BLOCK_SEPARATOR = "\n\n"
LINE_BREAK = "\n"  # what a <br> leaves in a block (the chunker reads lines and paragraphs)


@dataclass
class _Blocks:
    """The blocks found so far, and the inline text of the open one."""

    builder: TextBuilder = field(default_factory=TextBuilder)
    headings: list[Heading] = field(default_factory=list)
    locators: list[Locator] = field(default_factory=list)
    inline: list[str] = field(default_factory=list)
    elements: int = 0

    def flush(self) -> None:
        """Close the open block: its inline text, lines kept (see the module doc)."""
        block = _lines("".join(self.inline))
        self.inline = []
        if block:
            self.add(block, None)

    def add(self, block: str, heading: int | None) -> None:
        if self.builder.pos:
            self.builder.add(BLOCK_SEPARATOR)
        start, end = self.builder.add(block)
        if heading is not None:
            self.headings.append(Heading(heading, block, start, end))
        else:
            self.locators.append(Locator(start, end, "block"))


def extract_html(text: str, path: Path) -> Extraction:
    tree = LexborHTMLParser(text)
    root = tree.body
    if root is None:
        raise FormatError("HTML has no <body>")
    out = _Blocks()
    _walk(root, out)
    out.flush()
    if not out.locators:
        raise FormatError("HTML has no visible text outside headings, scripts and navigation")
    title_node = tree.css_first("title")
    title = " ".join(title_node.text().split()) if title_node is not None else ""
    title = title or next((h.title for h in out.headings if h.level == 1), path.stem)
    return Extraction(
        text=out.builder.text(), title=title, headings=out.headings, locators=out.locators
    )


def _walk(node: LexborNode, out: _Blocks) -> None:
    """Append the blocks of ``node``'s children to ``out``.

    An explicit stack, not recursion: a deeply nested page must not reach Python's limit."""
    stack: list[LexborNode | None] = [*reversed(_children(node))]
    while stack:
        child = stack.pop()
        if child is None:  # the end of a block-level element
            out.flush()
            continue
        out.elements += 1
        if out.elements % 1000 == 0:
            check_budget(f"element {out.elements}")  # issue 25
        if child.is_text_node:  # a newline in the source is white space, not a line break
            out.inline.append((child.text_content or "").replace("\r", " ").replace("\n", " "))
            continue
        tag = child.tag or ""
        if not child.is_element_node or tag in SKIPPED:
            continue
        if tag == "br":
            out.inline.append(LINE_BREAK)
            continue
        if tag not in BLOCK_LEVEL:  # inline: its children in place
            stack.extend(reversed(_children(child)))
            continue
        out.flush()
        if tag in HEADINGS:
            title = " ".join(_inline_text(child, pre=False).split())
            if title:
                out.add(title, 1 if tag == "h1" else 2)
            continue
        if tag == "pre":
            block = _preformatted(_inline_text(child, pre=True))
            if block:
                out.add(block, None)
            continue
        if tag == "tr" and _data_row(child):
            cells = [_lines(_inline_text(c, pre=False)) for c in _cells(child)]
            cells = [c for c in cells if c]
            title = " ".join(cells[0].split()) if len(cells) == 1 else ""
            if title and len(title) <= MAX_CAPTION_CHARS and _all_bold(child):
                out.add(title, 2)  # a table's caption row opens a section (pydoc's "Functions")
            elif len(cells) == 1:  # one cell: its lines and paragraphs, as any block's
                out.add(cells[0], None)
            elif cells:
                out.add(CELL_SEPARATOR.join(" ".join(c.split()) for c in cells), None)
            continue
        stack.append(None)
        stack.extend(reversed(_children(child)))


def _children(node: LexborNode) -> list[LexborNode]:
    return list(node.iter(include_text=True))


def _cells(row: LexborNode) -> list[LexborNode]:
    return [c for c in row.iter() if c.tag in ("td", "th")]


def _has_block(node: LexborNode) -> bool:
    """Whether a block-level element (other than a skipped one) is inside ``node``."""
    stack = _children(node)
    while stack:
        n = stack.pop()
        if not n.is_element_node or n.tag in SKIPPED:
            continue
        if n.tag in BLOCK_LEVEL:
            return True
        stack.extend(_children(n))
    return False


def _data_row(row: LexborNode) -> bool:
    """A row whose cells hold only inline content (text, links, emphasis, line breaks)."""
    return not any(_has_block(c) for c in _cells(row))


def _all_bold(row: LexborNode) -> bool:
    """Every non-blank text of the row is inside ``<strong>``/``<b>``."""
    stack = [(c, False) for c in _children(row)]
    seen = False
    while stack:
        n, bold = stack.pop()
        if n.is_text_node:
            if (n.text_content or "").strip():
                if not bold:
                    return False
                seen = True
            continue
        if n.is_element_node and n.tag not in SKIPPED:
            stack.extend((c, bold or n.tag in BOLD) for c in _children(n))
    return seen


def _inline_text(node: LexborNode, pre: bool) -> str:
    """The text of ``node`` with ``<br>`` as a line break, skipped elements and comments out;
    a newline of the source is a line break only in ``pre`` (elsewhere it is white space)."""
    parts: list[str] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n.is_text_node:
            text = n.text_content or ""
            parts.append(text if pre else text.replace("\r", " ").replace("\n", " "))
        elif n.is_element_node and n.tag not in SKIPPED:
            if n.tag == "br":
                parts.append(LINE_BREAK)
            else:
                stack.extend(reversed(_children(n)))
    return "".join(parts)


def _lines(raw: str) -> str:
    """Inline text as a browser shows it: white space collapsed within each line (``<br>``
    lines), blank lines at the edges dropped, runs of blank lines kept as one (a paragraph
    break)."""
    lines = [" ".join(line.split()) for line in raw.split(LINE_BREAK)]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out)


def _preformatted(raw: str) -> str:
    """``<pre>`` text: lines and indentation kept, trailing blanks and blank edge lines out."""
    lines = [line.rstrip() for line in raw.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def fragment_text(markup: str) -> str:
    """The visible text of an HTML fragment (a raw HTML block in a Markdown file), read by the
    rules of :func:`extract_html`: blocks separated by a blank line, ``<br>`` lines kept,
    scripts, styles and comments left out; "" when nothing is visible (an image, a comment)."""
    root = LexborHTMLParser(markup).body
    if root is None:
        return ""
    out = _Blocks()
    _walk(root, out)
    out.flush()
    return out.builder.text()
