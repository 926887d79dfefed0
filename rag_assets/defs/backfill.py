"""Fan-out embedding backfill (issue 13): one Dagster run per document batch, then one step that
completes the table and hands it to evaluation + publish.

``backfill_plan`` → ``embedding_batch`` (dynamic partitions, one per batch) →
``backfill_embeddings`` → the usual ``retrieval_eval`` → ``refusal_threshold`` →
``published_index``. A backfill of ``embedding_batch`` launches one run per partition; each
run writes its batch's rows in one LanceDB commit, so runs can go to many workers (any run
launcher / executor) and be retried in any order. :func:`backfill_definitions` builds that
graph as its own code location (same table as the single run: ``test_backfill.py``).

The default code location (``rag_assets/definitions.py``, issue 23) carries the fan-out too,
beside the single-run graph: :func:`default_backfill_definitions` adds ``backfill_plan``,
``embedding_batch`` and the partitioned ``embedding_backfill`` job (multiprocess executor: the
embedding runs in a step process of its own, so a crashed worker fails its run). There the
completing step is the ordinary ``chunk_embeddings``: once every batch is stored it reuses
every vector (same content hashes), then evaluation and publish follow as in every index run.
``rag-assets backfill`` (:func:`run_backfill`) plans, launches one run per missing batch
through the instance's run queue (Dagster's own ``dagster job backfill``) and, with ``--wait``,
runs ``index_job`` once they all succeeded.
(No ``from __future__ import annotations`` here: Dagster reads the context annotations.)
"""

import re
from typing import Any

import dagster as dg

from rag_assets.defs.adapt import adapt_config, run_stamps
from rag_assets.defs.artefacts import ARTEFACTS, artefact_in
from rag_assets.defs.resources import DocumentsFolder, EmbeddingModel, LanceIndex
from rag_assets.lib.index.artefacts import Artefacts, plan_file
from rag_assets.lib.index.backfill import (
    BACKFILL_BATCH_ROWS,
    Batch,
    complete,
    plan_batches,
    write_batch,
)
from rag_assets.lib.index.embed import window_report
from rag_assets.lib.index.store import shown_uri
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import ChunkStrategy

BATCHES = dg.DynamicPartitionsDefinition(name="embedding_batches")
BACKFILL_JOB = "embedding_backfill"  # partitioned: one run per batch (the run queue's unit)
PLAN_JOB = "backfill_plan_job"  # ingest + backfill_plan, run in-process by `rag-assets backfill`


def load_plan(artefacts: Artefacts, pipeline: str) -> list[Batch]:
    """The batch plan ``backfill_plan`` stored beside the chunks it was made from (the
    artefacts' IO manager: RAG_WORK_DIR, or the bucket of an object-store index)."""
    plan = artefacts.plan(pipeline)
    if plan is None:
        raise dg.Failure(
            f"no backfill plan at {artefacts.location(plan_file(pipeline))}: materialise "
            "backfill_plan first"
        )
    return plan


def build_backfill_assets(
    stamps: Stamps,
    strategy: ChunkStrategy,
    failed_policy: str,
    batch_rows: int = BACKFILL_BATCH_ROWS,
    adapt: Any = None,  # defs.adapt.AdaptConfig unless RAG_ADAPT=off (issue 32/44)
    partitions: dg.DynamicPartitionsDefinition = BATCHES,
) -> list[Any]:
    """The three backfill assets for one model + chunking strategy. Unless RAG_ADAPT=off they
    write with the adapted model the index's record proposes (issue 32), as chunk_embeddings.
    ``partitions``: the batches' (a ``RagIndex`` component has its own, issue 51)."""
    pipeline = strategy.pipeline_version

    @dg.asset(
        ins={"chunk_list": artefact_in("chunks"), "docs": artefact_in("extracted_documents")},
        group_name="backfill",
        code_version=stamps.code_version,
        kinds={"lancedb"},
        io_manager_key=ARTEFACTS,  # issue 42: the plan is read by batch runs on other workers
    )
    def backfill_plan(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        lance_index: LanceIndex,
        chunk_list: list,
        docs: list,
    ):  # no annotation: Dagster would take it as the output's type
        """Groups the extracted documents into batches of about ``batch_rows`` chunks (whole
        documents, keys from their ids), registers one ``embedding_batches`` partition per
        batch (removing stale ones), stores the canonical texts and creates the stamped table,
        so the batch runs only add rows."""
        batches = plan_batches(docs, chunk_list, batch_rows)
        store = lance_index.store()
        failed = {d.document_id for d in docs if d.status == "failed"}
        keep = failed if failed_policy == "keep" else set()
        store.sync_documents([d for d in docs if d.ok], keep)
        store.chunk_table(run_stamps(stamps, store, adapt))  # once, not raced by the batches
        where = Artefacts(lance_index.uri, documents.work_dir).location(plan_file(pipeline))
        keys = [b.key for b in batches]
        instance = context.instance
        have = set(instance.get_dynamic_partitions(partitions.name))
        stale = sorted(have - set(keys))
        for key in stale:
            instance.delete_dynamic_partition(partitions.name, key)
        instance.add_dynamic_partitions(partitions.name, [k for k in keys if k not in have])
        return dg.Output(
            batches,  # stored by the IO manager before the partitions' runs start
            metadata={
                "batches": dg.MetadataValue.int(len(batches)),
                "chunks": dg.MetadataValue.int(len(chunk_list)),
                "batch_rows": dg.MetadataValue.int(batch_rows),
                "stale_partitions_removed": dg.MetadataValue.int(len(stale)),
                "plan": dg.MetadataValue.path(where),
            },
        )

    @dg.asset(
        ins={
            "batches": artefact_in("backfill_plan"),
            "chunk_list": artefact_in("chunks"),
            "docs": artefact_in("extracted_documents"),
        },
        partitions_def=partitions,
        group_name="backfill",
        code_version=stamps.code_version,
        kinds={"lancedb"},
    )
    def embedding_batch(
        context: dg.AssetExecutionContext,
        embedding_model: EmbeddingModel,
        lance_index: LanceIndex,
        batches: list,
        chunk_list: list,
        docs: list,
    ) -> dg.MaterializeResult:
        """Embeds one batch's chunks and writes its rows in one LanceDB commit (nothing when
        they are already stored as planned; unchanged texts reuse their stored vectors)."""
        store = lance_index.store()
        written = run_stamps(stamps, store, adapt)
        embedder = embedding_model.embedder_for(written, store, lance_index.work_dir)
        plan = {b.key: b for b in batches}
        batch = plan.get(context.partition_key)
        if batch is None:
            raise dg.Failure(
                f"partition {context.partition_key} is not in the current plan: re-run "
                "backfill_plan (it removes stale partitions)"
            )
        done = write_batch(
            store,
            written,
            batch,
            chunk_list,
            docs,
            embedder,
        )
        context.log.info(f"batch {batch.key}: {done['rows']} rows, {done['embedded']} embedded")
        return dg.MaterializeResult(
            metadata={k: dg.MetadataValue.int(int(v)) for k, v in done.items()}
            | {"documents": dg.MetadataValue.int(len(batch.document_ids))}
        )

    @dg.asset(
        ins={
            "batches": artefact_in("backfill_plan"),
            "chunk_list": artefact_in("chunks"),
            "docs": artefact_in("extracted_documents"),
        },
        deps=[embedding_batch],
        group_name="backfill",
        code_version=stamps.code_version,
        kinds={"lancedb"},
    )
    def backfill_embeddings(
        context: dg.AssetExecutionContext,
        embedding_model: EmbeddingModel,
        lance_index: LanceIndex,
        batches: list,
        chunk_list: list,
        docs: list,
    ) -> dg.MaterializeResult:
        """Once every batch is stored: removes documents that left the corpus, builds the ANN
        index (large tables) and BM25, and stages the table version for evaluation, exactly as
        ``chunk_embeddings`` does. Fails naming the batches still missing."""
        store = lance_index.store()
        written = run_stamps(stamps, store, adapt)
        embedder = embedding_model.embedder_for_table(store, written, lance_index.work_dir)
        try:
            report, staging = complete(
                store,
                written,
                batches,
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
                "index_uri": dg.MetadataValue.text(shown_uri(store.uri)),
            }
        )

    return [backfill_plan, embedding_batch, backfill_embeddings]


def backfill_definitions(settings: Any, batch_rows: int = BACKFILL_BATCH_ROWS) -> dg.Definitions:
    """A code location with the backfill graph instead of ``chunk_embeddings``: the same
    resources, the evaluation and publish assets wired after ``backfill_embeddings``, and the
    multiprocess executor (one process per step within a run; one run per batch)."""
    from rag_assets.defs.assets import build_assets
    from rag_assets.defs.build import build_definitions, source_specs_of, stamps_for
    from rag_assets.defs.evaluation import build_evaluation_assets
    from rag_assets.lib.ingest.chunk import strategy as chunk_strategy

    strat = chunk_strategy(settings.chunk_strategy, settings.chunk_target)
    stamps = stamps_for(settings)
    single = build_definitions(settings)
    wanted = {"raw_documents", "extracted_documents", "chunks", "eval_questions"}
    ingest = [
        a
        for a in build_assets(
            stamps,
            strat,
            settings.reindex_cron,
            settings.failed_policy,
            sources=source_specs_of(settings),  # issue 41: the sources' observed assets
        )
        if {k.to_user_string() for k in _keys(a)} & wanted
        or any(k.to_user_string().startswith("source_") for k in _keys(a))
    ]
    backfill = build_backfill_assets(
        stamps, strat, settings.failed_policy, batch_rows, adapt_config(settings)
    )
    automation = dg.AutomationCondition.eager()
    return dg.Definitions(
        assets=[
            *ingest,
            *backfill,
            *build_evaluation_assets(
                backfill[-1],
                stamps,
                strat,
                automation,
                next(
                    a for a in ingest if "eval_questions" in {k.to_user_string() for k in _keys(a)}
                ),
            ),
        ],
        resources=dict(single.resources or {}),
        executor=dg.multiprocess_executor,
    )


def default_backfill_definitions(settings: Any, name: str = "") -> dg.Definitions:
    """The fan-out assets and jobs the default code location merges into the single-run graph
    (no resources of their own: the merged location's serve them). ``chunk_embeddings`` is the
    completing step, so ``backfill_embeddings`` is left out here. ``name``: a ``RagIndex``
    component's (issue 51): its own partitions and jobs, selecting its prefixed keys."""
    from rag_assets.defs.build import stamps_for
    from rag_assets.defs.namespace import key, qualified
    from rag_assets.lib.ingest.chunk import strategy as chunk_strategy

    strat = chunk_strategy(settings.chunk_strategy, settings.chunk_target)
    partitions = (
        dg.DynamicPartitionsDefinition(name=qualified(name, str(BATCHES.name))) if name else BATCHES
    )
    plan, batch, _ = build_backfill_assets(
        stamps_for(settings),
        strat,
        settings.failed_policy,
        settings.backfill_batch_rows,
        adapt_config(settings),  # issue 32
        partitions,
    )
    return dg.Definitions(
        assets=[plan, batch],
        jobs=[
            dg.define_asset_job(
                qualified(name, BACKFILL_JOB),
                # its partitions (BATCHES) are the job's
                selection=dg.AssetSelection.assets(key(name, "embedding_batch")),
                executor_def=dg.multiprocess_executor,
                description="One batch of the fan-out embedding (one run per partition).",
            ),
            dg.define_asset_job(
                qualified(name, PLAN_JOB),
                selection=dg.AssetSelection.assets(key(name, "backfill_plan"))
                .upstream()
                .materializable(),
                description="Extract, chunk and plan the embedding batches.",
            ),
        ],
    )


def _keys(definition: Any) -> list[dg.AssetKey]:
    if isinstance(definition, dg.AssetsDefinition):
        return list(definition.keys)
    return [definition.key] if isinstance(definition, dg.SourceAsset) else []


BACKFILL_TAG = "dagster/backfill"  # Dagster's own tag on the runs of one backfill
PARTITION_TAG = "dagster/partition"
POLL_SECONDS = 1.0  # how often `rag-assets backfill --wait` reads the runs' states
_TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


def run_backfill(
    settings: Any,
    env: dict[str, str],
    *,
    wait: bool = True,
    echo: Any = print,
    instance: Any = None,
    given: Any = (),
) -> int:
    """``rag-assets backfill``: (1) extract, chunk and plan in one in-process run
    (``backfill_plan_job``); (2) launch one ``embedding_backfill`` run per batch not yet stored,
    with Dagster's own ``dagster job backfill`` (the runs go to the instance's run coordinator:
    a ``QueuedRunCoordinator`` caps how many run at once, and ``dagster-daemon`` dequeues them
    to the configured run launcher); (3) with ``wait``, follow the runs and, once every batch
    succeeded, run ``index_job``, whose ``chunk_embeddings`` reuses every stored vector, then
    evaluates and publishes. A failed batch is named, the published version keeps serving, and
    running the command again launches only the batches still missing. ``env`` is the
    environment the ``dagster`` command (and so the code location) sees: it must name the same
    instance (``DAGSTER_HOME``) and settings as the daemon's.

    Issue 51: ``given`` (the settings given to this command) is recorded in the index's
    declaration before the batch runs are launched: the code location that runs them (the
    daemon's) reads the declaration, so it embeds with what this command was given."""
    import subprocess
    import sys
    import time

    from rag_assets.defs.build import build_definitions, stamps_for
    from rag_assets.defs.run import failure_of, materialize_graph
    from rag_assets.lib.index.backfill import missing_batches
    from rag_assets.lib.index.store import IndexStore

    if not env.get("DAGSTER_HOME"):
        raise ValueError(
            "rag-assets backfill launches its runs through a Dagster instance's run queue: set "
            "DAGSTER_HOME to that instance (its dagster.yaml names the run coordinator and the "
            "launcher, docs/scaling.md) and run dagster-daemon (or dagster dev) on it"
        )
    if instance is None:
        instance = dg.DagsterInstance.get()
    _check_queue_is_served(instance)
    defs = dg.Definitions.merge(
        build_definitions(settings, given=given), default_backfill_definitions(settings)
    )
    _declare(settings, defs)
    res = defs.resolve_job_def(PLAN_JOB).execute_in_process(
        instance=instance,
        run_config={"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}},
        raise_on_error=False,
    )
    if not res.success:
        step, why = failure_of(res)
        raise RuntimeError(f"backfill: {step} failed: {why}")
    pipeline = chunk_pipeline(settings)
    artefacts = Artefacts(settings.index_uri, settings.work_dir)  # issue 42: or the bucket
    plan = load_plan(artefacts, pipeline)
    chunk_list = artefacts.chunks(pipeline)
    store = IndexStore(settings.index_uri)
    stamps = run_stamps(stamps_for(settings), store, adapt_config(settings))  # issue 32
    missing = missing_batches(store, stamps, plan, chunk_list)
    echo(
        f"backfill: {len(plan)} batches of ~{settings.backfill_batch_rows} chunks planned, "
        f"{len(missing)} to embed"
    )
    if missing:
        child_env = {
            **env,
            "RAG_DOCUMENTS_DIR": str(settings.documents_dir),
            "RAG_INDEX_URI": str(settings.index_uri),
            "RAG_WORK_DIR": str(settings.work_dir),
        }
        cmd = [
            sys.executable,
            "-m",
            "dagster",
            "job",
            "backfill",
            "-m",
            "rag_assets.definitions",
            "-j",
            BACKFILL_JOB,
            "--partitions",
            ",".join(missing),
            "--noprompt",
        ]
        done = subprocess.run(cmd, env=child_env, capture_output=True, text=True, check=False)
        launched = re.search(r"Launched backfill job `([^`]+)`", done.stdout)
        if done.returncode != 0 or launched is None:
            last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise RuntimeError(f"backfill: dagster job backfill failed: {last}")
        backfill_id = launched.group(1)
        echo(
            f"backfill: {backfill_id} launched {len(missing)} runs of {BACKFILL_JOB} through "
            "the run queue"
        )
        if not wait:
            echo(
                "backfill: not waiting; `rag-assets index` completes and publishes once "
                "every batch run succeeded"
            )
            return 0
        states: dict[str, str] = {}
        while True:
            runs = instance.get_runs(filters=dg.RunsFilter(tags={BACKFILL_TAG: backfill_id}))
            for run in sorted(runs, key=lambda r: r.tags.get(PARTITION_TAG, "")):
                status = run.status.value
                if states.get(run.run_id) != status:
                    states[run.run_id] = status
                    echo(f"run {run.run_id[:8]} batch {run.tags.get(PARTITION_TAG)}: {status}")
            if len(runs) >= len(missing) and all(r.status.value in _TERMINAL for r in runs):
                break
            time.sleep(POLL_SECONDS)
        failed_keys = [str(r.tags.get(PARTITION_TAG)) for r in runs if r.status.value != "SUCCESS"]
        if failed_keys:
            echo(
                f"backfill: {len(failed_keys)} of {len(missing)} batch runs failed "
                f"({', '.join(sorted(failed_keys))}); the published version keeps serving: run "
                "`rag-assets backfill` again to launch only the batches still missing"
            )
            return 1
    outcome = materialize_graph(settings, progress=False, instance=instance, given=given)
    echo(outcome.summary())
    return 0 if outcome.success else 1


def _declare(settings: Any, defs: dg.Definitions) -> None:
    """Issue 51: record what the backfill's definitions declare (their ``lance_index``
    resource's) in the index, under its writer lease, before any batch run starts."""
    from dagster._core.utils import make_new_run_id

    from rag_assets.lib.index.store import IndexStore

    store = IndexStore(settings.index_uri)
    lance = (defs.resources or {})["lance_index"]
    with store.hold(make_new_run_id(), ttl_s=settings.lease_seconds, wait_s=settings.lease_wait):
        lance.record_declaration(store)


def _check_queue_is_served(instance: Any) -> None:
    """With a run queue (``QueuedRunCoordinator``), refuse in one line, before anything runs,
    when no ``dagster-daemon`` heartbeat is recent on the instance: queued runs would wait
    forever. (The default coordinator launches runs itself and needs no daemon.)"""
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster._daemon.controller import get_daemon_statuses

    if not isinstance(instance.run_coordinator, QueuedRunCoordinator):
        return
    daemon = "QUEUED_RUN_COORDINATOR"  # QueuedRunCoordinatorDaemon.daemon_type()
    status = get_daemon_statuses(instance, [daemon], ignore_errors=True).get(daemon)
    if status is None or not status.healthy:
        raise RuntimeError(
            f"no dagster-daemon serves the run queue of DAGSTER_HOME={instance.root_directory}"
            " (no recent heartbeat): start `dagster-daemon run -m rag_assets.definitions` (or "
            "`dagster dev`) with the same DAGSTER_HOME and settings, then run this again"
        )


def chunk_pipeline(settings: Any) -> str:
    """The chunking pipeline version the settings' strategy writes its artefacts under."""
    from rag_assets.lib.ingest.chunk import strategy as chunk_strategy

    return chunk_strategy(settings.chunk_strategy, settings.chunk_target).pipeline_version
