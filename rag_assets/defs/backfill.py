"""Fan-out embedding backfill (issue 13): one Dagster run per document batch, then one step that
completes the table and hands it to evaluation + publish.

``backfill_plan`` → ``embedding_batch`` (dynamic partitions, one per batch) →
``backfill_embeddings`` → the usual ``retrieval_eval`` → ``refusal_threshold`` →
``published_index``. A backfill of ``embedding_batch`` launches one run per partition; each
run writes its batch's rows in one LanceDB commit, so runs can go to many workers (any run
launcher / executor) and be retried in any order. The single-run ``chunk_embeddings`` graph
(``defs/build.py``) stays the default; this graph is built by :func:`backfill_definitions`
and gives the same table (same chunk ids, vectors within 1e-6: ``test_backfill.py``).
(No ``from __future__ import annotations`` here: Dagster reads the context annotations.)
"""

import json
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.defs.resources import DocumentsFolder, EmbeddingModel, LanceIndex
from rag_assets.lib.index.backfill import (
    BACKFILL_BATCH_ROWS,
    Batch,
    complete,
    plan_batches,
    write_batch,
)
from rag_assets.lib.index.embed import window_report
from rag_assets.lib.index.pipeline import chunks_path, load_chunks, load_documents
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import ChunkStrategy

BATCHES = dg.DynamicPartitionsDefinition(name="embedding_batches")


def plan_path(work_dir: str | Path, pipeline: str) -> Path:
    """The batch plan ``backfill_plan`` writes beside the chunks artefact it was made from."""
    chunks = chunks_path(work_dir, pipeline)
    return chunks.parent.parent / "backfill" / chunks.with_suffix(".json").name


def load_plan(work_dir: str | Path, pipeline: str) -> list[Batch]:
    path = plan_path(work_dir, pipeline)
    if not path.exists():
        raise dg.Failure(f"no backfill plan at {path}: materialise backfill_plan first")
    data = json.loads(path.read_text(encoding="utf-8"))
    return [Batch(b["key"], tuple(b["document_ids"]), int(b["rows"])) for b in data["batches"]]


def build_backfill_assets(
    stamps: Stamps,
    strategy: ChunkStrategy,
    failed_policy: str,
    batch_rows: int = BACKFILL_BATCH_ROWS,
) -> list[Any]:
    """The three backfill assets for one model + chunking strategy."""
    pipeline = strategy.pipeline_version

    @dg.asset(group_name="backfill", code_version=stamps.code_version, kinds={"lancedb"})
    def backfill_plan(
        context: dg.AssetExecutionContext, documents: DocumentsFolder, lance_index: LanceIndex
    ) -> dg.MaterializeResult:
        """Groups the extracted documents into batches of about ``batch_rows`` chunks (whole
        documents, keys from their ids), registers one ``embedding_batches`` partition per
        batch (removing stale ones), stores the canonical texts and creates the stamped table,
        so the batch runs only add rows."""
        docs = load_documents(documents.work_dir)
        chunk_list = load_chunks(documents.work_dir, pipeline)
        batches = plan_batches(docs, chunk_list, batch_rows)
        store = lance_index.store()
        failed = {d.document_id for d in docs if d.status == "failed"}
        keep = failed if failed_policy == "keep" else set()
        store.sync_documents([d for d in docs if d.ok], keep)
        store.chunk_table(stamps)  # created here once, not raced by the batch runs
        path = plan_path(documents.work_dir, pipeline)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"batches": [b.as_dict() for b in batches]}, indent=1))
        keys = [b.key for b in batches]
        instance = context.instance
        have = set(instance.get_dynamic_partitions(BATCHES.name))
        stale = sorted(have - set(keys))
        for key in stale:
            instance.delete_dynamic_partition(BATCHES.name, key)
        instance.add_dynamic_partitions(BATCHES.name, [k for k in keys if k not in have])
        return dg.MaterializeResult(
            metadata={
                "batches": dg.MetadataValue.int(len(batches)),
                "chunks": dg.MetadataValue.int(len(chunk_list)),
                "batch_rows": dg.MetadataValue.int(batch_rows),
                "stale_partitions_removed": dg.MetadataValue.int(len(stale)),
                "plan": dg.MetadataValue.path(str(path)),
            }
        )

    @dg.asset(
        deps=[backfill_plan],
        partitions_def=BATCHES,
        group_name="backfill",
        code_version=stamps.code_version,
        kinds={"lancedb"},
    )
    def embedding_batch(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        embedding_model: EmbeddingModel,
        lance_index: LanceIndex,
    ) -> dg.MaterializeResult:
        """Embeds one batch's chunks and writes its rows in one LanceDB commit (nothing when
        they are already stored as planned; unchanged texts reuse their stored vectors)."""
        embedder = embedding_model.embedder_for(stamps)
        plan = {b.key: b for b in load_plan(documents.work_dir, pipeline)}
        batch = plan.get(context.partition_key)
        if batch is None:
            raise dg.Failure(
                f"partition {context.partition_key} is not in the current plan: re-run "
                "backfill_plan (it removes stale partitions)"
            )
        done = write_batch(
            lance_index.store(),
            stamps,
            batch,
            load_chunks(documents.work_dir, pipeline),
            load_documents(documents.work_dir),
            embedder,
        )
        context.log.info(f"batch {batch.key}: {done['rows']} rows, {done['embedded']} embedded")
        return dg.MaterializeResult(
            metadata={k: dg.MetadataValue.int(int(v)) for k, v in done.items()}
            | {"documents": dg.MetadataValue.int(len(batch.document_ids))}
        )

    @dg.asset(
        deps=[embedding_batch],
        group_name="backfill",
        code_version=stamps.code_version,
        kinds={"lancedb"},
    )
    def backfill_embeddings(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        embedding_model: EmbeddingModel,
        lance_index: LanceIndex,
    ) -> dg.MaterializeResult:
        """Once every batch is stored: removes documents that left the corpus, builds the ANN
        index (large tables) and BM25, and stages the table version for evaluation, exactly as
        ``chunk_embeddings`` does. Fails naming the batches still missing."""
        store = lance_index.store()
        chunk_list = load_chunks(documents.work_dir, pipeline)
        docs = load_documents(documents.work_dir)
        embedder = embedding_model.embedder()
        try:
            report, staging = complete(
                store,
                stamps,
                load_plan(documents.work_dir, pipeline),
                chunk_list,
                docs,
                embedder,
                failed_policy=failed_policy,
            )
        except RuntimeError as exc:
            raise dg.Failure(str(exc)) from None
        window = window_report(embedder, chunk_list)
        store.write_staging(staging, chunks_over_window=window["over"])
        return dg.MaterializeResult(
            metadata={
                "dagster/row_count": report.rows,
                **{k: v for k, v in report.as_metadata().items() if k != "rows"},
                "chunks_over_window": dg.MetadataValue.int(int(window["over"])),
                "index_uri": dg.MetadataValue.text(store.uri),
            }
        )

    return [backfill_plan, embedding_batch, backfill_embeddings]


def backfill_definitions(settings: Any, batch_rows: int = BACKFILL_BATCH_ROWS) -> dg.Definitions:
    """A code location with the backfill graph instead of ``chunk_embeddings``: the same
    resources, the evaluation and publish assets wired after ``backfill_embeddings``, and the
    multiprocess executor (one process per step within a run; one run per batch)."""
    from rag_assets.defs.assets import build_assets
    from rag_assets.defs.build import build_definitions, stamps_for
    from rag_assets.defs.evaluation import build_evaluation_assets
    from rag_assets.lib.ingest.chunk import strategy as chunk_strategy

    strat = chunk_strategy(settings.chunk_strategy, settings.chunk_target)
    stamps = stamps_for(settings)
    single = build_definitions(settings)
    wanted = {"raw_documents", "extracted_documents", "chunks"}
    ingest = [
        a
        for a in build_assets(stamps, strat, settings.reindex_cron, settings.failed_policy)
        if {k.to_user_string() for k in _keys(a)} & wanted
    ]
    backfill = build_backfill_assets(stamps, strat, settings.failed_policy, batch_rows)
    automation = dg.AutomationCondition.eager()
    return dg.Definitions(
        assets=[
            *ingest,
            *backfill,
            *build_evaluation_assets(backfill[-1], stamps, strat, automation),
        ],
        resources=dict(single.resources or {}),
        executor=dg.multiprocess_executor,
    )


def _keys(definition: Any) -> list[dg.AssetKey]:
    if isinstance(definition, dg.AssetsDefinition):
        return list(definition.keys)
    return [definition.key] if isinstance(definition, dg.SourceAsset) else []
