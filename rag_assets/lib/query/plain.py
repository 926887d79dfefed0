"""The plain-text form of ``ask`` and ``search``: what ``rag-assets ask`` / ``search`` print
without ``--json``.

Links that open (issue 31), in one shape for every format (issue 39). A browser scrolls to no
``file://…#char=a,b``, so every citation names the place a terminal user can open
(:func:`open_link`): the service's URL when one is configured (``RAG_BASE_URL``: its document
view, ``?char=a,b``, scrolls to the span and highlights it, in the view of the document's
kind), else the file's path relative to the working directory (never ``file://``, never
absolute) with ``:LINE`` for a document whose text is the file's own (Markdown,
reStructuredText, plain text), which editors and terminals open at that line, or with the
fragment viewers honour (``#page=N`` of a PDF, ``#t=`` of a transcript's media, a text fragment
of an HTML page), else the bare path. A source's document no web address opens (issue 49: a
Git file in a local repository or on an unknown host, a private object) shows as
``path@commit:LINE`` (the commit's first 12 characters) or ``s3://bucket/key``. ``--json``
keeps the exact locators (``url``, ``fragment``, ``from``/``to``, ``span``) and the ``line``.

A refusal says how close it came (issue 31): the ``NO ANSWER`` line, then the nearest
distance, the cut and whether it was a near miss; with ``show_nearest`` the closest sources
below the bar follow, under a heading that says they are not an answer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlparse
from urllib.request import url2pathname

if TYPE_CHECKING:
    from rag_assets.lib.query.cite import Citation, Context
    from rag_assets.lib.query.verify import Verification
    from rag_assets.lib.types import Hit

_FULL_COMMIT = re.compile(r"@([0-9a-f]{12})[0-9a-f]{28}(?=[:#]|$)")
"""A Git citation's full commit (``path@<40 hex>:LINE``, issue 49), shown as 12 characters."""

QUOTE_WIDTH = 94
"""Characters of a quote shown on one line (4 indent + 2 quotes: 100)."""

VIEWER_FRAGMENTS = ("#page=", "#t=", "#:~:text=")
"""Fragments a viewer acts on: a PDF page, a media time, an HTML text fragment (kept after the
path, ``docs/x.pdf#page=4``). Others (``#char=``, a sheet's ``#Sheet!A1``) are dropped."""


def open_link(c: Citation, base_url: str | None = None, cwd: Path | None = None) -> str:
    """Where to open citation ``c`` (see the module doc): the service's document view under
    ``base_url`` with the span highlighted (``?char=a,b``, as the search page links it), else
    ``path:LINE``, ``path#page=N`` (a fragment a viewer understands) or the path, the path
    relative to ``cwd`` (default: the working directory), ``../`` included."""
    if base_url:
        a, b = (c.span.start, c.span.end) if c.span is not None else (c.start, c.end)
        return f"{base_url.rstrip('/')}/{quote(c.document_id, safe='/')}?char={a},{b}"
    if not c.url.startswith("file:"):  # a web address, or a source's path@commit:LINE
        web = c.url.startswith(("http://", "https://"))
        return c.url if web else _FULL_COMMIT.sub(r"@\1", c.url)
    path = _shown_path(url2pathname(unquote(urlparse(c.url).path)), cwd)
    if c.line is not None:
        return f"{path}:{c.line}"
    if c.fragment.startswith(VIEWER_FRAGMENTS):
        return f"{path}{c.fragment}"
    return path


def ask_lines(
    ctx: Context,
    answer_text: str | None = None,
    base_url: str | None = None,
    verification: Verification | None = None,
    note: str = "",
) -> list[str]:
    """The lines ``rag-assets ask`` prints (the written answer, if any, comes first, its
    unsupported sentences marked when it was verified: :func:`verified_lines`); ``note`` (issue
    53: a cut no question set checked, ``output.cut_note``) closes an answer."""
    if ctx.no_answer:
        lines = [ctx.message]
        if ctx.closeness:
            hint = "" if ctx.nearest else "; --show-nearest lists the closest sources"
            lines.append(f"  {ctx.closeness}{hint}")
        return lines + nearest_lines(ctx, base_url)
    lines = [answer_text, ""] if answer_text else []
    if answer_text and verification is not None:
        lines = [*verified_lines(answer_text, verification), ""]
    for c in ctx.citations:
        lines += _source_lines(f"[{c.index}] ", c, base_url)
    return lines + nearest_lines(ctx, base_url) + ([f"note: {note}"] if note else [])


UNSUPPORTED_MARK = "[UNSUPPORTED]"
"""What follows an unsupported sentence in ``rag-assets ask``'s text (issue 50)."""


def verified_lines(answer_text: str, verification: Verification) -> list[str]:
    """The answer with :data:`UNSUPPORTED_MARK` after each unsupported sentence, then one line
    per unsupported (or uncited) sentence with its reason, and the count supported."""
    marked, pos = [], 0
    for v in verification.sentences:
        if v.verdict == "unsupported" and not v.dropped:
            marked += [answer_text[pos : v.sentence.end], f" {UNSUPPORTED_MARK}"]
            pos = v.sentence.end
    lines = ["".join([*marked, answer_text[pos:]])]
    for i, v in enumerate(verification.sentences, start=1):
        if v.verdict == "supported":
            continue
        what = "dropped" if v.dropped else v.verdict
        lines.append(f'  {what}: sentence {i} "{shorten(v.sentence.claim, 60)}": {v.reason}')
    s = verification
    tail = f", {sum(v.dropped for v in s.sentences)} dropped" if s.policy == "drop" else ""
    lines.append(
        f"  verified: {s.supported} of {s.total} sentences supported by their sources{tail}"
    )
    return lines


def nearest_lines(ctx: Context, base_url: str | None = None) -> list[str]:
    """The sources below the bar (``show_nearest``), under a heading saying what they are not."""
    if not ctx.nearest:
        return []
    bar = {"judge": "the answer check", "verification": "the answer's verification"}.get(
        ctx.refused_by or "", f"the cut {ctx.threshold:g}"
    )
    lines = ["", f"below the bar ({bar}): not an answer, not sent to a model"]
    for c in ctx.nearest:
        lines += _source_lines("  - ", c, base_url)
    return lines


def search_lines(hits: Sequence[Hit], cited: Sequence[Citation], base_url: str | None) -> list[str]:
    """One line per hit (rank, score, distance, document, section, where to open it) and under
    it a line of the quote: the span that best matches the query, cut to one line."""
    doc_w = max([0, *(len(h.document_id) for h in hits)])  # names are never cut
    sec_w = max([0, *(len(h.section) for h in hits)])
    out = []
    for h, c in zip(hits, cited, strict=True):
        out.append(
            f"{h.rank:>3} {h.score:8.4f} d={h.cosine_distance:.3f} {h.document_id:{doc_w}} "
            f"{h.section:{sec_w}} {open_link(c, base_url)}"
        )
        out.append(f'    "{shorten(_quoted(c), QUOTE_WIDTH)}"')
    return out


def shorten(text: str, width: int) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``width`` characters with "…"."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def _source_lines(prefix: str, c: Citation, base_url: str | None) -> list[str]:
    dist = "" if c.cosine_distance is None else f"  d={c.cosine_distance:.3f}"
    head = f"{prefix}{c.document_name}  {c.locator_label}  {open_link(c, base_url)}{dist}"
    if c.span is not None:  # issue 21: the sentence(s)/row(s)/cue(s) that answer, whole
        return [head, f'    {c.span.label}  "{" ".join(c.span.text.split())}"']
    return [head, f'    "{shorten(c.quote, QUOTE_WIDTH)}"']  # the verified words, one line


def _quoted(c: Citation) -> str:
    return c.span.text if c.span is not None else c.quote


def _shown_path(path: str, cwd: Path | None) -> str:
    here = Path(cwd) if cwd is not None else Path.cwd()
    return os.path.relpath(path, here)
