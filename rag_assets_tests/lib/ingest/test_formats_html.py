"""HTML as a browser lays it out (issue 31): ``<br>`` lines and paragraphs, ``<pre>``, layout
tables, and real ``python -m pydoc -w`` pages whose docstrings stay lines and sentences."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rag_assets.lib.ingest.chunk import chunk_document, strategy
from rag_assets.lib.ingest.extract import extract_document
from rag_assets.lib.ingest.formats.html import extract_html, fragment_text

PAGE = """<!doctype html><html><head><title>Notes</title></head><body>
<p>First line,<br>second line.<br>&nbsp;<br>A new paragraph
   wrapped in the source.</p>
<ul><li>Fruit<ul><li>apple</li><li>pear</li></ul></li></ul>
<pre>
def f():
    return 1\t\t
</pre>
<table><tr><td class="section"><br><strong>Functions</strong></td></tr>
<tr><td><dl><dt>f()</dt><dd>Return one.<br>Always.</dd></dl></td></tr></table>
<table><tr><th>plant</th><th>water</th></tr><tr><td>fern</td><td>daily</td></tr></table>
<div>loose text <span>inline</span><p>inner paragraph</p>tail text</div>
<!-- a comment --><script>never()</script>
</body></html>"""


def test_blocks_lines_paragraphs_pre_and_tables() -> None:
    got = extract_html(PAGE, Path("notes.html"))
    assert got.text.split("\n\n") == [
        "First line,\nsecond line.",
        "A new paragraph wrapped in the source.",  # &nbsp;<br> is a paragraph break
        "Fruit",  # inline text before a nested list is a block of its own
        "apple",
        "pear",
        "def f():\n    return 1",  # <pre>: lines and indentation, trailing blanks out
        "Functions",  # an all-bold one-cell row: a section title
        "f()",
        "Return one.\nAlways.",
        "plant | water",  # a data row: cells joined
        "fern | daily",
        "loose text inline",
        "inner paragraph",
        "tail text",
    ]
    assert [(h.level, h.title) for h in got.headings] == [(2, "Functions")]
    assert got.title == "Notes"
    for loc in got.locators:  # every block's span holds its text
        assert got.text[loc.start : loc.end].strip() == got.text[loc.start : loc.end]


def test_fragment_text_of_a_raw_html_block() -> None:
    raw = '<p align="center">\n  <img src="logo.png" onerror="x()">\n  <b>Fast</b> queue.\n</p>'
    assert fragment_text(raw) == "Fast queue."
    assert fragment_text("<script>alert(1)</script>") == ""
    assert fragment_text("<!-- only a comment -->") == ""
    assert fragment_text("<details>\n<summary>More</summary>") == "More"


@pytest.fixture(scope="module")
def pydoc_pages(tmp_path_factory) -> Path:
    """Real pages written by this Python's ``pydoc -w`` (json, textwrap)."""
    folder = tmp_path_factory.mktemp("pydoc")
    for module in ("json", "textwrap"):
        subprocess.run(
            [sys.executable, "-m", "pydoc", "-w", module],
            cwd=folder,
            check=True,
            capture_output=True,
            timeout=120,
        )
    return folder


def test_pydoc_docstrings_keep_their_lines_and_sentences(pydoc_pages: Path) -> None:
    doc = extract_document(pydoc_pages / "json.html", pydoc_pages)
    assert doc.ok and doc.kind == "html"
    assert {"Classes", "Functions"} <= {h.title for h in doc.headings if h.level == 2}
    sentence = (
        "It also understands ``NaN``, ``Infinity``, and ``-Infinity`` as\n"
        "their corresponding ``float`` values, which is outside the JSON spec."
    )
    assert sentence in doc.text  # JSONDecoder's docstring: its own line break, not one line
    assert "\n| JSON | Python |\n" in doc.text  # its ASCII table stays line by line
    chunks = chunk_document(doc, strategy("E"))
    assert any(sentence in c.content for c in chunks)  # never `…understands` | `NaN, …`
    assert next(c for c in chunks if sentence in c.content).section == "Classes"
    for path in sorted(pydoc_pages.glob("*.html")):
        page = extract_document(path, pydoc_pages)
        for c in chunk_document(page, strategy("E")):  # at a line end or a sentence end
            ends = page.text[c.end : c.end + 1] in ("", "\n") or c.content[-1] in ".!?"
            assert ends, f"{path.name}: a chunk ends mid-sentence: {c.content[-60:]!r}"
