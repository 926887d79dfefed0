"""What the CLI runs: the graph through Dagster in-process, status, and evaluations."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings

# Each stage is one in-process run (the checks of its asset run with it), so a failed blocking
# check stops the graph exactly where Dagster would, and the progress bar moves per stage.
STAGES = [
    ("observe", "raw_documents"),
    ("extract", "extracted_documents"),
    ("chunk", "chunks"),
    ("embed", "chunk_embeddings"),
    ("evaluate", "retrieval_eval"),
    ("calibrate", "refusal_threshold"),
    ("publish", "published_index"),
]


# the CLI shows a progress bar and a summary; Dagster's own log lines stay in its event log
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


@dataclass
class Outcome:
    success: bool
    failed_stage: str | None = None
    error: str | None = None
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    evaluation: str = ""

    def summary(self) -> str:
        md = self.metadata
        lines = []
        if "extracted_documents" in md:
            e = md["extracted_documents"]
            lines.append(
                f"documents: {e['documents']} ({e['ok']} ok, {e['failed']} failed, "
                f"{e['reused']} reused)"
            )
            for row in e.get("failed_list", []):
                lines.append(f"  FAILED {row['document']}: {row['reason']}")
        if "chunks" in md:
            lines.append(
                f"chunks: {md['chunks']['dagster/row_count']} ({md['chunks']['strategy']})"
            )
        if "chunk_embeddings" in md:
            m = md["chunk_embeddings"]
            lines.append(
                f"embedded: {m['embedded']} new, {m['reused']} reused; rows in LanceDB: "
                f"{m['dagster/row_count']} (table {m['table']} v{m['table_version']})"
            )
        for name, passed, sev in self.checks:
            lines.append(f"check {name}: {'passed' if passed else 'FAILED'} ({sev})")
        if self.evaluation:
            lines += ["", self.evaluation, ""]
        if "refusal_threshold" in md:
            r = md["refusal_threshold"]
            lines.append(f"refusal cut: {r['cut']:.3f} ({r['policy']}): {r['reason']}")
        if "published_index" in md:
            p = md["published_index"]
            lines.append(
                f"published: {p['table']} v{p['table_version']} ({p['dagster/row_count']} rows)"
            )
        if not self.success:
            lines.append(f"PIPELINE FAILED at {self.failed_stage}: {self.error}")
        return "\n".join(lines)


def materialize_graph(settings: Settings, progress: bool = True, instance: Any = None) -> Outcome:
    """Materialise every stage of the graph with the same definitions the UI loads."""
    import dagster as dg
    from tqdm import tqdm

    from rag_assets.defs.build import build_definitions

    defs = build_definitions(settings)
    if instance is None:
        instance = (
            dg.DagsterInstance.get()
            if os.environ.get("DAGSTER_HOME")
            else dg.DagsterInstance.ephemeral()
        )
    nodes: list[Any] = [*(defs.assets or []), *(defs.asset_checks or [])]
    outcome = Outcome(success=True)
    bar = tqdm(STAGES, desc="index", unit="stage", disable=not progress, leave=False)
    for label, key in bar:
        bar.set_postfix_str(label)
        ak = dg.AssetKey(key)
        selection = dg.AssetSelection.assets(ak) | dg.AssetSelection.checks_for_assets(ak)
        res = dg.materialize(
            nodes,
            instance=instance,
            resources=defs.resources,
            selection=selection,
            raise_on_error=False,
            run_config=QUIET,
        )
        for ev in res.get_asset_materialization_events():
            md = ev.materialization.metadata
            outcome.metadata[key] = {k: getattr(v, "value", v) for k, v in md.items()}
        if res.get_asset_observation_events():
            outcome.metadata[key] = {"observed": True}
        for ce in res.get_asset_check_evaluations():
            outcome.checks.append((ce.check_name, ce.passed, ce.severity.value))
        if not res.success:
            outcome.success = False
            outcome.failed_stage = key
            outcome.error = _failure_text(res)
            break
    bar.close()
    if "extracted_documents" in outcome.metadata:
        table = outcome.metadata["extracted_documents"].get("failed_documents")
        if table is not None:
            outcome.metadata["extracted_documents"]["failed_list"] = [
                r.data for r in getattr(table, "records", [])
            ]
    if "retrieval_eval" in outcome.metadata:
        outcome.evaluation = str(outcome.metadata["retrieval_eval"].get("results", ""))
    return outcome


def _failure_text(res: Any) -> str:
    for ev in res.all_events:
        if ev.is_failure and ev.step_failure_data is not None:
            err = ev.step_failure_data.error
            return err.message.strip() if err else "step failed"
    return "run failed"


def status_report(settings: Settings) -> dict[str, Any]:
    """The JSON that ``rag-assets status --json`` prints."""
    from rag_assets.lib.store import IndexStore

    store = IndexStore(settings.index_uri)
    pub = store.published()
    tables = []
    for name in store.chunk_table_names():
        tbl = store.open_table(name)
        from rag_assets.lib.versioning import Stamps

        st = Stamps.from_schema_metadata(tbl.schema.metadata)
        tables.append(
            {
                "table": name,
                "rows": tbl.count_rows(),
                "version": tbl.version,
                "stamps": st.as_dict() if st else None,
                "published": bool(pub and pub.table == name),
            }
        )
    manifest = Path(settings.work_dir) / "extracted" / "manifest.json"
    rows = json.loads(manifest.read_text()) if manifest.exists() else []
    failed = [
        {"document": r["document_id"], "reason": r["reason"]} for r in rows if r["status"] != "ok"
    ]
    published = None
    over = 0
    if pub:
        tbl = store.open_table(pub.table, pub.version)
        st = pub.stamps
        published = {
            "table": pub.table,
            "version": pub.version,
            "rows": tbl.count_rows(),  # as stored, at the published version
            "stamps": {
                "model": st.model,
                "revision": st.revision,
                "dims": st.dims,
                "pipeline": st.pipeline,
                "extractor": st.extractor,
            },
            "threshold": pub.threshold,
            "threshold_policy": pub.threshold_policy,
            "published_at": pub.published_at,
        }
        over = _over_window(settings, tbl)
    return {
        "published": published,
        "tables": tables,
        "documents": {"ok": sum(1 for r in rows if r["status"] == "ok"), "failed": failed},
        "chunks_over_window": over,
        "rerank": f"rerank: {settings.rerank_model}"
        if settings.rerank_model
        else "rerank: no model configured",
    }


def _over_window(settings: Settings, tbl: Any) -> int:
    from rag_assets.lib.embed import Embedder, resolve_model
    from rag_assets.lib.store import scan

    texts = scan(tbl, ["text"])["text"].to_pylist()
    if not texts:
        return 0
    emb = Embedder(resolve_model(settings.embedding_model or None))
    window = emb.max_seq_length
    return sum(1 for n in emb.token_counts(texts) if n > window)


def run_eval(args: Any, settings: Settings) -> tuple[dict[str, Any], str]:
    """``rag-assets eval``: build (or reuse) an index of a folder and score it."""
    from rag_assets.lib.chunk import strategy as chunk_strategy
    from rag_assets.lib.embed import Embedder, resolve_model
    from rag_assets.lib.evaluate import ablation, evaluate_needles, markdown_tables
    from rag_assets.lib.extract import scan_folder
    from rag_assets.lib.pipeline import digest, index_folder
    from rag_assets.lib.questions import load_needle_set
    from rag_assets.lib.rerank import load_reranker
    from rag_assets.lib.retrieve import Index
    from rag_assets.lib.store import IndexStore

    embedder = Embedder(
        resolve_model(settings.embedding_model or None),
        batch_size=settings.embed_batch_size,
        threads=settings.embed_threads or None,
    )
    reranker = load_reranker(settings.rerank_model or None)
    retrievers = [r.strip() for r in args.retrievers.split(",") if r.strip()]
    cache = args.cache or Path(settings.work_dir) / "eval-cache"
    if args.beir:
        from rag_assets.beir import run_beir

        return run_beir(args.beir, cache, embedder, reranker, retrievers, args.strategy)
    documents = args.documents or Path(settings.documents_dir)
    questions = args.questions or Path(settings.eval_dir)
    qset = load_needle_set(questions)
    names = (args.strategies or args.strategy or settings.chunk_strategy).upper().split(",")
    target = args.target or settings.chunk_target
    root = Path(cache) / digest(scan_folder(Path(documents)))
    results: dict[str, Any] = {}
    texts = []
    for name in names:
        strat = chunk_strategy(name.strip(), target)
        built = index_folder(documents, root, strat, embedder, publish=False)
        index = Index(IndexStore(root), built.entry, embedder, reranker, settings.cut_override)
        res, _ = evaluate_needles(
            index,
            qset,
            retrievers,
            strategy=strat.name,
            max_bluff_rate=settings.max_bluff_rate,
            operating_cut=settings.cut_override,
        )
        res["index"] = {
            "uri": str(root),
            "table": built.entry.table,
            "embedded": built.sync.embedded,
        }
        results[strat.name] = res
        texts.append(f"## strategy {strat.name}\n\n{markdown_tables(res)}")
    if len(results) == 1:
        return next(iter(results.values())), texts[0]
    paired, summary = ablation(results)
    texts.insert(0, "## strategies\n\n" + summary)
    return {"strategies": results, "paired_vs_E": paired}, "\n\n".join(texts)
