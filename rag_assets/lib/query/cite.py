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

Pinpoint spans (issue 21): inside every cited chunk the sentence(s) (a sheet's row(s), a
transcript's cue(s), a PDF's sentence on its page) that best answer the question, chosen at
query time from the cited chunks only by a :data:`SpanScorer` (:data:`DEFAULT_SPAN_SCORING`),
with its own exact locator (:class:`Span`); ``span.text == canonical[span.start:span.end]`` and
the span lies inside the chunk. The quote stays the chunk's content. When a model wrote the
answer, :func:`ground_spans` chooses each cited chunk's span again by the answer's own sentences
that cite it (``[n]``): the model's wording of a claim is far closer to the source sentence than
the question's paraphrase.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote as url_quote

import numpy as np

from rag_assets.lib.index.lexical import tokenize
from rag_assets.lib.ingest.formats.locate import Location, locate, span_location, span_units
from rag_assets.lib.ingest.sources import VIEW
from rag_assets.lib.types import Hit, Locator

SpanScorer = Callable[[str, Sequence[str]], Sequence[float]]
"""``(question, candidate texts) -> one score each`` (higher is better)."""

DEFAULT_DISTANCE_CUT = 0.675
"""Cosine-distance cut used until a calibrated one exists (``RAG_DISTANCE_CUT`` overrides it;
the caller reads the environment). A hit is kept only when ``cosine_distance < cut``."""

JUDGE_REASON = "sources do not answer"
"""Refusal reason of the answer check (``RAG_ANSWER_CHECK=llm``), distinct from the distance's."""

VERIFY_REASON = "the answer is not supported by its sources"
"""Refusal reason of ``RAG_ANSWER_VERIFY=refuse`` (issue 50): no sentence of the written answer
is supported by the source it cites (``refused_by`` "verification")."""

MAX_SOURCES = 4
"""At most this many sources go into the prompt."""

NEAR_MISS_MARGIN = 0.05
"""A distance refusal is a *near miss* when the nearest source is less than this far (cosine
distance) above the cut. On the sample corpus and the course corpus with all-MiniLM-L6-v2 the
calibrated cuts sit near 0.47-0.68 and one paraphrase of a question moves its nearest distance by
a few hundredths, so a source this close to the cut is one a reader may want to judge: the
refusal says so and points at ``--show-nearest``. A convention for the message, not a gate: it
changes no answer."""

NEAREST_SHOWN = 3
"""How many sources below the bar ``--show-nearest`` (the page's toggle, ``show_nearest``) lists:
the closest candidates the gate refused, by distance, never numbered, never in the prompt."""

PROMPT_INSTRUCTION = (
    "Answer using ONLY the numbered sources below, in one to three full sentences that keep the "
    "sources' own wording; end each sentence with [n] for the source it comes from. "
    "If the sources do not contain the answer, say so and stop."
)
"""System instruction; also the first paragraph of :attr:`Context.prompt`. Asking for full
sentences matters for small models: with "Cite every claim as [n]" alone, Qwen2.5-Coder 1.5B
answered 24 of 52 course-dev questions with a bare marker ("[2]") and no words; with this
instruction 2 of 52 (``python -m rag_assets.bench.spans --llm …``, docs/measurements.md). Keeping
the sources' wording also lets :func:`ground_spans` find the sentence a claim comes from."""


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


SPAN_SCORINGS = ("lexical", "dense", "mix")
"""Ways to score a chunk's candidate spans: BM25 over the cited chunks' candidates
(:func:`lexical_scores`), the query encoder's cosine (:func:`dense_scorer`), or their mean
after min-max scaling (:func:`mix_scorer`)."""

DEFAULT_SPAN_SCORING = "lexical"
"""What :func:`build_context` uses when given no scorer: BM25 over the candidates needs no
model, costs well under a millisecond, and on course-dev + pdf-dev chose the needle's sentence
as often as the encoder or the mix (docs/measurements.md, ``python -m rag_assets.bench.spans``)."""

MIN_SPAN_CHARS = 25
"""A chosen sentence shorter than this ("Yes.", a label line) is extended by the next
candidate of the same chunk: such a fragment says too little to be the answer on its own."""

BM25_K1, BM25_B = 1.2, 0.75
"""Okapi BM25 parameters of :func:`lexical_scores` (the usual defaults, as the index's BM25)."""


@dataclass(frozen=True)
class Span:
    """The pinpoint inside a cited chunk: canonical ``[start, end)`` and its own locator."""

    start: int
    end: int
    text: str  # == canonical[start:end], inside the chunk
    fragment: str  # "#char=a,b" | "#page=N" | "#t=a,b" | "#Sheet!A5:D5" | "#:~:text=..."
    label: str  # "chars a–b" | "p. N, chars a–b" | "0:14.0–0:22.2" | "Sheet!A5:D5"
    page: int | None = None  # 1-based page of the span (PDF)
    chosen_by: str = "question"  # "question" | "answer" (re-chosen by ground_spans)

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.start,
            "to": self.end,
            "text": self.text,
            "fragment": self.fragment,
            "label": self.label,
            "page": self.page,
            "chosen_by": self.chosen_by,
        }


def _stem(token: str) -> str:
    """A light plural strip so "keepers" matches "keeper" (both sides alike)."""
    return token[:-1] if len(token) > 3 and token.endswith("s") and token[-2] != "s" else token


@functools.lru_cache(maxsize=16384)
def _stems(text: str) -> tuple[str, ...]:
    """``text``'s tokens, stemmed: a hit's candidate sentences recur across queries (issue 40:
    tokenising them again was a quarter of a ``/search``), so they are kept (about 1 KB each)."""
    return tuple(_stem(t) for t in tokenize(text))


def lexical_scores(question: str, texts: Sequence[str]) -> list[float]:
    """Okapi BM25 of ``question`` against each of ``texts``, the statistics (IDF, mean length)
    taken from ``texts`` themselves: the few dozen candidates of one answer."""
    docs = [_stems(x) for x in texts]
    if not docs:
        return []
    n = len(docs)
    avg = sum(len(d) for d in docs) / n or 1.0
    df: dict[str, int] = {}
    for d in docs:
        for t in set(d):
            df[t] = df.get(t, 0) + 1
    terms = set(_stem(t) for t in tokenize(question))
    out: list[float] = []
    for d in docs:
        tf: dict[str, int] = {}
        for t in d:
            tf[t] = tf.get(t, 0) + 1
        score = 0.0
        for t in terms:
            f = tf.get(t, 0)
            if f:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                score += (
                    idf * f * (BM25_K1 + 1) / (f + BM25_K1 * (1 - BM25_B + BM25_B * len(d) / avg))
                )
        out.append(score)
    return out


def dense_scorer(embedder: Any) -> SpanScorer:
    """Cosine of the question and each candidate, both through the query encoder already
    loaded (``embedder.encode_query`` is cached, so the question is not embedded again); the
    candidates are passages, so they get the model's document prompt (``encode_snippets``)."""

    def score(question: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        q = np.asarray(embedder.encode_query(question), dtype=np.float32)
        vecs = np.asarray(embedder.encode_snippets(list(texts)), dtype=np.float32)
        return [float(x) for x in vecs @ q]

    return score


def _minmax(xs: Sequence[float]) -> list[float]:
    lo, hi = min(xs, default=0.0), max(xs, default=0.0)
    return [(x - lo) / (hi - lo) if hi > lo else 0.0 for x in xs]


def mix_scorer(embedder: Any) -> SpanScorer:
    """Mean of the min-max scaled lexical and dense scores."""
    dense = dense_scorer(embedder)

    def score(question: str, texts: Sequence[str]) -> list[float]:
        lex, den = _minmax(lexical_scores(question, texts)), _minmax(dense(question, texts))
        return [(a + b) / 2 for a, b in zip(lex, den, strict=True)]

    return score


def span_scorer(name: str, embedder: Any = None) -> SpanScorer:
    """The scorer called ``name`` (one of :data:`SPAN_SCORINGS`)."""
    if name == "lexical":
        return lexical_scores
    if name not in SPAN_SCORINGS:
        raise ValueError(f"span scoring must be one of {', '.join(SPAN_SCORINGS)}, not {name!r}")
    if embedder is None:
        raise ValueError(f"span scoring {name!r} needs the query encoder")
    return dense_scorer(embedder) if name == "dense" else mix_scorer(embedder)


SPAN_WINDOW = 1
"""Consecutive candidates a span covers (the best-scoring run of this many; 1 = one sentence,
row or cue). 2 held the needle more often on course-dev/pdf-dev but is ~1.8x as long, most of a
chunk (docs/measurements.md); a pinpoint that is most of its chunk points at nothing."""


def choose_spans(
    question: str,
    chunks: Sequence[tuple[int, int, str, list[tuple[int, int]]]],
    scorer: SpanScorer = lexical_scores,
    window: int = SPAN_WINDOW,
) -> list[tuple[int, int]]:
    """For each chunk ``(start, end, content, candidates)`` the best-scoring run of ``window``
    consecutive candidates (summed scores; ties: the earliest), extended by the next one while
    shorter than :data:`MIN_SPAN_CHARS`; the whole chunk when it has no candidates. All
    candidates are scored in one call."""
    if window < 1:
        raise ValueError(f"span window must be >= 1, got {window}")
    flat = [(i, a, b) for i, (_, _, _, units) in enumerate(chunks) for a, b in units]
    texts = [chunks[i][2][a - chunks[i][0] : b - chunks[i][0]] for i, a, b in flat]
    scores = list(scorer(question, texts)) if texts else []
    by_chunk: list[list[float]] = [[] for _ in chunks]
    for (k, _, _), score in zip(flat, scores, strict=True):
        by_chunk[k].append(score)
    out: list[tuple[int, int]] = []
    for i, (start, end, _, units) in enumerate(chunks):
        sc = by_chunk[i]
        if not sc:
            out.append((start, end))
            continue
        runs = [(sum(sc[i : i + window]), -i) for i in range(len(units))]
        u0 = -max(runs)[1]
        u = min(len(units), u0 + window) - 1
        a, b = units[u0][0], units[u][1]
        while b - a < MIN_SPAN_CHARS and u + 1 < len(units):
            u += 1
            b = units[u][1]
        out.append((a, b))
    return out


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
    span: Span | None = None  # the sentence(s) / row(s) / cue(s) that answer, inside the chunk
    section: str = ""
    chunk_id: str = ""
    line: int | None = None  # 1-based line of the span's start, when the text is the file's

    def to_dict(self) -> dict[str, Any]:
        """Serialise with ``start``/``end`` as ``from``/``to`` (the project's wire names)."""
        return {
            "index": self.index,
            "chunk_id": self.chunk_id,
            "document_id": self.document_id,
            "document_name": self.document_name,
            "section": self.section,
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
            "span": self.span.to_dict() if self.span else None,
            "line": self.line,  # issue 31: what `path:LINE` opens (None: not a line-based file)
        }


LINE_KINDS = ("markdown", "rst", "text")
"""Document kinds whose canonical text is the file's own text (decoded, newlines as LF): a line
of it is a line of the file, so a citation can say ``path:LINE``."""


def line_of(kind: str, canonical: str, offset: int, locators: Sequence[Locator] = ()) -> int | None:
    """1-based line of the file at canonical ``offset`` in a document of ``kind`` (None: not
    line-based); a ``body`` locator says on which line the text starts (front matter above)."""
    if kind not in LINE_KINDS:
        return None
    first = next((loc.row for loc in locators if loc.kind == "body" and loc.row), 1)
    return canonical.count("\n", 0, offset) + first


@dataclass
class Context:
    """What a generator needs: the prompt and the citations it may refer to."""

    question: str
    prompt: str  # "" when no_answer
    citations: list[Citation] = field(default_factory=list)
    no_answer: bool = False
    threshold: float = DEFAULT_DISTANCE_CUT
    refused_by: str | None = None  # "distance" | "judge" | "verification" when no_answer
    judge: dict[str, Any] | None = None  # the answer check's verdict, when it ran
    # issue 31: how close it came. The smallest cosine distance among the candidates the gate
    # judged (None: nothing was retrieved), and, when asked for (show_nearest), the closest of
    # them that did not pass: shown below the bar, never numbered, never in the prompt
    nearest_distance: float | None = None
    nearest: list[Citation] = field(default_factory=list)

    @property
    def near_miss(self) -> bool:
        """Refused by the distance gate with the nearest source less than
        :data:`NEAR_MISS_MARGIN` above the cut."""
        return (
            self.no_answer
            and self.refused_by == "distance"
            and self.nearest_distance is not None
            and self.nearest_distance - self.threshold < NEAR_MISS_MARGIN
        )

    @property
    def closeness(self) -> str:
        """How close a refusal came, in one line ("" when answered): the nearest distance, the
        cut, and whether it is a near miss."""
        if not self.no_answer:
            return ""
        if self.nearest_distance is None:
            return f"nothing retrieved (cut {self.threshold:g})"
        d, cut = self.nearest_distance, self.threshold
        if self.refused_by in ("judge", "verification"):
            return f"nearest source at cosine distance {d:.3f} (under the cut {cut:g})"
        line = f"nearest source at cosine distance {d:.3f}, {d - cut:.3f} over the cut {cut:g}"
        if self.near_miss:
            line += f": a near miss (within {NEAR_MISS_MARGIN:g})"
        return line

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
        if self.refused_by == "verification":
            return VERIFY_REASON
        return f"nothing under cosine distance {self.threshold:g}"

    @property
    def message(self) -> str:
        """The refusal line when ``no_answer``, else ""."""
        if self.no_answer and self.refused_by == "judge":
            score = (self.judge or {}).get("score")
            cut = (self.judge or {}).get("cut")
            why = f" (judge P(yes) {score:.2f} < {cut:.2f})" if score is not None and cut else ""
            return f'NO ANSWER: {JUDGE_REASON} "{self.question}"{why}'
        if self.no_answer and self.refused_by == "verification":
            return f'NO ANSWER: {VERIFY_REASON} "{self.question}"'
        return no_answer_message(self.question, self.threshold) if self.no_answer else ""

    def refused_by_judge(self, verdict: dict[str, Any], show_nearest: bool = False) -> Context:
        """This context refused by the answer check: no sources, no prompt, the verdict kept
        (with ``show_nearest`` the sources the judge refused are what lies below its bar)."""
        below = [*self.citations, *self.nearest][:NEAREST_SHOWN] if show_nearest else []
        return Context(
            self.question,
            "",
            [],
            True,
            self.threshold,
            refused_by="judge",
            judge=verdict,
            nearest_distance=self.nearest_distance,
            nearest=below,
        )

    def refused_by_verification(self, show_nearest: bool = False) -> Context:
        """This context refused because no sentence of the written answer is supported by its
        sources (issue 50, ``RAG_ANSWER_VERIFY=refuse``): no sources, no prompt; with
        ``show_nearest`` the sources it had are listed below the bar, as a judge refusal's."""
        below = [*self.citations, *self.nearest][:NEAREST_SHOWN] if show_nearest else []
        return replace(
            self,
            prompt="",
            citations=[],
            no_answer=True,
            refused_by="verification",
            nearest=below,
        )

    def nearest_dicts(self) -> list[dict[str, Any]]:
        """:attr:`nearest` as JSON: each a citation without a number, marked ``below_the_bar``
        with how far over the cut it is (``over_cut``; negative for a judge refusal)."""
        out = []
        for c in self.nearest:
            d = c.to_dict()
            d.pop("index")
            over = None if c.cosine_distance is None else c.cosine_distance - self.threshold
            out.append({"below_the_bar": True, "over_cut": over, **d})
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["citations"] = [c.to_dict() for c in self.citations]
        d["nearest"] = self.nearest_dicts()
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
    span_scorer: SpanScorer | None = None,
    show_nearest: bool = False,
) -> Context:
    """Gate ``hits`` at ``threshold`` and build the prompt and numbered citations.

    ``canonical_text(document_id)`` returns the stored canonical text used to verify each quote
    (a mismatch raises :class:`StaleIndexError`). URLs use ``base_url`` when given, else the
    file URI of ``document_path(document_id)``. ``document_name`` defaults to the document id.
    ``document_locators(document_id)`` gives ``(kind, locator map)`` for per-format fragments.
    ``span_scorer`` picks each citation's :class:`Span` (default: :func:`lexical_scores`).
    When nothing passes the gate the context has ``no_answer=True``, no citations and an empty
    prompt; the caller must then not call a generator. Either way it carries the nearest
    distance among ``hits``; with ``show_nearest`` also the :data:`NEAREST_SHOWN` closest hits
    that did not pass (:attr:`Context.nearest`), cited but kept out of the prompt.
    """
    kept = gate(hits, threshold)
    dists = [h.cosine_distance for h in hits if h.cosine_distance is not None]
    nearest_distance = min(dists) if dists else None

    def cite(chosen: Sequence[Hit]) -> list[Citation]:
        return cite_hits(
            question,
            chosen,
            canonical_text=canonical_text,
            base_url=base_url,
            document_path=document_path,
            document_name=document_name,
            document_locators=document_locators,
            span_scorer=span_scorer,
        )

    below: list[Citation] = []
    if show_nearest:
        over = [h for h in hits if h.cosine_distance is not None and h.cosine_distance >= threshold]
        over.sort(key=lambda h: (h.cosine_distance or 0.0, h.rank))
        if over:
            below = cite(over[:NEAREST_SHOWN])
    if not kept:
        return Context(
            question,
            "",
            [],
            no_answer=True,
            threshold=threshold,
            refused_by="distance",
            nearest_distance=nearest_distance,
            nearest=below,
        )
    citations = cite(kept)
    prompt = f"{PROMPT_INSTRUCTION}\n\n{render_user_message(question, citations)}"
    return Context(
        question,
        prompt,
        citations,
        no_answer=False,
        threshold=threshold,
        nearest_distance=nearest_distance,
        nearest=below,
    )


def cite_hits(
    question: str,
    hits: Sequence[Hit],
    *,
    canonical_text: Callable[[str], str],
    base_url: str | None = None,
    document_path: Callable[[str], str] | None = None,
    document_name: Callable[[str], str] | None = None,
    document_locators: Callable[[str], tuple[str, list[Locator]]] | None = None,
    span_scorer: SpanScorer | None = None,
    numbers: Sequence[int] | None = None,
    span_window: int = SPAN_WINDOW,
) -> list[Citation]:
    """One :class:`Citation` per hit (no gate), numbered 1.. or by ``numbers`` (a search's
    ranks), each quote verified and each with its :class:`Span` chosen among all ``hits``'
    candidates by ``span_scorer``. The shape ``ask`` and ``search`` share."""
    if base_url is None and document_path is None:
        raise ValueError("build_context needs base_url or document_path to link citations")
    texts: dict[str, str] = {}
    maps: dict[str, tuple[str, list[Locator]]] = {}
    for hit in hits:
        if hit.document_id not in texts:
            texts[hit.document_id] = canonical_text(hit.document_id)
            maps[hit.document_id] = (
                document_locators(hit.document_id) if document_locators is not None else ("", [])
            )
        verify_quote(hit, texts[hit.document_id])
    units = [
        (h.start, h.end, h.content, span_units(*maps[h.document_id], h.start, h.end, h.content))
        for h in hits
    ]
    spans = choose_spans(question, units, span_scorer or lexical_scores, span_window)
    citations: list[Citation] = []
    for n, hit, (a, b) in zip(numbers or range(1, len(hits) + 1), hits, spans, strict=True):
        kind, locs = maps[hit.document_id]
        where = locate(kind, locs, hit.start, hit.end, hit.content) if kind else Location()
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
        line = line_of(kind, texts[hit.document_id], a, locs)
        url = document_url(link_id, base_url, path, line)
        if base_url or not carries_line(path, line):  # a Git link carries its line (issue 41)
            url += fragment
        citations.append(
            Citation(
                index=n,
                document_id=hit.document_id,
                document_name=(
                    document_name(hit.document_id) if document_name else hit.document_id
                ),
                locator_label=label,
                fragment=fragment,
                url=url,
                quote=hit.content,
                start=hit.start,
                end=hit.end,
                page=hit.page,
                cosine_distance=hit.cosine_distance,
                rerank_score=hit.rerank_score,
                ocr=where.ocr,
                ocr_confidence=where.ocr_confidence,
                span=_span(
                    kind, locs, texts[hit.document_id], a, b, hit.page, hit.start, hit.content
                ),
                section=hit.section,
                chunk_id=hit.chunk_id,
                line=line,
            )
        )
    return citations


def _span(
    kind: str,
    locs: list[Locator],
    canonical: str,
    a: int,
    b: int,
    chunk_page: int | None,
    chunk_start: int,
    content: str,
    chosen_by: str = "question",
) -> Span:
    """The :class:`Span` of canonical ``[a, b)`` inside a chunk (its page counted from the
    chunk's first page by the form feeds before ``a``)."""
    text = canonical[a:b]
    page = None if chunk_page is None else chunk_page + content[: a - chunk_start].count("\f")
    at = span_location(kind, locs, a, b, text, page)
    return Span(a, b, text, at.fragment or "", at.label or "", page, chosen_by)


_CLAIM_END = re.compile(r"(?<=[.!?])\s+(?!\[)|\n+")
_CLAIM_MARKER = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]")


def answer_claims(answer_text: str, sources: Sequence[int] = ()) -> dict[int, str]:
    """Source number → the answer's sentences (markers removed) that cite it, joined.

    A sentence is cut at ``. ``/``! ``/``? `` or a line break; a marker right after a sentence
    end (``… end. [2]``) belongs to that sentence. Expects markers as
    :func:`~rag_assets.lib.query.generate.map_markers` leaves them (``[1]``, ``[1, 2]``). An
    answer with no marker at all (small models often cite nothing) is claimed whole for every
    one of ``sources``: it was written from them, which one is unknown."""
    claims: dict[int, list[str]] = {}
    marked = False
    for sentence in _CLAIM_END.split(answer_text):
        numbers = [int(n) for m in _CLAIM_MARKER.finditer(sentence) for n in m.group(1).split(",")]
        marked = marked or bool(numbers)
        words = " ".join(_CLAIM_MARKER.sub(" ", sentence).split())
        for n in dict.fromkeys(numbers):
            if words:
                claims.setdefault(n, []).append(words)
    whole = " ".join(answer_text.split())
    if not marked and whole:
        return {n: whole for n in sources}
    return {n: " ".join(ws) for n, ws in claims.items()}


def ground_spans(
    question: str,
    citations: Sequence[Citation],
    answer_text: str,
    *,
    canonical_text: Callable[[str], str],
    document_locators: Callable[[str], tuple[str, list[Locator]]] | None = None,
    scorer: SpanScorer = lexical_scores,
    window: int = SPAN_WINDOW,
) -> list[Citation]:
    """``citations`` with the span of every chunk the answer cites chosen again, by the
    question followed by the answer's sentences citing it (:func:`answer_claims`), among the
    candidates of all ``citations`` (their statistics, as :func:`cite_hits` scores them).
    Uncited citations keep the question's span (an answer citing nothing is claimed for all).
    Spans stay inside their chunks, and ``span.text == canonical[from:to]`` holds as before;
    ``span.chosen_by`` says "answer"."""
    claims = answer_claims(answer_text, [c.index for c in citations])
    if not any(c.index in claims for c in citations):
        return list(citations)
    maps = {
        c.document_id: (document_locators(c.document_id) if document_locators else ("", []))
        for c in citations
    }
    units = [
        (c.start, c.end, c.quote, span_units(*maps[c.document_id], c.start, c.end, c.quote))
        for c in citations
    ]
    out: list[Citation] = []
    for i, c in enumerate(citations):
        claim = claims.get(c.index)
        if not claim:
            out.append(c)
            continue
        a, b = choose_spans(f"{question} {claim}", units, scorer, window)[i]
        kind, locs = maps[c.document_id]
        canonical = canonical_text(c.document_id)
        span = _span(kind, locs, canonical, a, b, c.page, c.start, c.quote, "answer")
        line = None if c.line is None else line_of(kind, canonical, a, locs)  # line-based kinds
        out.append(replace(c, span=span, line=line))
    return out


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


def document_url(
    document_id: str, base_url: str | None, path: str | None, line: int | None = None
) -> str:
    """``base_url`` + percent-quoted ``document_id`` when configured, else ``Path(path).as_uri()``.

    ``document_id`` is a POSIX relative path, so ``/`` is kept unquoted. ``path`` is made
    absolute first (relative paths resolve against the working directory). A document from a
    source (issue 41) has a URL as its path (an object's, a page's, a Git file's at its
    commit): it is the link, its ``{line}`` placeholder filled with ``line`` (else 1); one no
    web address opens (:data:`VIEW`, issue 49) is its text and ``:LINE``.
    """
    if base_url:
        return base_url.rstrip("/") + "/" + url_quote(document_id, safe="/")
    if not path:
        raise ValueError(f"no base_url and no path for document {document_id!r}")
    if path.startswith(VIEW):  # no web address (issue 49): path@commit:LINE, s3://bucket/key
        return path[len(VIEW) :] + (f":{line}" if line is not None else "")
    if "://" in path and not path.startswith("file://"):
        return path.replace("{line}", str(line or 1))
    return _file_uri(path, os.getcwd())


def carries_line(path: str | None, line: int | None) -> bool:
    """Whether a source document's link says its line itself (a Git host's ``#L{line}``, a
    :data:`VIEW` text's ``:LINE``): then no ``#char=`` fragment follows it."""
    if not path:
        return False
    return "{line}" in path or (path.startswith(VIEW) and line is not None)


@functools.lru_cache(maxsize=4096)
def _file_uri(path: str, cwd: str) -> str:
    """``path`` resolved (against ``cwd``) as a ``file://`` URI; kept, as resolving stats every
    component (issue 40: a fifth of a ``/search``'s citing, 20 hits each)."""
    p = Path(path)
    return (p if p.is_absolute() else Path(cwd) / p).resolve().as_uri()


def no_answer_message(question: str, cut: float) -> str:
    """The refusal line: ``NO ANSWER: nothing under cosine distance 0.675 for "…"``."""
    return f'NO ANSWER: nothing under cosine distance {cut:g} for "{question}"'
