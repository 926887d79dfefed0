"""Extraction: turn each source file into canonical text plus a locator map, or a failure.

Public API: :func:`extract_folder`, :func:`extract_document`, :func:`scan_folder`,
:func:`markdown_headings`, :data:`EXTRACTOR_VERSIONS`, :data:`EXTRACTOR_SUITE_VERSION`,
:class:`FolderExtraction`.

Canonical text rules (offsets everywhere are code-point indices into it):

* Markdown (``.md``, ``.markdown``) and plain text (``.txt``): the bytes decoded as strict
  UTF-8, one leading BOM removed, CRLF and lone CR turned into LF; nothing else changes.
  Markdown level-1/level-2 ATX heading lines outside fenced code blocks become
  :class:`Heading` records spanning the line (without its newline).
* PDF: each page's ``page.get_text()`` exactly as PyMuPDF returns it, pages joined with
  :data:`PAGE_SEPARATOR`; ``page_starts[i]`` is where page ``i + 1`` starts. Outline
  (``get_toc``) entries become level-2 headings spanning the title where it is found on its
  page (whitespace- and case-insensitive), else an empty span at the page start.

A bad file never raises: it comes back with ``status="failed"`` and a specific reason.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import pymupdf

from rag_assets.lib.types import ExtractedDocument, Heading

#: Joins the text of consecutive PDF pages. A form feed on its own line: it never occurs in
#: prose, so no needle or sentence can straddle a page boundary by accident.
PAGE_SEPARATOR = "\n\f\n"
#: Default size limit per file (decimal megabytes); larger files fail without being parsed.
DEFAULT_MAX_BYTES = 50_000_000
#: Above this share of C0 control bytes (other than tab, LF, CR, FF) a text file is binary.
CONTROL_BYTE_RATIO = 0.05

MARKDOWN_SUFFIXES = (".md", ".markdown")
TEXT_SUFFIXES = (".txt",)
PDF_SUFFIXES = (".pdf",)

#: Extractor name -> version string. Bump a version whenever that extractor's output (text,
#: title, headings, page map) can change; reuse of earlier results keys on it.
EXTRACTOR_VERSIONS: dict[str, str] = {
    "markdown": "markdown-1",
    "text": "text-1",
    "pymupdf": f"pymupdf-1/mupdf-{pymupdf.mupdf_version}",
    "none": "none-1",  # unsupported file types: nothing is extracted
}
#: All extractors that can produce an ok document, in one string (for version stamps).
EXTRACTOR_SUITE_VERSION = "+".join(EXTRACTOR_VERSIONS[n] for n in ("markdown", "text", "pymupdf"))

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"%PDF-", "a PDF document"),
    (b"PK\x03\x04", "a ZIP archive (docx/xlsx/...)"),
    (b"\x1f\x8b", "a gzip archive"),
)
_CONTROL_BYTES = bytes(b for b in range(32) if b not in (9, 10, 12, 13)) + b"\x7f"
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_ATX = re.compile(r"^ {0,3}(#{1,2})(?:[ \t]+(.*))?$")
_CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+$")
_JUNK_TITLE = re.compile(
    r"^(untitled.*|title|document\d*|microsoft word - .*|.*\.(pdf|docx?|tex|dvi|ps|indd))$",
    re.IGNORECASE,
)


class ExtractionError(Exception):
    """Raised inside an extractor; its message becomes the document's failure reason."""


@dataclass
class FolderExtraction:
    """Result of :func:`extract_folder`.

    ``documents`` holds every file in document-id order (ok and failed); ``reused`` lists the
    ids whose earlier ok extraction was taken over unchanged (same bytes, same extractor).
    """

    documents: list[ExtractedDocument]
    reused: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[ExtractedDocument]:
        return [d for d in self.documents if not d.ok]


def extract_folder(
    root: Path,
    previous: dict[str, ExtractedDocument] | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> FolderExtraction:
    """Extract every non-hidden file under ``root`` (recursively, sorted by document id).

    A document from ``previous`` (keyed by document id) is reused without re-extraction when
    it is ok and has the same ``source_hash`` and ``extractor_version`` as the file now would;
    failed documents are always retried. Raises only if ``root`` is not a directory.
    """
    previous = previous or {}
    documents: list[ExtractedDocument] = []
    reused: list[str] = []
    for doc_id, path in _list_files(root):
        old = previous.get(doc_id)
        if old is not None and old.ok:
            source_hash = _file_sha256(path)
            name = _extractor_for(path)[1]
            if old.source_hash == source_hash and old.extractor_version == EXTRACTOR_VERSIONS[name]:
                documents.append(replace(old, path=str(path.resolve())))
                reused.append(doc_id)
                continue
        documents.append(extract_document(path, root, max_bytes=max_bytes))
    return FolderExtraction(documents, reused)


def extract_document(
    path: Path, root: Path, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> ExtractedDocument:
    """Extract one file; never raises for bad input (returns ``status="failed"`` instead)."""
    path = Path(path)
    kind, name = _extractor_for(path)
    doc = ExtractedDocument(
        document_id=path.relative_to(root).as_posix(),
        path=str(path.resolve()),
        kind=kind,
        status="failed",
        reason=None,
        extractor=name,
        extractor_version=EXTRACTOR_VERSIONS[name],
        source_hash="",
    )
    try:
        size = path.stat().st_size
        if size > max_bytes:
            doc.source_hash = _file_sha256(path)
            raise ExtractionError(
                f"file too large: {size:,} bytes, over the size limit of {_human(max_bytes)}"
            )
        data = path.read_bytes()
        doc.source_hash = hashlib.sha256(data).hexdigest()
        if name == "none":
            raise ExtractionError(
                f"unsupported file type {path.suffix.lower() or '(no extension)'!r} (supported: "
                + ", ".join(MARKDOWN_SUFFIXES + TEXT_SUFFIXES + PDF_SUFFIXES)
                + ")"
            )
        if not data.strip():
            raise ExtractionError(
                "file is empty (0 bytes)" if not data else "file is empty (only whitespace)"
            )
        if name == "pymupdf":
            doc.text, doc.page_starts, doc.headings, doc.title = _extract_pdf(data, path.stem)
        else:
            doc.text = _decode_text(data)
            if name == "markdown":
                doc.headings = markdown_headings(doc.text)
            doc.title = next((h.title for h in doc.headings if h.level == 1), path.stem)
    except ExtractionError as exc:
        doc.reason = str(exc)
    except Exception as exc:  # noqa: BLE001 - one bad file must never stop the folder
        doc.reason = f"extraction error: {type(exc).__name__}: {exc}"
    else:
        doc.status = "ok"
    if not doc.ok:
        doc.text, doc.page_starts, doc.headings, doc.title = "", [], [], ""
    return doc


def scan_folder(root: Path) -> dict[str, str]:
    """``{document_id: sha256 of the file bytes}`` for every file :func:`extract_folder` sees."""
    return {doc_id: _file_sha256(path) for doc_id, path in _list_files(root)}


def markdown_headings(text: str) -> list[Heading]:
    """Level-1 and level-2 ATX heading lines of ``text`` outside fenced code blocks."""
    headings: list[Heading] = []
    fence = ""  # the opening fence run while inside a fenced block
    pos = 0
    for line in text.split("\n"):
        start, pos = pos, pos + len(line) + 1
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = "" if not m.group(2).strip() else fence
            continue
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = m.group(1)
            continue
        h = _ATX.match(line)
        title = _CLOSING_HASHES.sub("", (h.group(2) or "").strip()).strip() if h else ""
        if h and title:  # an empty heading (``#`` alone) opens nothing
            headings.append(Heading(len(h.group(1)), title, start, start + len(line)))
    return headings


def _decode_text(data: bytes) -> str:
    """Strict UTF-8 decode + BOM/newline normalisation, with specific failure reasons."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ExtractionError(
            "not valid UTF-8: the file is UTF-16 (byte-order mark); re-save as UTF-8"
        )
    for magic, what in _MAGIC:
        if data.startswith(magic):
            raise ExtractionError(f"binary content: the file looks like {what}, not text")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ExtractionError(f"binary content: NUL byte at offset {nul}")
    controls = len(data) - len(data.translate(None, _CONTROL_BYTES))
    if controls > CONTROL_BYTE_RATIO * len(data):
        raise ExtractionError(
            f"binary content: {controls} of {len(data)} bytes are control characters"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExtractionError(
            f"not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} cannot be "
            "decoded (re-save the file as UTF-8)"
        ) from None
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise ExtractionError("file is empty (only whitespace)")
    return text


def _extract_pdf(data: bytes, stem: str) -> tuple[str, list[int], list[Heading], str]:
    """Canonical text, page starts, outline headings and title of a PDF."""
    try:
        pdf = pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:  # noqa: BLE001 - pymupdf raises several types here
        raise ExtractionError(f"corrupt PDF: cannot be opened ({exc})") from None
    with pdf:
        if pdf.needs_pass:
            raise ExtractionError("encrypted PDF: needs a password to open")
        if pdf.page_count == 0:
            raise ExtractionError("corrupt PDF: no readable pages (damaged or truncated file)")
        pages: list[str] = []
        for number in range(pdf.page_count):
            try:
                pages.append(pdf[number].get_text())
            except Exception as exc:  # noqa: BLE001
                raise ExtractionError(
                    f"corrupt PDF: page {number + 1} unreadable ({exc})"
                ) from None
        if not any(p.strip() for p in pages) and pdf.is_repaired:
            raise ExtractionError(
                f"corrupt PDF: damaged or truncated file ({len(pages)} page(s) recovered by "
                "repair, none with readable content)"
            )
        if not any(p.strip() for p in pages):
            raise ExtractionError(
                f"no text layer (scanned?): {len(pages)} page(s) without extractable text"
            )
        starts: list[int] = []
        pos = 0
        for page_text in pages:
            starts.append(pos)
            pos += len(page_text) + len(PAGE_SEPARATOR)
        headings = _outline_headings(pdf.get_toc(simple=True), pages, starts)
        meta_title = " ".join(((pdf.metadata or {}).get("title") or "").split())
    if meta_title and not _JUNK_TITLE.match(meta_title) and re.search(r"\w\w", meta_title):
        title = meta_title
    else:
        first = (line.strip() for p in pages for line in p.split("\n"))
        title = next((line for line in first if re.search(r"\w", line)), stem)
    return PAGE_SEPARATOR.join(pages), starts, headings, title


def _outline_headings(toc: list, pages: list[str], starts: list[int]) -> list[Heading]:
    """Level-2 headings from outline entries, located on their page, sorted by start."""
    found: list[tuple[int, int, Heading]] = []
    cursor: dict[int, int] = {}  # page index -> where the previous entry on it ended
    for order, entry in enumerate(toc):
        title, page_no = " ".join(str(entry[1]).split()), int(entry[2])
        if not title or not 1 <= page_no <= len(pages):
            continue
        index = page_no - 1
        span = _find_loose(pages[index], title, cursor.get(index, 0))
        if span is None:
            start = end = starts[index]
        else:
            start, end = starts[index] + span[0], starts[index] + span[1]
            cursor[index] = span[1]
        found.append((start, order, Heading(2, title, start, end)))
    return [h for _, _, h in sorted(found, key=lambda t: t[:2])]


def _find_loose(page: str, title: str, begin: int) -> tuple[int, int] | None:
    """Span of ``title`` in ``page[begin:]`` ignoring case and whitespace-run differences."""
    chars: list[str] = []
    where: list[int] = []  # collapsed index -> page index
    for i in range(begin, len(page)):
        c = page[i]
        if c.isspace():
            if chars and chars[-1] == " ":
                continue
            c = " "
        low = c.lower()
        chars.append(low if len(low) == 1 else c)
        where.append(i)
    needle = "".join(low if len(low := c.lower()) == 1 else c for c in title)
    hit = "".join(chars).find(needle)
    if hit < 0:
        return None
    return where[hit], where[hit + len(needle) - 1] + 1


def _extractor_for(path: Path) -> tuple[str, str]:
    """(kind, extractor name) chosen by file extension."""
    suffix = path.suffix.lower()
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown", "markdown"
    if suffix in TEXT_SUFFIXES:
        return "text", "text"
    if suffix in PDF_SUFFIXES:
        return "pdf", "pymupdf"
    return "unknown", "none"


def _list_files(root: Path) -> list[tuple[str, Path]]:
    """(document_id, path) of every regular, non-hidden file under ``root``, sorted by id."""
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(f"documents folder not found: {root}")
    files: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            path = Path(dirpath) / name
            if not name.startswith(".") and path.is_file():
                files.append((path.relative_to(root).as_posix(), path))
    return sorted(files)


def _human(n: int) -> str:
    return f"{n / 1e6:g} MB" if n >= 1_000_000 else f"{n:,} bytes"


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
