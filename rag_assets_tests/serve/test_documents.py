"""The document view's renderer (fast tier): the span's words, and only those, are marked."""

from __future__ import annotations

import re

import pytest

from rag_assets.serve.documents import (
    parse_char_span,
    render_document,
    render_markdown,
    render_preformatted,
)

DOC = (
    "# Title\n\nIntro paragraph.\n\n## Section\n\n- first item\n- second item\n\n"
    "```python\nx = 1\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nLast paragraph here.\n"
)


def _marked(html: str) -> list[str]:
    return [
        m.strip() for m in re.findall(r"<mark class=\"cite\"[^>]*>(.*?)</mark>", html, flags=re.S)
    ]


def _span(text: str, start: str, end: str) -> tuple[int, int]:
    a = DOC.index(start)
    return a, DOC.index(end, a) + len(end)


def test_span_across_list_code_and_table_stays_well_formed():
    html = render_markdown(DOC, _span(DOC, "- first", "| 1 | 2 |"))
    assert _marked(html) == ["first item", "second item", "x = 1", "a", "b", "1", "2"]
    assert html.count('id="cite"') == 1
    assert "<ul>" in html and "<table>" in html and "<pre><code" in html  # syntax intact
    assert "Intro paragraph" in html and "Intro paragraph" not in " ".join(_marked(html))


def test_code_block_span_keeps_its_fences():
    html = render_markdown(DOC, _span(DOC, "```python", "```\n\n|"))
    assert "x = 1" in _marked(html)[0] and "```" not in html


def test_no_span_renders_plain_markdown():
    html = render_markdown(DOC, None)
    assert "<mark" not in html and "<h1>Title</h1>" in html


def test_preformatted_marks_exact_offsets_and_escapes():
    text = "a <b> & c"
    assert render_preformatted(text, (2, 5)) == (
        '<pre class="text">a <mark class="cite" id="cite">&lt;b&gt;</mark> &amp; c</pre>'
    )


def test_page_wraps_body_and_escapes_the_id():
    page = render_document(DOC, "markdown", "<x>.md", "", (0, 7))
    assert "&lt;x&gt;.md" in page and "static/document.js" in page


@pytest.mark.parametrize(
    ("value", "error"),
    [("9,2", "outside"), ("0,999", "outside"), ("a,b", "not 'from,to'"), ("1", "not")],
)
def test_bad_char_spans_are_one_line_errors(value, error):
    with pytest.raises(ValueError, match=error):
        parse_char_span(value, 100)
    assert parse_char_span("3,7", 100) == (3, 7) and parse_char_span(None, 100) is None
