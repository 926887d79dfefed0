"""What ``rag-assets status --json`` prints and the service's ``/status`` answers (its callers
present it: :mod:`rag_assets.commands.status` as text, :meth:`rag_assets.serve.service.Service.
status` over HTTP and MCP). It reads only the index: no model, no Dagster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_assets.settings import Settings, adapt_mode


def status_report(settings: Settings) -> dict[str, Any]:
    """The JSON that ``rag-assets status --json`` prints.

    Reads only the index directory ``settings.index_uri``: the pointer (a damaged one is named
    and recovered from the history), the rollback stack and history, table metadata, and the
    manifest stored with the published table version (documents and their reasons, chunks over
    the encoder window, recorded when it was embedded). No model is loaded, and nothing is read
    from ``RAG_WORK_DIR``, which may belong to another index.
    """
    from rag_assets.lib.index.declaration import read_store_declaration
    from rag_assets.lib.index.store import IndexStore, PointerDamaged, Published
    from rag_assets.lib.index.store.records import index_versions
    from rag_assets.lib.index.versioning import Stamps
    from rag_assets.lib.ingest.select import Selection

    store = IndexStore(settings.index_uri)
    pub = store.published()
    declaration = read_store_declaration(store)  # issue 51
    records = store.history_records()
    counted = index_versions(records)  # issue 39: version 1, 2, ... as a user counts them
    tables = []
    for name in store.chunk_table_names():
        tbl = store.open_table(name)
        st = Stamps.from_schema_metadata(tbl.schema.metadata)
        tables.append(
            {
                "table": name,
                "rows": tbl.count_rows(),
                "lancedb_version": tbl.version,  # issue 51: LanceDB's, by its own name
                "version": tbl.version,  # the same, for the readers of the older name
                "stamps": st.as_dict() if st else None,
                "published": bool(pub and pub.table == name),
            }
        )
    described: Published | None = pub
    if described is None:  # nothing published yet: what was embedded last
        try:
            described = store.staging()
        except (FileNotFoundError, PointerDamaged):
            described = None
    manifest = store.manifest(described) if described else None
    rows = manifest.get("documents") if manifest else None
    documents: dict[str, Any] = {
        "of": described.key if described else None,
        "manifest": str(store.manifest_path(described)) if manifest and described else None,
        "ok": None,
        "failed": [],
        "skipped": [],
        "partial": [],  # indexed, with what was left out (issue 14)
    }
    if isinstance(rows, list):
        documents["ok"] = sum(1 for r in rows if r["status"] == "ok")
        for r in rows:
            if r["status"] != "ok":
                kind = r["status"] if r["status"] in ("skipped", "partial") else "failed"
                documents[kind].append({"document": r["document_id"], "reason": r["reason"]})
        # issue 22: every document with its state, its rows in the described table version
        # (a failed one under RAG_FAILED_POLICY=keep still has its last good rows), its reason
        per_doc = _rows_per_document(store, described) if described else {}
        documents["list"] = [
            {
                "document": r["document_id"],
                "state": r["status"],
                "chunks": per_doc.get(r["document_id"], 0),
                "reason": r.get("reason") or "",
                "metadata": r.get("metadata") or {},  # issue 34: keys -> values
            }
            for r in sorted(rows, key=lambda r: r["document_id"])
        ]
    from rag_assets.lib.query.output import cut_note

    source = manifest.get("source") if manifest else None
    published = None
    if pub:
        tbl = store.open_table(pub.table, pub.version)
        st = pub.stamps
        published = {
            "table": pub.table,
            "index_version": counted.get(pub.key),  # the index's own: first publish = 1
            # LanceDB's version of the table (`rollback --to TABLE@V` takes it); "version" is
            # the same, kept for the readers of the older name (issue 51)
            "lancedb_version": pub.version,
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
            "threshold_source": pub.threshold_source,  # calibrated | default | override
            "evaluation": pub.evaluation,  # evaluated | unrelated-only | unevaluated | empty
            "evaluation_note": pub.evaluation_note,
            # issue 19: hand-written | reviewed | generated (model …) | unrelated-only, and counts
            "evaluation_source": pub.evaluation_source or pub.evaluation,
            "evaluation_counts": pub.evaluation_counts,
            "threshold_warning": pub.threshold_warning,  # issue 53: the day-0 cut failed closed
            "cut_note": cut_note(pub),  # issue 53: "" once a question set checked the cut
            "published_at": pub.published_at,
            "change": pub.change,  # issue 34: content | metadata (nothing embedded) | none
        }
    stack = store.rollback_stack()
    return {
        "published": published,
        "tables": tables,
        # issue 22: the folder and chunking strategy the index is built from (None: not recorded)
        "source": source if isinstance(source, dict) else None,
        "sources": _source_lines(settings),  # issue 41: each source, ok or stale
        "documents": documents,
        # None: not recorded with this version (embedded outside the graph, or before counting)
        "chunks_over_window": manifest.get("chunks_over_window") if manifest else None,
        "rollback_stack": [  # newest first; `rollback` goes to the second entry
            {
                "table": e.table,
                "index_version": counted.get(e.key),
                "lancedb_version": e.version,
                "version": e.version,
                "rows": e.rows,
                "threshold": e.threshold,
                "published_at": e.published_at,
                "current": bool(pub and e.key == pub.key),
            }
            for e in reversed(stack)
        ],
        "history": [  # every publish and rollback, newest first
            {
                "action": r.action,
                "at": r.at,
                "table": r.entry.table,
                "index_version": counted.get(r.entry.key),
                "lancedb_version": r.entry.version,
                "version": r.entry.version,
                "change": r.entry.change,  # issue 34: what that version changed
            }
            for r in reversed(records)
        ],
        # issue 22: which files are documents (RAG_INCLUDE / RAG_EXCLUDE / .ragignore)
        "selection": Selection.for_folder(
            Path(settings.documents_dir), settings.include, settings.exclude
        ).describe(),
        # issue 25: who holds the writer lease now (empty: nobody is writing)
        "writers": [
            {"run": h.run, "pid": h.pid, "host": h.host, "since": h.since}
            for h in store.lease_holders()
        ],
        "rerank": _rerank_line(settings),
        # issue 32: the adapted encoder's policy and last training (None: never adapted)
        "adaptation": _adaptation(store, settings, pub, declaration),
        # issue 33: the query log (counts only) and what reviewed traffic still needs
        "query_log": _query_log_status(settings, store),
        # issue 51: the settings the index declares (what every process reads), or None
        "declaration": declaration.as_report() if declaration is not None else None,
    }


def _source_lines(settings: Settings) -> list[str]:
    """From the sources' state beside the index's artefacts (in the bucket for an object-store
    index, issue 42)."""
    from rag_assets.lib.index.artefacts import Artefacts
    from rag_assets.lib.ingest.sources.state import source_lines

    return source_lines(Artefacts(settings.index_uri, settings.work_dir))


def _query_log_status(settings: Settings, store: Any) -> dict[str, Any]:
    from rag_assets.lib.evaluate.traffic import log_status
    from rag_assets.serve.bounds import log_enabled

    return log_status(store, log_enabled(settings))


def _rerank_line(settings: Settings) -> str:
    """``rerank: …`` of ``status``: the /rerank server (issue 35, URL redacted), else the
    local model, else none."""
    if settings.rerank_url:
        from rag_assets.lib.models.http import redact

        model = f" ({settings.rerank_model})" if settings.rerank_model else ""
        return f"rerank: RAG_RERANK_URL={redact(settings.rerank_url)}{model}"
    if settings.rerank_model:
        return f"rerank: {settings.rerank_model}"
    return "rerank: no model configured"


def _adaptation(
    store: Any, settings: Settings, pub: Any, declaration: Any = None
) -> dict[str, Any] | None:
    """Issue 32: ``adaptation_status`` of the index, the published rows' hashes compared with
    the last training's (None when adaptation is off and the index was never adapted)."""
    from rag_assets.lib.index.adapt_policy import RetrainPolicy, parse_policy
    from rag_assets.lib.index.adapted import HASH_CHARS, adaptation_status
    from rag_assets.lib.index.store import scan

    try:  # never refused here
        mode = adapt_mode(settings.adapt)
    except ValueError:
        mode = "off"
    enabled = mode != "off"
    try:
        policy, error = parse_policy(settings.adapt_retrain), ""
    except ValueError as e:  # status still answers; `adapt` and `index` refuse it
        policy, error = RetrainPolicy(changed=None), str(e)
    report = adaptation_status(store, enabled, policy, mode=mode)
    if report["last_training"] is not None and pub is not None:
        tbl = store.open_table(pub.table, pub.version)  # one column, only for an adapted index
        hashes = [h[:HASH_CHARS] for h in scan(tbl, ["content_hash"])["content_hash"].to_pylist()]
        report = adaptation_status(store, enabled, policy, hashes, mode=mode)
    if error:
        report["policy"] = f"invalid: {error}"
    # issue 51: why the declared adaptation does not apply (a model server: auto trains nothing)
    note = declaration.notes.get("adapt", "") if declaration is not None else ""
    if note and enabled and not report["published_model_adapted"]:
        report["applies"] = False
        report["why_not"] = note
        report["serving"] = f"the base model: adaptation {note}"
    # issue 51: an index that declares its adaptation reports it, off included (the index's
    # mode, not this shell's)
    shown = enabled or report["last_training"] is not None or declaration is not None
    return report if shown else None


def _rows_per_document(store: Any, entry: Any) -> dict[str, int]:
    """document_id → rows of ``entry``'s table version (one column read, no vectors)."""
    from collections import Counter

    from rag_assets.lib.index.store import scan

    try:
        tbl = store.open_table(entry.table, entry.version)
    except (OSError, ValueError, RuntimeError):  # a version compacted away: counts unknown
        return {}
    return dict(Counter(scan(tbl, ["document_id"])["document_id"].to_pylist()))
