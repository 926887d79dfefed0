"""``GET /documents/{id}``: a stored document as HTML with one ``[from, to)`` span highlighted.

The text comes from the published index (the canonical text quotes were verified against),
never from a path in the request. Markdown is rendered with markdown-it-py (CommonMark +
tables): two private-use sentinels are put into the source at the span's ends (moved off
line-leading block syntax such as list bullets or code fences, which they would otherwise
break), and after rendering every text run between them is wrapped in ``<mark class="cite">``,
so a span that crosses paragraphs or list items still yields well-nested HTML. Plain text is
shown in ``<pre>``. If the sentinels do not come through the renderer intact the document is
shown as preformatted text instead, where the span is exact by construction.
"""

from __future__ import annotations

import html
import re

from markdown_it import MarkdownIt

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
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
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
