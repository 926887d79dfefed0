"""Extraction: turn each source file into canonical text plus a locator map, or a failure.

Public API: :func:`extract_folder`, :func:`extract_document`, :func:`scan_folder`,
:func:`markdown_headings`, :data:`EXTRACTOR_VERSIONS`, :data:`EXTRACTOR_SUITE_VERSION`,
:class:`FolderExtraction`.

Canonical text rules (offsets everywhere are code-point indices into it):

* Markdown (``.md``, ``.markdown``), reStructuredText (``.rst``, ``.rest``) and plain text
  (``.txt``): the bytes decoded as strict UTF-8, one leading BOM removed, CRLF and lone CR
  turned into LF; nothing else changes. Markdown level-1/level-2 ATX heading lines outside
  fenced code blocks become :class:`Heading` records spanning the line (without its newline);
  reStructuredText section titles become headings spanning their adornment lines (see
  :mod:`rag_assets.lib.ingest.formats.rst`).
* PDF: each page's ``page.get_text()`` exactly as PyMuPDF returns it, pages joined with
  :data:`PAGE_SEPARATOR`; ``page_starts[i]`` is where page ``i + 1`` starts. Outline
  (``get_toc``) entries become level-2 headings spanning the title where it is found on its
  page (whitespace- and case-insensitive), else an empty span at the page start. Pages
  without a text layer are OCR'd; running headers/footers/page numbers are ``furniture``
  locators (see :mod:`rag_assets.lib.ingest.formats.pdf`).
* WebVTT/SRT, CSV/XLSX, HTML, DOCX: see the modules in :mod:`rag_assets.lib.ingest.formats`; the
  text formats are decoded by the same strict UTF-8 rules first.

A bad file never raises: it comes back with ``status="failed"`` and a specific reason. A file
read with gaps (low-confidence OCR pages, a repaired PDF, a sheet cut at its row limit, formula
cells without cached values, a Markdown file of headings only) is ``status="partial"``: indexed,
with a reason naming what was left out.

One bad file fails alone at every stage, the folder scan included (issue 25): a file that cannot
be read (permissions) or vanishes between the scan and the read fails with the cause; a name
that is not valid UTF-8 fails with its bytes escaped in its id (``bad\\xff.md``); a FIFO,
device or socket is ``skipped`` (never opened: reading a FIFO would block). Every extractor runs
under a time budget (:data:`~rag_assets.lib.ingest.formats.DEFAULT_BUDGET_S` per document).

What is read (issue 22): files whose extension has an extractor (:data:`SUPPORTED_SUFFIXES`),
and extension-less files that are UTF-8 text (``README``, ``LICENSE``): the sniffing rule is
that the first :data:`SNIFF_BYTES` bytes contain no NUL byte and decode as UTF-8 (a multi-byte
character cut at the end of the sample is allowed). Other files (``.png``, binary files without
an extension, ...) are ``skipped`` with the reason, not failed. ``RAG_INCLUDE`` /
``RAG_EXCLUDE`` / ``.ragignore`` choose which files are documents at all
(:mod:`rag_assets.lib.ingest.select`).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

import pymupdf

from rag_assets.lib.ingest.formats import Extraction, FormatError, budget, media, sheets
from rag_assets.lib.ingest.formats import html as html_format
from rag_assets.lib.ingest.formats import ocr as ocr_format
from rag_assets.lib.ingest.formats import office as office_format
from rag_assets.lib.ingest.formats import rst as rst_format
from rag_assets.lib.ingest.formats.pdf import PAGE_SEPARATOR, extract_pdf
from rag_assets.lib.ingest.metadata import (
    ACCESS_KEY,
    TITLE_KEY,
    MetadataError,
    MetaRules,
    front_matter,
    merge,
    read_rules,
    system_facts,
)
from rag_assets.lib.ingest.select import Selection
from rag_assets.lib.types import ExtractedDocument, Heading, Locator

__all__ = ["PAGE_SEPARATOR"]
#: Default size limit per file (decimal megabytes); larger files fail without being parsed.
DEFAULT_MAX_BYTES = 50_000_000
#: Bytes of an extension-less file read to decide whether it is text (see the module doc).
SNIFF_BYTES = 8192
#: Above this share of C0 control bytes (other than tab, LF, CR, FF) a text file is binary.
CONTROL_BYTE_RATIO = 0.05

MARKDOWN_SUFFIXES = (".md", ".markdown")
RST_SUFFIXES = rst_format.RST_SUFFIXES
TEXT_SUFFIXES = (".txt",)
PDF_SUFFIXES = (".pdf",)
HTML_SUFFIXES = html_format.HTML_SUFFIXES
DOCX_SUFFIXES = office_format.DOCX_SUFFIXES
#: Every suffix that has an extractor, in the order the "unsupported" reason lists them.
SUPPORTED_SUFFIXES = (
    MARKDOWN_SUFFIXES
    + RST_SUFFIXES
    + TEXT_SUFFIXES
    + PDF_SUFFIXES
    + media.VTT_SUFFIXES
    + media.SRT_SUFFIXES
    + sheets.CSV_SUFFIXES
    + sheets.XLSX_SUFFIXES
    + HTML_SUFFIXES
    + DOCX_SUFFIXES
)
#: Default OCR confidence floor (``RAG_OCR_MIN_CONFIDENCE``); part of the PDF extractor version.
DEFAULT_OCR_MIN_CONFIDENCE = ocr_format.DEFAULT_MIN_CONFIDENCE

#: Extractor name -> version string. Bump a version whenever that extractor's output (text,
#: title, headings, page map, locators) can change; reuse of earlier results keys on it (the
#: PDF one also carries the OCR floor a document was read with, see :func:`extractor_version`).
EXTRACTOR_VERSIONS: dict[str, str] = {
    # 2: a file of headings only is partial (issue 25); 3: front matter is metadata (issue 34)
    "markdown": "markdown-3",
    "rst": rst_format.VERSION,
    "text": "text-1",
    "pymupdf": f"pymupdf-3/mupdf-{pymupdf.mupdf_version}/{ocr_format.engine_version()}",
    "webvtt": "webvtt-1",
    "sheets": "sheets-3",  # 3: formula cells without cached values make it partial
    "html": html_format.VERSION,
    "docx": office_format.VERSION,
    "none": "none-1",  # unsupported file types: nothing is extracted
}
#: All extractors that can produce an ok document, in one string (for version stamps).
EXTRACTOR_SUITE_VERSION = "+".join(
    EXTRACTOR_VERSIONS[n]
    for n in ("markdown", "rst", "text", "pymupdf", "webvtt", "sheets", "html", "docx")
)

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
        return [d for d in self.documents if d.status == "failed"]

    @property
    def skipped(self) -> list[ExtractedDocument]:
        """Symbolic links not followed (leaving the folder, broken, or duplicates), with why."""
        return [d for d in self.documents if d.status == "skipped"]


def extract_folder(
    root: Path,
    previous: dict[str, ExtractedDocument] | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    ocr_min_confidence: float = DEFAULT_OCR_MIN_CONFIDENCE,
    select: Selection | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> FolderExtraction:
    """Extract every non-hidden file under ``root`` (recursively, sorted by document id).
    ``progress(i, total, document_id)`` is called before each file is read, and
    ``progress(total, total, "")`` at the end (issue 31).

    A document from ``previous`` (keyed by document id) is reused without re-extraction when
    it is ok and has the same ``source_hash``, ``extractor_version`` and locator inputs
    (:func:`_locator_inputs`) as the file now would; failed documents are always retried.
    Raises only if ``root`` is not a directory.

    Symbolic links are followed only when they resolve to a file inside ``root`` that is not
    indexed already (each file is read once); the others come back ``status="skipped"`` with the
    reason, and their rows are dropped from the index.
    """
    previous = previous or {}
    documents: list[ExtractedDocument] = []
    reused: list[str] = []
    files, skipped = _walk(Path(root), select)
    documents += [_skipped_document(doc_id, path, why) for doc_id, path, why in skipped]
    for i, (doc_id, path) in enumerate(files):
        if progress is not None:
            progress(i, len(files), doc_id)
        if _has_surrogates(doc_id):
            documents.append(_bad_name_document(doc_id, path))
            continue
        old = previous.get(doc_id)
        if old is not None and old.ok:
            try:
                source_hash = _file_sha256(path)
            except OSError:  # unreadable or gone: extract_document says why
                source_hash = ""
            name = _extractor_for(path)[1]
            version = extractor_version(name, ocr_min_confidence)
            if (
                old.source_hash == source_hash
                and old.extractor_version == version
                and _reused_locator_inputs(old) == _locator_inputs(name, path, Path(root))
            ):
                documents.append(replace(old, path=str(path.resolve())))
                reused.append(doc_id)
                continue
        documents.append(
            extract_document(path, root, max_bytes=max_bytes, ocr_min_confidence=ocr_min_confidence)
        )
    if progress is not None:
        progress(len(files), len(files), "")
    documents.sort(key=lambda d: d.document_id)
    rules = read_rules(Path(root))
    return FolderExtraction([with_metadata(d, rules) for d in documents], reused)


def with_metadata(doc: ExtractedDocument, rules: MetaRules) -> ExtractedDocument:
    """``doc`` with its metadata (issue 34, :mod:`rag_assets.lib.ingest.metadata`): the file
    system's facts, the ``.ragmeta`` lines and its front matter. A ``.ragmeta`` that cannot be
    read fails the documents under its folder (closed: their access is unknown)."""
    path = Path(doc.path) if doc.status != "skipped" else None
    facts = system_facts(doc.document_id, doc.kind, path, doc.title)
    try:
        given = rules.for_document(doc.document_id)
    except MetadataError as exc:
        facts[ACCESS_KEY] = []  # unknown access: the administrator's alone (status, lists)
        if doc.status == "skipped":
            return replace(doc, metadata=facts)
        return replace(
            doc,
            status="failed",
            reason=f"metadata: {exc}",
            text="",
            page_starts=[],
            headings=[],
            locators=[],
            title="",
            metadata=facts,
        )
    return replace(doc, metadata=merge(facts, given, doc.front_matter))


def extract_document(
    path: Path,
    root: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    ocr_min_confidence: float = DEFAULT_OCR_MIN_CONFIDENCE,
) -> ExtractedDocument:
    """Extract one file; never raises for bad input (returns ``status="failed"`` instead)."""
    path = Path(path)
    kind, name = _extractor_for(path)
    doc_id = path.relative_to(root).as_posix()
    if _has_surrogates(doc_id):
        return _bad_name_document(_escaped(doc_id), path)
    doc = ExtractedDocument(
        document_id=doc_id,
        path=str(path.resolve()),
        kind=kind,
        status="failed",
        reason=None,
        extractor=name,
        extractor_version=extractor_version(name, ocr_min_confidence),
        source_hash="",
    )
    outside = _leaves(path, Path(root))
    if outside:  # checked again at read time: a link may have been swapped since the walk
        return _skipped_document(doc.document_id, path, outside)
    transcript = media.transcript_for(path)
    if transcript is not None:  # a video/audio file is cited through its transcript
        return _skipped_document(
            doc.document_id, path, f"media file: cited through its transcript {transcript}"
        )
    if name == "none":  # issue 22: not a failure, nothing to read
        return _skipped_document(doc.document_id, path, _unsupported(path))
    try:
        with budget():
            _extract_into(doc, path, Path(root), name, kind, max_bytes, ocr_min_confidence)
    except (ExtractionError, FormatError) as exc:
        doc.reason = str(exc)
    except FileNotFoundError:
        doc.reason = "the file vanished before it was read (deleted or renamed during the run)"
    except OSError as exc:
        doc.reason = f"cannot read the file: {exc.strerror or type(exc).__name__}"
    except Exception as exc:  # noqa: BLE001 - one bad file must never stop the folder
        doc.reason = f"extraction error: {type(exc).__name__}: {exc}"
    else:
        doc.status = "partial" if doc.reason else "ok"
    if not doc.ok:
        doc.text, doc.page_starts, doc.headings, doc.title = "", [], [], ""
        doc.locators, doc.front_matter = [], {}
    return doc


def _extract_into(
    doc: ExtractedDocument,
    path: Path,
    root: Path,
    name: str,
    kind: str,
    max_bytes: int,
    ocr_min_confidence: float,
) -> None:
    """Read and extract ``path`` into ``doc`` (raises for a bad file, see the caller)."""
    size = path.stat().st_size
    if size > max_bytes:
        doc.source_hash = _file_sha256(path)
        raise ExtractionError(
            f"file too large: {size:,} bytes, over the size limit of {_human(max_bytes)}"
        )
    data = _read_stable(path)
    doc.source_hash = hashlib.sha256(data).hexdigest()
    if not data.strip():
        raise ExtractionError(
            "file is empty (0 bytes)" if not data else "file is empty (only whitespace)"
        )
    if name in ("markdown", "rst", "text"):
        doc.text = _decode_text(data)
        if name == "markdown":
            _take_front_matter(doc)
            doc.headings = markdown_headings(doc.text)
            doc.reason = _headings_only(doc.text, doc.headings)
        if name == "rst":  # issue 31: titles (over/underlined) as sections, not skipped
            _, doc.headings = rst_format.rst_headings(doc.text, path.stem)
            doc.reason = _headings_only(doc.text, doc.headings)
        doc.title = next((h.title for h in doc.headings if h.level == 1), path.stem)
        if doc.front_matter.get(TITLE_KEY):  # the owner's title wins (issue 34)
            doc.title = doc.front_matter[TITLE_KEY][0]
    else:
        got = _extract_format(name, kind, data, path, Path(root), ocr_min_confidence)
        doc.text, doc.title, doc.headings = got.text, got.title, got.headings
        doc.page_starts, doc.locators = got.page_starts, got.locators
        doc.reason = got.partial


def _take_front_matter(doc: ExtractedDocument) -> None:
    """Move a Markdown file's front matter out of its text into ``doc.front_matter`` (issue 34):
    the canonical text starts at the body, so a metadata edit changes no chunk."""
    try:
        fm = front_matter(doc.text)
    except MetadataError as exc:
        raise ExtractionError(str(exc)) from None
    if not fm.end:
        return
    doc.front_matter = fm.fields
    first_line = doc.text.count("\n", 0, fm.end) + 1  # where the body starts in the file
    doc.text = doc.text[fm.end :]
    doc.locators = [Locator(0, len(doc.text), "body", row=first_line)]  # `path:LINE` stays true
    if not doc.text.strip():
        raise ExtractionError("only front matter, no body text: nothing to index")


def _headings_only(text: str, headings: list[Heading]) -> str | None:
    """The partial reason of a Markdown file with no text besides its heading lines."""
    if not headings:
        return None
    rest = list(text)
    for h in headings:
        rest[h.start : h.end] = [" "] * (h.end - h.start)
    if "".join(rest).strip():
        return None
    return f"only headings, no body text ({len(headings)} heading lines): nothing to cite yet"


def _unsupported(path: Path) -> str:
    suffix = path.suffix.lower()
    if not suffix:
        return (
            f"no extension and not UTF-8 text (a NUL byte or invalid UTF-8 in its first "
            f"{SNIFF_BYTES:,} bytes): binary files are not indexed"
        )
    return f"unsupported file type {suffix!r} (supported: " + ", ".join(SUPPORTED_SUFFIXES) + ")"


def _sniff_text(path: Path) -> bool:
    """An extension-less file is text when its first :data:`SNIFF_BYTES` bytes hold no NUL
    byte and decode as UTF-8 (a character cut at the end of the sample allowed). A file that
    cannot be read counts as text, so it fails with the read error instead of being skipped."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return True
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            len(head) == SNIFF_BYTES
            and exc.start >= len(head) - 3
            and exc.reason in ("unexpected end of data",)
        )
    return True


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _escaped(text: str) -> str:
    """A name with undecodable bytes (surrogate-escaped by the OS layer) as ``\\xNN`` text."""
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def _bad_name_document(doc_id: str, path: Path) -> ExtractedDocument:
    """A file whose name is not valid UTF-8: failed alone, named with its bytes escaped."""
    kind, name = _extractor_for(path)
    return ExtractedDocument(
        document_id=_escaped(doc_id),
        path=_escaped(os.path.abspath(path)),
        kind=kind,
        status="failed",
        reason=(
            "file name is not valid UTF-8 (shown with its bytes escaped): rename the file "
            "with a UTF-8 name"
        ),
        extractor=name,
        extractor_version=EXTRACTOR_VERSIONS[name],
        source_hash="",
    )


def extractor_version(name: str, ocr_min_confidence: float = DEFAULT_OCR_MIN_CONFIDENCE) -> str:
    """The version a document extracted by ``name`` is stamped with (PDF: + the OCR floor)."""
    if name == "pymupdf":
        return f"{EXTRACTOR_VERSIONS[name]}/ocr-floor-{ocr_min_confidence:g}"
    return EXTRACTOR_VERSIONS[name]


def _locator_inputs(name: str, path: Path, root: Path) -> str | None:
    """What a document's locators depend on besides its bytes (part of the reuse key): for a
    transcript, the media file next to it that its citations link to."""
    if name == "webvtt":
        return media.media_for(path, root)
    return None


def _reused_locator_inputs(doc: ExtractedDocument) -> str | None:
    """:func:`_locator_inputs` as recorded in an earlier extraction's locators."""
    if doc.extractor == "webvtt":
        return next((loc.target for loc in doc.locators if loc.kind == "media"), None)
    return None


def _extract_format(
    name: str, kind: str, data: bytes, path: Path, root: Path, ocr_min_confidence: float
) -> Extraction:
    """Dispatch to the per-format module (text formats are strictly decoded first)."""
    if name == "pymupdf":
        return extract_pdf(data, path.stem, ocr_min_confidence)
    if kind == "xlsx":
        return sheets.extract_xlsx(data, path)
    if kind == "docx":
        return office_format.extract_docx(data, path)
    text = _decode_text(data)
    if name == "webvtt":
        return media.extract_transcript(text, kind, path, root)
    if kind == "csv":
        return sheets.extract_csv(text, path)
    if name == "html":
        return html_format.extract_html(text, path)
    raise ExtractionError(f"no extractor for {name!r}")


def scan_folder(root: Path, select: Selection | None = None) -> dict[str, str]:
    """``{document_id: sha256 of the file bytes}`` for every file :func:`extract_folder` sees
    (a skipped link or FIFO: its reason, never the bytes it points to; a file that cannot be
    read: ``failed: <why>``, so one bad file never stops the scan)."""
    files, skipped = _walk(Path(root), select)
    out: dict[str, str] = {}
    for doc_id, path in files:
        if _has_surrogates(doc_id):
            out[_escaped(doc_id)] = "failed: file name is not valid UTF-8"
            continue
        try:
            out[doc_id] = _file_sha256(path)
        except OSError as exc:
            out[doc_id] = f"failed: {exc.strerror or type(exc).__name__}"
    out.update({_escaped(doc_id): f"skipped: {why}" for doc_id, _, why in skipped})
    # issue 34: a .ragmeta edit changes the folder's data version (its documents' metadata)
    out.update({name: f"metadata: {sha}" for name, sha in read_rules(Path(root)).digests.items()})
    return dict(sorted(out.items()))


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


def _extractor_for(path: Path) -> tuple[str, str]:
    """(kind, extractor name) chosen by file extension (none: sniffed, see the module doc)."""
    suffix = path.suffix.lower()
    if not suffix and not path.name.startswith("."):
        return ("text", "text") if _sniff_text(path) else ("unknown", "none")
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown", "markdown"
    if suffix in RST_SUFFIXES:
        return "rst", "rst"
    if suffix in TEXT_SUFFIXES:
        return "text", "text"
    if suffix in PDF_SUFFIXES:
        return "pdf", "pymupdf"
    if suffix in media.VTT_SUFFIXES:
        return "vtt", "webvtt"
    if suffix in media.SRT_SUFFIXES:
        return "srt", "webvtt"
    if suffix in sheets.CSV_SUFFIXES:
        return "csv", "sheets"
    if suffix in sheets.XLSX_SUFFIXES:
        return "xlsx", "sheets"
    if suffix in HTML_SUFFIXES:
        return "html", "html"
    if suffix in DOCX_SUFFIXES:
        return "docx", "docx"
    return "unknown", "none"


def list_files(root: Path) -> list[tuple[str, Path]]:
    """(document_id, path) of every file :func:`extract_folder` reads, sorted by id."""
    return _walk(Path(root))[0]


def _walk(
    root: Path, select: Selection | None = None
) -> tuple[list[tuple[str, Path]], list[tuple[str, Path, str]]]:
    """Files to read and links skipped (with the reason) under ``root``, each sorted by id.

    Regular non-hidden files are read. A (non-hidden) symbolic link to a file is followed once:
    only when it resolves inside ``root`` to a file that is not read already (as itself or
    through an earlier link; a link to a hidden file makes it visible). Links that leave
    ``root``, broken links and links to folders are skipped (folders are never entered through a
    link: no cycles, no escape).
    """
    if not root.is_dir():
        raise NotADirectoryError(f"documents folder not found: {root}")
    select = select if select is not None else Selection.for_folder(root)
    real_root = root.resolve()
    files: list[tuple[str, Path]] = []
    links: list[tuple[str, Path, Path]] = []
    skipped: list[tuple[str, Path, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):  # never follows links to folders
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            path = Path(dirpath) / name
            doc_id = path.relative_to(root).as_posix()
            if name.startswith(".") or not select.wants(doc_id):
                continue
            if not path.is_symlink():
                special = _special_file(path)
                if special:
                    skipped.append((doc_id, path, special))
                elif path.is_file():
                    files.append((doc_id, path))
                continue
            why = _leaves(path, root)
            target = path.resolve()
            if not why and target.is_dir():
                why = (
                    f"symbolic link to the folder {target.relative_to(real_root).as_posix() or '.'}"
                    " inside the documents folder: links to folders are not followed"
                )
            elif not why and not target.is_file():
                why = f"symbolic link to something that is not a regular file ({_link_text(path)})"
            if why:
                skipped.append((doc_id, path, why))
            else:
                links.append((doc_id, path, target))
    claimed = {path.resolve(): doc_id for doc_id, path in files}
    for doc_id, path, target in sorted(links):
        if target in claimed:
            skipped.append(
                (
                    doc_id,
                    path,
                    f"symbolic link to {target.relative_to(real_root).as_posix()}, which is "
                    f"indexed as {claimed[target]} (links are followed once)",
                )
            )
        else:
            claimed[target] = doc_id
            files.append((doc_id, path))
    return sorted(files), sorted(skipped)


def _special_file(path: Path) -> str:
    """Why a directory entry that is not a regular file is skipped (never opened), or ``""``."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return ""  # gone since the listing: nothing to index
    for test, what in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return f"not a regular file: {what} is never read"
    return ""


def _leaves(path: Path, root: Path) -> str:
    """Why ``path`` (a symbolic link somewhere in it) must not be read, or ``""``."""
    path = Path(path)
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        if path.is_symlink():
            return f"broken symbolic link ({_link_text(path)})"
        return ""  # a missing plain file fails later with its own reason
    if not target.is_relative_to(Path(root).resolve()):
        return f"symbolic link leaves the documents folder ({_link_text(path)}): not followed"
    return ""


def _link_text(path: Path) -> str:
    try:
        return f"-> {os.readlink(path)}"
    except OSError:
        return f"-> {path.resolve()}"


def _skipped_document(doc_id: str, path: Path, reason: str) -> ExtractedDocument:
    """A file that is not read (a link not followed): listed in the manifest with why."""
    kind, name = ("unknown", "none") if _special_file(path) else _extractor_for(path)
    return ExtractedDocument(
        document_id=_escaped(doc_id),
        path=_escaped(os.path.abspath(path)),  # the link itself, never its target
        kind=kind,
        status="skipped",
        reason=reason,
        extractor=name,
        extractor_version=EXTRACTOR_VERSIONS[name],
        source_hash="",
    )


#: Reads of one file while its size/mtime/inode keep changing before it fails "changed while
#: reading" (it is retried on the next run, like every failed document).
READ_ATTEMPTS = 2


def _read_stable(path: Path) -> bytes:
    """The file's bytes, read while its size, mtime, ctime and inode did not change (checked
    before, at the end of, and after the read); one retry, then ExtractionError."""
    for _ in range(READ_ATTEMPTS):
        before = os.stat(path)
        with open(path, "rb") as fh:
            data = _read_all(fh)
            during = os.fstat(fh.fileno())
        after = os.stat(path)
        if (
            _identity(before) == _identity(during) == _identity(after)
            and len(data) == before.st_size
        ):
            return data
    raise ExtractionError(
        f"changed while reading: size or modification time changed during {READ_ATTEMPTS} "
        f"reads (now {after.st_size:,} bytes); it is read again on the next run"
    )


def _read_all(fh: BinaryIO) -> bytes:
    return fh.read()


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _human(n: int) -> str:
    return f"{n / 1e6:g} MB" if n >= 1_000_000 else f"{n:,} bytes"


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
