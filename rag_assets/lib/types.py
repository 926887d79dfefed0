"""The records that pass between stages: documents, chunks, hits.

Plain dataclasses, no Dagster. Offsets are Python string indices (code points) into a
document's canonical text; ``start``/``end`` are serialised as ``from``/``to``.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any


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


@dataclass
class ExtractedDocument:
    """One source file after extraction: canonical text plus a locator map, or a failure."""

    document_id: str  # path relative to the documents folder, POSIX separators
    path: str  # absolute path of the source file
    kind: str  # "markdown" | "text" | "pdf" | "unknown"
    status: str  # "ok" | "failed"
    reason: str | None  # human reason when failed
    extractor: str  # e.g. "text", "pymupdf"
    extractor_version: str  # e.g. "text-1", "pymupdf-1/mupdf-1.28.5"
    source_hash: str  # sha256 of the file bytes
    title: str = ""
    text: str = ""  # canonical text ("" when failed)
    page_starts: list[int] = field(default_factory=list)  # PDF: offset where page i+1 starts
    headings: list[Heading] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

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
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["headings"] = [asdict(h) for h in self.headings]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExtractedDocument:
        d = dict(d)
        d["headings"] = [Heading(**h) for h in d.get("headings", [])]
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
