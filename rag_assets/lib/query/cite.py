"""Refusal gate, prompt context and citations.

The gate keeps at most :data:`MAX_SOURCES` hits (in final retrieval order) whose cosine distance
to the query is strictly below a cut; when none passes the question is refused and no generator
is called. Every kept hit becomes a :class:`Citation` whose ``quote`` is the chunk's ``content``
(never ``text``, which carries the ``[Title > Section]`` header), verified against the stored
canonical text so a stale index cannot produce a false quote. Links come only from here: a
``file://`` URI (or ``base_url`` + document id) plus an RFC 5147-style ``#char=a,b`` fragment for
text or ``#page=N`` (RFC 8118 PDF fragment) for PDFs; with the document's locator map (issue 14)
``#t=a,b`` on a transcript's media file, ``#Sheet1!A12:F19`` for spreadsheet rows, a text
fragment ``#:~:text=start,end`` for HTML, and ``ocr``/``ocr_confidence`` for OCR'd PDF pages
(see :mod:`rag_assets.lib.ingest.formats.locate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote as url_quote

from rag_assets.lib.ingest.formats.locate import Location, locate
from rag_assets.lib.types import Hit, Locator

DEFAULT_DISTANCE_CUT = 0.675
"""Cosine-distance cut used until a calibrated one exists (``RAG_DISTANCE_CUT`` overrides it;
the caller reads the environment). A hit is kept only when ``cosine_distance < cut``."""

JUDGE_REASON = "sources do not answer"
"""Refusal reason of the answer check (``RAG_ANSWER_CHECK=llm``), distinct from the distance's."""

MAX_SOURCES = 4
"""At most this many sources go into the prompt."""

PROMPT_INSTRUCTION = (
    "Answer using ONLY the numbered sources below. Cite every claim as [n]. "
    "If the sources do not contain the answer, say so and stop."
)
"""System instruction; also the first paragraph of :attr:`Context.prompt`."""


class StaleIndexError(ValueError):
    """A chunk's stored offsets no longer select its content in the canonical text."""


def gate(hits: Sequence[Hit], cut: float, keep: int = MAX_SOURCES) -> list[Hit]:
    """Keep, in the given order, at most ``keep`` hits whose ``cosine_distance < cut``.

    ``hits`` must be in final retrieval order (after fusion/rerank). Every hit must carry a
    finite ``cosine_distance``; one without is an error (the caller computes it from the stored
    vector), so a reranked list can never pass the gate on a score of another scale.
    """
    if not math.isfinite(cut):
        raise ValueError(f"distance cut must be a finite number, got {cut!r}")
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    for hit in hits:
        d = hit.cosine_distance
        if d is None or not math.isfinite(d):
            raise ValueError(
                f"hit {hit.chunk_id!r} (rank {hit.rank}, {hit.retriever}) has no finite "
                f"cosine_distance ({d!r}); compute it from the stored vector before gating"
            )
    passed = [h for h in hits if h.cosine_distance is not None and h.cosine_distance < cut]
    return passed[:keep]


@dataclass
class Citation:
    """One numbered source shown to the model and returned to the user."""

    index: int  # 1-based number used as [n] in the prompt and the answer
    document_id: str
    document_name: str
    locator_label: str  # "Title > Section" (text) or "Title > Section, p. N" / "p. N" (PDF)
    fragment: str  # "#char=a,b", "#page=N", "#t=a,b", "#Sheet1!A2:C4", "#:~:text=a,b"
    url: str  # document URL including the fragment
    quote: str  # the chunk content, verified against the canonical text
    start: int
    end: int
    page: int | None
    cosine_distance: float | None
    rerank_score: float | None
    ocr: bool = False  # the quote was recognised by OCR from a page image
    ocr_confidence: float | None = None  # that page's OCR confidence (0..1)

    def to_dict(self) -> dict[str, Any]:
        """Serialise with ``start``/``end`` as ``from``/``to`` (the project's wire names)."""
        return {
            "index": self.index,
            "document_id": self.document_id,
            "document_name": self.document_name,
            "locator_label": self.locator_label,
            "fragment": self.fragment,
            "url": self.url,
            "quote": self.quote,
            "from": self.start,
            "to": self.end,
            "page": self.page,
            "cosine_distance": self.cosine_distance,
            "rerank_score": self.rerank_score,
            "ocr": self.ocr,
            "ocr_confidence": self.ocr_confidence,
        }


@dataclass
class Context:
    """What a generator needs: the prompt and the citations it may refer to."""

    question: str
    prompt: str  # "" when no_answer
    citations: list[Citation] = field(default_factory=list)
    no_answer: bool = False
    threshold: float = DEFAULT_DISTANCE_CUT
    refused_by: str | None = None  # "distance" | "judge" when no_answer
    judge: dict[str, Any] | None = None  # the answer check's verdict, when it ran

    @property
    def user_message(self) -> str:
        """The numbered sources and the question (the prompt without the instruction)."""
        return render_user_message(self.question, self.citations)

    @property
    def reason(self) -> str:
        """Why it was refused: distance ("nothing under cosine distance ...") or the judge
        ("sources do not answer"); "" when answered."""
        if not self.no_answer:
            return ""
        if self.refused_by == "judge":
            return JUDGE_REASON
        return f"nothing under cosine distance {self.threshold:g}"

    @property
    def message(self) -> str:
        """The refusal line when ``no_answer``, else ""."""
        if self.no_answer and self.refused_by == "judge":
            score = (self.judge or {}).get("score")
            cut = (self.judge or {}).get("cut")
            why = f" (judge P(yes) {score:.2f} < {cut:.2f})" if score is not None and cut else ""
            return f'NO ANSWER: {JUDGE_REASON} "{self.question}"{why}'
        return no_answer_message(self.question, self.threshold) if self.no_answer else ""

    def refused_by_judge(self, verdict: dict[str, Any]) -> Context:
        """This context refused by the answer check: no sources, no prompt, the verdict kept."""
        return Context(
            self.question, "", [], True, self.threshold, refused_by="judge", judge=verdict
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["citations"] = [c.to_dict() for c in self.citations]
        return d


def build_context(
    question: str,
    hits: Sequence[Hit],
    *,
    threshold: float,
    canonical_text: Callable[[str], str],
    base_url: str | None = None,
    document_path: Callable[[str], str] | None = None,
    document_name: Callable[[str], str] | None = None,
    document_locators: Callable[[str], tuple[str, list[Locator]]] | None = None,
) -> Context:
    """Gate ``hits`` at ``threshold`` and build the prompt and numbered citations.

    ``canonical_text(document_id)`` returns the stored canonical text used to verify each quote
    (a mismatch raises :class:`StaleIndexError`). URLs use ``base_url`` when given, else the
    file URI of ``document_path(document_id)``. ``document_name`` defaults to the document id.
    ``document_locators(document_id)`` gives ``(kind, locator map)`` for per-format fragments.
    When nothing passes the gate the context has ``no_answer=True``, no citations and an empty
    prompt; the caller must then not call a generator.
    """
    kept = gate(hits, threshold)
    if not kept:
        return Context(question, "", [], no_answer=True, threshold=threshold, refused_by="distance")
    if base_url is None and document_path is None:
        raise ValueError("build_context needs base_url or document_path to link citations")
    texts: dict[str, str] = {}
    citations: list[Citation] = []
    for index, hit in enumerate(kept, start=1):
        if hit.document_id not in texts:
            texts[hit.document_id] = canonical_text(hit.document_id)
        verify_quote(hit, texts[hit.document_id])
        where = Location()
        if document_locators is not None:
            kind, locs = document_locators(hit.document_id)
            where = locate(kind, locs, hit.start, hit.end, hit.content)
        fragment = where.fragment or fragment_for(hit)
        path = document_path(hit.document_id) if document_path is not None else None
        link_id = hit.document_id
        if where.target is not None:  # a transcript links to its media file, next to it
            link_id = where.target
            path = str(Path(path).with_name(Path(where.target).name)) if path else None
        label = locator_label(hit)
        if where.label:
            label = where.label if where.replace_label else f"{label}, {where.label}"
        if where.ocr and where.ocr_confidence is not None:
            label = f"{label} (OCR, confidence {where.ocr_confidence:.2f})"
        citations.append(
            Citation(
                index=index,
                document_id=hit.document_id,
                document_name=(
                    document_name(hit.document_id) if document_name else hit.document_id
                ),
                locator_label=label,
                fragment=fragment,
                url=document_url(link_id, base_url, path) + fragment,
                quote=hit.content,
                start=hit.start,
                end=hit.end,
                page=hit.page,
                cosine_distance=hit.cosine_distance,
                rerank_score=hit.rerank_score,
                ocr=where.ocr,
                ocr_confidence=where.ocr_confidence,
            )
        )
    prompt = f"{PROMPT_INSTRUCTION}\n\n{render_user_message(question, citations)}"
    return Context(question, prompt, citations, no_answer=False, threshold=threshold)


def render_user_message(question: str, citations: Sequence[Citation]) -> str:
    """Numbered sources ``[n] (name — label)`` + quote, blank-line separated, then the question."""
    blocks = [f"[{c.index}] ({c.document_name} — {c.locator_label})\n{c.quote}" for c in citations]
    return "\n\n".join([*blocks, f"Question: {question}"])


def verify_quote(hit: Hit, canonical: str) -> None:
    """Raise :class:`StaleIndexError` unless ``canonical[start:end] == hit.content``."""
    in_range = 0 <= hit.start <= hit.end <= len(canonical)
    if not hit.content or not in_range or canonical[hit.start : hit.end] != hit.content:
        found = canonical[hit.start : hit.end] if in_range else "<out of range>"
        raise StaleIndexError(
            f"stale index: chunk {hit.chunk_id!r} of {hit.document_id!r} says chars "
            f"{hit.start}..{hit.end} hold {hit.content[:60]!r}, but the canonical text "
            f"({len(canonical)} chars) has {found[:60]!r} there; re-run extraction and indexing"
        )


def locator_label(hit: Hit) -> str:
    """Human locator: section path for text; ``"<path>, p. N"`` or ``"p. N"`` for PDFs.

    The section path is ``hit.section`` prefixed with the document title unless it already
    starts with it. For a text hit with no title or section it falls back to ``chars a–b``.
    """
    section = hit.section.strip()
    title = hit.title.strip()
    if section and title and section != title and not section.startswith(f"{title} > "):
        path = f"{title} > {section}"
    else:
        path = section
    if hit.page is not None:
        return f"{path}, p. {hit.page}" if path else f"p. {hit.page}"
    return path or title or f"chars {hit.start}–{hit.end}"


def fragment_for(hit: Hit) -> str:
    """``#page=N`` for a PDF hit (``page`` set), else ``#char=start,end`` (RFC 5147 style).

    Offsets are code-point positions in the canonical (extracted) text, which for Markdown and
    plain text is the file's decoded text.
    """
    if hit.page is not None:
        return f"#page={hit.page}"
    return f"#char={hit.start},{hit.end}"


def document_url(document_id: str, base_url: str | None, path: str | None) -> str:
    """``base_url`` + percent-quoted ``document_id`` when configured, else ``Path(path).as_uri()``.

    ``document_id`` is a POSIX relative path, so ``/`` is kept unquoted. ``path`` is made
    absolute first (relative paths resolve against the working directory).
    """
    if base_url:
        return base_url.rstrip("/") + "/" + url_quote(document_id, safe="/")
    if not path:
        raise ValueError(f"no base_url and no path for document {document_id!r}")
    return Path(path).resolve().as_uri()


def no_answer_message(question: str, cut: float) -> str:
    """The refusal line: ``NO ANSWER: nothing under cosine distance 0.675 for "…"``."""
    return f'NO ANSWER: nothing under cosine distance {cut:g} for "{question}"'
