"""The records that pass between stages: documents, chunks, hits.

Plain dataclasses, no Dagster. Offsets are Python string indices (code points) into a
document's canonical text; ``start``/``end`` are serialised as ``from``/``to``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

_WS = re.compile(r"\s+")


def normalize_ws(text: str) -> str:
    """Collapse every whitespace run to one space and strip (the PDF-set match rule)."""
    return _WS.sub(" ", text).strip()


def sha256_text(text: str) -> str:
    """Hex sha256 of UTF-8 text (the content hash used everywhere)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Heading:
    """A section heading found by the extractor.

    ``start``/``end`` span the heading *line* in the canonical text (without its newline) for
    Markdown, which the chunker excludes from every chunk's content. For a PDF outline entry
    the span is where the title was found on its page (or an empty span at the page start).
    ``level`` 1 is the document title; level 2 opens a section.
    """

    level: int
    title: str
    start: int
    end: int


#: Document states. ``partial``: indexed, but some content could not be read with confidence
#: (low-confidence OCR pages, a repaired PDF); ``reason`` then says which pages.
DOCUMENT_STATES = ("ok", "partial", "failed", "skipped")  # skipped: a link not followed


@dataclass(frozen=True)
class Locator:
    """Where a span of canonical text ``[start, end)`` came from in its source file.

    ``kind`` is one of:

    * ``"furniture"``: a running header, footer or page number of a PDF page; kept in the
      canonical text (offsets stay true) but out of every chunk's content.
    * ``"ocr"``: a PDF page whose text was recognised from its image; ``page`` and the mean
      per-line recogniser ``ocr_confidence`` (0..1, weighted by characters).
    * ``"cue"``: one WebVTT/SRT cue; ``t_start``/``t_end`` in seconds on the media timeline.
    * ``"row"``: one spreadsheet row; ``sheet``, 1-based ``row``, 1-based ``col_first`` and
      ``col_last`` of its non-empty cells (a CSV file is one sheet named after the file).
    * ``"block"``: one HTML/DOCX block (heading, paragraph, list item, table row).
    * ``"media"``: spans the whole transcript; ``target`` is the media file it belongs to
      (a path relative to the documents folder), the one citations link to.
    * ``"body"``: spans a Markdown text whose front matter was taken out as metadata (issue 34);
      ``row`` is the file's 1-based line where the text starts, so ``path:LINE`` stays true.
    """

    start: int
    end: int
    kind: str
    page: int | None = None
    ocr_confidence: float | None = None
    t_start: float | None = None
    t_end: float | None = None
    sheet: str | None = None
    row: int | None = None
    col_first: int | None = None
    col_last: int | None = None
    target: str | None = None


@dataclass
class ExtractedDocument:
    """One source file after extraction: canonical text plus a locator map, or a failure."""

    document_id: str  # path relative to the documents folder, POSIX separators
    path: str  # absolute path of the source file
    # "markdown" | "rst" | "text" | "pdf" | "vtt" | "srt" | "csv" | "xlsx" | "html" | "docx"
    kind: str
    status: str  # one of DOCUMENT_STATES
    reason: str | None  # human reason when failed (or, when partial, what was left out)
    extractor: str  # e.g. "text", "pymupdf"
    extractor_version: str  # e.g. "text-1", "pymupdf-1/mupdf-1.28.5"
    source_hash: str  # sha256 of the file bytes
    title: str = ""
    text: str = ""  # canonical text ("" when failed)
    page_starts: list[int] = field(default_factory=list)  # PDF: offset where page i+1 starts
    headings: list[Heading] = field(default_factory=list)
    locators: list[Locator] = field(default_factory=list)  # sorted by (start, end, kind)
    # issue 34: key -> values (rag_assets/lib/ingest/metadata.py): the file system's facts,
    # .ragmeta lines and front matter merged; front_matter keeps the fields the file's own bytes
    # gave (reused with an unchanged file), metadata is rebuilt on every run
    front_matter: dict[str, list[str]] = field(default_factory=dict)
    metadata: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Indexable: ``ok`` or ``partial`` (a partial document is indexed, with its reason)."""
        return self.status in ("ok", "partial")

    def locators_at(self, start: int, end: int, kind: str) -> list[Locator]:
        """Locators of ``kind`` overlapping ``[start, end)`` (an empty span: containing it)."""
        return [
            loc
            for loc in self.locators
            if loc.kind == kind
            and (loc.start < end and start < loc.end or loc.start <= start == end <= loc.end)
        ]

    @property
    def text_hash(self) -> str:
        return sha256_text(self.text)

    @property
    def pages(self) -> int:
        return len(self.page_starts)

    def page_at(self, offset: int) -> int | None:
        """1-based page holding character ``offset`` (PDF only), else None."""
        if not self.page_starts:
            return None
        return max(1, bisect.bisect_right(self.page_starts, offset))

    def manifest_row(self) -> dict[str, Any]:
        """The per-document manifest entry (no text)."""
        return {
            "document_id": self.document_id,
            "path": self.path,
            "kind": self.kind,
            "status": self.status,
            "reason": self.reason,
            "extractor": self.extractor,
            "extractor_version": self.extractor_version,
            "source_hash": self.source_hash,
            "title": self.title,
            "text_hash": self.text_hash if self.ok else None,
            "chars": len(self.text),
            "pages": self.pages,
            "metadata": self.metadata,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["headings"] = [asdict(h) for h in self.headings]
        d["locators"] = [asdict(loc) for loc in self.locators]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExtractedDocument:
        d = dict(d)
        d["headings"] = [Heading(**h) for h in d.get("headings", [])]
        d["locators"] = [Locator(**loc) for loc in d.get("locators") or []]
        return cls(**d)


@dataclass(frozen=True)
class Chunk:
    """A span of one document's canonical text.

    Invariant: ``content == canonical[start:end]``. ``text`` is what is embedded (optional
    ``[Title > Section]`` header line + content); ``content`` is what is quoted.
    """

    chunk_id: str
    document_id: str
    section: str
    start: int
    end: int
    content: str
    text: str
    page: int | None = None  # 1-based page of ``start`` for PDFs

    def to_dict(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "document": self.document_id,
            "section": self.section,
            "from": self.start,
            "to": self.end,
            "page": self.page,
            "content": self.content,
            "text": self.text,
        }


@dataclass
class Hit:
    """One ranked retrieval result with the stored chunk's fields and stamps."""

    chunk_id: str
    document_id: str
    section: str
    start: int
    end: int
    content: str
    text: str
    page: int | None
    score: float  # retriever's own score (higher is better)
    rank: int  # 1-based
    retriever: str  # "dense" | "bm25" | "hybrid" | "rerank"
    cosine_distance: float | None = None  # 1 - cos(query, chunk)
    rerank_score: float | None = None
    stamps: dict[str, Any] = field(default_factory=dict)
    title: str = ""  # document title

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["from"] = d.pop("start")
        d["to"] = d.pop("end")
        return d


def locators_to_json(locators: list[Locator]) -> str:
    """Compact JSON of a locator map, only the fields that are set (stored with the text)."""
    rows = [{k: v for k, v in asdict(loc).items() if v is not None} for loc in locators]
    return json.dumps(rows, separators=(",", ":"), ensure_ascii=False)


def locators_from_json(blob: str | None) -> list[Locator]:
    """Inverse of :func:`locators_to_json`; ``None`` or ``""`` (older stores) give ``[]``."""
    return [Locator(**row) for row in json.loads(blob)] if blob else []
