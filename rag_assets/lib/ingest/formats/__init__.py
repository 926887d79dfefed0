"""Per-format extractors beyond Markdown/text: each turns file bytes into a :class:`Extraction`.

Every module builds its canonical text with :class:`TextBuilder`, so each locator's offsets are
the positions where its text was appended (never recomputed by searching). Modules raise
:class:`FormatError` with a one-line reason for bad input; ``extract.py`` turns that into a
failed document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rag_assets.lib.types import Heading, Locator


class FormatError(Exception):
    """Bad input for a format; the message is the document's failure reason."""


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
