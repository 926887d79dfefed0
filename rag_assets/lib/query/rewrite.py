"""Query rewriting (query2doc / HyDE style): the model writes documentation-style text for a
question, which is searched *beside* the original question, never instead of it.

Measured before this module (issue 15): searching the rewrite alone lost recall, and fusing it
with the original at equal weight lost rank on more questions than it gained. So the design is:

- the model writes a short passage as the documentation would phrase the answer (HyDE, Gao et
  al. 2022; query2doc, Wang et al. 2023), not a "search query";
- retrieval runs the original question on both sides (dense, BM25) as today, plus the passage
  on both sides; the four rankings are fused by weighted RRF with the original's rankings at
  weight 1 and the passage's at :data:`REWRITE_WEIGHT` (< 1: the original keeps the upper hand);
- the refusal gate still measures the cosine distance of the *original question* to each hit,
  so a fluent invented passage cannot make an out-of-domain question pass.

Rewrites are cached per question (the request, model included, is the cache key) through
:class:`~rag_assets.lib.models.llm_cache.CachedClient`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rag_assets.lib.models.llm import LLMClient
from rag_assets.lib.models.llm_cache import CachedClient
from rag_assets.lib.query.fusion import RRF_K, rrf

PROMPT_VERSION = "q2d-1"

SYSTEM_PROMPT = (
    "You are the documentation of a software library. Answer as the documentation would: "
    "two or three plain sentences in its technical terms, no code, no preamble."
)
"""The passage is written in the documentation's vocabulary (the gap is vocabulary: users
describe symptoms, documents name mechanisms)."""

USER_TEMPLATE = "Question: {question}\n\nThe documentation passage that answers it:"

MAX_TOKENS = 96
"""Two or three sentences; longer passages drift from the question (and cost ~linear time)."""

REWRITE_WEIGHT = 0.5
"""RRF weight of the passage's rankings against 1.0 for the original question's."""

MAX_QUESTION_CHARS = 1000
"""Longer questions are cut before prompting."""


@dataclass
class Rewrite:
    question: str
    text: str  # the model's passage ("" when the model returned nothing usable)
    seconds: float  # wall time of this call (≈ 0 when answered from the cache)
    cached: bool


class QueryRewriter:
    """Turns a question into a documentation-style passage; cached per question on disk."""

    def __init__(self, client: LLMClient, cache_dir: str | Path | None = None):
        self.client = client
        self.cached = CachedClient(client, Path(cache_dir) if cache_dir else None)

    @property
    def label(self) -> str:
        return f"{PROMPT_VERSION}:{self.client.model or 'server-default'}:w{REWRITE_WEIGHT:g}"

    def rewrite(self, question: str) -> Rewrite:
        before = self.cached.hits
        t = time.perf_counter()
        reply = self.cached.chat(
            [
                {"role": "system", "content": SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": USER_TEMPLATE.format(question=question[:MAX_QUESTION_CHARS]),
                },
            ],
            max_tokens=MAX_TOKENS,
            seed=0,
        )
        text = " ".join(reply.text.split())
        return Rewrite(question, text, time.perf_counter() - t, self.cached.hits > before)


def load_rewriter(
    mode: str, url: str, model: str, api_key: str, cache_dir: str | Path | None
) -> QueryRewriter | None:
    """``RAG_QUERY_REWRITE`` → a rewriter (``llm``) or None (unset); the model's name is
    ``RAG_LLM_MODEL``, else asked of the server once (it is part of every cache key)."""
    from rag_assets.lib.index.expand import model_label
    from rag_assets.lib.models.llm import LLMError

    mode = (mode or "").strip().lower()
    if not mode:
        return None
    if mode != "llm":
        raise ValueError(f"RAG_QUERY_REWRITE={mode!r}: use llm (or leave it unset)")
    if not url:
        raise ValueError("RAG_QUERY_REWRITE=llm needs RAG_LLM_URL")
    try:
        name = model or model_label(LLMClient(url, None, api_key or None, timeout=30.0))
    except LLMError as e:
        raise ValueError(f"RAG_QUERY_REWRITE=llm: {e}; set RAG_LLM_MODEL") from None
    return QueryRewriter(LLMClient(url, name, api_key or None, timeout=300.0), cache_dir)


def fuse_with_rewrite(
    original: Sequence[Sequence[str]],
    rewritten: Sequence[Sequence[str]],
    weight: float | Sequence[float] = REWRITE_WEIGHT,
    k: int = RRF_K,
    side_weights: Sequence[float] | None = None,
) -> list[tuple[str, float]]:
    """Weighted RRF of the original question's rankings (``side_weights``, default 1 each) and
    the rewrite's (the same side weights times ``weight``, one factor or one per side, e.g.
    ``(0.5, 0)`` for the dense side only); a zero weight drops a ranking.
    Ties as in :func:`~rag_assets.lib.query.fusion.rrf` (best rank, then id)."""
    sides = list(side_weights) if side_weights is not None else [1.0] * len(original)
    if len(sides) != len(original) or len(rewritten) != len(original):
        raise ValueError("fuse_with_rewrite: one weight per side, as many rewritten as original")
    pairs = [(r, w) for r, w in zip(original, sides, strict=True) if w > 0]
    factors = [float(weight)] * len(sides) if isinstance(weight, int | float) else list(weight)
    if len(factors) != len(sides):
        raise ValueError("fuse_with_rewrite: one rewrite weight, or one per side")
    pairs += [(r, w * f) for r, w, f in zip(rewritten, sides, factors, strict=True) if w * f > 0]
    return rrf([r for r, _ in pairs], k=k, weights=[w for _, w in pairs])
