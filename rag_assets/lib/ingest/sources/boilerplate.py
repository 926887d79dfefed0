"""Website boilerplate (issue 49): a page's main content, less the blocks most of its site's
pages repeat.

A page of a website is mostly its site's frame: a menu, a sidebar of chapters, a "Next:
Types, Previous: Simple Example, Up: Using libffi [Contents][Index]" line, a footer. The HTML
extractor already leaves out ``<nav>``, ``<header>``, ``<footer>``, ``<aside>`` and forms; what
generated manuals and CMS pages write with plain ``<div>``s and tables stays. So, for a website
source:

1. **Main content.** The page's ``<main>`` or ``role="main"`` element (the first), else its one
   ``<article>``, else its body; ARIA landmarks that are not content (``role="navigation"``,
   ``banner``, ``contentinfo``, ``complementary``, ``search``) are left out wherever they are.
2. **Repeated blocks.** Each block of the main content (a paragraph, a list item, a data row of
   a table, a ``<div>`` of inline text: what the extractor reads as one block) has a
   signature: its text, and, for a block of two links or more that is at least half link text,
   its *shape* (the text with each link's text masked: "Next: ·, Previous: ·, Up: · [·][·]",
   the same on every page of a Texinfo manual), and, for such a block that opens or closes the
   page, that place (the first page of a chapter has no "Previous:"). A signature found on at
   least half of the site's HTML pages (and on 3 at least; a site of 4 pages or more) is the
   site's frame, and its blocks are dropped from every page. Headings are never dropped (they
   make the sections), and a page left with no text keeps its main content whole (a page of
   links is its links).

:func:`page_signatures` is computed once per fetched page (kept with the page in the crawl's
cache); :func:`repeated` over the site's pages at each listing; :func:`main_content` writes the
page the extractor reads. A page's content identity includes the signatures dropped from it, so
a page whose frame changes is read again, and only then.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable

from selectolax.lexbor import LexborHTMLParser, LexborNode

from rag_assets.lib.ingest.formats.html import BLOCK_LEVEL, HEADINGS, SKIPPED

VERSION = "main-1"  # part of a page's identity: a change here reads every page again
MIN_PAGES = 4  # a site smaller than this has no frame to tell apart
MIN_SHARE = 0.5  # on at least this share of the site's HTML pages
MIN_REPEATS = 3  # and on at least this many
MAX_BLOCK_CHARS = 400  # a longer block is content, never a frame's
NOT_CONTENT = ",".join(
    f'[role="{r}"]' for r in ("navigation", "banner", "contentinfo", "complementary", "search")
)
_CELLS = ("td", "th")
_MASK = "\u00b7"


def page_signatures(html: bytes) -> list[str]:
    """The signatures of the blocks of ``html``'s main content (see the module), sorted,
    each once."""
    tree = _parse(html)
    if tree is None:
        return []
    root = _main(tree)
    return sorted({s for _, sigs in _blocks(root) for s in sigs})


def repeated(pages: Iterable[Iterable[str]]) -> frozenset[str]:
    """The signatures that make the site's frame: on at least :data:`MIN_SHARE` of ``pages``
    (each page's signatures) and on :data:`MIN_REPEATS` of them; none for a site of fewer
    than :data:`MIN_PAGES` pages."""
    counts: Counter[str] = Counter()
    n = 0
    for sigs in pages:
        n += 1
        counts.update(set(sigs))
    if n < MIN_PAGES:
        return frozenset()
    need = max(MIN_REPEATS, math.ceil(MIN_SHARE * n))
    return frozenset(s for s, c in counts.items() if c >= need)


def main_content(html: bytes, drop: Iterable[str] = ()) -> bytes:
    """``html`` as the extractor should read it: its head (title, canonical link) and its main
    content, less the blocks whose signature is in ``drop``; unchanged when it is not UTF-8
    (the extractor says so) or has no body."""
    tree = _parse(html)
    if tree is None or tree.body is None:
        return html
    root = _main(tree)
    kept = root.html or ""
    dropped = set(drop)
    if dropped:
        for node, sigs in list(_blocks(root)):
            if dropped.intersection(sigs):
                node.decompose()
        if (root.text(deep=True) or "").strip():
            kept = root.html or ""
    head = tree.head.html if tree.head is not None else "<head></head>"
    page = f"<!DOCTYPE html><html>{head}<body>{kept}</body></html>"
    return page.encode("utf-8")


def dropped_digest(sigs: Iterable[str], frame: frozenset[str]) -> str:
    """What of the site's frame a page loses (part of its identity): ``main-1:<digest>``."""
    mine = sorted(set(sigs) & frame)
    return f"{VERSION}:{hashlib.sha256('|'.join(mine).encode()).hexdigest()[:12]}"


def _parse(html: bytes) -> LexborHTMLParser | None:
    try:
        return LexborHTMLParser(html.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def _main(tree: LexborHTMLParser) -> LexborNode:
    """The main content element (see the module), with the non-content landmarks removed."""
    for node in tree.css(NOT_CONTENT):
        node.decompose()
    main = tree.css_first('main, [role="main"]')
    if main is None:
        articles = tree.css("article")
        main = articles[0] if len(articles) == 1 else None
    return main if main is not None else tree.body  # type: ignore[return-value]


def _blocks(root: LexborNode) -> Iterable[tuple[LexborNode, list[str]]]:
    """(element, its signatures) for each block the extractor reads as one: a block-level
    element with no block-level element inside it, a table row of inline cells as one; never
    a heading, nothing inside what the extractor skips, nothing longer than
    :data:`MAX_BLOCK_CHARS`."""
    top = root.mem_id
    blocks = [n for n in root.traverse() if n.tag in BLOCK_LEVEL]
    outer: set[int] = set()  # elements with a block-level element inside them
    for node in blocks:
        parent = node.parent
        while parent is not None and parent.mem_id not in outer and node.mem_id != top:
            outer.add(parent.mem_id)
            if parent.mem_id == top:
                break
            parent = parent.parent
    seen: set[int] = set()
    found: list[tuple[LexborNode, list[str]]] = []
    for node in blocks:
        tag = node.tag or ""
        if node.mem_id in outer or tag in HEADINGS or tag == "pre":
            continue
        row = node.parent
        if (
            tag in _CELLS
            and row is not None
            and row.tag == "tr"
            and row.mem_id != top
            and not any(c.mem_id in outer for c in row.iter() if c.tag in _CELLS)
        ):
            node = row  # a data row: one block (its cells joined)
        if node.mem_id in seen or _skipped(node, top):
            continue
        seen.add(node.mem_id)
        sigs = _signatures(node)
        if sigs:
            found.append((node, sigs))
    # where a page starts or ends with links (a "Previous: ·, Up: ·" line on the first page of
    # a chapter has no "Next"), that place is a signature too: the frame's, on most pages
    places = ((found[0], "pfirst"), (found[-1], "plast")) if found else ()
    for (_, sigs), place in places:
        if any(s.startswith("s") for s in sigs):
            sigs.append(place)
    yield from found


def _skipped(node: LexborNode, top: int) -> bool:
    parent = node.parent
    while parent is not None and parent.mem_id != top:
        if parent.tag in SKIPPED or parent.tag == "pre":
            return True
        parent = parent.parent
    return False


def _signatures(node: LexborNode) -> list[str]:
    text = " ".join((node.text(deep=True, separator=" ") or "").split())
    if not text or len(text) > MAX_BLOCK_CHARS:
        return []
    out = [_sig("t", text)]
    links = [" ".join((a.text(deep=True, separator=" ") or "").split()) for a in node.css("a")]
    links = [t for t in links if t]
    linked = sum(len(t.replace(" ", "")) for t in links)
    if len(links) >= 2 and linked * 2 >= len(text.replace(" ", "")):
        shape = text
        for t in links:
            shape = shape.replace(t, _MASK, 1)
        out.append(_sig("s", shape))
    return out


def _sig(kind: str, text: str) -> str:
    return f"{kind}{hashlib.sha256(text.encode()).hexdigest()[:16]}"
