"""Locator map -> citation locator: the fragment, the label part and the OCR flag of a span.

Given a chunk's ``[start, end)`` and its document's kind and :class:`~rag_assets.lib.types.
Locator` list, :func:`locate` says where the words are in the source:

* transcript (``vtt``/``srt``): ``#t=a,b`` (W3C Media Fragments, seconds) from the first to the
  last cue the span overlaps, on the media file the transcript belongs to when there is one;
* spreadsheet (``csv``/``xlsx``): ``#Sheet1!A12:F19``, the A1 range of the rows it overlaps;
* HTML: a text fragment ``#:~:text=start,end`` (WICG Scroll-to-Text) from its first and last
  :data:`FRAGMENT_WORDS` words (the whole span when it has at most twice as many);
* PDF: ``ocr`` / ``ocr_confidence`` of the OCR page it is on (fragment stays ``#page=N``).

``None`` fields mean "keep the default" (``#char=a,b`` / ``#page=N``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from rag_assets.lib.ingest.formats.sheets import a1_range
from rag_assets.lib.types import Locator

#: Words taken from each end of a chunk for an HTML text fragment.
FRAGMENT_WORDS = 4


@dataclass(frozen=True)
class Location:
    fragment: str | None = None  # replaces the default fragment when set
    label: str | None = None  # appended to the section label (", 0:01.0–0:04.5") ...
    replace_label: bool = False  # ... or, when set, the whole label (a sheet's A1 range)
    ocr: bool = False
    ocr_confidence: float | None = None
    target: str | None = None  # another file to link (a transcript's media), relative path


def locate(kind: str, locators: list[Locator], start: int, end: int, content: str) -> Location:
    """Where ``content`` (= canonical ``[start, end)``) lies in a document of ``kind``."""

    def over(k: str) -> list[Locator]:
        return [loc for loc in locators if loc.kind == k and loc.start < end and start < loc.end]

    if kind in ("vtt", "srt"):
        cues = over("cue")
        media = next((loc.target for loc in locators if loc.kind == "media"), None)
        if cues:
            t0, t1 = cues[0].t_start or 0.0, cues[-1].t_end or 0.0
            return Location(
                fragment=f"#t={_seconds(t0)},{_seconds(t1)}",
                label=f"{_clock(t0)}–{_clock(t1)}",
                target=media,
            )
        return Location(target=media)
    if kind in ("csv", "xlsx"):
        rows = over("row")
        if rows:
            sheet = rows[0].sheet or ""
            same = [r for r in rows if r.sheet == sheet]
            rng = a1_range(
                sheet,
                min(r.row or 1 for r in same),
                max(r.row or 1 for r in same),
                min(r.col_first or 1 for r in same),
                max(r.col_last or 1 for r in same),
            )
            return Location(fragment="#" + quote(rng, safe="!:'"), label=rng, replace_label=True)
        return Location()
    if kind == "html":
        return Location(fragment=text_fragment(content))
    ocr = over("ocr")
    if ocr:
        return Location(ocr=True, ocr_confidence=ocr[0].ocr_confidence)
    return Location()


def text_fragment(content: str, words: int = FRAGMENT_WORDS) -> str:
    """``#:~:text=start,end`` for ``content`` (cell separators ``|`` are not page words)."""
    tokens = [t for t in content.split() if t != "|"]
    if len(tokens) <= 2 * words:
        return "#:~:text=" + _encode(" ".join(tokens))
    return f"#:~:text={_encode(' '.join(tokens[:words]))},{_encode(' '.join(tokens[-words:]))}"


def _encode(s: str) -> str:
    # the fragment's own syntax characters must be percent-encoded: "-" "," "&" (and "%")
    return quote(s, safe="").replace("-", "%2D")


def _seconds(t: float) -> str:
    return f"{t:.3f}".rstrip("0").rstrip(".")


def _clock(t: float) -> str:
    minutes, seconds = divmod(t, 60)
    hours, minutes = divmod(int(minutes), 60)
    sec = f"{seconds:04.1f}"
    return f"{hours}:{minutes:02d}:{sec}" if hours else f"{minutes}:{sec}"
