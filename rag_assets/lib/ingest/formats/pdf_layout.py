"""PDF page furniture: running headers, footers and page numbers, found across pages.

A line is furniture when it lies in the top or bottom :data:`MARGIN_BAND` of its page (by its
bounding box from ``page.get_text("dict")``) and either

* its text with digit runs replaced by ``#`` (case and whitespace folded) occurs in that band
  on at least :data:`MIN_SHARE` of the pages (and on at least 2), e.g. a running title or
  ``Page # of #``; or
* it is a bare page number (``12``, ``- 12 -``, ``xii``, ``Page 12``, ``12 of 40``) in a
  document of two or more pages.

Spans are located in the page's ``get_text()`` output (the canonical text) as whole lines, the
occurrence nearest the line's position in the ``dict`` order, so they are true offsets. The
chunker keeps them out of chunk content; the canonical text keeps them.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

#: Share of the page height, at the top and at the bottom, where running lines are looked for.
MARGIN_BAND = 0.09
#: A repeated margin line is furniture when it is on at least this share of the pages.
MIN_SHARE = 0.4

_PAGE_NUMBER = re.compile(
    r"^(?:[-–—]\s*)?(?:page\s+)?(?:\d{1,4}|[ivxlcdm]{1,7})(?:\s*(?:of|/)\s*\d{1,4})?(?:\s*[-–—])?$",
    re.IGNORECASE,
)


def furniture_spans(pdf: Any, pages: list[str]) -> list[list[tuple[int, int]]]:
    """Per page, the ``(start, end)`` offsets (into that page's text) of its furniture lines."""
    margins: list[list[tuple[int, str]]] = []  # per page: (dict line index, text) in the band
    for number in range(len(pages)):
        page = pdf[number]
        height = page.rect.height
        found: list[tuple[int, str]] = []
        index = 0
        for block in page.get_text("dict")["blocks"]:
            if block.get("type") != 0:
                continue
            for line in block["lines"]:
                text = "".join(span["text"] for span in line["spans"])
                y0, y1 = line["bbox"][1], line["bbox"][3]
                top, bottom = MARGIN_BAND * height, (1 - MARGIN_BAND) * height
                if text.strip() and (y1 <= top or y0 >= bottom):
                    found.append((index, text))
                index += 1
        margins.append(found)
    counts = Counter(key for found in margins for key in {_key(t) for _, t in found})
    floor = max(2, MIN_SHARE * len(pages))
    out: list[list[tuple[int, int]]] = []
    for page_text, found in zip(pages, margins, strict=True):
        lines = _lines(page_text)
        used: set[int] = set()
        spans: list[tuple[int, int]] = []
        for index, text in found:
            key = _key(text)
            bare_number = len(pages) >= 2 and _PAGE_NUMBER.match(" ".join(text.split()))
            if counts[key] < floor and not bare_number:
                continue
            hits = [j for j, (_, _, t) in enumerate(lines) if t == text and j not in used]
            if not hits:
                continue
            j = min(hits, key=lambda j: (abs(j - index), j))
            used.add(j)
            spans.append(lines[j][:2])
        out.append(sorted(spans))
    return out


def _key(text: str) -> str:
    return re.sub(r"\d+", "#", " ".join(text.lower().split()))


def _lines(page_text: str) -> list[tuple[int, int, str]]:
    out = []
    pos = 0
    for line in page_text.split("\n"):
        out.append((pos, pos + len(line), line))
        pos += len(line) + 1
    return out
