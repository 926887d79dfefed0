"""Thin Dagster resources over the Dagster-free core."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.lib.index.embed import Embedder, ModelSpec, resolve_model
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.query.rerank import Reranker, load_reranker

ASSET_LEASE_WAIT_S = 600.0
"""Seconds a Dagster (sensor / UI) run's index-writing step (embedding, publishing) waits for
another writer's lease before it fails naming that writer (the next sensor tick retries)."""


class DocumentsFolder(dg.ConfigurableResource):
    """The source folder and where intermediate artefacts (Parquet) are kept."""

    path: str = "data/documents"
    work_dir: str = "data/work"
    ocr_min_confidence: float = 0.80  # RAG_OCR_MIN_CONFIDENCE: OCR pages below are not indexed
    include: str = ""  # RAG_INCLUDE: comma-separated globs; only matching files are documents
    exclude: str = ""  # RAG_EXCLUDE: comma-separated globs left out (plus .ragignore)
    sources: str = ""  # RAG_SOURCES: a sources file (issue 41)
    max_delete_share: float = 0.5  # RAG_SOURCE_MAX_DELETE_SHARE
    confirm_delete: str = ""  # RAG_SOURCE_CONFIRM_DELETE: source names (or all)

    @property
    def root(self) -> Path:
        return Path(self.path)

    def selection(self) -> Any:
        """Which files are documents (rag_assets/lib/ingest/select.py, issue 22)."""
        from rag_assets.lib.ingest.select import Selection

        return Selection.for_folder(self.root, self.include, self.exclude)

    def specs(self) -> Any:
        """The sources (issue 41, rag_assets/lib/ingest/sources/), or None for a folder."""
        from rag_assets.lib.ingest.sources.config import source_specs

        return source_specs(self.path, self.sources, self.include, self.exclude)

    def label(self) -> str:
        """What the index records it is built from (a folder, a location, a sources file)."""
        from rag_assets.lib.ingest.sources.config import documents_label

        return documents_label(self.path, self.sources)


class EmbeddingModel(dg.ConfigurableResource):
    """The sentence-transformers encoder ("" = packaged all-MiniLM-L6-v2), loaded offline."""

    model: str = ""
    batch_size: int = 16
    threads: int = 0
    dims: int = 0  # RAG_EMBED_DIMS: 0 = the model's own size, else a Matryoshka truncation
    query_prompt: str = ""  # RAG_QUERY_PROMPT: "" = the model's own "query" prompt
    document_prompt: str = ""  # RAG_DOCUMENT_PROMPT: "" = its "document"/"passage" prompt
    device: str = "auto"  # RAG_DEVICE: auto = CUDA when torch sees one, else the CPU
    precision: str = "fp32"  # RAG_EMBED_PRECISION: fp16/bf16 are stamps (another table)
    # issue 35: a model server embeds instead (RAG_EMBED_URL); the key is only referenced here
    url: str = ""  # RAG_EMBED_URL
    endpoint_model: str = ""  # RAG_EMBED_MODEL
    api_key_ref: str = ""  # RAG_EMBED_API_KEY as rag_assets.lib.models.http.secret_ref
    concurrency: int = 2  # RAG_EMBED_CONCURRENCY
    timeout: float = 300.0  # RAG_EMBED_TIMEOUT
    retries: int = 4  # RAG_EMBED_RETRIES
    window: int = 0  # RAG_EMBED_WINDOW
    index_uri: str = ""  # where the server's fingerprints are recorded (RAG_INDEX_URI)
    work_dir: str = ""  # RAG_WORK_DIR

    def embedder(self) -> Embedder:
        if self.url:
            return self._endpoint()
        return _embedder(
            self.model,
            self.batch_size,
            self.threads,
            self.dims,
            self.query_prompt,
            self.document_prompt,
            self.device,
            self.precision,
        )

    def embedder_for(self, stamps: Stamps, store: Any = None, cache_root: str = "") -> Embedder:
        """The embedder, refused (one Dagster failure naming the differences) when it would not
        write rows with ``stamps``: the resource and the asset's code_version disagree. With
        ``store``, stamps naming an adapted model of this index (issue 32) get that model."""
        if self.url:  # issue 35: probed afresh, recorded in the index before rows are written
            endpoint = self._endpoint(prefer=stamps.revision, max_age=0)
            runtime = endpoint.stamps(stamps.pipeline, stamps.extractor)
            if runtime != stamps:
                raise dg.Failure(
                    f"the model served at RAG_EMBED_URL={endpoint.spec.url} is not the one this "
                    "asset's code version was computed for: "
                    + "; ".join(runtime.differences(stamps))
                    + ". Reload the code location (the UI's Reload; `rag-assets index` reloads "
                    "on every run) to embed with it into a new table."
                )
            endpoint.register(endpoint.store)
            return endpoint
        embedder = self.embedder_for_table(store, stamps, cache_root)
        runtime = embedder.stamps(stamps.pipeline, stamps.extractor)
        if runtime != stamps:
            raise dg.Failure(
                "the embedding resource disagrees with this asset's code_version: "
                + "; ".join(runtime.differences(stamps))
                + ". Change RAG_EMBEDDING_MODEL and reload the code location instead."
            )
        return embedder

    def _endpoint(self, prefer: str | None = None, max_age: float | None = None) -> Any:
        from rag_assets.lib.index.endpoint import PROBE_TTL_S, EndpointConfig, connect
        from rag_assets.lib.models.http import secret

        config = EndpointConfig(
            url=self.url,
            model=self.endpoint_model,
            api_key=secret(self.api_key_ref, "RAG_EMBED_API_KEY"),
            batch_size=self.batch_size,
            concurrency=self.concurrency,
            timeout=self.timeout,
            retries=self.retries,
            dims=self.dims,
            query_prompt=self.query_prompt,
            document_prompt=self.document_prompt,
            window=self.window,
        )
        store = IndexStore(self.index_uri) if self.index_uri else None
        return connect(
            config,
            store=store,
            work_dir=self.work_dir or None,
            prefer=prefer,
            max_age=PROBE_TTL_S if max_age is None else max_age,
        )

    def embedder_for_table(self, store: Any, stamps: Stamps, cache_root: str = "") -> Embedder:
        """The embedder of a table with ``stamps``: the adapted model stored in ``store`` when
        the stamps name one trained from this resource's model (issue 32), else this model."""
        base = self.embedder()
        if store is None or self.url:  # a served model is not adapted here (issue 35)
            return base
        from rag_assets.lib.index.adapted import spec_for

        spec = spec_for(stamps, base.spec, store, cache_root or ".")
        if spec is None:
            return base
        return _adapted_embedder(spec, self.batch_size, self.threads, self.device)


class LanceIndex(dg.ConfigurableResource):
    """The LanceDB index directory (stamped tables, documents, BM25, published pointer)."""

    uri: str = "data/index"
    work_dir: str = "data/work"  # RAG_WORK_DIR: local copies of an object-store index's files
    # issue 51: the settings this build declares (rag_assets.lib.index.declaration.intent)
    declare: str = ""

    def store(self) -> IndexStore:
        return IndexStore(self.uri)

    def record_declaration(self, store: IndexStore) -> list[Any]:
        """Record this build's settings in the index's declaration (the first build's, or what
        was given to this one); the changes made. Held under the writer lease by the caller."""
        from rag_assets.lib.index.declaration import record_intent
        from rag_assets.lib.index.store import now_iso

        return record_intent(store, self.declare, now_iso())


class RerankModel(dg.ConfigurableResource):
    """A local CrossEncoder directory, or "llm" for the chat model at ``llm_url``; "" switches
    reranking off. ``answer_check`` "llm" adds the judge after the distance gate (issue 9)."""

    model: str = ""
    llm_url: str = ""  # RAG_LLM_URL
    llm_model: str = ""  # RAG_LLM_MODEL
    llm_api_key: str = ""  # RAG_LLM_API_KEY
    depth: int = 25  # RAG_RERANK_DEPTH
    answer_check: str = ""  # RAG_ANSWER_CHECK
    work_dir: str = "data/work"  # RAG_WORK_DIR: model replies are cached under llm-cache/
    # issue 35: a /rerank server (RAG_RERANK_URL); `model` is then the name sent to it
    url: str = ""  # RAG_RERANK_URL
    api_key_ref: str = ""  # RAG_RERANK_API_KEY as rag_assets.lib.models.http.secret_ref
    timeout: float = 5.0  # RAG_RERANK_TIMEOUT

    def reranker(self) -> Any:
        if self.url:
            from rag_assets.lib.models.http import secret

            return load_reranker(
                self.model,
                rerank_url=self.url,
                rerank_api_key=secret(self.api_key_ref, "RAG_RERANK_API_KEY"),
                rerank_timeout=self.timeout,
                depth=self.depth,
            )
        if self.model.strip().lower() == "llm":
            return load_reranker(self.model, **self._llm())
        return _reranker(self.model)

    def judge(self) -> Any:
        from rag_assets.lib.query.judge import load_judge

        options = {k: v for k, v in self._llm().items() if k != "depth"}
        return load_judge(self.answer_check, **options)

    def _llm(self) -> dict[str, Any]:
        from rag_assets.lib.query.judge import llm_cache_dir

        return {
            "llm_url": self.llm_url or None,
            "llm_model": self.llm_model or None,
            "api_key": self.llm_api_key or None,
            "depth": self.depth,
            "cache_dir": llm_cache_dir(self.work_dir),
        }


class QuestionSet(dg.ConfigurableResource):
    """The evaluation questions (needle format) and the gates built on them."""

    path: str = "data/eval"
    recall_floor: float = 0.5
    max_bluff_rate: float = 0.10
    distance_cut: str = ""  # RAG_DISTANCE_CUT: overrides the calibrated cut when set


@lru_cache(maxsize=4)
def _embedder(
    model: str,
    batch_size: int,
    threads: int,
    dims: int = 0,
    query_prompt: str = "",
    document_prompt: str = "",
    device: str = "auto",
    precision: str = "fp32",
) -> Embedder:
    spec = resolve_model(
        model or None,
        dims=dims,
        query_prompt=query_prompt,
        document_prompt=document_prompt,
        precision=precision,
    )
    return Embedder(spec, batch_size=batch_size, threads=threads or None, device=device)


@lru_cache(maxsize=4)
def _adapted_embedder(spec: ModelSpec, batch_size: int, threads: int, device: str) -> Embedder:
    return Embedder(spec, batch_size=batch_size, threads=threads or None, device=device)


@lru_cache(maxsize=2)
def _reranker(model: str) -> Reranker | None:
    return load_reranker(model or None)
