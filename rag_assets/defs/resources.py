"""Thin Dagster resources over the Dagster-free core."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import dagster as dg

from rag_assets.lib.embed import Embedder, resolve_model
from rag_assets.lib.rerank import Reranker, load_reranker
from rag_assets.lib.store import IndexStore


class DocumentsFolder(dg.ConfigurableResource):
    """The source folder and where intermediate artefacts (Parquet) are kept."""

    path: str = "data/documents"
    work_dir: str = "data/work"

    @property
    def root(self) -> Path:
        return Path(self.path)


class EmbeddingModel(dg.ConfigurableResource):
    """The sentence-transformers encoder ("" = packaged all-MiniLM-L6-v2), loaded offline."""

    model: str = ""
    batch_size: int = 16
    threads: int = 0

    def embedder(self) -> Embedder:
        return _embedder(self.model, self.batch_size, self.threads)


class LanceIndex(dg.ConfigurableResource):
    """The LanceDB index directory (stamped tables, documents, BM25, published pointer)."""

    uri: str = "data/index"

    def store(self) -> IndexStore:
        return IndexStore(self.uri)


class RerankModel(dg.ConfigurableResource):
    """A local CrossEncoder directory; "" switches reranking off."""

    model: str = ""

    def reranker(self) -> Reranker | None:
        return _reranker(self.model)


class QuestionSet(dg.ConfigurableResource):
    """The evaluation questions (needle format) and the gates built on them."""

    path: str = "data/eval"
    recall_floor: float = 0.5
    max_bluff_rate: float = 0.10
    distance_cut: str = ""  # RAG_DISTANCE_CUT: overrides the calibrated cut when set


@lru_cache(maxsize=4)
def _embedder(model: str, batch_size: int, threads: int) -> Embedder:
    return Embedder(resolve_model(model or None), batch_size=batch_size, threads=threads or None)


@lru_cache(maxsize=2)
def _reranker(model: str) -> Reranker | None:
    return load_reranker(model or None)
