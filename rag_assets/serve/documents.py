"""``GET /documents/{id}``: a stored document as HTML with one ``[from, to)`` span highlighted.

Every locator kind has its view (issue 21, :func:`render_view`): Markdown rendered, text/DOCX/
HTML as their extracted text (the span in ``<mark id="cite">``, scrolled to); a sheet as a table
per sheet with the row(s) the span overlaps highlighted; a transcript as its cues with times,
the cited cue(s) highlighted, and a ``<video>``/``<audio>`` element on the media file beside it
seeked to the cues' ``#t=``; a PDF (with a span) at ``#page=N`` in an embedded viewer, the span's
text shown beside it. The header names the span's own locator (``Sheet!A5:D5``, ``0:14.0–0:22.2``,
``p. N, chars a–b``, ``chars a–b``).

The text comes from the published index (the canonical text quotes were verified against),
never from a path in the request. Markdown is rendered with markdown-it-py (CommonMark +
tables): two private-use sentinels are put into the source at the span's ends (moved off
line-leading block syntax such as list bullets or code fences, which they would otherwise
break), and after rendering every text run between them is wrapped in ``<mark class="cite">``,
so a span that crosses paragraphs or list items still yields well-nested HTML. Plain text is
shown in ``<pre>``. If the sentinels do not come through the renderer intact the document is
shown as preformatted text instead, where the span is exact by construction.

Raw HTML in Markdown (issue 31: a README's ``<p align="center"><img …></p>``, ``<details>``,
``<kbd>``) is never passed through and never shown as escaped markup in the prose: a raw HTML
block becomes its visible text (``div.html-block``, read as HTML extraction reads a page:
scripts, styles and comments out), an inline tag disappears and the words between tags stay.
Everything shown is escaped text, so nothing in a document runs in the page.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from markdown_it import MarkdownIt

from rag_assets.lib.ingest.formats.html import fragment_text
from rag_assets.lib.ingest.formats.locate import clock, seconds, span_location
from rag_assets.lib.ingest.formats.media import MEDIA_SUFFIXES
from rag_assets.lib.ingest.formats.sheets import CELL_SEPARATOR
from rag_assets.lib.ingest.sources import VIEW
from rag_assets.lib.types import Locator, locators_from_json

AUDIO_SUFFIXES = (".m4a", ".mp3", ".ogg", ".opus", ".wav")
"""Media played in ``<audio>``; the other :data:`MEDIA_SUFFIXES` in ``<video>``."""

OPEN, CLOSE = "\ue000", "\ue001"  # Unicode private-use: never in rendered Markdown syntax
_LEAD = re.compile(r"[ \t]*(?:(?:[-*+]|\d{1,9}[.)])[ \t]+|>[ \t]?|#{1,6}[ \t]+|\|[ \t]*)*")
_FENCE = re.compile(r"[ \t]{0,3}(```|~~~)")
_TAG_SPLIT = re.compile(r"(<[^>]*>)")

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="stylesheet" href="{root}static/style.css">
</head><body class="document">
<header><a href="{root}">&larr; search</a> <span class="doc-id">{doc_id}</span>
<span class="span-info">{span_info}</span></header>
<main class="doc-body">
{body}
</main>
<script src="{root}static/document.js"></script>
</body></html>
"""


def parse_char_span(value: str | None, length: int) -> tuple[int, int] | None:
    """``"a,b"`` → ``(a, b)`` with ``0 <= a <= b <= length``; None for no value.

    Raises ``ValueError`` with one line naming the problem otherwise.
    """
    if value is None or value == "":
        return None
    m = re.fullmatch(r"(\d{1,9}),(\d{1,9})", value.strip())
    if not m:
        raise ValueError(f"char={value!r} is not 'from,to' (two offsets, e.g. char=120,480)")
    a, b = int(m.group(1)), int(m.group(2))
    if a > b:
        raise ValueError(f"char={a},{b} is reversed: give from,to with from <= to (char={b},{a})")
    if not 0 <= a <= b <= length:
        raise ValueError(f"char={a},{b} is outside the document (0..{length})")
    return a, b


def render_document(
    text: str, kind: str, doc_id: str, title: str, span: tuple[int, int] | None, root: str = "/"
) -> str:
    """The full HTML page for one stored document."""
    body = render_markdown(text, span) if kind == "markdown" else render_preformatted(text, span)
    span_info = f"#char={span[0]},{span[1]}" if span else ""
    return PAGE.format(
        title=html.escape(title or doc_id),
        doc_id=html.escape(doc_id),
        span_info=span_info,
        body=body,
        root=root,
    )


def render_preformatted(text: str, span: tuple[int, int] | None) -> str:
    """``<pre>`` of the text, the span (exact offsets) in ``<mark id="cite">``."""
    if span is None:
        return f'<pre class="text">{html.escape(text)}</pre>'
    a, b = span
    return (
        f'<pre class="text">{html.escape(text[:a])}<mark class="cite" id="cite">'
        f"{html.escape(text[a:b])}</mark>{html.escape(text[b:])}</pre>"
    )


def render_markdown(text: str, span: tuple[int, int] | None) -> str:
    """Markdown rendered to HTML with the span's text runs in ``<mark class="cite">``."""
    md = _markdown()
    if span is None or span[0] == span[1]:
        return str(md.render(text))
    if OPEN in text or CLOSE in text:
        return render_preformatted(text, span)
    a, b = _adjust(text, *span)
    marked = text[:a] + OPEN + text[a:b] + CLOSE + text[b:]
    out = str(md.render(marked))
    if out.count(OPEN) != 1 or out.count(CLOSE) != 1 or out.index(OPEN) > out.index(CLOSE):
        return render_preformatted(text, span)
    return _wrap_marked(out)


def _markdown() -> MarkdownIt:
    """CommonMark + tables, raw HTML recognised as such (not as paragraph text) and rendered by
    :func:`_html_block` / :func:`_html_inline`: its text, escaped; never its markup."""
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    md.add_render_rule("html_block", _html_block)
    md.add_render_rule("html_inline", _html_inline)
    return md


def _sentinels(raw: str, shown: str) -> tuple[str, str]:
    """The span sentinels of ``raw`` that ``shown`` lost (inside a tag or a comment): put
    back before / after the shown text so the highlight still opens and closes there."""
    before = OPEN if OPEN in raw and OPEN not in shown else ""
    after = CLOSE if CLOSE in raw and CLOSE not in shown else ""
    return before, after


def _html_block(self: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
    """A raw HTML block as its visible text (escaped), in ``div.html-block``."""
    raw = tokens[idx].content
    shown = fragment_text(raw)
    before, after = _sentinels(raw, shown)
    if not shown:
        return before + after
    return f'<div class="html-block">{before}{html.escape(shown, quote=False)}{after}</div>\n'


def _html_inline(self: Any, tokens: list[Any], idx: int, options: Any, env: Any) -> str:
    """An inline tag (``<kbd>``, ``<br>``, ``<img>``, a comment): nothing but a line break for
    ``<br>`` (the words around and between tags are ordinary text tokens)."""
    raw = tokens[idx].content
    before, after = _sentinels(raw, "")
    brk = "<br>" if re.fullmatch(r"<br\s*/?>", raw.strip(), re.I) else ""
    return before + brk + after


def _adjust(text: str, a: int, b: int) -> tuple[int, int]:
    """Move the span's ends off block syntax the sentinels would break."""
    if a == 0 or text[a - 1] == "\n":
        line = text[a : (text.find("\n", a) + 1 or len(text) + 1) - 1]
        if _FENCE.match(line) and a + len(line) + 1 <= b:
            a += len(line) + 1  # start inside the code block, after the opening fence
        else:
            a += _LEAD.match(line).end()  # type: ignore[union-attr]  # always matches
    line_start = text.rfind("\n", 0, b) + 1
    last = text[line_start:b]
    if _FENCE.match(last) and line_start - 1 > a:
        b = line_start - 1  # end before a closing fence's line, inside the code block
    elif last.lstrip().startswith("|") and last.rstrip().endswith("|"):
        b = line_start + len(last.rstrip()) - 1  # inside a table row's last cell
    return min(a, b), b


def _wrap_marked(out: str) -> str:
    """Wrap every non-blank text run between the sentinels in ``<mark>`` (the first gets
    ``id="cite"``, the scroll target); tags are copied unchanged."""
    parts: list[str] = []
    inside = False
    first = True
    for part in _TAG_SPLIT.split(out):
        if part.startswith("<"):
            inside = (inside or OPEN in part) and CLOSE not in part
            parts.append(part.replace(OPEN, "").replace(CLOSE, ""))
            continue
        for seg in re.split(f"([{OPEN}{CLOSE}])", part):
            if seg == OPEN:
                inside = True
            elif seg == CLOSE:
                inside = False
            elif inside and seg.strip():
                anchor = ' id="cite"' if first else ""
                parts.append(f'<mark class="cite"{anchor}>{seg}</mark>')
                first = False
            else:
                parts.append(seg)
    return "".join(parts)


# -- one view per locator kind (issue 21) -----------------------------------------------------
def media_file(doc: dict[str, Any]) -> tuple[str, Path] | None:
    """``(media id, path)`` of the media file a transcript belongs to, when it is beside it."""
    target = next(
        (loc.target for loc in _locators(doc) if loc.kind == "media" and loc.target), None
    )
    if target is None or not doc.get("path"):
        return None
    path = Path(doc["path"]).with_name(Path(target).name)
    return (target, path) if path.is_file() else None


def media_owner(documents: dict[str, dict[str, Any]], media_id: str) -> Path | None:
    """The file of ``media_id`` when a published transcript names it as its media (the only
    non-document files ``/documents/`` serves: what transcript citations link to)."""
    if not media_id.lower().endswith(MEDIA_SUFFIXES):
        return None
    for doc in documents.values():
        if doc.get("kind") in ("vtt", "srt"):
            found = media_file(doc)
            if found is not None and found[0] == media_id:
                return found[1]
    return None


def _locators(doc: dict[str, Any]) -> list[Locator]:
    return locators_from_json(doc.get("locators_json"))


def original_pdf(
    document_id: str, doc: dict[str, Any], work_dir: str | Path
) -> Path | bytes | str | None:
    """Where the view of a PDF finds the file (issue 49): its file; else the source's bytes
    (a Git file at the commit it was indexed at, from the source's cache; an object, from its
    bucket); else the web address it was read from (a website's PDF, a ``link`` template's
    URL: a redirect); None when there is none."""
    from rag_assets.lib.ingest.sources.original import read_original

    path = str(doc.get("path") or "")
    if path and "://" not in path and not path.startswith(VIEW):
        return Path(path) if Path(path).is_file() else None
    data = read_original(document_id, doc, work_dir, None)
    if data is not None:
        return data
    if path.startswith(("http://", "https://")):
        return path.replace("{line}", "1")
    return None


def pdf_page(doc: dict[str, Any], offset: int) -> int:
    """1-based page of a PDF holding canonical ``offset``."""
    return sum(1 for s in doc.get("page_starts") or [0] if s <= offset) or 1


def span_label(doc: dict[str, Any], span: tuple[int, int] | None) -> str:
    """The span's own locator in words (empty without a span)."""
    if span is None:
        return ""
    text, kind = doc["text"], doc.get("kind") or ""
    page = pdf_page(doc, span[0]) if kind == "pdf" else None
    where = span_location(kind, _locators(doc), span[0], span[1], text[span[0] : span[1]], page)
    return where.label or f"#char={span[0]},{span[1]}"


def render_view(
    doc: dict[str, Any], doc_id: str, span: tuple[int, int] | None, root: str = "/"
) -> str:
    """The HTML page of one stored document in the view of its kind (see the module doc)."""
    kind, text = doc.get("kind") or "text", doc["text"]
    if kind in ("csv", "xlsx"):
        body = render_sheet(text, _locators(doc), span)
    elif kind in ("vtt", "srt"):
        media = media_file(doc)
        src = f"{root}documents/{quote(media[0], safe='/')}" if media else None
        body = render_cues(text, _locators(doc), span, src)
    elif kind == "pdf" and span is not None:
        url = f"{root}documents/{quote(doc_id, safe='/')}"
        body = render_pdf(text, span, url, pdf_page(doc, span[0]))
    elif kind == "markdown":
        body = render_markdown(text, span)
    else:
        body = render_preformatted(text, span)
    return PAGE.format(
        title=html.escape(doc.get("title") or doc_id),
        doc_id=html.escape(doc_id),
        span_info=html.escape(span_label(doc, span)),
        body=body,
        root=root,
    ).replace('<body class="document">', f'<body class="document kind-{html.escape(kind)}">')


def render_sheet(text: str, locators: list[Locator], span: tuple[int, int] | None) -> str:
    """One ``<table>`` per sheet: a row per data row (its number first), header cells from the
    rows' ``header: value`` pairs; the rows the span overlaps are ``tr.cite`` (the first
    ``id="cite"``)."""
    sheets: dict[str, list[tuple[Locator, list[tuple[str, str]]]]] = {}
    for loc in (x for x in locators if x.kind == "row"):
        pairs = []
        for cell in text[loc.start : loc.end].split(CELL_SEPARATOR):
            head, sep, value = cell.partition(": ")
            pairs.append((head, value) if sep else ("", cell))
        sheets.setdefault(loc.sheet or "", []).append((loc, pairs))
    if not sheets:
        return render_preformatted(text, span)
    out: list[str] = []
    first = True
    for name, rows in sheets.items():
        heads: list[str] = []
        for _, pairs in rows:
            heads += [h for h, _ in pairs if h not in heads]
        out.append(f'<table class="sheet"><caption>{html.escape(name)}</caption><thead><tr>')
        out.append("<th>row</th>" + "".join(f"<th>{html.escape(h)}</th>" for h in heads))
        out.append("</tr></thead><tbody>")
        for loc, pairs in rows:
            cells = dict(pairs)
            hit = span is not None and loc.start < span[1] and span[0] < loc.end
            attrs = ' class="cite"' + (' id="cite"' if first else "") if hit else ""
            first = first and not hit
            out.append(f'<tr data-row="{loc.row}"{attrs}><th>{loc.row}</th>')
            out.append("".join(f"<td>{html.escape(cells.get(h, ''))}</td>" for h in heads))
            out.append("</tr>")
        out.append("</tbody></table>")
    return "".join(out)


def render_cues(
    text: str, locators: list[Locator], span: tuple[int, int] | None, media_src: str | None
) -> str:
    """The cues with their times (``li.cue``); those the span overlaps are ``li.cite`` (the
    first ``id="cite"``); with ``media_src`` a ``<video>``/``<audio>`` seeked to their
    ``#t=first,last``."""
    cues = [x for x in locators if x.kind == "cue"]
    if not cues:
        return render_preformatted(text, span)
    cited = [c for c in cues if span is not None and c.start < span[1] and span[0] < c.end]
    out: list[str] = []
    if media_src is not None:
        tag = "audio" if media_src.lower().endswith(AUDIO_SUFFIXES) else "video"
        t = ""
        if cited:
            t = f"#t={seconds(cited[0].t_start or 0.0)},{seconds(cited[-1].t_end or 0.0)}"
        out.append(
            f'<{tag} class="media" controls preload="metadata" src="{html.escape(media_src + t)}"'
            f' data-start="{cited[0].t_start if cited else 0}"></{tag}>'
        )
    out.append('<ol class="cues">')
    for c in cues:
        hit = c in cited
        attrs = (
            ' class="cue cite"' + (' id="cite"' if c is cited[0] else "") if hit else ' class="cue"'
        )
        times = f"{clock(c.t_start or 0.0)}–{clock(c.t_end or 0.0)}"
        out.append(
            f'<li{attrs} data-start="{c.t_start}" data-end="{c.t_end}">'
            f'<span class="cue-time">{times}</span> '
            f'<span class="cue-text">{html.escape(text[c.start : c.end])}</span></li>'
        )
    out.append("</ol>")
    return "".join(out)


def render_pdf(text: str, span: tuple[int, int], pdf_url: str, page: int) -> str:
    """The PDF at ``#page=N`` in the browser's viewer, the span's exact text beside it."""
    a, b = span
    return (
        '<div class="pdf-view">'
        f'<iframe class="pdf" title="PDF page {page}" src="{html.escape(pdf_url)}#page={page}">'
        "</iframe>"
        f'<aside class="pdf-span"><p class="pdf-page">p. {page}</p>'
        f'<blockquote><mark class="cite" id="cite">{html.escape(text[a:b])}</mark></blockquote>'
        "</aside></div>"
    )
