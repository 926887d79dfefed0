"""Assemble the Definitions for one Settings value (tests build graphs with other models)."""

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.defs.adapt import ADAPT_JOB, adapt_config
from rag_assets.defs.artefacts import ARTEFACTS, ArtefactIOManager
from rag_assets.defs.assets import build_assets
from rag_assets.defs.expansion import expansion_config
from rag_assets.defs.namespace import key, qualified
from rag_assets.defs.questions import QuestionWriter, build_continuation_sensor
from rag_assets.defs.resources import (
    DocumentsFolder,
    EmbeddingModel,
    LanceIndex,
    QuestionSet,
    RerankModel,
)
from rag_assets.defs.traffic import build_reviews_sensor, build_traffic_assets
from rag_assets.lib.index.declaration import INDEX_RUN, intent
from rag_assets.lib.index.embed import configured_model
from rag_assets.lib.index.expand import ExpansionStamp, expanded_pipeline
from rag_assets.lib.index.pipeline import extractor_suite_version
from rag_assets.lib.index.store import IndexStore, is_remote
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import strategy as chunk_strategy
from rag_assets.lib.models.http import secret_ref
from rag_assets.settings import ENV, Settings

ALL_GROUPS = ["ingest", "chunking", "embedding", "evaluation", "serving", "traffic"]
INDEX_JOB = "index_job"
#: the fan-out's assets (defs/backfill.py): not in index_job, they run one batch a run
BACKFILL_ASSETS = ("backfill_plan", "embedding_batch")

#: the settings an index's recorded source fills in when neither the environment nor a flag
#: gives them (issue 22): the folder and the chunking it was built from
SOURCE_FIELDS = ("documents_dir", "chunk_strategy", "chunk_target")


def given_in(env: Mapping[str, str]) -> set[str]:
    """The Settings fields whose ``RAG_*`` variable is set (non-empty) in ``env``."""
    return {name for name, (var, _) in ENV.items() if env.get(var, "") != ""}


def resolve_source(settings: Settings, given: Collection[str] = ()) -> Settings:
    """Issue 22's rule, for an index without a declaration (issue 51 declares more, see
    :func:`rag_assets.lib.index.declaration.declared_settings`): an index that records what it
    is built from (the documents folder and the
    chunking strategy, :func:`rag_assets.lib.index.pipeline.recorded_source`) supplies
    RAG_DOCUMENTS_DIR, RAG_CHUNK_STRATEGY and RAG_CHUNK_TARGET where ``given`` (the fields set
    by the environment or a flag) lacks them. So ``dg dev`` started without RAG_DOCUMENTS_DIR
    watches the folder the CLI indexed, not ``data/documents``. Reads a local index directory
    only when it exists (nothing is created), an object-store index from its ``_rag_meta``."""
    from rag_assets.lib.index.declaration import source_recorded

    return source_recorded(settings, given)


def source_specs_of(settings: Settings) -> Any:
    """The sources of ``settings`` (issue 41): RAG_SOURCES's, or the one location
    RAG_DOCUMENTS_DIR names; None for a folder. A bad sources file is a ValueError."""
    from rag_assets.lib.ingest.sources import SourceError
    from rag_assets.lib.ingest.sources.config import source_specs

    try:
        return source_specs(settings.documents_dir, settings.sources, settings.include,
                            settings.exclude)  # fmt: skip
    except SourceError as exc:
        raise ValueError(str(exc)) from None


def open_existing(uri: str) -> IndexStore | None:
    """The index at ``uri`` when there is one to read: a local directory that exists, or an
    object-store prefix (its bucket and credentials checked, one line when they fail)."""
    if is_remote(uri):
        return IndexStore(uri)
    path = Path(uri).expanduser()
    return IndexStore(path) if path.is_dir() else None


def force_folder(settings: Settings) -> bool:
    """RAG_FORCE_FOLDER: "1" (or true/yes) lets a run replace the index's documents folder."""
    value = settings.force_folder.strip().lower()
    if value not in ("", "0", "1", "true", "false", "yes", "no"):
        raise ValueError(f"RAG_FORCE_FOLDER={settings.force_folder!r}: give 1 or 0")
    return value in ("1", "true", "yes")


def _expansion_stamp(settings: Settings) -> ExpansionStamp | None:
    cfg = expansion_config(settings)
    return cfg.stamp if cfg else None


def stamps_for(settings: Settings, *, fresh: bool = True) -> Stamps:
    """The stamps this configuration writes: they drive table names and code versions.
    ``fresh`` False: a model server's probe of the last seconds will do (issue 35)."""
    spec = embedding_spec(settings, fresh=fresh)
    strat = chunk_strategy(settings.chunk_strategy, settings.chunk_target)
    return Stamps(
        model=spec.model_id,
        revision=spec.revision,
        dims=spec.dims,
        normalized=True,
        pipeline=expanded_pipeline(strat.pipeline_version, _expansion_stamp(settings)),
        extractor=extractor_suite_version(),
        query_prompt=spec.query_prompt,
        document_prompt=spec.document_prompt,
        precision=spec.precision,
    )


def embedding_spec(settings: Settings, *, fresh: bool = True) -> Any:
    """The local model's spec, or (issue 35, ``RAG_EMBED_URL``) the served model's: probed
    (``fresh``: now, else a probe of the last ``PROBE_TTL_S`` seconds will do), its fingerprint
    resolved against the ones the index records (the published table's first) and remembered
    in ``RAG_WORK_DIR``, so a changed model is a new code version."""
    from rag_assets.lib.index.endpoint import PROBE_TTL_S, EndpointConfig, connect

    config = EndpointConfig.from_settings(settings)
    if config is None:
        return configured_model(settings)
    store = open_existing(settings.index_uri)
    pub = store.published(strict=False) if store is not None else None
    return connect(
        config,
        store=store,
        work_dir=settings.work_dir,
        prefer=pub.stamps.revision if pub is not None else None,
        record_work=True,
        max_age=0 if fresh else PROBE_TTL_S,
    ).spec


def build_definitions(
    settings: Settings, name: str = "", given: Collection[str] = (), by: str = ""
) -> dg.Definitions:
    """The code location for ``settings``. ``name`` (issue 51, a ``RagIndex`` component's): the
    jobs, sensors and partitions are named for it and select its prefixed keys; the assets are
    moved under it by :func:`rag_assets.defs.namespace.namespaced` (``""``: the CLI's single
    index, plain keys). ``RAG_INDEX_URI`` may be a local directory or an
    object-store URI (``s3://bucket/prefix``, credentials from ``AWS_*`` or the store's own
    variables): the tables, the pointer and every file the graph writes beside them go to the
    index (:mod:`rag_assets.lib.index.store.files`), and so do the extracted documents, the chunk
    Parquet and the batch plan (the artefacts' IO manager, issue 42): ``RAG_WORK_DIR`` holds
    only caches (model replies, local copies) on an object-store index.

    Issue 51: ``chunk_embeddings`` records the settings in the index's declaration (its first
    build: all that shape it; later: the ``given`` ones, ``by`` what gave them)."""
    strat = chunk_strategy(settings.chunk_strategy, settings.chunk_target)
    adapt = adapt_config(settings)  # issue 32/44: None when RAG_ADAPT=off
    assets = build_assets(
        stamps_for(settings),
        strat,
        settings.reindex_cron,
        settings.failed_policy,
        expansion_config(settings),  # issue 15: None unless RAG_EXPAND=llm
        force_folder=force_folder(settings),  # issue 22: RAG_FORCE_FOLDER
        adapt=adapt,
        sources=source_specs_of(settings),  # issue 41: None for a plain folder
    )
    # issue 33: the query log observed, its drift check, content gaps, the replay on upgrade
    assets += build_traffic_assets(settings.reindex_cron, settings.fusion)
    everything = (
        dg.AssetSelection.key_prefixes([name], include_sources=True)
        if name  # issue 51: one index of several in the location
        else dg.AssetSelection.all(include_sources=True)
    )
    automation = dg.AutomationConditionSensorDefinition(
        name=qualified(name, "rag_automation_sensor"),
        target=everything,
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
    )
    index_job = dg.define_asset_job(
        qualified(name, INDEX_JOB),
        # not the ablation, nor the fan-out (defs/backfill.py: one batch a run); key_prefixes
        # selects nothing, rather than failing, where the location has no such asset
        selection=everything
        - dg.AssetSelection.key_prefixes(
            *(key(name, a).path for a in ("strategy_ablation", *BACKFILL_ASSETS))
        ),
        description="Extract, chunk, embed, evaluate, calibrate and publish.",
    )
    jobs = [index_job]
    if adapt is not None:  # issue 32: `rag-assets adapt`, one run
        jobs.append(
            dg.define_asset_job(
                qualified(name, ADAPT_JOB),
                selection=dg.AssetSelection.assets(key(name, "adapted_encoder"))
                .upstream()
                .materializable(),  # not the folder or sources: they are observed
                description="Extract, chunk and adapt the encoder to the corpus.",
            )
        )
    return dg.Definitions(
        assets=assets,
        sensors=[
            automation,
            build_continuation_sensor(settings.index_uri, name),
            build_reviews_sensor(settings.index_uri, name),  # issue 33: re-evaluate on reviews
        ],
        jobs=jobs,
        resources={
            "documents": DocumentsFolder(
                path=settings.documents_dir,
                work_dir=settings.work_dir,
                ocr_min_confidence=settings.ocr_min_confidence,
                include=settings.include,  # issue 22: RAG_INCLUDE / RAG_EXCLUDE
                exclude=settings.exclude,
                sources=settings.sources,  # issue 41: RAG_SOURCES
                max_delete_share=settings.source_max_delete_share,
                confirm_delete=settings.source_confirm_delete,
            ),
            "embedding_model": EmbeddingModel(
                model=settings.embedding_model,
                batch_size=settings.embed_batch_size,
                threads=settings.embed_threads,
                dims=settings.embed_dims,
                query_prompt=settings.query_prompt,
                document_prompt=settings.document_prompt,
                device=settings.device,
                precision=settings.embed_precision,
                **_endpoint_config(settings),  # issue 35: RAG_EMBED_URL
            ),
            "lance_index": LanceIndex(
                uri=settings.index_uri,
                work_dir=settings.work_dir,
                declare=intent(settings, given, by or INDEX_RUN, declaration_notes(settings)),
            ),
            # issue 42: extracted documents, chunks, the batch plan: RAG_WORK_DIR for a local
            # index, the bucket (<index>/_rag_work/) for an object-store one
            ARTEFACTS: ArtefactIOManager(
                index_uri=settings.index_uri,
                work_dir=settings.work_dir,
                pipeline=strat.pipeline_version,
            ),
            "rerank_model": RerankModel(
                model=settings.rerank_model,
                llm_url=settings.llm_url,
                llm_model=settings.llm_model,
                llm_api_key=settings.llm_api_key,
                depth=settings.rerank_depth,
                answer_check=settings.answer_check,
                work_dir=settings.work_dir,
                url=settings.rerank_url,  # issue 35: a /rerank server
                api_key_ref=secret_ref(settings.rerank_api_key),
                timeout=settings.rerank_timeout,
            ),
            "question_writer": QuestionWriter(
                llm_url=settings.llm_url,
                llm_model=settings.llm_model,
                llm_api_key=settings.llm_api_key,
                work_dir=settings.work_dir,
                budget_s=settings.eval_budget_s,
            ),
            "questions": QuestionSet(
                path=settings.eval_dir,
                recall_floor=settings.recall_floor,
                max_bluff_rate=settings.max_bluff_rate,
                distance_cut=settings.distance_cut,
            ),
        },
        executor=dg.in_process_executor,
    )


def declaration_notes(settings: Settings) -> dict[str, str]:
    """Issue 51: why a declared setting does not apply to this index (adaptation of an encoder
    this process cannot train), kept in its declaration for every process to say."""
    from rag_assets.lib.index.adapt_scope import why_not_trainable
    from rag_assets.settings import adapt_mode

    if adapt_mode(settings.adapt) != "off":
        why = why_not_trainable(settings)
        if why:
            return {"adapt": f"it does not apply: {why}; nothing is trained"}
    return {}


def _endpoint_config(settings: Settings) -> dict[str, Any]:
    """The EmbeddingModel fields of a model server (issue 35); none when RAG_EMBED_URL is unset.
    The API key enters the resource only as a reference (resource config shows in the UI)."""
    if not settings.embed_url.strip():
        return {}
    return {
        "url": settings.embed_url.strip(),
        "endpoint_model": settings.embed_model,
        "api_key_ref": secret_ref(settings.embed_api_key),
        "concurrency": settings.embed_concurrency,
        "timeout": settings.embed_timeout,
        "retries": settings.embed_retries,
        "window": settings.embed_window,
        "index_uri": settings.index_uri,
        "work_dir": settings.work_dir,
    }
