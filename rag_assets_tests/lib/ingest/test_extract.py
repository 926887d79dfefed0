"""Tests for rag_assets.lib.ingest.extract: canonical text, headings, page maps, failures, reuse."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path

import pymupdf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_assets.lib.ingest.extract import (
    EXTRACTOR_SUITE_VERSION,
    EXTRACTOR_VERSIONS,
    PAGE_SEPARATOR,
    extract_document,
    extract_folder,
    markdown_headings,
    scan_folder,
)
from rag_assets.lib.types import ExtractedDocument, Heading

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared"
SAMPLE = REPO / "data" / "documents"
needs_shared = pytest.mark.skipif(
    not (SHARED / "corpus" / "pdf").is_dir(), reason="needs ../shared (corpus and eval sets)"
)


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _extract(tmp_path: Path, name: str, data: bytes, **kw: int) -> ExtractedDocument:
    return extract_document(_write(tmp_path, name, data), tmp_path, **kw)


def _png() -> bytes:
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 40, 30), False)
    pix.clear_with(200)
    return pix.tobytes("png")


def _pdf(pages: list[str], toc: list[list] | None = None, title: str = "") -> pymupdf.Document:
    doc = pymupdf.open()
    for text in pages:
        doc.new_page().insert_text((72, 72), text, fontsize=11)
    if toc:
        doc.set_toc(toc)
    doc.set_metadata({"title": title})
    return doc


def _collapse(text: str) -> tuple[str, list[int]]:
    """Whitespace runs -> one space, plus the canonical offset of every collapsed char."""
    out: list[str] = []
    where: list[int] = []
    for i, c in enumerate(text):
        if c.isspace():
            if out and out[-1] == " ":
                continue
            c = " "
        out.append(c)
        where.append(i)
    return "".join(out), where


# ----------------------------------------------------------------------------- Markdown / text

MD_BYTES = (
    b"\xef\xbb\xbf# Title\r\nintro\rline\r\n\r\n## Sec A\n```\n## not a heading\n```\n"
    b"~~~\n# nope\n~~~\n### deep\n  ## Sec B  \n"
)
MD_TEXT = (
    "# Title\nintro\nline\n\n## Sec A\n```\n## not a heading\n```\n"
    "~~~\n# nope\n~~~\n### deep\n  ## Sec B  \n"
)


def test_markdown_canonical_text_offsets_and_headings(tmp_path: Path) -> None:
    doc = _extract(tmp_path, "notes/guide.md", MD_BYTES)
    assert doc.ok and doc.reason is None
    assert doc.document_id == "notes/guide.md"
    assert (doc.kind, doc.extractor, doc.extractor_version) == (
        "markdown",
        "markdown",
        "markdown-3",
    )
    assert doc.source_hash == hashlib.sha256(MD_BYTES).hexdigest()
    assert doc.text == MD_TEXT  # BOM gone, CRLF and lone CR -> LF, nothing else touched
    assert len(doc.text) == 91
    assert doc.title == "Title"
    # hand-computed: "# Title" 0-7, "## Sec A" 20-28, "  ## Sec B  " 78-90 (whole line)
    assert doc.headings == [
        Heading(1, "Title", 0, 7),
        Heading(2, "Sec A", 20, 28),
        Heading(2, "Sec B", 78, 90),
    ]
    assert doc.text[78:90] == "  ## Sec B  "
    assert doc.page_starts == [] and doc.page_at(10) is None


def test_markdown_title_falls_back_to_stem_and_first_h1_wins(tmp_path: Path) -> None:
    assert _extract(tmp_path, "a.md", b"## Only a section\ntext\n").title == "a"
    assert _extract(tmp_path, "b.markdown", b"#NoSpace\ntext\n").title == "b"
    fenced = b"```\n# In code\n```\n## S\n# Real Title #\n# Second\n"
    doc = _extract(tmp_path, "c.md", fenced)
    assert doc.title == "Real Title"
    assert [(h.level, h.title, h.start, h.end) for h in doc.headings] == [
        (2, "S", 18, 22),
        (1, "Real Title", 23, 37),
        (1, "Second", 38, 46),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("````\n```\n## in\n````\n## out\n", [(2, "out", 20, 26)]),  # closes only with >= 4
        ("~~~\n```\n## in\n~~~\n## out\n", [(2, "out", 18, 24)]),  # ``` does not close ~~~
        ("```\n## in\n``` not closing\n## still in\n", []),  # unclosed fence runs to the end
        ("``` a`b\n## real\n", [(2, "real", 8, 15)]),  # backtick info with ` is no fence
        ("    ## indented code\n   ## three spaces\n", [(2, "three spaces", 21, 39)]),
        ("## Setup ##\n## C# tips\n#\n## \n", [(2, "Setup", 0, 11), (2, "C# tips", 12, 22)]),
    ],
)
def test_markdown_heading_rules(text: str, expected: list[tuple]) -> None:
    got = markdown_headings(text)
    assert [(h.level, h.title, h.start, h.end) for h in got] == expected


def test_text_file_has_no_headings_and_stem_title(tmp_path: Path) -> None:
    doc = _extract(tmp_path, "readme.txt", b"# Looks like a heading\r\nbody\r")
    assert doc.ok and doc.kind == "text" and doc.extractor_version == "text-1"
    assert doc.text == "# Looks like a heading\nbody\n"
    assert doc.headings == [] and doc.title == "readme"


_LINES = st.sampled_from(
    ["# a", "## b", "### c", "```", "````", "~~~", "~~~~", "``` x", "~~~ `y`", "``` `z",
     "    # d", "   ## e", "#", "# #", "## f ##", "#g", "a", "", "  ", "==", "  ```", "## h#"]
)  # fmt: skip
_TEXT = st.one_of(
    st.lists(_LINES, max_size=25).map("\n".join),
    st.text(alphabet="#`~ a=\n", max_size=80),
)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_markdown_headings_agree_with_commonmark(text: str) -> None:
    """Oracle: markdown-it-py (CommonMark) ATX headings of level 1-2, by line and title."""
    markdown_it = pytest.importorskip("markdown_it")
    tokens = markdown_it.MarkdownIt("commonmark").parse(text)
    expected = []
    for i, tok in enumerate(tokens):
        atx = tok.type == "heading_open" and tok.markup.startswith("#")
        if atx and tok.tag in ("h1", "h2") and tokens[i + 1].content:
            expected.append((int(tok.tag[1]), tok.map[0], tokens[i + 1].content))
    lines = text.split("\n")
    line_starts = [sum(len(x) + 1 for x in lines[:n]) for n in range(len(lines))]
    got = markdown_headings(text)
    assert [(h.level, line_starts.index(h.start), h.title) for h in got] == expected
    for h in got:  # spans are whole lines without their newline
        assert text[h.start : h.end] == lines[line_starts.index(h.start)]


# ----------------------------------------------------------------------------------------- PDF


def test_pdf_pages_outline_and_title(tmp_path: Path) -> None:
    pages = [
        "Alpha Report\nIntroduction\nThe first phrase lives on page one.",
        "Part two\nMethods\nWe measured things carefully.\nThe second phrase lives on page two.",
        "Results and\ndiscussion\nThe third phrase lives on page three.",
    ]
    toc = [
        [1, "Introduction", 1],
        [1, "Methods", 2],
        [2, "Not On The Page", 2],
        [2, "RESULTS AND   DISCUSSION", 3],
    ]
    _pdf(pages, toc, title="Untitled").save(tmp_path / "report.pdf")
    doc = extract_document(tmp_path / "report.pdf", tmp_path)
    assert doc.ok, doc.reason
    assert (doc.kind, doc.extractor) == ("pdf", "pymupdf")
    assert doc.extractor_version == f"{EXTRACTOR_VERSIONS['pymupdf']}/ocr-floor-0.8"
    assert doc.pages == 3
    # the canonical text is PyMuPDF's page text joined by the separator, nothing else
    with pymupdf.open(tmp_path / "report.pdf") as pdf:
        raw = [page.get_text() for page in pdf]
    assert doc.text == PAGE_SEPARATOR.join(raw)
    assert doc.page_starts == [0, len(raw[0]) + 3, len(raw[0]) + len(raw[1]) + 6]
    for n, word in enumerate(["first", "second", "third"], start=1):
        at = doc.text.index(f"The {word} phrase")
        assert doc.page_at(at) == n
        assert doc.page_at(doc.text.index("lives", at)) == n
    assert doc.page_at(doc.page_starts[1]) == 2 and doc.page_at(doc.page_starts[1] - 1) == 1
    assert doc.title == "Alpha Report"  # "Untitled" metadata is junk -> first line

    heads = doc.headings
    assert [h.title for h in heads] == [
        "Introduction", "Not On The Page", "Methods", "RESULTS AND DISCUSSION"
    ]  # fmt: skip
    assert all(h.level == 2 for h in heads)
    assert [h.start for h in heads] == sorted(h.start for h in heads)
    intro, missing, methods, results = heads
    assert doc.text[intro.start : intro.end] == "Introduction"
    assert doc.text[methods.start : methods.end] == "Methods"
    assert (missing.start, missing.end) == (doc.page_starts[1], doc.page_starts[1])
    assert doc.text[results.start : results.end] == "Results and\ndiscussion"
    assert [doc.page_at(h.start) for h in heads] == [1, 2, 2, 3]


def test_pdf_metadata_title_and_repeated_outline_titles(tmp_path: Path) -> None:
    _pdf(["Summary\nSummary\nbody"], [[1, "Summary", 1], [1, "Summary", 1]], "A Real Title").save(
        tmp_path / "t.pdf"
    )
    doc = extract_document(tmp_path / "t.pdf", tmp_path)
    assert doc.title == "A Real Title"
    first, second = doc.headings  # the second entry is found after the first one
    assert doc.text[first.start : first.end] == doc.text[second.start : second.end] == "Summary"
    assert first.end <= second.start


def test_sample_corpus_extracts_as_documented() -> None:
    result = extract_folder(SAMPLE)
    by_id = {d.document_id: d for d in result.documents}
    assert [d.document_id for d in result.documents] == sorted(by_id)
    markdown = [d for d in result.documents if d.kind == "markdown"]
    assert len(markdown) >= 5 and all(d.ok and d.headings[0].level == 1 for d in markdown)
    glossary = by_id["glossary.pdf"]
    assert glossary.ok and glossary.pages >= 2 and glossary.title == "Glossary of rag_assets terms"
    assert len(glossary.headings) == 6
    for h in glossary.headings:  # every outline entry is found on its page
        assert h.end > h.start and glossary.text[h.start : h.end] == h.title
    assert {glossary.page_at(h.start) for h in glossary.headings} >= {1, 2}
    broken = by_id["broken-scan.pdf"]
    assert not broken.ok and broken.reason and broken.reason.startswith("corrupt PDF")
    chunking = by_id["02-chunking-strategies.md"]  # its fenced "## Install" is not a section
    assert "## Install" in chunking.text
    assert "Install" not in [h.title for h in chunking.headings]
    questions = [json.loads(line) for line in (REPO / "data/eval/questions.jsonl").open()]
    for q in questions:
        assert by_id[q["document"]].text.count(q["needle"]) == 1, q["id"]


# ------------------------------------------------------------------------------------ failures


def _encrypted_pdf(path: Path) -> None:
    _pdf(["secret text"]).save(
        path, encryption=pymupdf.PDF_ENCRYPT_AES_256, owner_pw="owner", user_pw="user"
    )


def _image_only_pdf(path: Path) -> None:
    doc = pymupdf.open()
    for _ in range(2):
        doc.new_page().insert_image(pymupdf.Rect(50, 50, 250, 200), stream=_png())
    doc.save(path)


def _truncated_pdf(path: Path) -> None:
    """Cut where MuPDF's repair still finds the 3 pages but none of their content streams."""
    path.write_bytes(_pdf(["some text"] * 3).tobytes()[:500])


BAD_FILES = {
    "empty.md": (b"", "file is empty (0 bytes)"),
    "blank.txt": (b" \n\t\r\n", "file is empty (only whitespace)"),
    "bom-only.md": (b"\xef\xbb\xbf\r\n", "file is empty (only whitespace)"),
    "image.md": (_png(), "binary content: the file looks like a PNG image, not text"),
    "nul.txt": (b"abc\x00def", "binary content: NUL byte at offset 3"),
    "ctrl.txt": (b"ab\x01\x02\x03\x04cd", "binary content: 4 of 8 bytes are control characters"),
    "latin1.md": ("# Café\n".encode("latin-1"), "not valid UTF-8: byte 0xe9 at offset 5"),
    "utf16.txt": ("hello".encode("utf-16"), "not valid UTF-8: the file is UTF-16"),
    "garbage.pdf": (b"%PDF-1.7\nthis is not a pdf", "corrupt PDF: cannot be opened"),
    "empty.pdf": (b"", "file is empty (0 bytes)"),
}
BAD_PDFS = {
    "locked.pdf": (_encrypted_pdf, "encrypted PDF: needs a password to open"),
    "scan.pdf": (_image_only_pdf, "no text layer (scanned?): 2 page(s) without extractable text"),
    "truncated.pdf": (_truncated_pdf, "corrupt PDF: damaged or truncated file"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_fails_with_specific_reason(tmp_path: Path, name: str) -> None:
    data, reason = BAD_FILES[name]
    doc = _extract(tmp_path, name, data)
    assert doc.status == "failed" and not doc.ok
    assert doc.reason is not None and doc.reason.startswith(reason), doc.reason
    assert doc.text == "" and doc.headings == [] and doc.page_starts == []
    assert doc.source_hash == hashlib.sha256(data).hexdigest()
    assert doc.manifest_row()["text_hash"] is None


@pytest.mark.parametrize("name", sorted(BAD_PDFS))
def test_bad_pdf_fails_with_specific_reason(tmp_path: Path, name: str) -> None:
    make, reason = BAD_PDFS[name]
    make(tmp_path / name)
    doc = extract_document(tmp_path / name, tmp_path)
    assert doc.status == "failed" and doc.kind == "pdf"
    assert doc.reason is not None and doc.reason.startswith(reason), doc.reason


def test_size_limit(tmp_path: Path) -> None:
    assert _extract(tmp_path, "small.md", b"# ok\n", max_bytes=5).ok
    doc = _extract(tmp_path, "big.md", b"# ok!\n", max_bytes=5)
    assert doc.reason == "file too large: 6 bytes, over the size limit of 5 bytes"
    huge = tmp_path / "huge.txt"
    with huge.open("wb") as fh:  # sparse: no 50 MB written to disk
        fh.truncate(50_000_001)
    doc = extract_document(huge, tmp_path)
    assert doc.reason == "file too large: 50,000,001 bytes, over the size limit of 50 MB"
    assert doc.source_hash == scan_folder(tmp_path)["huge.txt"]


def test_folder_with_good_and_bad_files_never_raises(tmp_path: Path) -> None:
    for name, (data, _) in BAD_FILES.items():
        _write(tmp_path, f"bad/{name}", data)
    for name, (make, _) in BAD_PDFS.items():
        make(tmp_path / "bad" / name)
    _write(tmp_path, "good/a.md", b"# A\n\n## One\ntext\n")
    _write(tmp_path, "good/b.txt", b"plain")
    _pdf(["pdf text"]).save(tmp_path / "good" / "c.pdf")
    _write(tmp_path, ".hidden.md", b"# hidden")
    _write(tmp_path, "good/.git/config.md", b"# hidden dir")

    result = extract_folder(tmp_path)
    ids = [d.document_id for d in result.documents]
    assert ids == sorted(ids) and len(ids) == len(BAD_FILES) + len(BAD_PDFS) + 3
    assert not any(i.startswith(".") or "/." in i for i in ids)
    good = ["good/a.md", "good/b.txt", "good/c.pdf"]
    assert [d.document_id for d in result.documents if d.ok] == good
    assert {d.document_id for d in result.failed} == {f"bad/{n}" for n in [*BAD_FILES, *BAD_PDFS]}
    assert all(d.reason for d in result.failed) and result.reused == []
    assert scan_folder(tmp_path) == {d.document_id: d.source_hash for d in result.documents}
    # deterministic: a second run gives identical records
    assert [d.to_dict() for d in extract_folder(tmp_path).documents] == [
        d.to_dict() for d in result.documents
    ]


def test_missing_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError):
        extract_folder(tmp_path / "nope")


# --------------------------------------------------------------------------------------- reuse


def test_reuse_unchanged_ok_documents_only(tmp_path: Path) -> None:
    _write(tmp_path, "same.md", b"# Same\n")
    _write(tmp_path, "edited.md", b"# Before\n")
    _write(tmp_path, "broken.md", b"caf\xe9")
    _pdf(["page text"]).save(tmp_path / "doc.pdf")
    first = extract_folder(tmp_path)
    assert first.reused == [] and [d.ok for d in first.documents] == [False, True, True, True]

    # mark the previous records so reuse (not re-extraction) is observable
    previous = {d.document_id: replace(d, title=d.title + " (previous)") for d in first.documents}
    _write(tmp_path, "edited.md", b"# After\n")
    second = extract_folder(tmp_path, previous)
    by_id = {d.document_id: d for d in second.documents}
    assert second.reused == ["doc.pdf", "same.md"]
    assert by_id["same.md"].title == "Same (previous)"
    assert by_id["edited.md"].title == "After"
    assert by_id["broken.md"].status == "failed"  # retried, still broken

    _write(tmp_path, "broken.md", b"# Fixed\n")
    stale = dict(previous, **{"same.md": replace(previous["same.md"], extractor_version="old")})
    third = extract_folder(tmp_path, stale)
    by_id = {d.document_id: d for d in third.documents}
    assert third.reused == ["doc.pdf"]  # same.md: other extractor version; edited.md: new bytes
    assert by_id["same.md"].title == "Same" and by_id["edited.md"].title == "After"
    assert by_id["broken.md"].ok and by_id["broken.md"].title == "Fixed"


def test_extractor_versions() -> None:
    assert EXTRACTOR_VERSIONS["pymupdf"].startswith(f"pymupdf-3/mupdf-{pymupdf.mupdf_version}/")
    assert EXTRACTOR_SUITE_VERSION.split("+") == [
        "markdown-3",
        "rst-1",  # issue 31: reStructuredText, titles as sections
        "text-1",
        EXTRACTOR_VERSIONS["pymupdf"],
        *(EXTRACTOR_VERSIONS[n] for n in ("webvtt", "sheets", "html", "docx")),
    ]


# -------------------------------------------------------------------------------- shared tier


@pytest.mark.shared
@needs_shared
def test_shared_pdfs_extract_and_needles_land_on_their_page() -> None:
    pdf_dir = SHARED / "corpus" / "pdf"
    # speed is measured in `python -m rag_assets.bench.formats pdf` (CPU seconds), not here
    docs = [extract_document(p, pdf_dir) for p in sorted(pdf_dir.glob("*.pdf"))]
    assert len(docs) == 4 and all(d.ok for d in docs), [d.reason for d in docs]
    assert sum(d.pages for d in docs) == 100
    by_id = {d.document_id: d for d in docs}
    questions = [json.loads(x) for x in (SHARED / "eval/pdf-dev/questions.jsonl").open()]
    assert questions
    for q in questions:
        doc = by_id[q["document"]]
        collapsed, where = _collapse(doc.text)
        needle = " ".join(q["needle"].split())
        at = collapsed.find(needle)
        assert at >= 0, q["id"]
        assert doc.page_at(where[at]) == q["page"], q["id"]
        assert re.sub(r"\s+", " ", doc.text[where[at] :]).startswith(needle)


@pytest.mark.shared
@needs_shared
def test_shared_course_markdown_extracts_and_holds_needles() -> None:
    course = SHARED / "corpus" / "course"
    docs = {
        d.document_id: d
        for d in extract_folder(course).documents
        if d.document_id not in ("README.md", "LICENSE")
    }
    assert len(docs) == 14 and all(d.ok and d.kind == "markdown" for d in docs.values())
    for d in docs.values():
        assert d.title != Path(d.document_id).stem  # every course doc has a "# " title
        assert all(d.text[h.start : h.end].lstrip(" ").startswith("#") for h in d.headings)
    questions = [json.loads(x) for x in (SHARED / "eval/course-dev/questions.jsonl").open()]
    assert len(questions) == 32
    for q in questions:
        assert q["needle"] in docs[q["document"]].text, q["id"]
