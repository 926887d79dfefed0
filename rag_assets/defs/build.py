"""Assemble the Definitions for one Settings value (tests build graphs with other models)."""

import dagster as dg

from rag_assets.defs.assets import build_assets
from rag_assets.defs.resources import (
    DocumentsFolder,
    EmbeddingModel,
    LanceIndex,
    QuestionSet,
    RerankModel,
)
from rag_assets.lib.chunk import strategy as chunk_strategy
from rag_assets.lib.embed import resolve_model
from rag_assets.lib.pipeline import extractor_suite_version
from rag_assets.lib.versioning import Stamps
from rag_assets.settings import Settings

ALL_GROUPS = ["ingest", "chunking", "embedding", "evaluation", "serving"]


def stamps_for(settings: Settings) -> Stamps:
    """The stamps this configuration writes: they drive table names and code versions."""
    spec = resolve_model(settings.embedding_model or None)
    strat = chunk_strategy(settings.chunk_strategy, settings.chunk_target)
    return Stamps(
        model=spec.model_id,
        revision=spec.revision,
        dims=spec.dims,
        normalized=True,
        pipeline=strat.pipeline_version,
        extractor=extractor_suite_version(),
    )


def build_definitions(settings: Settings) -> dg.Definitions:
    strat = chunk_strategy(settings.chunk_strategy, settings.chunk_target)
    assets = build_assets(
        stamps_for(settings), strat, settings.reindex_cron, settings.failed_policy
    )
    automation = dg.AutomationConditionSensorDefinition(
        name="rag_automation_sensor",
        target=dg.AssetSelection.all(include_sources=True),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
    )
    index_job = dg.define_asset_job(
        "index_job",
        selection=dg.AssetSelection.all(include_sources=True)
        - dg.AssetSelection.assets("strategy_ablation"),
        description="Extract, chunk, embed, evaluate, calibrate and publish.",
    )
    return dg.Definitions(
        assets=assets,
        sensors=[automation],
        jobs=[index_job],
        resources={
            "documents": DocumentsFolder(path=settings.documents_dir, work_dir=settings.work_dir),
            "embedding_model": EmbeddingModel(
                model=settings.embedding_model,
                batch_size=settings.embed_batch_size,
                threads=settings.embed_threads,
            ),
            "lance_index": LanceIndex(uri=settings.index_uri),
            "rerank_model": RerankModel(model=settings.rerank_model),
            "questions": QuestionSet(
                path=settings.eval_dir,
                recall_floor=settings.recall_floor,
                max_bluff_rate=settings.max_bluff_rate,
                distance_cut=settings.distance_cut,
            ),
        },
        executor=dg.in_process_executor,
    )
