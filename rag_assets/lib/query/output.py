"""The one serializer for ``ask`` / ``search`` / ``status`` JSON.

``rag-assets ask --json`` / ``search --json`` and the HTTP service (``POST /ask``,
``GET /search``) print exactly these objects, so a client can switch between them. Each carries
the table version that answered it: ``ask`` under ``"published"``, every ``search`` hit in its
``stamps`` (``table``, ``version``).

One citation shape (issue 21): an ``ask`` citation and a ``search`` hit (with the index) carry
the same fields: ``document_id``/``document_name``, ``section``, the chunk's ``from``/``to``/
``fragment``/``locator_label``, ``url``, ``cosine_distance``, the ``quote`` once, and the
pinpoint ``span`` ``{from, to, text, fragment, label, page}`` inside the chunk.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rag_assets.lib.index.store import Published
    from rag_assets.lib.query.cite import Context
    from rag_assets.lib.query.generate import Answer
    from rag_assets.lib.query.retrieve import Index
    from rag_assets.lib.query.verify import Verification
    from rag_assets.lib.types import Hit


#: Issue 53: said beside every answer of an index whose refusal cut no question set checked (the
#: day-0 cut): it refuses questions about other topics, not every close question the documents
#: do not answer. What to do is said in the same line.
DAY0_NOTE = (
    "this index's refusal cut is not yet checked against questions close to its documents: a "
    "question near them that they do not answer may still get sources; a question set "
    "(RAG_EVAL_DIR) or reviewed answers (rag-assets review) check it"
)


def cut_note(published: Published) -> str:
    """:data:`DAY0_NOTE` for an index whose cut came from no question set (``unrelated-only``,
    ``default``), else ""."""
    return DAY0_NOTE if published.threshold_source in ("unrelated-only", "default") else ""


def answered_by(published: Published, index_version: int | None = None) -> dict[str, Any]:
    """The published version that answered: ``index_version`` (issue 51: the index's own count,
    the number people see), ``table``, ``lancedb_version`` (LanceDB's version of the table;
    ``version`` is the same, kept for the clients that read it) and ``documents_version``."""
    return {
        "index_version": index_version,
        "table": published.table,
        "lancedb_version": published.version,
        "version": published.version,
        "documents_version": published.documents_version,
    }


def ask_json(
    ctx: Context,
    answer: Answer | None,
    published: Published,
    notes: list[str] | None = None,
    verification: Verification | None = None,
    index_version: int | None = None,
) -> dict[str, Any]:
    """The object ``ask --json`` prints and ``POST /ask`` returns. ``notes``: what degraded
    while answering (issue 35: a /rerank server that failed, the hybrid order kept).
    ``verification``: the written answer's sentences checked against their sources (issue 50:
    ``sentences`` with their verdicts, None without a written answer or when it was refused;
    ``verification`` the counts and the policy)."""
    shown = verification.sentences if verification is not None and answer is not None else None
    return {
        "question": ctx.question,
        "no_answer": ctx.no_answer,
        "refused_by": ctx.refused_by,  # "distance" | "judge" | None (answered)
        "reason": ctx.reason,  # "" | "nothing under cosine distance ..." | "sources do not answer"
        "message": ctx.message,  # the NO ANSWER line naming the gate that refused, or ""
        "judge": ctx.judge,  # the answer check's verdict when RAG_ANSWER_CHECK=llm, else None
        "threshold": ctx.threshold,  # the cut in effect
        # issue 31: how close it came: the nearest candidate's distance (also when answered),
        # whether a distance refusal missed by less than NEAR_MISS_MARGIN, that in one line,
        # and (show_nearest) the closest sources below the bar: never numbered, never in the
        # prompt, never an answer
        "nearest_distance": ctx.nearest_distance,
        "near_miss": ctx.near_miss,
        "closeness": ctx.closeness,
        "nearest": ctx.nearest_dicts(),
        "citations": [c.to_dict() for c in ctx.citations],
        "prompt": ctx.prompt,
        "answer": answer.to_dict() if answer else None,
        "sentences": [v.to_dict() for v in shown] if shown is not None else None,
        "verification": verification.summary() if verification is not None else None,
        "published": answered_by(published, index_version),
        "notes": list(notes or []),
        "cut_note": cut_note(published),  # issue 53: "" once a question set checked the cut
    }


def search_json(
    hits: list[Hit],
    index: Index | None = None,
    query: str = "",
    base_url: str | None = None,
) -> list[dict[str, Any]]:
    """The list ``search --json`` prints and ``GET /search`` returns (hit stamps name the
    table version). With the ``index`` the hits were found in, each hit is cited as ``ask``
    cites (url, fragment, locator_label, span for ``query``; the quote once, no ``text``/
    ``content`` copies) plus its ``rank``, ``score`` and ``retriever``."""
    if index is None:
        return [h.to_dict() for h in hits]
    out = []
    for hit, cit in zip(hits, cite_search_hits(index, query, hits, base_url), strict=True):
        d = cit.to_dict()
        d.pop("index")
        out.append(
            {
                "rank": hit.rank,
                "score": hit.score,
                "retriever": hit.retriever,
                "title": hit.title,
                **d,
                "stamps": hit.stamps,
            }
        )
    return out


def cite_search_hits(
    index: Index, query: str, hits: list[Hit], base_url: str | None = None
) -> list[Any]:
    """:func:`~rag_assets.lib.query.cite.cite_hits` for a search's hits, as ``Index.ask``
    cites (its documents, links under ``base_url`` else file URIs, numbered by rank)."""
    from rag_assets.lib.query.cite import cite_hits
    from rag_assets.lib.types import locators_from_json

    docs = index.documents
    return cite_hits(
        query,
        hits,
        canonical_text=lambda d: docs[d]["text"],
        base_url=base_url,
        document_path=getattr(index, "link_path", None) or (lambda d: docs[d]["path"]),
        document_name=lambda d: d.rsplit("/", 1)[-1],
        document_locators=lambda d: (
            docs[d]["kind"],
            locators_from_json(docs[d].get("locators_json")),
        ),
        span_scorer=getattr(index, "span_scorer", None),
        numbers=[h.rank for h in hits],
    )


def dumps(obj: Any) -> str:
    """The CLI's text form of these objects (indented, non-ASCII kept)."""
    return json.dumps(obj, indent=2, ensure_ascii=False)
