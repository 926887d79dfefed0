"""Checks of text that comes from outside (questions, queries, names): one reason or None.

A question must be encodable as UTF-8 and readable: lone surrogates (U+D800..U+DFFF, which
JSON ``\\ud800`` escapes and undecodable command-line bytes produce) cannot reach the tokenizer,
and control characters other than tab, LF and CR are refused rather than silently embedded.
"""

from __future__ import annotations

import re

ALLOWED_CONTROLS = "\t\n\r"
"""Control characters a question may contain (everything else in C0, DEL and C1 is refused)."""

_BAD = re.compile(r"[\ud800-\udfff]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def text_problem(text: str, what: str = "text") -> str | None:
    """Why ``text`` is refused (one line naming the character and where), or None when fine."""
    m = _BAD.search(text)
    if m is None:
        return None
    ch = m.group()
    if "\ud800" <= ch <= "\udfff":
        return (
            f"{what} contains a lone surrogate U+{ord(ch):04X} at character {m.start()}: "
            "send valid Unicode text (UTF-8)"
        )
    return (
        f"{what} contains the control character U+{ord(ch):04X} at character {m.start()}: "
        "remove it (tab, newline and carriage return are allowed)"
    )
