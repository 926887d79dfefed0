"""What every route, MCP tool and command shares without the web framework (issue 40: `status`
and the parser import this, not :mod:`rag_assets.serve.service` or FastAPI): the bounds of
``k``, the error a bad request raises, and the query log's switches."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rag_assets.settings import Settings

MAX_K = 100
"""Largest ``k`` for ``/search``, the MCP ``search`` tool and ``rag-assets search -k`` (the
fusion depth is 50; 100 covers a dense-only page). The smallest is 1."""


class BadRequest(ValueError):
    """The request itself is wrong (HTTP 400)."""


def check_k(k: int) -> int:
    """``k`` when it is within 1..:data:`MAX_K`, else :class:`BadRequest` (one line, the bounds);
    the CLI, HTTP and MCP all refuse with this same line."""
    if not 1 <= k <= MAX_K:
        raise BadRequest(f"k={k} is out of range: use 1..{MAX_K}")
    return k


def log_enabled(settings: Settings) -> bool:
    """``RAG_QUERY_LOG``: on unless set off."""
    from rag_assets.settings import is_on

    return is_on("RAG_QUERY_LOG", settings.query_log, empty=True)


def redacting(settings: Settings) -> bool:
    """``RAG_QUERY_LOG_REDACT``: off unless set on."""
    from rag_assets.settings import is_on

    return is_on("RAG_QUERY_LOG_REDACT", settings.query_log_redact)
