"""The reviewed-traffic question set in the graph's store (issue 33): what ``eval_questions``
and ``retrieval_eval`` use of the query log, and what a purge removes. The assets, checks and
sensor that watch the log are in :mod:`rag_assets.defs.traffic`."""

import shutil
import tempfile
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.lib.evaluate.traffic import FOLDER
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import FEEDBACK_TABLE, LogDamaged, QueryLog

QUERY_LOG_KEY = dg.AssetKey("query_log")
GAPS_MD = "reports/content-gaps.md"
GAPS_JSON = "reports/content-gaps.json"


# -- the traffic question set (used by eval_questions and retrieval_eval) ---------------------
def traffic_choice(
    store: IndexStore, texts: dict[str, str], configured: Any, log: Any
) -> tuple[Any, dict[str, Any]]:
    """``question_source.traffic_decision`` on this store: the set written to
    ``evaluation/traffic`` (files locally, ``_rag_files`` rows on object storage)."""
    from rag_assets.lib.evaluate.question_source import traffic_decision

    qlog = QueryLog(store, warn=log.warning)
    try:
        has_reviews = qlog.exists(FEEDBACK_TABLE) and bool(qlog.reviews(trusted=True))
    except LogDamaged as exc:  # issue 43: on object storage; the evaluation goes on without it
        log.warning(str(exc))
        return None, {}
    if not has_reviews:
        if store.file_names(FOLDER):  # every review purged: the old set goes too
            store.write_files(dict.fromkeys(store.file_names(FOLDER)))
        return None, {}
    digest = qlog.reviews_digest()
    if not store.remote:
        decision, progress = traffic_decision(qlog, texts, store.file_path(FOLDER), configured)
    else:
        with tempfile.TemporaryDirectory(prefix="rag-traffic-") as tmp:
            folder = Path(tmp) / "traffic"
            decision, progress = traffic_decision(
                qlog, texts, folder, configured, shown=store.file_location(FOLDER)
            )
            store.write_tree(FOLDER, folder)
    progress["digest"] = digest
    if decision is not None:
        decision.traffic = progress
        if decision.source.endswith("traffic"):
            log.info(f"evaluation set: {decision.label} ({decision.counts})")
    return decision, progress


def traffic_progress(store: IndexStore) -> dict[str, Any]:
    """Review progress of this store's log ({} when it has no reviews)."""
    from rag_assets.lib.evaluate.traffic import review_progress

    qlog = QueryLog(store)
    try:
        if not qlog.exists(FEEDBACK_TABLE):
            return {}
        return review_progress(qlog) | {"digest": qlog.reviews_digest()}
    except LogDamaged:  # issue 43: on object storage; said where the log is read
        return {}


def traffic_metadata(progress: dict[str, Any]) -> dict[str, Any]:
    """Numeric metadata of the review progress (plotted in the UI; no question text)."""
    if not progress:
        return {}
    need = progress.get("needed", {})
    return {
        "traffic/reviewed": dg.MetadataValue.int(int(progress.get("reviewed", 0))),
        "traffic/answerable": dg.MetadataValue.int(int(progress.get("answerable", 0))),
        "traffic/out_of_domain": dg.MetadataValue.int(int(progress.get("out_of_domain", 0))),
        "traffic/needed_answerable": dg.MetadataValue.int(int(need.get("answerable", 0))),
        "traffic/needed_out_of_domain": dg.MetadataValue.int(int(need.get("out_of_domain", 0))),
        "traffic/dropped": dg.MetadataValue.int(int(progress.get("dropped", 0))),
    }


_COPY: dict[str, tempfile.TemporaryDirectory[str]] = {}


def traffic_copy(store: IndexStore) -> Path:
    """A scratch copy of an object-store index's traffic set (for code that reads files); the
    previous copy is removed, the last one when the process ends."""
    for old in list(_COPY):
        _COPY.pop(old).cleanup()
    tmp = tempfile.TemporaryDirectory(prefix="rag-traffic-")
    _COPY[tmp.name] = tmp
    folder = Path(tmp.name) / "traffic"
    store.read_tree(FOLDER, folder)
    return folder


def forget_derived(store: IndexStore) -> list[str]:
    """After a purge: remove what was made from the purged questions (the traffic set, the
    content-gap report), for the next run to make again; returns the names removed."""
    names = [*store.file_names(FOLDER), *(n for n in (GAPS_MD, GAPS_JSON) if store.read_file(n))]
    if names:
        store.write_files(dict.fromkeys(names))
    if not store.remote:
        shutil.rmtree(store.file_path(FOLDER), ignore_errors=True)
    return names
