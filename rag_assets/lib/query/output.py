"""The one serializer for ``ask`` / ``search`` / ``status`` JSON.

``rag-assets ask --json`` / ``search --json`` and the HTTP service (``POST /ask``,
``GET /search``) print exactly these objects, so a client can switch between them. Each carries
the table version that answered it: ``ask`` under ``"published"``, every ``search`` hit in its
``stamps`` (``table``, ``version``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rag_assets.lib.index.store import Published
    from rag_assets.lib.query.cite import Context
    from rag_assets.lib.query.generate import Answer
    from rag_assets.lib.types import Hit


def answered_by(published: Published) -> dict[str, Any]:
    """``{"table", "version", "documents_version"}``: the published version that answered."""
    return {
        "table": published.table,
        "version": published.version,
        "documents_version": published.documents_version,
    }


def ask_json(ctx: Context, answer: Answer | None, published: Published) -> dict[str, Any]:
    """The object ``ask --json`` prints and ``POST /ask`` returns."""
    return {
        "question": ctx.question,
        "no_answer": ctx.no_answer,
        "refused_by": ctx.refused_by,  # "distance" | "judge" | None (answered)
        "reason": ctx.reason,  # "" | "nothing under cosine distance ..." | "sources do not answer"
        "judge": ctx.judge,  # the answer check's verdict when RAG_ANSWER_CHECK=llm, else None
        "threshold": ctx.threshold,
        "citations": [c.to_dict() for c in ctx.citations],
        "prompt": ctx.prompt,
        "answer": answer.to_dict() if answer else None,
        "published": answered_by(published),
    }


def search_json(hits: list[Hit]) -> list[dict[str, Any]]:
    """The list ``search --json`` prints and ``GET /search`` returns (hit stamps name the
    table version)."""
    return [h.to_dict() for h in hits]


def dumps(obj: Any) -> str:
    """The CLI's text form of these objects (indented, non-ASCII kept)."""
    return json.dumps(obj, indent=2, ensure_ascii=False)
