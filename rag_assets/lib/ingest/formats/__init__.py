"""Per-format extractors beyond Markdown/text: each turns file bytes into a :class:`Extraction`.

Every module builds its canonical text with :class:`TextBuilder`, so each locator's offsets are
the positions where its text was appended (never recomputed by searching). Modules raise
:class:`FormatError` with a one-line reason for bad input; ``extract.py`` turns that into a
failed document.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rag_assets.lib.types import Heading, Locator


class FormatError(Exception):
    """Bad input for a format; the message is the document's failure reason."""


DEFAULT_BUDGET_S = 120.0
"""Seconds of extraction work one document may take (issue 25). Every extractor checks it as
it goes (per PDF page, DOCX block, sheet row, HTML block, Markdown heading scan): past it the
document fails alone with this reason and the folder goes on. The paths measured in
``rag-assets bench formats`` take well under a second per megabyte, so only a pathological
file reaches it."""

_deadline: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "rag_extraction_deadline", default=None
)


@contextmanager
def budget(seconds: float = DEFAULT_BUDGET_S) -> Iterator[None]:
    """Run one document's extraction under a time budget (see :func:`check_budget`)."""
    token = _deadline.set((time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


def check_budget(where: str) -> None:
    """Raise :class:`FormatError` when the current document's budget is spent (``where``
    names how far extraction got, e.g. ``"page 812"``)."""
    deadline = _deadline.get()
    if deadline is not None and time.monotonic() > deadline[0]:
        raise FormatError(
            f"extraction budget of {deadline[1]:g} s per document spent at {where}: the file "
            "is too costly to read (split it, or simplify its structure)"
        )


@dataclass
class Extraction:
    """What a format extractor returns (``partial`` is a reason when some content is left out)."""

    text: str
    title: str
    headings: list[Heading] = field(default_factory=list)
    locators: list[Locator] = field(default_factory=list)
    page_starts: list[int] = field(default_factory=list)
    partial: str | None = None


class TextBuilder:
    """Append-only canonical text that records where each piece landed."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self.pos = 0

    def add(self, piece: str) -> tuple[int, int]:
        """Append ``piece``; return its ``(start, end)`` in the canonical text."""
        start = self.pos
        self._parts.append(piece)
        self.pos += len(piece)
        return start, self.pos

    def text(self) -> str:
        return "".join(self._parts)


def sort_locators(locators: list[Locator]) -> list[Locator]:
    """Deterministic order: by start, end, then kind."""
    return sorted(locators, key=lambda loc: (loc.start, loc.end, loc.kind))


MAX_EXPANDED_BYTES = 250_000_000
"""The most bytes the members of a ZIP-based document (DOCX, XLSX) may expand to, by the sizes
its directory declares (issue 30). Checked before anything is decompressed, so a 2 MB file that
expands to 2 GiB of XML fails alone at once instead of taking the machine's memory. Python's
``zipfile`` never returns more than a member's declared size (then fails its CRC), so the
declared sizes bound what is read. Real documents stay far below it: the 50 MB file limit's
worth of XML expands about 5-10x."""


def check_zip_expansion(zf: Any, what: str, limit: int | None = None) -> None:
    """Raise :class:`FormatError` when the members of ``zf`` (a ``zipfile.ZipFile``) declare
    more than ``limit`` (default :data:`MAX_EXPANDED_BYTES`) bytes in all."""
    limit = MAX_EXPANDED_BYTES if limit is None else limit
    infos = zf.infolist()
    total = sum(max(0, i.file_size) for i in infos)
    if total > limit:
        big = max(infos, key=lambda i: i.file_size)
        packed = sum(i.compress_size for i in infos)
        raise FormatError(
            f"{what} expands to {total:,} bytes ({big.filename} alone {big.file_size:,}) from "
            f"{packed:,} compressed: over the limit of {limit:,} bytes a ZIP-based document may "
            "expand to (a zip bomb, or a document to split)"
        )
