"""Sources in the graph (issue 41): one observable source asset per source of ``RAG_SOURCES``
(or the one location ``--documents`` names), each with its own schedule, whose data version is
the source's state (its listing's identities, a commit). ``extracted_documents`` depends on all
of them: a change in one source makes it stale, and it re-reads only that source's changed
items (:func:`rag_assets.lib.ingest.sources.sync.extract_sources`).

A source that cannot be observed does not fail the run: the observation logs one line naming
the source and the cause and keeps its last good data version (nothing downstream turns
stale), with ``stale`` and ``error`` in its metadata; ``status`` shows it stale since then.
"""

import re
import time
from typing import Any

import dagster as dg

from rag_assets.defs.artefacts import artefacts_of
from rag_assets.defs.resources import DocumentsFolder, LanceIndex
from rag_assets.lib.ingest.sources.config import SourceSpec
from rag_assets.lib.ingest.sources.state import Keep, load_state
from rag_assets.lib.ingest.sources.sync import (
    as_metadata,
    extract_sources,
    failure_cause,
    list_source,
)


def asset_name(spec: SourceSpec) -> str:
    """``source_<name>`` (characters Dagster does not take in a name become ``_``)."""
    return "source_" + re.sub(r"[^A-Za-z0-9_]", "_", spec.name)


def build_source_assets(specs: list[SourceSpec], reindex_cron: str) -> list[Any]:
    return [_source_asset(spec, reindex_cron) for spec in specs]


def _source_asset(spec: SourceSpec, reindex_cron: str) -> Any:
    @dg.observable_source_asset(
        name=asset_name(spec),
        group_name="ingest",
        description=f"The {spec.kind} source {spec.name} ({spec.shown}); its data version is "
        "the source's state (its items' content identities, a commit).",
        automation_condition=dg.AutomationCondition.cron_tick_passed(spec.schedule or reindex_cron),
        tags={"rag/source": spec.name},
    )
    def observe(
        context,  # noqa: ANN001
        documents: DocumentsFolder,
        lance_index: LanceIndex,
    ) -> dg.ObserveResult:
        return observe_source(
            context, spec, documents.work_dir, artefacts_of(documents, lance_index)
        )

    return observe


def observe_source(
    context: Any, spec: SourceSpec, work_dir: str, keep: Keep | None = None
) -> dg.ObserveResult:
    """One source observed: its listing's state is the data version. ``work_dir`` holds its
    caches, ``keep`` the sources' state (the index's artefacts; default: ``work_dir``)."""
    started = time.monotonic()
    try:
        # kept for this run's extraction, which takes it instead of listing again
        _, listing = list_source(spec, work_dir, run_id=_run_id(context), keep=keep)
    except Exception as exc:  # noqa: BLE001 - one source fails alone, the run goes on
        cause = failure_cause(exc, spec)
        last = load_state(keep or work_dir).get(spec.name, {})
        context.log.warning(
            f"source {spec.name}: FAILED: {cause}; its documents are kept (last good "
            f"observation {last.get('last_good') or 'never'})"
        )
        return dg.ObserveResult(
            data_version=dg.DataVersion(
                f"{last.get('state') or 'never-observed'}-{spec.settings_digest()}"
            ),
            metadata={"stale": True, "error": cause, "location": spec.shown},
        )
    seconds = time.monotonic() - started
    return dg.ObserveResult(
        data_version=dg.DataVersion(f"{listing.state}-{spec.settings_digest()}"),
        metadata={
            "kind": spec.kind,
            "location": spec.shown,
            "items": len(listing.items),
            "items_per_second": round(len(listing.items) / seconds, 1) if seconds else 0.0,
            "notes": dg.MetadataValue.json(listing.notes),
            **({"commit": listing.info["commit"]} if listing.info.get("commit") else {}),
        },
    )


def extract(
    context: Any, documents: DocumentsFolder, previous: dict, progress: Any, keep: Keep
) -> Any:
    """The sources' documents, each source's outcome logged in one line; their state is kept
    in ``keep`` (the index's artefacts: in the bucket for an object-store index)."""

    def log(line: str) -> None:
        warn = "FAILED" in line or "WITHHELD" in line or "limit " in line
        (context.log.warning if warn else context.log.info)(line)

    confirm = [n.strip() for n in documents.confirm_delete.split(",") if n.strip()]
    return extract_sources(
        documents.specs() or [],
        previous,
        documents.work_dir,
        ocr_min_confidence=documents.ocr_min_confidence,
        max_delete_share=documents.max_delete_share,
        confirm_delete=confirm,
        progress=progress,
        log=log,
        run_id=_run_id(context),  # each source's listing: its observation's in this run
        keep=keep,  # issue 42: the state beside the index's other artefacts
    )


def _run_id(context: Any) -> str:
    """The run's id ("" outside a run: then a source is listed on each call)."""
    try:
        return str(context.run.run_id or "")
    except Exception:  # noqa: BLE001 - a context without a run (a direct invocation)
        return ""


def sources_metadata(result: Any) -> dict[str, Any]:
    """The run metadata of the sources (the run summary prints ``source_lines``)."""
    reports = getattr(result, "sources", None)
    if reports is None:
        return {}
    return {
        "sources": dg.MetadataValue.json(as_metadata(reports)),
        "source_lines": dg.MetadataValue.json([ln for r in reports for ln in r.lines()]),
        "sources_failed": dg.MetadataValue.int(sum(not r.ok for r in reports)),
        "deletions_withheld": dg.MetadataValue.int(sum(r.withheld for r in reports)),
        "reread_bytes": dg.MetadataValue.int(sum(r.read_bytes for r in reports)),
    }
