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

import re
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


def seconds(t: float) -> str:
    """Seconds for a media fragment: ``132.4``, ``1`` (no trailing zeros)."""
    return _seconds(t)


def clock(t: float) -> str:
    """A clock time for people: ``2:12.4``, ``1:02:03.0``."""
    return _clock(t)


def _seconds(t: float) -> str:
    return f"{t:.3f}".rstrip("0").rstrip(".")


def _clock(t: float) -> str:
    minutes, seconds = divmod(t, 60)
    hours, minutes = divmod(int(minutes), 60)
    sec = f"{seconds:04.1f}"
    return f"{hours}:{minutes:02d}:{sec}" if hours else f"{minutes}:{sec}"


# -- pinpoint spans (issue 21) ---------------------------------------------------------------
#: Abbreviations whose period does not end a sentence (lowercased, without the period).
ABBREVIATIONS = frozenset(
    {
        "e.g",
        "i.e",
        "etc",
        "vs",
        "cf",
        "al",
        "fig",
        "figs",
        "eq",
        "eqs",
        "no",
        "nos",
        "p",
        "pp",
        "ch",
        "sec",
        "vol",
        "approx",
        "dr",
        "mr",
        "mrs",
        "ms",
        "st",
    }
)

_BLOCK_BREAK = re.compile(
    r"\n[ \t]*\n+|\f|\n(?=[ \t]*(?:[-*+•][ \t]|\d{1,3}[.)][ \t]|\||#{1,6}[ \t]|>|```|~~~))"
)
"""Where a text block ends: a blank line, a page break, or a line that opens a list item,
table row, heading, quote or code fence (hard-wrapped prose lines stay one block)."""

_SENTENCE_END = re.compile(r"[.!?…][)\]\"'”’*_`]*(?=\s+[\"'“‘(\[*_`]*[A-Z0-9])")
"""A sentence end: terminal punctuation (and closing quotes/brackets/emphasis), then white
space and a capital letter or digit."""


def span_units(
    kind: str, locators: list[Locator], start: int, end: int, content: str
) -> list[tuple[int, int]]:
    """The candidate spans of a chunk, as canonical ``[a, b)`` inside ``[start, end)``.

    A sheet's rows and a transcript's cues (from the locator map, clipped to the chunk), else
    the sentences of every text block (see :data:`_BLOCK_BREAK`, :data:`_SENTENCE_END`): never
    mid-word, whitespace trimmed, empty ones dropped, in document order.
    """
    unit_kind = {"csv": "row", "xlsx": "row", "vtt": "cue", "srt": "cue"}.get(kind)
    if unit_kind is not None:
        spans = [
            (max(loc.start, start), min(loc.end, end))
            for loc in locators
            if loc.kind == unit_kind and loc.start < end and start < loc.end
        ]
        return [s for s in (_trim(content, start, a, b) for a, b in sorted(spans)) if s]
    out: list[tuple[int, int]] = []
    pos = 0
    for brk in [*_BLOCK_BREAK.finditer(content), None]:
        stop = brk.start() if brk is not None else len(content)
        for a, b in _sentences(content, pos, stop):
            if (s := _trim(content, start, start + a, start + b)) is not None:
                out.append(s)
        pos = brk.end() if brk is not None else stop
    return out


def _sentences(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """Sentence ``[a, b)`` pieces of ``text[a:b]`` (offsets into ``text``)."""
    out: list[tuple[int, int]] = []
    pos = a
    for m in _SENTENCE_END.finditer(text, a, b):
        word = text[pos : m.start()].rsplit(None, 1)[-1] if text[pos : m.start()].strip() else ""
        bare = word.lower().lstrip("(\"'*_`")
        if bare in ABBREVIATIONS or (len(bare) == 1 and bare.isalpha()):
            continue  # "e.g. The", "J. Smith"
        out.append((pos, m.end()))
        pos = m.end()
    out.append((pos, b))
    return out


def _trim(content: str, start: int, a: int, b: int) -> tuple[int, int] | None:
    """``[a, b)`` (canonical offsets) without leading/trailing white space; None when blank
    or without a letter or digit."""
    piece = content[a - start : b - start]
    lead = len(piece) - len(piece.lstrip())
    tail = len(piece.rstrip())
    if tail <= lead or not any(ch.isalnum() for ch in piece):
        return None
    return a + lead, a + tail


def span_location(
    kind: str,
    locators: list[Locator],
    start: int,
    end: int,
    text: str,
    page: int | None = None,
) -> Location:
    """The locator of a span ``text`` = canonical ``[start, end)``: the cue times (``#t=``)
    of a transcript, the A1 range of a sheet's rows, a text fragment for HTML, ``#page=N`` for
    a PDF span on page ``page``, else ``#char=start,end``. ``label`` is always set."""
    where = locate(kind, locators, start, end, text)
    chars = f"chars {start}–{end}"
    if kind in ("vtt", "srt", "csv", "xlsx") and where.fragment:
        return where
    if kind == "html":
        return Location(fragment=where.fragment, label=chars)
    if page is not None:
        return Location(
            fragment=f"#page={page}",
            label=f"p. {page}, {chars}",
            ocr=where.ocr,
            ocr_confidence=where.ocr_confidence,
        )
    return Location(fragment=f"#char={start},{end}", label=chars)
