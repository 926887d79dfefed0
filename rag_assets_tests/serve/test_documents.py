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
    [
        ("9,2", "reversed: give from,to with from <= to \\(char=2,9\\)"),
        ("0,999", "outside"),
        ("a,b", "not 'from,to'"),
        ("1", "not"),
    ],
)
def test_bad_char_spans_are_one_line_errors(value, error):
    with pytest.raises(ValueError, match=error):
        parse_char_span(value, 100)
    assert parse_char_span("3,7", 100) == (3, 7) and parse_char_span(None, 100) is None


# ---------------------------------------------------------------- issue 21: a view per kind


def _doc(kind: str, text: str, locators: list, path: str = "/nowhere/x") -> dict:  # type: ignore[type-arg]
    from rag_assets.lib.types import locators_to_json

    return {"kind": kind, "text": text, "title": "", "path": path,
            "locators_json": locators_to_json(locators), "page_starts": []}  # fmt: skip


def test_sheet_view_is_a_table_with_the_spans_rows_marked():
    from rag_assets.lib.types import Locator
    from rag_assets.serve.documents import render_view

    rows = ["sku: A1; product: teapot", "sku: B2; product: jar <b>"]
    text = "prices\n\n" + "\n\n".join(rows)
    a = text.index(rows[1])
    locs = [
        Locator(text.index(rows[0]), text.index(rows[0]) + len(rows[0]), "row", sheet="prices",
                row=2, col_first=1, col_last=2),
        Locator(a, a + len(rows[1]), "row", sheet="prices", row=3, col_first=1, col_last=2),
    ]  # fmt: skip
    page = render_view(_doc("csv", text, locs), "prices.csv", (a, a + 8))
    assert "<th>sku</th><th>product</th>" in page and "<caption>prices</caption>" in page
    assert re.findall(r'<tr data-row="(\d)" class="cite" id="cite">', page) == ["3"]
    assert "jar &lt;b&gt;" in page and '<span class="span-info">prices!A3:B3</span>' in page


def test_transcript_view_marks_cues_and_seeks_the_media_beside_it(tmp_path):
    from rag_assets.lib.types import Locator
    from rag_assets.serve.documents import media_owner, render_view

    (tmp_path / "talk.mp4").write_bytes(b"\x00")
    cues = ["Welcome.", "The answer is here."]
    text = "\n\n".join(cues)
    b = text.index(cues[1])
    locs = [
        Locator(0, len(text), "media", target="talk.mp4"),
        Locator(0, 8, "cue", t_start=1.0, t_end=4.5),
        Locator(b, len(text), "cue", t_start=14.0, t_end=22.25),
    ]
    doc = _doc("vtt", text, locs, str(tmp_path / "talk.vtt"))
    page = render_view(doc, "talk.vtt", (b, len(text)))
    assert (
        '<video class="media" controls preload="metadata" src="/documents/talk.mp4#t=14,22.25"'
        in page
    )
    assert re.findall(r'<li class="cue cite" id="cite" data-start="([\d.]+)"', page) == ["14.0"]
    assert "0:14.0–0:22.2" in page and page.count("<li class") == 2
    assert media_owner({"talk.vtt": doc}, "talk.mp4") == tmp_path / "talk.mp4"
    assert media_owner({"talk.vtt": doc}, "other.mp4") is None
    (tmp_path / "talk.mp4").unlink()  # no media file beside it: cues only, nothing served
    assert "<video" not in render_view(doc, "talk.vtt", (b, len(text)))
    assert media_owner({"talk.vtt": doc}, "talk.mp4") is None


def test_pdf_view_with_a_span_shows_the_page_and_the_spans_text():
    from rag_assets.serve.documents import render_view

    text = "Page one.\n\f\nPage two says <this>."
    doc = _doc("pdf", text, []) | {"page_starts": [0, 12]}
    a = text.index("Page two")
    page = render_view(doc, "r.pdf", (a, len(text)))
    assert '<iframe class="pdf" title="PDF page 2" src="/documents/r.pdf#page=2">' in page
    assert '<mark class="cite" id="cite">Page two says &lt;this&gt;.</mark>' in page
    assert f"p. 2, chars {a}–{len(text)}" in page


RAW = (
    "# Pkg\n\n"
    '<p align="center">\n  <img src="logo.png" onerror="alert(1)">\n  <b>Fast</b> queue.\n</p>\n\n'
    "<script>alert(2)</script>\n\n<!-- a comment -->\n\n"
    "Stop it with <kbd>Ctrl</kbd>+<kbd>C</kbd>.<br>Jobs stay on disk.\n"
)


def test_raw_html_is_shown_as_its_text_never_as_markup():
    """Issue 31: raw HTML blocks as their visible text, inline tags dropped; nothing runs."""
    html = render_markdown(RAW, None)
    assert html == (
        "<h1>Pkg</h1>\n"
        '<div class="html-block">Fast queue.</div>\n'
        "<p>Stop it with Ctrl+C.<br>Jobs stay on disk.</p>\n"
    )


def test_a_span_starting_inside_a_tag_still_opens_its_mark():
    a = RAW.index("logo.png")  # inside an attribute: the sentinel cannot survive there
    b = RAW.index("queue.") + len("queue.")
    html = render_markdown(RAW, (a, b))
    assert _marked(html) == ["Fast queue."]  # the block's text, opened where the tag was
    assert "<img" not in html and "alert" not in html
