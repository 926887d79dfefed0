"""The ``chunk_questions`` asset (doc2query, issue 15) between ``chunks`` and ``chunk_embeddings``.

Off by default: with ``RAG_EXPAND`` unset the asset is not in the graph (issue 22: an asset that
does nothing is not materialised in every run), and every table, code version and query is
exactly what it was without it. With ``RAG_EXPAND=llm`` the
model behind ``RAG_EXPAND_LLM_URL`` (default ``RAG_LLM_URL``) writes ``RAG_EXPAND_N`` questions
per chunk. The expansion stamp (model, prompt hash, n) is this asset's ``code_version`` and part of
the embedding table's ``pipeline`` stamp, so a change of model or prompt re-runs exactly this
asset and what is downstream, into a new table. Questions are cached per chunk text hash, so an
edited document costs only its changed chunks, and a killed run resumes.
(No ``from __future__ import annotations`` here: Dagster reads the context annotations.)
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.lib.index.artefacts import Artefacts
from rag_assets.lib.index.expand import (
    ExpansionStamp,
    QuestionCache,
    expand_chunks,
    model_label,
    prompt_hash,
    questions_from,
    questions_json,
    questions_name,
    seed_entries,
    view_rows,
)
from rag_assets.lib.index.pipeline import digest
from rag_assets.lib.ingest.chunk import ChunkStrategy
from rag_assets.lib.models.llm import LLMClient, LLMError
from rag_assets.lib.types import Chunk, sha256_text
from rag_assets.settings import Settings


@dataclass(frozen=True)
class ExpansionConfig:
    """Where the questions come from, resolved once when the definitions are built."""

    url: str
    model: str  # what the client sends ("" = the server's loaded model)
    api_key: str
    stamp: ExpansionStamp

    def client(self) -> LLMClient:
        return LLMClient(self.url, self.model or None, self.api_key or None, timeout=300.0)


def expansion_config(settings: Settings) -> ExpansionConfig | None:
    """None when ``RAG_EXPAND`` is off; else the endpoint and the stamp. The model's name is
    taken from ``RAG_EXPAND_LLM_MODEL`` / ``RAG_LLM_MODEL``, else asked of the server once."""
    mode = settings.expand.strip().lower()
    if not mode:
        return None
    if mode != "llm":
        raise ValueError(f"RAG_EXPAND={settings.expand!r}: use llm (or leave it unset)")
    url = settings.expand_llm_url or settings.llm_url
    if not url:
        raise ValueError("RAG_EXPAND=llm needs RAG_EXPAND_LLM_URL or RAG_LLM_URL")
    if settings.expand_n < 1:
        raise ValueError(f"RAG_EXPAND_N={settings.expand_n}: must be at least 1")
    model = settings.expand_llm_model or settings.llm_model
    api_key = settings.llm_api_key
    client = LLMClient(url, model or None, api_key or None, timeout=30.0)
    try:
        label = model_label(client, model)
    except LLMError as e:
        raise ValueError(
            f"RAG_EXPAND=llm: {e}; set RAG_EXPAND_LLM_MODEL to name the model"
        ) from None
    return ExpansionConfig(
        url, model, api_key, ExpansionStamp(label, prompt_hash(), settings.expand_n)
    )


def questions_cache_dir(work_dir: str | Path) -> Path:
    return Path(work_dir) / "questions" / "cache"


def build_expansion_asset(
    expansion: ExpansionConfig | None, strategy: ChunkStrategy, chunks_asset: Any, automation: Any
) -> Any:
    """The ``chunk_questions`` asset for one configuration; None when expansion is off (the
    asset is then left out of the graph)."""
    from rag_assets.defs.resources import DocumentsFolder, LanceIndex

    if expansion is None:
        return None
    config: ExpansionConfig = expansion

    from rag_assets.defs.artefacts import artefact_in

    @dg.asset(
        ins={"chunk_list": artefact_in("chunks")},  # issue 42: through the artefacts' IO manager
        group_name="chunking",
        code_version=config.stamp.label,
        automation_condition=automation,
        kinds={"python", "json"},
    )
    def chunk_questions(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        lance_index: LanceIndex,
        chunk_list: list,
    ) -> dg.MaterializeResult:
        """Questions a user might ask that each chunk answers (doc2query), written by the model
        of RAG_EXPAND_LLM_URL when RAG_EXPAND=llm; indexed as extra views of their chunk.

        Cached per chunk text hash under the stamp (model, prompt, n): only new or edited
        chunks reach the model, and a killed run resumes. The questions are kept with the
        index's artefacts (in the bucket for an object-store index), so a run on another
        machine, or with an empty RAG_WORK_DIR, asks the model only for new or edited chunks.
        """
        store = Artefacts(lance_index.uri, documents.work_dir)
        name = questions_name(config.stamp, strategy.pipeline_version)
        cache = QuestionCache(questions_cache_dir(documents.work_dir), config.stamp)
        seeded = cache.seed(seed_entries(store.read(name)))  # issue 42: what others wrote

        def progress(done: int, total: int) -> None:
            if done % 25 == 0 or done == total:
                context.log.info(f"wrote questions for {done}/{total} chunks")

        report = expand_chunks(chunk_list, config.client(), cache, progress=progress)
        if report.failed:
            raise dg.Failure(
                f"{len(report.failed)} chunks got no questions (endpoint errors); the "
                f"{report.generated} written are cached, re-run to resume"
            )
        path = store.write(name, questions_json(report, chunk_list))
        return dg.MaterializeResult(
            data_version=dg.DataVersion(
                questions_data_version(config.stamp, chunk_list, report.questions)
            ),
            metadata={
                "expansion": config.stamp.label,
                **{k: dg.MetadataValue.text(str(v)) for k, v in config.stamp.as_dict().items()},
                "chunks": len(chunk_list),
                "generated": dg.MetadataValue.int(report.generated),  # plotted: model calls
                "cached": report.cached,
                "seeded": seeded,  # cache entries taken from the kept artefact (issue 42)
                "views": dg.MetadataValue.int(report.views),
                "seconds_per_generated_chunk": round(report.seconds_per_chunk, 3),
                "path": dg.MetadataValue.path(str(path)),
            },
        )

    return chunk_questions


def questions_data_version(
    stamp: ExpansionStamp, chunks: list[Chunk], questions: dict[str, list[str]]
) -> str:
    return digest(
        {
            "stamp": stamp.as_dict(),
            "chunks": sorted(
                (c.chunk_id, sha256_text(c.text), tuple(questions.get(c.chunk_id, [])))
                for c in chunks
            ),
        }
    )


def views_for(
    expansion: ExpansionConfig, store: Artefacts, strategy: ChunkStrategy, chunks: list[Chunk]
) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """The (chunk_id, view) rows and the questions ``chunk_embeddings`` indexes, from the
    ``chunk_questions`` artefact kept with the index's others (``store``)."""
    name = questions_name(expansion.stamp, strategy.pipeline_version)
    questions = questions_from(store.read(name), store.location(name))
    return view_rows(chunks, questions), questions


def eval_expander(settings: Settings) -> Any:
    """For ``rag-assets eval`` / ``index_folder``: chunks → (stamp, questions), or None when
    ``RAG_EXPAND`` is off. Shares the asset's on-disk cache under ``RAG_WORK_DIR``."""
    cfg = expansion_config(settings)
    if cfg is None:
        return None

    def expand(chunks: list[Chunk]) -> tuple[ExpansionStamp, dict[str, list[str]]]:
        cache = QuestionCache(questions_cache_dir(settings.work_dir), cfg.stamp)
        report = expand_chunks(chunks, cfg.client(), cache)
        if report.failed:
            raise LLMError(f"{len(report.failed)} chunks got no questions; re-run to resume")
        return cfg.stamp, report.questions

    return expand


def query_rewriter(settings: Settings) -> Any:
    """``RAG_QUERY_REWRITE=llm``: a :class:`~rag_assets.lib.query.rewrite.QueryRewriter` on
    ``RAG_LLM_URL`` cached under ``RAG_WORK_DIR/rewrite-cache``; None when off."""
    from rag_assets.lib.query.rewrite import load_rewriter

    return load_rewriter(
        settings.query_rewrite,
        settings.llm_url,
        settings.llm_model,
        settings.llm_api_key,
        Path(settings.work_dir) / "rewrite-cache",
    )
