"""Reranking by a ``/rerank`` server (issue 35): text-embeddings-inference, Cohere, Jina, Voyage,
vLLM, Infinity and llama.cpp's ``llama-server --reranking`` all speak it.

``RAG_RERANK_URL`` is the server's base URL (``/rerank`` is appended unless the URL ends with it:
``http://127.0.0.1:8081``, ``https://api.cohere.com/v2/rerank``, ``https://api.jina.ai/v1``);
``RAG_RERANK_MODEL``, when set, is sent as the model to use, ``RAG_RERANK_API_KEY`` as a bearer
token (never printed). The hybrid top ``RAG_RERANK_DEPTH`` is sent in one request.

Request: ``{"query", "documents": [...], "top_n", "return_documents": false}`` (Cohere, Jina,
llama.cpp, vLLM); a server that answers 400/422 asking for ``texts`` (text-embeddings-inference)
gets ``{"query", "texts": [...], "return_text": false}`` from then on. Response: a list of
``{"index", "score"}`` (TEI) or ``{"results": [{"index", "relevance_score"}]}`` (the others).
Scores are the server's (TEI: a sigmoid unless started with raw scores; Cohere/Jina: relevance
in [0, 1]) and are recorded as each hit's ``rerank_score``, as the local cross-encoder's logits
are.

**Never fails a query.** A reranker that errors, answers malformed JSON or takes longer than
``RAG_RERANK_TIMEOUT`` seconds in all (one retry on 429/5xx when the time allows) leaves the
hybrid order: :meth:`HttpReranker.rerank` returns the items unscored, the hits say
``retriever: hybrid`` with no ``rerank_score``, the request's note says why
(:meth:`HttpReranker.take_note`: ``/search``'s ``X-RAG-Note`` header, ``/ask``'s ``notes``, the
CLI's stderr) and :attr:`HttpReranker.fallbacks` counts it (``/healthz``: ``rerank``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rag_assets.lib.models.http import HttpError, JsonEndpoint, RetryLog, redact, with_retries

T = TypeVar("T")

SETTING_URL = "RAG_RERANK_URL"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_RETRIES = 1
"""Retries of a 429/5xx/dropped connection within the timeout: a query waits for the reranker at
most ``RAG_RERANK_TIMEOUT`` seconds in all, whatever happens."""


class RerankUnavailable(RuntimeError):
    """The rerank server could not score this request (the query keeps the hybrid order)."""


def rerank_endpoint(url: str) -> str:
    """``RAG_RERANK_URL`` with ``/rerank`` appended unless it already ends with it."""
    base = url.strip().rstrip("/")
    return base if base.endswith("/rerank") else base + "/rerank"


class HttpReranker:
    """Scores (query, passage) pairs at a ``/rerank`` server, with the interface of
    :class:`~rag_assets.lib.query.rerank.Reranker` (``score``, ``rerank``, ``model_name``), so
    every place that takes the cross-encoder takes it too (``depth``: ``RAG_RERANK_DEPTH``).
    Not a subclass: :func:`~rag_assets.lib.query.rerank.load_reranker` imports this module."""

    def __init__(
        self,
        url: str,
        model: str = "",
        api_key: str = "",
        depth: int = 25,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        if depth < 1:
            raise ValueError(f"rerank: RAG_RERANK_DEPTH must be >= 1, got {depth}")
        if timeout <= 0:
            raise ValueError(f"RAG_RERANK_TIMEOUT={timeout} must be positive")
        self.api = JsonEndpoint(rerank_endpoint(url), SETTING_URL, api_key or None, timeout)
        self.url = redact(url)
        self.model = model.strip()
        self.depth = depth
        self.timeout = timeout
        self.retries = retries
        self.batch_size = depth
        self.threads = None
        self.model_name = f"{SETTING_URL}={self.url}" + (f" ({self.model})" if self.model else "")
        self.log = RetryLog()
        self.requests = 0
        self.fallbacks = 0
        self.last_note: str | None = None
        self._shape = "documents"
        self._lock = threading.Lock()
        self._local = threading.local()

    # -- scoring ----------------------------------------------------------------------------
    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One score per passage, in the order given; :class:`RerankUnavailable` (one line,
        credentials scrubbed) when the server cannot give them within the timeout."""
        if not passages:
            return []
        deadline = time.monotonic() + self.timeout
        try:
            data = with_retries(
                lambda: self._post(query, passages, deadline),
                retries=self.retries,
                deadline=deadline,
                log=self.log,
            )
        except HttpError as exc:
            raise RerankUnavailable(self.api.scrub(str(exc))) from None
        return self._scores(data, len(passages))

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        text_of: Callable[[T], str],
        top: int | None = None,
    ) -> list[tuple[T, float]]:
        """``items`` by score, descending (ties keep their order); when the server fails, the
        items in the order given with ``None`` scores (the hybrid order) and a note."""
        self._local.note = None
        try:
            scores = self.score(query, [text_of(item) for item in items])
        except Exception as exc:  # whatever happens at the server, the query goes on
            why = str(exc) if isinstance(exc, RerankUnavailable) else f"{type(exc).__name__}: {exc}"
            note = f"rerank skipped, hybrid order kept: {self.api.scrub(why)}"
            with self._lock:
                self.fallbacks += 1
                self.last_note = note
            self._local.note = note
            kept: list[tuple[T, Any]] = [(item, None) for item in items]
            return kept if top is None else kept[: max(0, top)]
        order = sorted(range(len(items)), key=lambda i: (-scores[i], i))
        ranked = [(items[i], scores[i]) for i in order]
        return ranked if top is None else ranked[: max(0, top)]

    def take_note(self) -> str | None:
        """The note of this thread's last :meth:`rerank` (None: it scored), then cleared."""
        note = getattr(self._local, "note", None)
        self._local.note = None
        return note

    def status(self) -> dict[str, Any]:
        """For ``/healthz``: the server, the requests sent and the fallbacks to hybrid order."""
        with self._lock:
            return {
                "url": self.url,
                "model": self.model or None,
                "depth": self.depth,
                "timeout_s": self.timeout,
                "requests": self.requests,
                "fallbacks": self.fallbacks,
                "retries": dict(self.log.retries),
                "last_note": self.last_note,
            }

    # -- internals --------------------------------------------------------------------------
    def _post(self, query: str, passages: Sequence[str], deadline: float) -> Any:
        late = f"{self.api.where} did not answer within RAG_RERANK_TIMEOUT={self.timeout:g} s"
        left = deadline - time.monotonic()
        if left <= 0:
            raise HttpError(late, "timeout")
        with self._lock:
            self.requests += 1
        try:
            return self.api.request("", self._body(query, passages), timeout=left)
        except HttpError as exc:
            if exc.kind == "timeout":
                raise HttpError(late, "timeout") from None
            other = "texts" if self._shape == "documents" else "documents"
            if exc.kind == "http" and exc.status in (400, 422) and other in exc.body:
                self._shape = other  # text-embeddings-inference asks for "texts"
                return self.api.request("", self._body(query, passages), timeout=left)
            raise

    def _body(self, query: str, passages: Sequence[str]) -> dict[str, Any]:
        body: dict[str, Any] = {"query": query}
        if self._shape == "texts":
            body.update(texts=list(passages), return_text=False)
        else:
            body.update(documents=list(passages), top_n=len(passages), return_documents=False)
        if self.model:
            body["model"] = self.model
        return body

    def _scores(self, data: Any, n: int) -> list[float]:
        rows = data.get("results") if isinstance(data, dict) else data
        scores: dict[int, float] = {}
        try:
            if not isinstance(rows, list):
                raise TypeError("no list of results")
            for r in rows:
                value = r["relevance_score"] if "relevance_score" in r else r["score"]
                scores[int(r["index"])] = float(value)
        except (KeyError, TypeError, ValueError) as exc:
            raise RerankUnavailable(
                f"{self.api.where} is not a /rerank server: no results[].index with "
                "relevance_score or score in its reply"
            ) from exc
        if sorted(scores) != list(range(n)) or len(rows) != n:
            outside = sorted(i for i in scores if not 0 <= i < n)
            missing = sorted(set(range(n)) - set(scores))
            raise RerankUnavailable(
                f"{self.api.where} scored {len(rows)} results for {n} passages (indices must be "
                f"0..{n - 1}, each once; out of range: {outside[:5]}, missing: {missing[:5]})"
            )
        bad = [i for i in range(n) if not math.isfinite(scores[i])]
        if bad:  # issue 43: NaN/Infinity cannot rank, and is not JSON an answer may carry
            raise RerankUnavailable(
                f"{self.api.where} gave a non-finite score ({scores[bad[0]]}) for passage "
                f"{bad[0]} (and {len(bad) - 1} more)"
            )
        return [scores[i] for i in range(n)]


def take_note(reranker: Any) -> str | None:
    """The note of this thread's last rerank by ``reranker`` (None for the local ones)."""
    take = getattr(reranker, "take_note", None)
    return take() if take is not None else None
