"""The query side: ``Index.open(uri).search(q)`` / ``.ask(q)``.

Retrievers: ``dense`` (LanceDB cosine search), ``bm25`` (persisted lexical index), ``hybrid``
(reciprocal rank fusion of the two), ``rerank`` (a cross-encoder over the hybrid top 25).
Every hit carries its cosine distance (computed from the stored vector for BM25-only hits)
so the refusal gate can say no before any generator is called.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_assets.lib.cite import DEFAULT_DISTANCE_CUT, Context, build_context
from rag_assets.lib.embed import Embedder, resolve_model
from rag_assets.lib.fusion import rrf
from rag_assets.lib.lexical import BM25Index
from rag_assets.lib.rerank import Reranker, load_reranker
from rag_assets.lib.store import IndexStore, Published, StampMismatch, bm25_dir, scan, vectors
from rag_assets.lib.types import Hit

RETRIEVERS = ("dense", "bm25", "hybrid", "rerank")
RERANK_DEPTH = 25  # shortlist the cross-encoder scores (the design's affordable depth)
CANDIDATE_DEPTH = 50  # per-retriever depth fed into fusion
_ROW_COLUMNS = [
    "chunk_id",
    "document_id",
    "document_title",
    "section",
    "from",
    "to",
    "page",
    "content",
    "text",
    "model",
    "model_revision",
    "dims",
    "pipeline_version",
    "extractor_version",
]


@dataclass
class Timings:
    """Per-stage wall time of the last query, in milliseconds."""

    stages: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + (now - since) * 1000
        return now


class Index:
    """A published (or explicitly chosen) table version, ready to query."""

    def __init__(
        self,
        store: IndexStore,
        published: Published,
        embedder: Embedder,
        reranker: Reranker | None = None,
        distance_cut: float | None = None,
    ):
        self.store = store
        self.published = published
        self.embedder = embedder
        self.reranker = reranker
        self.distance_cut = (
            distance_cut
            if distance_cut is not None
            else (published.threshold if published.threshold is not None else DEFAULT_DISTANCE_CUT)
        )
        self.table = store.open_table(published.table, published.version)
        stamps = published.stamps
        query_stamps = embedder.stamps(stamps.pipeline, stamps.extractor)
        diff = [d for d in stamps.differences(query_stamps) if not d.startswith("normalized")]
        if diff:
            raise StampMismatch(
                f"index table {published.table} was embedded with {stamps.model} "
                f"(rev {stamps.revision}, {stamps.dims} dims) but queries would be embedded with "
                f"{query_stamps.model} (rev {query_stamps.revision}, {query_stamps.dims} dims): "
                f"{'; '.join(diff)}. Set RAG_EMBEDDING_MODEL to the table's model or re-index."
            )
        self.bm25 = BM25Index.load(
            bm25_dir(store.uri, published.table, published.version),
            expect_stamps={
                **stamps.as_dict(),
                "table": published.table,
                "version": published.version,
            },
        )
        rows = scan(self.table, [*_ROW_COLUMNS, "vector"])
        self._rows = {r["chunk_id"]: r for r in rows.select(_ROW_COLUMNS).to_pylist()}
        self._vector_of = {cid: i for i, cid in enumerate(rows["chunk_id"].to_pylist())}
        self._vectors = vectors(rows["vector"], stamps.dims)
        self._docs = store.canonical_texts(published.documents_version)
        self.timings = Timings()

    @classmethod
    def open(
        cls,
        uri: str | Path | None = None,
        *,
        model: str | None = None,
        rerank_model: str | None = None,
        distance_cut: float | None = None,
        embedder: Embedder | None = None,
        reranker: Reranker | None = None,
    ) -> Index:
        """Open the published table version of an index directory.

        ``model`` / ``rerank_model`` / ``distance_cut`` default to ``RAG_EMBEDDING_MODEL``,
        ``RAG_RERANK_MODEL`` and ``RAG_DISTANCE_CUT`` (else the calibrated cut, else 0.675).
        """
        uri = uri or os.environ.get("RAG_INDEX_URI", "data/index")
        store = IndexStore(uri)
        published = store.published()
        if published is None:
            raise FileNotFoundError(
                f"nothing is published in {uri}: run `rag-assets index` (or materialise the "
                "graph) first"
            )
        if embedder is None:
            embedder = Embedder(resolve_model(model or os.environ.get("RAG_EMBEDDING_MODEL")))
        if reranker is None:
            reranker = load_reranker(rerank_model or os.environ.get("RAG_RERANK_MODEL"))
        if distance_cut is None and os.environ.get("RAG_DISTANCE_CUT"):
            distance_cut = float(os.environ["RAG_DISTANCE_CUT"])
        return cls(store, published, embedder, reranker, distance_cut)

    # -- retrieval ------------------------------------------------------------------------
    def search(self, query: str, retriever: str = "hybrid", k: int = 20) -> list[Hit]:
        """Ranked hits of one retriever, each with its cosine distance to the query."""
        if retriever not in RETRIEVERS:
            raise ValueError(f"retriever must be one of {RETRIEVERS}, not {retriever!r}")
        if retriever == "rerank" and self.reranker is None:
            raise RuntimeError("rerank: no model configured (set RAG_RERANK_MODEL)")
        self.timings = Timings()
        t = time.perf_counter()
        qvec = self.embedder.encode_query(query)
        t = self.timings.add("embed", t)
        depth = max(k, CANDIDATE_DEPTH) if retriever in ("hybrid", "rerank") else k
        dense: list[tuple[str, float]] = []
        lexical: list[tuple[str, float]] = []
        if retriever != "bm25":
            dense = self._dense(qvec, depth)
            t = self.timings.add("dense", t)
        if retriever != "dense":
            lexical = self.bm25.search(query, depth)
            t = self.timings.add("bm25", t)
        if retriever == "dense":
            ranked = [(cid, 1.0 - d) for cid, d in dense]
        elif retriever == "bm25":
            ranked = lexical
        else:
            ranked = rrf([[c for c, _ in dense], [c for c, _ in lexical]], k=60)
            t = self.timings.add("fuse", t)
        if retriever == "rerank":
            assert self.reranker is not None
            short = ranked[:RERANK_DEPTH]
            scored = self.reranker.rerank(query, short, text_of=lambda x: self._rows[x[0]]["text"])
            t = self.timings.add("rerank", t)
            # the shortlist in cross-encoder order, then the rest of the fused list unchanged
            hits = [
                self._hit(cid, s, i + 1, retriever, qvec, rerank_score=s)
                for i, ((cid, _), s) in enumerate(scored)
            ]
            tail = ranked[len(short) : k]
            hits += [
                self._hit(cid, s, len(hits) + i + 1, retriever, qvec)
                for i, (cid, s) in enumerate(tail)
            ]
            return hits[:k]
        return [self._hit(cid, s, i + 1, retriever, qvec) for i, (cid, s) in enumerate(ranked[:k])]

    def ask(self, question: str, *, rerank: bool = True, base_url: str | None = None) -> Context:
        """Retrieve, gate by the distance cut, and build the cited context (no generation)."""
        retriever = "rerank" if (rerank and self.reranker is not None) else "hybrid"
        hits = self.search(question, retriever=retriever, k=RERANK_DEPTH)
        return build_context(
            question,
            hits,
            threshold=self.distance_cut,
            canonical_text=lambda d: self._docs[d]["text"],
            base_url=base_url or os.environ.get("RAG_BASE_URL") or None,
            document_path=lambda d: self._docs[d]["path"],
            document_name=lambda d: Path(d).name,
        )

    @property
    def documents(self) -> dict[str, dict[str, Any]]:
        """document_id → {text, title, path, kind, page_starts} of the indexed version."""
        return self._docs

    def chunk_contents(self) -> list[str]:
        return [r["content"] for r in self._rows.values()]

    # -- internals ------------------------------------------------------------------------
    def _dense(self, qvec: np.ndarray, k: int) -> list[tuple[str, float]]:
        res = (
            self.table.search(qvec, vector_column_name="vector")
            .distance_type("cosine")
            .select(["chunk_id", "_distance"])
            .limit(k)
            .to_arrow()
        )
        pairs = zip(res["chunk_id"].to_pylist(), res["_distance"].to_pylist(), strict=True)
        return sorted(((c, float(d)) for c, d in pairs), key=lambda x: (x[1], x[0]))

    def _hit(
        self,
        chunk_id: str,
        score: float,
        rank: int,
        retriever: str,
        qvec: np.ndarray,
        rerank_score: float | None = None,
    ) -> Hit:
        r = self._rows[chunk_id]
        vec = self._vectors[self._vector_of[chunk_id]]
        return Hit(
            chunk_id=chunk_id,
            document_id=r["document_id"],
            section=r["section"],
            start=int(r["from"]),
            end=int(r["to"]),
            content=r["content"],
            text=r["text"],
            page=r["page"],
            score=float(score),
            rank=rank,
            retriever=retriever,
            cosine_distance=float(1.0 - float(np.dot(qvec, vec))),
            rerank_score=rerank_score,
            stamps={
                "model": r["model"],
                "revision": r["model_revision"],
                "dims": r["dims"],
                "pipeline": r["pipeline_version"],
                "extractor": r["extractor_version"],
                "table": self.published.table,
                "version": self.published.version,
            },
            title=r["document_title"],
        )
