"""reStructuredText (``.rst``): the file's text as it is, section titles as headings.

Canonical text: the decoded file, exactly as Markdown and plain text are kept (strict UTF-8,
BOM dropped, CRLF/CR to LF), so a quote is the file's own words and a line number in the
canonical text is the line in the file. Nothing is rendered: directives, roles and literal
blocks stay as written.

Section titles are found by their adornment, as docutils defines it
(https://docutils.sourceforge.io/docs/ref/rst/restructuredtext.html#sections):

* a title line followed by an *underline*: one punctuation character repeated, at least as long
  as the title (or, for a shorter title, at least :data:`MIN_SHORT_UNDERLINE` characters long;
  docutils accepts that with a warning), both at the left margin; or
* an *overline*, the title line (it may be inset) and an underline of the same character and
  the same length.

A title starts a block: it is the first line of the file or follows a blank line. Indented
text (block quotes, literal blocks after ``::``, directive bodies) never holds a title, and an
adornment line alone between blank lines is a transition, not a title. Each adornment style
(character, with or without an overline) is a level, in the order styles first appear.

Levels become :class:`~rag_assets.lib.types.Heading` levels as the chunker reads them: when the
first style is used exactly once and opens the file (docutils' document title), that title is
level 1 (the document's title) and every other title is level 2, a section; otherwise every
title is a section (level 2) and the document title is the file stem. A heading spans its
adornment lines too, so no chunk holds a run of ``=====``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag_assets.lib.types import Heading

VERSION = "rst-1"
RST_SUFFIXES = (".rst", ".rest")

#: Characters docutils accepts in adornment lines: every printable 7-bit ASCII non-alphanumeric.
ADORNMENT_CHARS = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
#: An underline shorter than its title is still one from this many characters on (docutils:
#: "Title underline too short" is a warning there, and below it no title at all).
MIN_SHORT_UNDERLINE = 4

_ADORNMENT = re.compile("([" + re.escape(ADORNMENT_CHARS) + r"])\1*[ \t]*$")


@dataclass(frozen=True)
class Title:
    """One section title: its text, style ``(char, overlined)`` and ``[start, end)`` span
    covering the adornment lines."""

    text: str
    style: tuple[str, bool]
    start: int
    end: int


def rst_titles(text: str) -> list[Title]:
    """Every section title of ``text`` in document order (see the module doc for the rules)."""
    lines = text.split("\n")
    starts = []
    pos = 0
    for line in lines:
        starts.append(pos)
        pos += len(line) + 1
    out: list[Title] = []
    i = 0
    n = len(lines)
    while i < n:
        blank_before = i == 0 or not lines[i - 1].strip()
        if not blank_before:
            i += 1
            continue
        over = _adornment(lines[i])
        # overline, title, underline (same char, same length)
        if over and i + 2 < n:
            title = lines[i + 1].strip()
            under = _adornment(lines[i + 2])
            if (
                title
                and under == over
                and len(lines[i + 2].rstrip()) == len(lines[i].rstrip())
                and len(lines[i].rstrip()) >= len(title)
                and not _adornment(lines[i + 1])
            ):
                end = starts[i + 2] + len(lines[i + 2])
                out.append(Title(title, (over, True), starts[i], end))
                i += 3
                continue
        # title at the left margin, underline below it
        line = lines[i]
        if line.strip() and not line[0].isspace() and not over and i + 1 < n:
            under = _adornment(lines[i + 1])
            title = line.strip()
            width = len(lines[i + 1].rstrip())
            if under and (width >= len(title) or width >= MIN_SHORT_UNDERLINE):
                end = starts[i + 1] + len(lines[i + 1])
                out.append(Title(title, (under, False), starts[i], end))
                i += 2
                continue
        i += 1
    return out


def rst_headings(text: str, fallback_title: str) -> tuple[str, list[Heading]]:
    """(document title, headings) of ``text``: the levels of the module doc."""
    titles = rst_titles(text)
    if not titles:
        return fallback_title, []
    first_style = titles[0].style
    is_doctitle = (
        sum(1 for t in titles if t.style == first_style) == 1
        and not text[: titles[0].start].strip()
    )
    headings = [
        Heading(1 if (is_doctitle and k == 0) else 2, t.text, t.start, t.end)
        for k, t in enumerate(titles)
    ]
    return (titles[0].text if is_doctitle else fallback_title), headings


def _adornment(line: str) -> str | None:
    """The adornment character of a line that is one repeated punctuation character (at the
    left margin, trailing blanks allowed), else None."""
    if not line or line[0].isspace():
        return None
    m = _ADORNMENT.match(line)
    return m.group(1) if m else None
