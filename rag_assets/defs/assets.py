"""The asset graph: raw_documents → extracted_documents → chunks → chunk_embeddings →
retrieval_eval → refusal_threshold → published_index (+ strategy_ablation on demand).

Built by a factory because the embedding asset's ``code_version`` derives from the configured
model's stamps: a model change is a code change, so exactly that asset turns stale.
(No ``from __future__ import annotations`` here: Dagster reads the context annotations.)
"""

from collections import Counter
from typing import Any

import dagster as dg
import numpy as np

from rag_assets.defs.adapt import build_adapt_asset, run_stamps
from rag_assets.defs.artefacts import ARTEFACTS, artefact_in, artefacts_of
from rag_assets.defs.expansion import build_expansion_asset, views_for
from rag_assets.defs.progress import StepProgress
from rag_assets.defs.resources import (
    ASSET_LEASE_WAIT_S,
    DocumentsFolder,
    EmbeddingModel,
    LanceIndex,
)
from rag_assets.defs.sources import build_source_assets, sources_metadata
from rag_assets.defs.sources import extract as extract_sources
from rag_assets.lib.index.artefacts import Artefacts
from rag_assets.lib.index.embed import window_report
from rag_assets.lib.index.expand import chunk_pipeline_of
from rag_assets.lib.index.pipeline import (
    FORCE_FOLDER_TAG,
    MANIFEST_FILE,
    FolderMismatch,
    IndexSource,
    check_source,
    chunks_data_version,
    chunks_file,
    digest,
    embed_chunks,
    extraction_data_version,
    extractor_suite_version,
)
from rag_assets.lib.index.store import IndexStore, scan, shown_uri, vectors
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.index.views import write_views_for
from rag_assets.lib.ingest.chunk import ChunkStrategy, chunk_documents
from rag_assets.lib.ingest.extract import extract_folder, scan_folder

AC = dg.AutomationCondition
# Re-run when upstream data changed or this asset's code (model!) changed, never past a
# failed blocking check (see ../shared/design/dagster-findings.md §3).
AUTOMATION = (
    (AC.eager() | AC.code_version_changed()) & AC.all_deps_blocking_checks_passed()
).with_label("eager_or_code_changed")

INDEX_POOL = "rag_index_writer"
"""Dagster pool of the asset that writes the index (issue 25): with ``concurrency: pools:
default_limit: 1`` in ``dagster.yaml`` the run queue lets one such step run at a time per
instance. Across instances and processes the writer lease (``_rag_lease``) is what holds."""


def build_assets(
    stamps: Stamps,
    strategy: ChunkStrategy,
    reindex_cron: str,
    failed_policy: str,
    expansion: Any = None,  # defs.expansion.ExpansionConfig when RAG_EXPAND=llm (issue 15)
    force_folder: bool = False,  # RAG_FORCE_FOLDER: may replace the index's recorded folder
    adapt: Any = None,  # defs.adapt.AdaptConfig unless RAG_ADAPT=off (issue 32/44)
    sources: Any = None,  # issue 41: the SourceSpecs of RAG_SOURCES or a --documents location
) -> list[Any]:
    """All assets and checks for one configured model + chunking strategy. ``chunk_questions``
    is in the graph only when expansion is on (issue 22: no asset that does nothing), and
    ``adapted_encoder`` only when adaptation is on (issue 32)."""

    @dg.observable_source_asset(
        group_name="ingest",
        description="The documents folder; its data version is the hash of every file's bytes.",
        automation_condition=AC.cron_tick_passed(reindex_cron),
    )
    def raw_documents(documents: DocumentsFolder) -> dg.DataVersion:
        return dg.DataVersion(digest(scan_folder(documents.root, documents.selection())))

    # issue 41: one observable source asset per source instead of the folder's
    observed = build_source_assets(sources, reindex_cron) if sources else [raw_documents]

    @dg.asset(
        deps=observed,
        group_name="ingest",
        code_version=extractor_suite_version(),
        automation_condition=AUTOMATION,
        check_specs=[
            dg.AssetCheckSpec(
                "all_documents_extracted",
                asset="extracted_documents",
                description="WARN when a file could not be extracted (empty, binary, corrupt "
                "PDF, no text layer); its reason is listed, the other documents go on.",
            )
        ],
        kinds={"python", "parquet"},
        io_manager_key=ARTEFACTS,  # issue 42: kept in the bucket for an object-store index
    )
    def extracted_documents(
        context: dg.AssetExecutionContext, documents: DocumentsFolder, lance_index: LanceIndex
    ):  # no annotation: Dagster would take it as the output's type
        """Canonical text + locator map per document; failed documents keep their reason.

        Unchanged documents are reused; failed ones are retried on every run.
        """
        artefacts = artefacts_of(documents, lance_index)
        previous = {d.document_id: d for d in artefacts.documents()}
        files = StepProgress(context, "extract", "files")  # issue 31: progress in the log
        if sources:  # issue 41: each source listed, only its changed items read
            result = extract_sources(context, documents, previous, files, artefacts)
        else:
            result = extract_folder(
                documents.root,
                previous,
                ocr_min_confidence=documents.ocr_min_confidence,
                select=documents.selection(),
                progress=files,
            )
        docs = result.documents
        failed = result.failed
        for d in failed:
            context.log.warning(f"extraction failed: {d.document_id}: {d.reason}")
        ok = [d for d in docs if d.ok]
        yield dg.Output(
            docs,  # stored by the IO manager (defs/artefacts.py)
            data_version=dg.DataVersion(extraction_data_version(docs)),
            metadata={
                "documents": len(docs),
                "ok": len(ok),
                "failed": dg.MetadataValue.int(len(failed)),  # plotted across runs
                "reused": len(result.reused),
                "characters": sum(len(d.text) for d in ok),
                "failed_documents": _failed_table(failed),
                "partial": dg.MetadataValue.int(sum(d.status == "partial" for d in docs)),
                "partial_documents": _failed_table([d for d in docs if d.status == "partial"]),
                "skipped": dg.MetadataValue.int(len(result.skipped)),  # links not followed
                "skipped_documents": _failed_table(result.skipped),  # issue 31: named, as chunk
                "manifest": dg.MetadataValue.path(artefacts.location(MANIFEST_FILE)),
                **sources_metadata(result),  # issue 41: per source: listed, read, deleted
            },
        )
        yield dg.AssetCheckResult(
            check_name="all_documents_extracted",
            passed=not failed,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"failed": len(failed), "reasons": _reasons_md(failed)},
        )

    @dg.asset(
        ins={"docs": artefact_in("extracted_documents")},
        group_name="chunking",
        code_version=strategy.pipeline_version,
        automation_condition=AUTOMATION,
        kinds={"python", "parquet"},
        io_manager_key=ARTEFACTS,  # issue 42: kept in the bucket for an object-store index
    )
    def chunks(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        lance_index: LanceIndex,
        docs: list,
    ):  # no annotation: Dagster would take it as the output's type
        """Chunks of the configured strategy; each chunk's content is found in its document."""
        out = chunk_documents(docs, strategy)
        texts = {d.document_id: d.text for d in docs}
        bad = [c.chunk_id for c in out if texts[c.document_id][c.start : c.end] != c.content]
        if bad:
            raise dg.Failure(f"{len(bad)} chunks do not match their document text: {bad[:5]}")
        where = artefacts_of(documents, lance_index).location(
            chunks_file(strategy.pipeline_version)
        )
        per_doc = Counter(c.document_id for c in out)
        return dg.Output(
            out,  # stored by the IO manager (defs/artefacts.py)
            data_version=dg.DataVersion(chunks_data_version(strategy.pipeline_version, out)),
            metadata={
                "dagster/row_count": len(out),
                "strategy": strategy.name,
                "pipeline_version": strategy.pipeline_version,
                "per_document": dg.MetadataValue.md(_counts_md(per_doc, "chunks")),
                "size_histogram": dg.MetadataValue.md(_histogram_md([len(c.content) for c in out])),
                "path": dg.MetadataValue.path(where),
            },
        )

    chunk_questions = build_expansion_asset(expansion, strategy, chunks, AUTOMATION)
    adapted_encoder = build_adapt_asset(adapt, chunks, stamps, strategy)
    upstream = [a for a in (chunk_questions, adapted_encoder) if a is not None]

    @dg.asset(
        ins={"chunk_list": artefact_in("chunks"), "docs": artefact_in("extracted_documents")},
        deps=upstream,
        group_name="embedding",
        code_version=stamps.code_version + (adapt.code_suffix if adapt is not None else ""),
        automation_condition=AUTOMATION,
        check_specs=[
            dg.AssetCheckSpec(
                "chunks_within_encoder_window",
                asset="chunk_embeddings",
                description="WARN when an embedded text (header + content) has more tokens "
                "than the encoder's window, so its tail is not in the vector.",
            )
        ],
        kinds={"lancedb"},
        pool=INDEX_POOL,  # issue 25: one index writer at a time per instance (see INDEX_POOL)
    )
    def chunk_embeddings(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        embedding_model: EmbeddingModel,
        lance_index: LanceIndex,
        chunk_list: list,
        docs: list,
    ) -> dg.MaterializeResult:
        """Embeds new or changed chunks into the stamped LanceDB table of this model + pipeline.

        The published table is not touched: publish happens after evaluation passes. Refused
        (before anything is written) when the index is built from another documents folder,
        unless RAG_FORCE_FOLDER=1 or the run's tag ``rag/force-folder`` is "1" (issue 22).
        Unless RAG_ADAPT=off the rows are written by the model `adapted_encoder` proposed, under
        its stamps (issue 32).
        """
        source = IndexSource.of(documents.label(), strategy)  # issue 41: or the sources
        forced = force_folder or context.run.tags.get(FORCE_FOLDER_TAG, "") == "1"
        try:
            check_source(lance_index.store(), source, forced)
        except FolderMismatch as exc:
            raise dg.Failure(str(exc)) from None
        store = lance_index.store()
        written = run_stamps(stamps, store, adapt)  # the adapted model's, when one is proposed
        embedder = embedding_model.embedder_for(written, store, lance_index.work_dir)

        def progress(done: int, total: int) -> None:
            context.log.info(f"written {done}/{total} chunks to the table")  # one per commit

        # the writer lease (issue 25): re-entrant when `rag-assets index` already holds it for
        # the run; a sensor or UI run waits for another writer, then fails naming it
        with store.hold(context.run.run_id, wait_s=ASSET_LEASE_WAIT_S):
            lance_index.record_declaration(store)  # issue 51: what shapes the index, kept
            return _embed_and_stage(
                context, documents, store, chunk_list, docs, embedder, progress, source, written,
                StepProgress(context, "embed", "texts"),  # issue 31: texts encoded / to encode
            )  # fmt: skip

    def _embed_and_stage(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        store: Any,
        chunk_list: list[Any],
        docs: list[Any],
        embedder: Any,
        progress: Any,
        source: IndexSource,
        stamps: Stamps,
        embed_progress: Any = None,
    ) -> dg.MaterializeResult:
        report, staging = embed_chunks(
            store,
            stamps,
            chunk_list,
            docs,
            embedder,
            failed_policy=failed_policy,
            progress=progress,
            source=source,  # issue 22: the folder and strategy, in this version's manifest
            embed_progress=embed_progress,
        )
        views_meta = {}
        if expansion is not None:  # issue 15: doc2query views beside this table version
            kept = Artefacts(store.uri, documents.work_dir)  # issue 42: beside the index's
            view_list, questions = views_for(expansion, kept, strategy, chunk_list)
            views_meta = write_views_for(
                store,
                report.table,
                report.version,
                stamps.as_dict(),
                chunk_list,
                questions,
                embedder,
                expansion.stamp.as_dict(),
            )
            context.log.info(f"{len(view_list)} views written beside {report.table}")
        window = window_report(embedder, chunk_list)
        # evaluated next; published only if the checks pass (`status` reads the count back)
        store.write_staging(staging, chunks_over_window=window["over"])
        tbl = store.open_table(report.table, report.version)
        stored = scan(tbl, ["chunk_id", "content_hash", "meta_hash"]).to_pylist()
        return dg.MaterializeResult(
            data_version=dg.DataVersion(
                digest(
                    {
                        "stamps": stamps.as_dict(),
                        "rows": sorted((r["chunk_id"], r["content_hash"]) for r in stored),
                        # issue 34: a metadata change is a new version to publish (evaluation
                        # carries its figures over, see defs/evaluation.py)
                        "metadata": digest(sorted((r["chunk_id"], r["meta_hash"]) for r in stored)),
                    }
                )
            ),
            metadata={
                "dagster/row_count": report.rows,  # read back from LanceDB after the commit
                **{k: v for k, v in report.as_metadata().items() if k != "rows"},
                "stamps": dg.MetadataValue.json(stamps.as_dict()),
                "header_token_share": window["header_token_share"],
                "chunks_over_window": dg.MetadataValue.int(int(window["over"])),  # plotted
                "index_uri": dg.MetadataValue.path(shown_uri(store.uri)),
                "views": dg.MetadataValue.int(int(views_meta.get("views", 0))),  # issue 15
                "documents_folder": dg.MetadataValue.path(source.documents),  # issue 22
                "strategy": source.strategy,
            },
            check_results=[
                dg.AssetCheckResult(
                    check_name="chunks_within_encoder_window",
                    passed=window["over"] == 0,
                    severity=dg.AssetCheckSeverity.WARN,
                    metadata={
                        "window": window["window"],
                        "chunks_over_window": window["over"],
                        "characters_dropped": window["dropped_chars"],
                        "worst": dg.MetadataValue.md(window["worst_md"]),
                        # issue 35: how a model server's window was (or could not be) counted
                        **({"note": window["note"]} if window.get("note") else {}),
                        # issue 31: what the command line's warning names, and what to change
                        "worst_chunks": dg.MetadataValue.json(window["worst"]),
                        "chunk_target": strategy.target,
                        "model": stamps.model,
                    },
                )
            ],
        )

    @dg.asset_check(
        asset=chunk_embeddings,
        blocking=True,
        description="Stored rows equal the chunks produced; ids unique; stamps uniform; "
        "vectors unit length.",
    )
    def index_matches_chunks(
        documents: DocumentsFolder, lance_index: LanceIndex
    ) -> dg.AssetCheckResult:
        store = lance_index.store()
        return _index_matches_chunks(
            store, artefacts_of(documents, lance_index), run_stamps(stamps, store, adapt),
            failed_policy,
        )  # fmt: skip

    from rag_assets.defs.evaluation import build_evaluation_assets
    from rag_assets.defs.questions import build_eval_questions_asset

    eval_questions = build_eval_questions_asset(chunks, strategy, AUTOMATION)

    return [
        *observed,
        extracted_documents,
        chunks,
        *([chunk_questions] if chunk_questions is not None else []),
        *([adapted_encoder] if adapted_encoder is not None else []),
        chunk_embeddings,
        index_matches_chunks,
        eval_questions,
        *build_evaluation_assets(chunk_embeddings, stamps, strategy, AUTOMATION, eval_questions),
    ]


def _index_matches_chunks(
    store: IndexStore, artefacts: Any, stamps: Stamps, failed_policy: str
) -> dg.AssetCheckResult:
    staging = store.staging()
    tbl = store.open_table(staging.table, staging.version)
    rows = scan(
        tbl,
        [
            "chunk_id",
            "document_id",
            "model",
            "model_revision",
            "dims",
            "pipeline_version",
            "vector",
        ],
    )
    produced = artefacts.chunks(chunk_pipeline_of(stamps.pipeline))
    docs = artefacts.documents()
    failed = {d.document_id for d in docs if d.status == "failed"}  # not skipped links
    failed = failed if failed_policy == "keep" else set()
    ids = rows["chunk_id"].to_pylist()
    kept = sum(1 for d in rows["document_id"].to_pylist() if d in failed)
    expected = len(produced) + kept
    stamp_sets = {
        (m, r, d, p)
        for m, r, d, p in zip(
            rows["model"].to_pylist(),
            rows["model_revision"].to_pylist(),
            rows["dims"].to_pylist(),
            rows["pipeline_version"].to_pylist(),
            strict=True,
        )
    }
    vecs = vectors(rows["vector"], stamps.dims)
    max_norm_err = float(np.abs(np.linalg.norm(vecs, axis=1) - 1).max()) if len(vecs) else 0.0
    want = {(stamps.model, stamps.revision, stamps.dims, stamps.pipeline)}
    passed = (
        len(ids) == expected
        and len(set(ids)) == len(ids)
        and stamp_sets <= want
        and max_norm_err < 1e-5
    )
    return dg.AssetCheckResult(
        passed=passed,
        metadata={
            "rows_stored": len(ids),
            "chunks_produced": len(produced),
            "rows_kept_for_failed_documents": kept,
            "duplicate_ids": len(ids) - len(set(ids)),
            "foreign_stamps": len(stamp_sets - want),
            "max_norm_error": max_norm_err,
        },
    )


def _failed_table(failed: list[Any]) -> dg.MetadataValue:
    schema = dg.TableSchema(
        columns=[dg.TableColumn("document", "string"), dg.TableColumn("reason", "string")]
    )
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord({"document": d.document_id, "reason": d.reason or ""}) for d in failed
        ],
        schema=schema,
    )


def _reasons_md(failed: list[Any]) -> dg.MetadataValue:
    if not failed:
        return dg.MetadataValue.md("all documents extracted")
    return dg.MetadataValue.md("\n".join(f"- `{d.document_id}`: {d.reason}" for d in failed))


def _counts_md(counts: Counter, label: str) -> str:
    lines = [f"| document | {label} |", "|---|---|"]
    lines += [f"| {doc} | {n} |" for doc, n in sorted(counts.items())]
    return "\n".join(lines)


def _histogram_md(sizes: list[int], width: int = 128) -> str:
    if not sizes:
        return "no chunks"
    buckets = Counter((s // width) * width for s in sizes)
    lines = ["| content chars | chunks |", "|---|---|"]
    lines += [f"| {b}–{b + width - 1} | {n} |" for b, n in sorted(buckets.items())]
    return "\n".join(lines)
