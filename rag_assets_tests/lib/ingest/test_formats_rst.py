"""reStructuredText (issue 31): read as text, section titles (over/underlined) as sections."""

from __future__ import annotations

from pathlib import Path

from rag_assets.lib.ingest.chunk import chunk_document, strategy
from rag_assets.lib.ingest.extract import SUPPORTED_SUFFIXES, extract_document
from rag_assets.lib.ingest.formats.rst import rst_headings, rst_titles

README = """\
==========
tinyqueue
==========

tinyqueue is a small persistent job queue for Python scripts that must survive a reboot.

Installation
============

Install it with pip. The package has no dependencies beyond the standard library.

Usage
=====

Create a queue on a folder and take the jobs out in order::

    from tinyqueue import Queue
    Not a title
    ===========

Retries
-------

A job that raises is put back at most three times.

----

Limits
------

Short
--

Ab
--

=====  =====
col a  col b
=====  =====
"""


def test_titles_follow_docutils_adornment_rules() -> None:
    titles = rst_titles(README)
    assert [(t.text, t.style) for t in titles] == [
        ("tinyqueue", ("=", True)),
        ("Installation", ("=", False)),
        ("Usage", ("=", False)),
        ("Retries", ("-", False)),
        ("Limits", ("-", False)),
        ("Ab", ("-", False)),  # an underline as long as its title
    ]  # not: the indented lines of the literal block, the "----" transition, "Short" (its
    # 2-character underline is shorter than the title and than 4), a simple table's borders
    first = titles[0]
    assert README[first.start : first.end] == "==========\ntinyqueue\n=========="
    assert README[titles[1].start : titles[1].end] == "Installation\n============"


def test_document_title_and_sections() -> None:
    title, headings = rst_headings(README, "README")
    assert title == "tinyqueue"
    assert [(h.level, h.title) for h in headings] == [
        (1, "tinyqueue"),
        (2, "Installation"),
        (2, "Usage"),
        (2, "Retries"),
        (2, "Limits"),
        (2, "Ab"),
    ]
    # no lone top title: every title is a section and the file stem names the document
    title, headings = rst_headings("Intro\n=====\n\nText.\n\nMore\n====\n\nText.\n", "notes")
    assert title == "notes" and [(h.level, h.title) for h in headings] == [
        (2, "Intro"),
        (2, "More"),
    ]
    assert rst_headings("Just text, no titles.\n", "plain") == ("plain", [])


def test_rst_files_are_indexed_with_sections_and_exact_offsets(tmp_path: Path) -> None:
    assert ".rst" in SUPPORTED_SUFFIXES
    path = tmp_path / "README.rst"
    path.write_bytes(README.replace("\n", "\r\n").encode("utf-8"))
    doc = extract_document(path, tmp_path)
    assert doc.ok and doc.kind == "rst" and doc.extractor_version == "rst-1"
    assert doc.text == README  # the file's own text (CRLF read as LF)
    assert doc.title == "tinyqueue"
    chunks = chunk_document(doc, strategy("E"))
    by_section = {c.section: c for c in chunks}
    assert set(by_section) >= {"tinyqueue", "Installation", "Usage", "Retries", "Limits"}
    assert by_section["Installation"].content == (
        "Install it with pip. The package has no dependencies beyond the standard library."
    )
    assert by_section["Retries"].text.startswith("[tinyqueue > Retries]\n")
    for c in chunks:
        assert doc.text[c.start : c.end] == c.content
        for h in doc.headings:  # a title and its adornment lines are in no chunk
            assert c.end <= h.start or h.end <= c.start
    assert "Not a title" in by_section["Usage"].content  # a literal block stays as written


def test_a_file_of_titles_only_is_partial(tmp_path: Path) -> None:
    path = tmp_path / "empty.rst"
    path.write_text("Title\n=====\n\nSection\n-------\n", encoding="utf-8")
    doc = extract_document(path, tmp_path)
    assert doc.status == "partial" and "only headings" in (doc.reason or "")
