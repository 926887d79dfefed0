"""HTML via selectolax (the Lexbor HTML5 parser): visible block text, headings as sections.

Canonical text: the text of each block element (:data:`BLOCKS`) in document order, whitespace
runs collapsed to one space as a browser renders them, blocks separated by a blank line; a
block inside another block is part of the outer one. A table row is its cells joined by
:data:`CELL_SEPARATOR`. Nothing inside :data:`SKIPPED` (scripts, styles, navigation, page
header/footer, asides, forms) is kept. ``<h1>`` is the document title (a level-1 heading) and
``<h2>``-``<h6>`` open sections (level-2 headings); the title is ``<title>``, else the first
``<h1>``, else the file stem. Citations carry a text fragment (``#:~:text=start,end``) built from
the chunk's first and last words, which a browser scrolls to.
"""

from __future__ import annotations

from pathlib import Path

from selectolax.lexbor import LexborHTMLParser, LexborNode

from rag_assets.lib.ingest.formats import Extraction, FormatError, TextBuilder, check_budget
from rag_assets.lib.types import Heading, Locator

VERSION = "html-selectolax-1"
HTML_SUFFIXES = (".html", ".htm")
BLOCKS = frozenset(
    [
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "p",
        "li",
        "pre",
        "blockquote",
        "tr",
        "dt",
        "dd",
        "figcaption",
        "caption",
        "summary",
    ]
)
SKIPPED = frozenset(
    ["script", "style", "noscript", "template", "nav", "header", "footer", "aside", "form"]
)
CELL_SEPARATOR = " | "
BLOCK_SEPARATOR = "\n\n"


def extract_html(text: str, path: Path) -> Extraction:
    tree = LexborHTMLParser(text)
    root = tree.body
    if root is None:
        raise FormatError("HTML has no <body>")
    for br in root.css("br"):  # a line break renders as white space between its words
        br.replace_with(" ")
    builder = TextBuilder()
    headings: list[Heading] = []
    locators: list[Locator] = []
    for n, node in enumerate(root.traverse(include_text=False)):
        if n % 1000 == 0:
            check_budget(f"element {n + 1}")  # issue 25
        if node.tag not in BLOCKS or _skipped(node):
            continue
        block = _block_text(node)
        if not block:
            continue
        if builder.pos:
            builder.add(BLOCK_SEPARATOR)
        start, end = builder.add(block)
        if node.tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            headings.append(Heading(1 if node.tag == "h1" else 2, block, start, end))
        else:
            locators.append(Locator(start, end, "block"))
    if not locators:
        raise FormatError("HTML has no visible text outside headings, scripts and navigation")
    title_node = tree.css_first("title")
    title = " ".join(title_node.text().split()) if title_node is not None else ""
    title = title or next((h.title for h in headings if h.level == 1), path.stem)
    return Extraction(text=builder.text(), title=title, headings=headings, locators=locators)


def _skipped(node: LexborNode) -> bool:
    """Inside a skipped element, or inside another block (the outer block holds its text)."""
    parent = node.parent
    while parent is not None:
        if parent.tag in SKIPPED or parent.tag in BLOCKS:
            return True
        parent = parent.parent
    return False


def _block_text(node: LexborNode) -> str:
    if node.tag == "tr":
        cells = [_collapse(c.text(deep=True)) for c in node.iter() if c.tag in ("td", "th")]
        return CELL_SEPARATOR.join(c for c in cells if c)
    return _collapse(node.text(deep=True))


def _collapse(text: str) -> str:
    return " ".join(text.split())
