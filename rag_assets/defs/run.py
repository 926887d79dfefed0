"""What ``rag-assets index`` and ``adapt`` run: the graph through Dagster in-process, under the
index's writer lease, and the run summary they print (``backfill`` finishes with it too).

The status report is :mod:`rag_assets.serve.status`; ``eval``: :mod:`rag_assets.commands.evaluate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shlex
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings

# One `rag-assets index` is one run of `index_job` (tagged with the folder, strategy and model);
# the progress bar moves on the run's step events, one stage per asset.
INDEX_JOB = "index_job"
STAGES = [
    ("observe", "raw_documents"),
    ("extract", "extracted_documents"),
    ("chunk", "chunks"),
    ("embed", "chunk_embeddings"),
    ("questions", "eval_questions"),
    ("evaluate", "retrieval_eval"),
    ("calibrate", "refusal_threshold"),
    ("publish", "published_index"),
]
STAGE_OF = {key: label for label, key in STAGES}
ADAPT_STAGES = [*STAGES[1:3], ("adapt", "adapted_encoder")]  # `rag-assets adapt`'s run
STAGE_OF["adapted_encoder"] = "adapt"  # issue 32: in the graph unless RAG_ADAPT=off

INTERRUPTED_TRAINING = (
    "training interrupted (Ctrl-C): the published version stays and answers; the training "
    "resumes with the next `rag-assets index`, or run `rag-assets adapt` now"
)
"""Issue 51: the summary's last line after Ctrl-C during the encoder's training."""

# the CLI shows a progress bar and a summary; Dagster's own log lines stay in its event log
QUIET_LOG_LEVEL = "CRITICAL"
"""The CLI's console log level: failures and warnings reach the user through the summary (one
line per failed document, one root-cause line per failed step); the full events, tracebacks
included, stay in Dagster's event log. ``"WARNING"`` (the CLI's ``RAG_DEBUG=1``) prints them."""


@dataclass
class Outcome:
    success: bool
    failed_stage: str | None = None
    error: str | None = None
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    check_metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    evaluation: str = ""
    run_id: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # not re-run: inputs' data versions unchanged
    # issue 25: the pointer read back after the run (table, version, rows, evaluation), so the
    # summary reports what is published, not the last materialisation's figures
    published: dict[str, Any] | None = None
    # issue 22: the checks that stop what is downstream of them when they fail
    blocking: set[str] = field(default_factory=set)
    # issue 32: the summary of the run that published the base model before this one
    preceded_by: str = ""
    # issue 51: the index's declaration after the run (what `status` shows) and what the run
    # changed in it; set by materialize_graph
    declaration: Any = None
    declared: list[tuple[str, str | None, str]] = field(default_factory=list)
    # issue 51: Ctrl-C: "training" (the published version stays; exit 0), else the stage
    interrupted: str = ""

    def summary(self) -> str:
        md = self.metadata
        lines = [self.preceded_by, ""] if self.preceded_by else []
        lines += [f"run {self.run_id} of {INDEX_JOB}"] if self.run_id else []
        m = md.get("chunk_embeddings", {})
        if m.get("documents_folder"):  # issue 22: what the index is now built from
            from rag_assets.lib.ingest.sources.config import built_from

            what, where = built_from(str(m["documents_folder"]))  # issue 49: its kind
            lines.append(f"{what}: {where} (strategy {m.get('strategy', '?')})")
        if "extracted_documents" in md:
            e = md["extracted_documents"]
            partial, skipped = e.get("partial", 0), e.get("skipped", 0)  # "ok" counts partial
            line = (
                f"documents: {e['documents']} ({e['ok'] - partial} ok, {partial} partial, "
                f"{skipped} skipped, {e['failed']} failed)"
            )
            if "documents_new" in m:  # against the rows the index held before this run
                line += "; " + _changes(m, "documents", "documents_deleted")
            lines.append(line)
            lines += [f"  {ln}" for ln in e.get("source_lines", [])]  # issue 41: per source
            for row in e.get("failed_list", []):
                lines.append(f"  FAILED {row['document']}: {row['reason']}")
            for row in e.get("partial_list", []):
                lines.append(f"  PARTIAL {row['document']}: {row['reason']}")
            for row in e.get("skipped_list", []):  # issue 31: the words `chunk` uses
                lines.append(f"  SKIPPED {row['document']}: {row['reason']}")
        if "chunks" in md:
            line = f"chunks: {md['chunks']['dagster/row_count']} ({md['chunks']['strategy']})"
            if "chunks_in_new_documents" in m:  # issue 31: by text, not by shifted chunk ids
                line += ": " + _text_changes(m)
            elif "chunks_new" in m:
                line += ": " + _changes(m, "chunks", "chunks_removed")
            lines.append(line)
        if "adapted_encoder" in md:  # issue 32: trained or kept, and what embeds
            from rag_assets.defs.adapt import summary as adapt_summary

            lines += adapt_summary(md["adapted_encoder"], None).splitlines()
        if m and "rows_before" in m:  # issue 31: where the vectors came from, in words
            lines.append(_embedded_line(m))
        elif m:
            history = m.get("reused_from_history", 0)
            lines.append(
                f"embedded: {_n(m['embedded'], 'text')} "
                f"({_n(m['reused'], 'vector')} reused, {history} of them from earlier table "
                f"versions); rows in LanceDB: {m['dagster/row_count']} (table {m['table']})"
            )
        for name, passed, sev in self.checks:
            kind = "blocking" if name in self.blocking else "non-blocking"
            outcome = "passed" if passed else "FAILED" if sev == "ERROR" else "WARNING"
            cm = self.check_metadata.get(name, {})
            if cm.get("evaluation") == "unevaluated":
                outcome = "UNEVALUATED"
            lines.append(f"check {name}: {outcome} ({kind})")
            if outcome == "WARNING":  # issue 31: what it found, and what to change
                lines += [f"  {x}" for x in _check_advice(name, cm, md)]
        if self.skipped:
            lines.append(
                "not re-run (inputs' data versions unchanged): "
                + ", ".join(self.skipped)
                + "; figures below are from their last materialisation"
            )
        note = ""
        verdict = str(md.get("retrieval_eval", {}).get("evaluation", ""))
        if verdict == "unevaluated":
            note = str(md["retrieval_eval"].get("evaluation_note", ""))
            lines.append(f"evaluation: UNEVALUATED: {note}")
        elif verdict in ("unrelated-only", "empty"):  # nothing measured: one plain line
            reason = md["retrieval_eval"].get("evaluation_note", "")
            lines.append(f"evaluation: {verdict}: {reason}")
        elif self.evaluation:
            # issue 31: one refusal cut per run: the sweep's own row gives way to the line below
            lines += ["", _without_refusal_row(self.evaluation), ""]
        carried = md.get("retrieval_eval", {}).get("carried_over_from")
        if carried:  # issue 34: a metadata-only version keeps its evaluation
            lines.append(f"evaluation carried over from {carried}: only metadata changed")
        if "refusal_threshold" in md:
            lines.append(_cut_line(md["refusal_threshold"], note))
            at_cut = _outcome_line(md["refusal_threshold"])
            if at_cut:
                lines.append(at_cut)
        if self.published is not None:  # read back from the pointer (issue 25)
            p = self.published  # issue 39/51: the index's version, as a user counts (first: 1)
            version = f" version {p['index_version']}" if p.get("index_version") else ""
            lines.append(f"published: {p['table']}{version} ({p['rows']} rows, {p['evaluation']})")
        elif "published_index" in md:
            p = md["published_index"]
            lines.append(
                f"published: {p['table']} ({p['dagster/row_count']} rows, "
                f"{p.get('evaluation', 'evaluated')})"
            )
        lines += self.declaration_lines()
        if self.interrupted == "training":
            lines.append(INTERRUPTED_TRAINING)
        elif self.interrupted:
            lines.append(f"INTERRUPTED at {self.interrupted}: nothing new is published")
        elif not self.success:
            lines.append(f"PIPELINE FAILED at {self.failed_stage}: {self.error}")
        return "\n".join(lines)

    def declaration_lines(self) -> list[str]:
        """Issue 51: what the run recorded in the index's declaration, and the adaptation the
        index declares (``adaptation: off, set at the first build on 2026-12-05``)."""
        from rag_assets.lib.index.declaration import adaptation_line, change_lines

        lines = change_lines(self.declaration, self.declared)
        adapting = adaptation_line(self.declaration)
        return lines + ([adapting] if adapting else [])


def _n(count: int, noun: str) -> str:
    """``1 text``, ``2 texts``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _changes(m: dict[str, Any], what: str, removed: str) -> str:
    """``1 new, 1 changed, 2 metadata only, 11 unchanged, 0 removed`` from chunk_embeddings'
    metadata (issue 34: "metadata only", shown when there are any: their rows were given new
    metadata, nothing was embedded)."""
    relabelled = m.get(f"{what}_metadata", 0)
    return (
        f"{m.get(f'{what}_new', 0)} new, {m.get(f'{what}_changed', 0)} changed, "
        + (f"{relabelled} metadata only, " if relabelled else "")
        + f"{m.get(f'{what}_unchanged', 0)} unchanged, {m.get(removed, 0)} removed"
    )


def _check_advice(name: str, meta: dict[str, Any], md: dict[str, dict[str, Any]]) -> list[str]:
    """What a non-blocking check that warned found, and the setting or step that changes it."""
    if name == "chunks_within_encoder_window":
        worst = meta.get("worst_chunks") or []
        n, window = meta.get("chunks_over_window", len(worst)), meta.get("window", "?")
        out = [
            f"{_n(int(n), 'chunk')} longer than the encoder's window of {window} word-pieces: "
            f"their ends ({meta.get('characters_dropped', '?')} characters in all) are not in "
            "their vectors (BM25 still finds them); the longest:"
        ]
        out += [
            f"  {w['document']} > {w['section'] or '(no section)'}: {w['word_pieces']} "
            f"word-pieces, {w['dropped_chars']} characters unseen"
            for w in worst
        ]
        target = meta.get("chunk_target")
        out.append(
            "lower RAG_CHUNK_TARGET"
            + (f" (now {target} characters)" if target else "")
            + " or use a model with a longer window (RAG_EMBEDDING_MODEL)"
        )
        return out
    if name == "all_documents_extracted":
        e = md.get("extracted_documents", {})
        failed = int(meta.get("failed", e.get("failed", 0)))
        ok = f"; {e['ok']} indexed" if "ok" in e else ""
        return [
            f"{failed} of {e.get('documents', '?')} documents could not be read (FAILED above, "
            f"with the reason){ok}. Fix or replace the file, or leave it out with RAG_EXCLUDE "
            "or a .ragignore line"
        ]
    found = "; ".join(f"{k}={v}" for k, v in meta.items() if isinstance(v, int | float | str))
    return [f"{found} (details on the check's page in the UI: `rag-assets status` prints it)"]


def _without_refusal_row(evaluation: str) -> str:
    """The evaluation tables without their ``refusal (retriever, cut …)`` paragraph: it gives
    the gate at the sweep's own best cut, which is not always the cut published (a set with too
    few out-of-domain questions, a generated set bounded by the model-free cut, an override);
    :func:`_outcome_line` gives the outcome at the published one."""
    kept = [p for p in evaluation.split("\n\n") if not p.startswith("refusal (")]
    return "\n\n".join(kept)


def _outcome_line(r: dict[str, Any]) -> str:
    """``  at this cut, the question set: 16/24 answerable answered correctly (3 wrongly, 5
    refused); 2/22 out-of-domain answered (bluffs: 2 near, 0 unrelated)``, from the
    refusal_threshold metadata at the published cut ("" when the set has no such counts)."""
    if "answerable_questions" not in r:
        return ""
    if f"answers {r['answered_correct']}/{r['answerable_questions']} " in str(r.get("reason")):
        return ""  # the cut's own reason says it already (a cut calibrated on this set)
    return (
        f"  at this cut, the question set: {r['answered_correct']}/{r['answerable_questions']} "
        f"answerable answered correctly ({r['answered_wrong']} wrongly, "
        f"{r['refused_answerable']} refused); {r['bluffs']}/{r['out_of_domain_questions']} "
        f"out-of-domain answered (bluffs: {r['bluffs_near']} near, "
        f"{r['bluffs_unrelated']} unrelated)"
    )


def _text_changes(m: dict[str, Any]) -> str:
    """Issue 31: the ``chunks:`` line by what happened to the texts, e.g. ``1 document changed:
    1 chunk re-embedded, 8 reused; 70 unchanged`` (an edited paragraph moves the ids of every
    later chunk of its document, so "8 new, 8 removed" by id would overstate it)."""
    parts = []
    new_docs, changed = m.get("documents_new", 0), m.get("documents_changed", 0)
    if new_docs:
        n = m.get("chunks_in_new_documents", 0)
        parts.append(f"{_n(n, 'chunk')} in {_n(new_docs, 'new document')}")
    if changed:
        fresh = m.get("changed_documents_reembedded", 0)
        history = m.get("changed_documents_from_history", 0)
        # an edited chunk replaces its old text: only texts gone beyond those are "removed"
        removed = max(0, m.get("changed_documents_dropped", 0) - fresh - history)
        what = [
            f"{_n(fresh, 'chunk')} re-embedded",
            f"{history} from an earlier table version",
            f"{m.get('changed_documents_reused', 0)} reused",
            f"{removed} removed",
        ]
        kept = [w for w in what if not w.startswith("0 ")] or ["the same texts"]
        doc = "document" if changed == 1 else "documents"
        parts.append(f"{changed} {doc} changed: " + ", ".join(kept))
    unchanged = m.get("chunks_in_unchanged_documents", 0)
    if unchanged:
        parts.append(f"{unchanged} unchanged")
    deleted = m.get("documents_deleted", 0)
    if deleted:
        n = m.get("chunks_of_deleted_documents", 0)
        parts.append(f"{n} removed with {_n(deleted, 'deleted document')}")
    return "; ".join(parts) or "none"


def _embedded_line(m: dict[str, Any]) -> str:
    """Issue 31: ``embedded: 1 text (8 vectors the table already had); rows in LanceDB: 79
    (table …: 1 write by this run)``; a new table says only that, and repeated texts are not
    "reused". No LanceDB version (issue 51: it counts commits, 6 on a new table, not a version
    a user made; the ``published:`` line gives the index's own, ``--json`` LanceDB's)."""
    reused = [
        (m.get("reused_from_table", 0), "vector the table already had", "vectors the table "
         "already had"),
        (m.get("reused_from_history", 0), "vector from an earlier table version",
         "vectors from earlier table versions"),
        (m.get("reused_in_run", 0), "chunk repeats a text embedded in this run",
         "chunks repeat a text embedded in this run"),
    ]  # fmt: skip
    said = [f"{n} {one if n == 1 else many}" for n, one, many in reused if n]
    how = f" ({'; '.join(said)})" if said else ""
    version = int(m["table_version"])
    if not m["rows_before"]:  # LanceDB counts versions per commit: none a user made
        table = f"a new table {m['table']}"
    else:
        writes = version - int(m.get("version_before", version))
        done = f"{_n(writes, 'write')} by this run" if writes > 0 else "unchanged"
        table = f"table {m['table']}: {done}"  # issue 51: LanceDB's version only in --json
    rows = m["dagster/row_count"]
    return f"embedded: {_n(m['embedded'], 'text')}{how}; rows in LanceDB: {rows} ({table})"


def _cut_line(r: dict[str, Any], note: str) -> str:
    """``refusal cut: 0.675 (default): unevaluated``: the source once (and the policy when it
    differs), without the cut and the evaluation note the lines above already say."""
    source, policy = str(r.get("cut_source", r["policy"])), str(r["policy"])
    label = source if source == policy else f"{source}, {policy}"
    reason = str(r.get("reason", ""))
    if note:
        reason = reason.replace(f" ({note})", "").replace(note, "")
    reason = re.sub(rf"^{re.escape(source)} cut {r['cut']:.3f}\s*:?\s*", "", reason).strip(" :;")
    return f"refusal cut: {r['cut']:.3f} ({label})" + (f": {reason}" if reason else "")


DAGSTER_YAML = """\
# written by rag-assets (issue 22) where this Dagster home had no dagster.yaml: no telemetry
# (nothing leaves the machine at run time); everything else is Dagster's default (SQLite here)
telemetry:
  enabled: false
"""
"""The ``dagster.yaml`` written into a Dagster home that has none, so the first ``rag-assets
index`` prints neither Dagster's "No dagster instance configuration file" notice nor its
telemetry banner. An existing ``dagster.yaml`` is never changed."""


def ensure_instance_config(home: Path) -> None:
    path = home / "dagster.yaml"
    if not path.exists():
        tmp = home / f".dagster.yaml.{os.getpid()}.tmp"
        tmp.write_text(DAGSTER_YAML, encoding="utf-8")
        os.replace(tmp, path)


def index_instance(settings: Settings) -> Any:
    """Where `rag-assets index` records its runs: ``$DAGSTER_HOME`` when set, else a persistent
    instance in the index's working folder, ``<index>/.rag-work/dagster`` (issue 31:
    :func:`rag_assets.defs.ui.dagster_home`; ``rag-assets ui`` shows them). Either way a re-run
    sees the data versions of the last one, so unchanged evaluation is not redone."""
    import dagster as dg

    env_home = os.environ.get("DAGSTER_HOME")
    home = Path(env_home) if env_home else Path(settings.work_dir) / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    # issue 25: two processes creating one instance's SQLite storage at once leave it with two
    # alembic heads; its creation (schema migration) is serialised by a lock file beside it
    with _instance_lock(home):
        ensure_instance_config(home)  # issue 22: no config notice, no telemetry banner
        if env_home:
            return dg.DagsterInstance.get()
        return dg.DagsterInstance.local_temp(
            tempdir=str(home), overrides={"telemetry": {"enabled": False}}
        )


INSTANCE_LOCK = ".rag-instance.lock"
"""Lock file in the Dagster home held while an instance is opened (its storage created)."""


@contextlib.contextmanager
def _instance_lock(home: Path) -> Iterator[None]:
    import fcntl

    with open(home / INSTANCE_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_tags(settings: Settings) -> dict[str, str]:
    """The tags of an index run: which folder, chunking strategy and model (and index)."""
    from rag_assets.defs.build import force_folder, stamps_for
    from rag_assets.lib.index.pipeline import FORCE_FOLDER_TAG
    from rag_assets.lib.index.store import shown_uri
    from rag_assets.lib.ingest.sources.config import documents_label

    tags = {
        "rag/documents": documents_label(settings.documents_dir, settings.sources),
        "rag/strategy": settings.chunk_strategy,
        "rag/model": stamps_for(settings, fresh=False).model,  # the probe build_definitions made
        "rag/index": shown_uri(str(settings.index_uri)),
        "rag/selection": _selection(settings).tag(),  # issue 22: RAG_INCLUDE/EXCLUDE/.ragignore
    }
    if force_folder(settings):  # issue 22: this run may replace the index's folder
        tags[FORCE_FOLDER_TAG] = "1"
    return tags


def _selection(settings: Settings) -> Any:
    from rag_assets.lib.ingest.select import Selection

    return Selection.for_folder(Path(settings.documents_dir), settings.include, settings.exclude)


def index_settings(settings: Settings, given: Collection[str]) -> Settings:
    """What ``rag-assets index`` (``adapt``, ``backfill``) runs with: the settings ``given`` to it
    (its flags and environment), the index's declaration for the rest (issue 51; an older index:
    its recorded folder and strategy, issue 22), then the defaults, as in the code location."""
    from rag_assets.lib.index.declaration import declared_settings

    return declared_settings(settings, given, legacy=True)


def check_folder(settings: Settings) -> None:
    """Refuse, before Dagster starts, a run that would publish another folder into an index
    built from one (one line naming both, and ``--force-folder``); an index directory that does
    not exist yet, or records no folder, is not checked."""
    from rag_assets.defs.build import force_folder, open_existing
    from rag_assets.lib.index.pipeline import IndexSource, check_source
    from rag_assets.lib.ingest.chunk import strategy

    store = open_existing(settings.index_uri)
    if store is None:
        return
    from rag_assets.lib.ingest.sources.config import documents_label

    label = documents_label(settings.documents_dir, settings.sources)  # issue 41: or sources
    source = IndexSource.of(label, strategy(settings.chunk_strategy, settings.chunk_target))
    check_source(store, source, force_folder(settings))


def materialize_graph(
    settings: Settings,
    progress: bool = True,
    instance: Any = None,
    on_stage: Callable[[str, str], None] | None = None,
    log_level: str = QUIET_LOG_LEVEL,
    stage_lines: bool = False,
    given: Collection[str] = (),
    announce: Callable[[str], None] | None = None,
) -> Outcome:
    """One run of ``index_job`` with the same definitions the UI loads; it stops at a failed
    blocking check (Dagster skips what is downstream of it). ``on_stage(stage, event)`` sees
    each stage's STEP_START / STEP_SUCCESS / STEP_SKIPPED / STEP_FAILURE as it happens.
    ``progress``: live bars on stderr (a terminal); ``stage_lines``: one line per stage on
    stderr as it ends, with its time (issue 31, :mod:`rag_assets.defs.run_progress`).

    The whole run holds the index's writer lease (issue 25, :mod:`rag_assets.lib.index.store.
    lease`): a second writer waits ``RAG_LEASE_WAIT`` seconds, then refuses in one line naming
    this run. The summary's ``published:`` line is read back from the pointer afterwards.

    Issue 51: ``given``: the settings given to this run (its flags and environment), which the
    index's declaration takes (:mod:`rag_assets.lib.index.declaration`); the summary says what
    changed and the adaptation the index declares. ``announce(line)``: told as soon as a first
    publish can answer while the encoder's training follows ("you can ask now"). Ctrl-C during
    that training keeps the published version (``outcome.interrupted == "training"``)."""
    from dagster._core.utils import make_new_run_id

    from rag_assets.defs.build import build_definitions
    from rag_assets.lib.index.declaration import read_store_declaration
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.index.store.records import index_versions

    # refuses an object-store URI (and RAG_ADAPT=on for an encoder not trainable here) before
    # anything is written
    defs = build_definitions(settings, given=given)
    run_id = make_new_run_id()
    try:  # the lease lives in the index: one that cannot be opened fails before any run
        store = IndexStore(settings.index_uri)
    except OSError as exc:
        where = f": '{exc.filename}'" if exc.filename else ""
        return Outcome(False, "index", f"{exc.strerror or exc}{where}")
    with store.hold(run_id, ttl_s=settings.lease_seconds, wait_s=settings.lease_wait):
        first_publish = store.published(strict=False) is None
        declared_before = read_store_declaration(store)
        outcome = _materialize_held(
            settings, defs, run_id, progress, instance, on_stage, log_level, stage_lines
        )
        if outcome.success and first_publish and _adapted_model_waits(outcome):
            # issue 32: a new index publishes the base model first; the adapted model's table
            # follows in a second run, gated against it and one `rollback` away from it
            if announce is not None:  # issue 51: the first answer does not wait for it
                announce(ask_now_line(settings, store))
            before = outcome
            outcome = _materialize_held(
                settings, defs, make_new_run_id(), progress, instance, on_stage, log_level,
                stage_lines,
            )  # fmt: skip
            outcome.preceded_by = before.summary()
    _read_declaration(outcome, store, declared_before)
    pub = store.published(strict=False)
    if outcome.interrupted == "adapted_encoder" and pub is not None:
        outcome.interrupted = "training"  # issue 51: Ctrl-C while training: the published stays
    if pub is not None:
        tbl = store.open_table(pub.table, pub.version)
        outcome.published = {
            "table": pub.table,
            "index_version": index_versions(store.history_records()).get(pub.key),
            "version": pub.version,  # LanceDB's
            "rows": int(tbl.count_rows()),
            "evaluation": pub.evaluation_source or pub.evaluation,
            "threshold": pub.threshold,
            "threshold_source": pub.threshold_source,
        }
    return outcome


def ask_now_line(settings: Settings, store: Any) -> str:
    """Issue 51: ``published version 1 (…): you can ask now: rag-assets ask --index … "…"``,
    said when the base model's table is published and the encoder's training follows."""
    from rag_assets.lib.index.store.records import index_versions

    uri = settings.index_uri
    where = uri if "://" in uri else str(Path(uri).expanduser().resolve())
    pub = store.published(strict=False)
    n = index_versions(store.history_records()).get(pub.key) if pub is not None else None
    version = f"version {n}" if n else "the base model's version"
    return (
        f"published {version}: you can ask now (rag-assets ask --index {shlex.quote(where)} "
        '"your question"); adapting the encoder follows, where the corpus gives enough to train '
        "on (Ctrl-C stops it, the published version stays)"
    )


def _read_declaration(outcome: Outcome, store: Any, before: Any) -> None:
    """The declaration after the run, and what the run changed in it (issue 51)."""
    from rag_assets.lib.index.declaration import changes_between, read_store_declaration

    outcome.declaration = read_store_declaration(store)
    outcome.declared = changes_between(before, outcome.declaration)


def _materialize_held(
    settings: Settings,
    defs: Any,
    run_id: str,
    progress: bool,
    instance: Any,
    on_stage: Callable[[str, str], None] | None,
    log_level: str,
    stage_lines: bool = False,
) -> Outcome:
    """:func:`materialize_graph` under the lease."""
    import sys

    import dagster as dg

    from rag_assets.defs.run_progress import RunProgress

    if instance is None:
        instance = index_instance(settings)
    job = defs.resolve_job_def(INDEX_JOB)
    tags = run_tags(settings)
    stages = list(STAGES)
    if job.asset_layer.has(dg.AssetKey("adapted_encoder")):  # issue 32/44: unless RAG_ADAPT=off
        stages.insert(3, ("adapt", "adapted_encoder"))
    bar = RunProgress(sys.stderr, stages, live=progress, lines=stage_lines)

    def on_event(entry: Any) -> None:
        bar.on_event(entry)  # issue 31: bars on a terminal, else a line per finished stage
        ev = entry.dagster_event
        if ev is None or ev.step_key not in STAGE_OF:
            return
        if on_stage is not None:
            on_stage(STAGE_OF[ev.step_key], ev.event_type_value)

    instance.add_event_listener(run_id, on_event)
    quiet = _SkippedCheckNote()
    active_log = logging.getLogger("dagster._core.execution.plan.active")
    active_log.addFilter(quiet)
    try:
        res = _execute(job, instance, run_id, tags, log_level, bar)
    finally:
        active_log.removeFilter(quiet)
    outcome = Outcome(success=res.success, run_id=run_id, tags=tags)
    graph = defs.resolve_asset_graph()
    outcome.blocking = {k.name for k in graph.asset_check_keys if graph.get_check_spec(k).blocking}
    for ev in res.get_asset_materialization_events():
        key = ev.asset_key.to_user_string() if ev.asset_key else ""
        outcome.metadata[key] = _values(ev.materialization.metadata)
    if res.get_asset_observation_events():
        outcome.metadata["raw_documents"] = {"observed": True}
    for ce in res.get_asset_check_evaluations():
        outcome.checks.append((ce.check_name, ce.passed, ce.severity.value))
        outcome.check_metadata[ce.check_name] = _values(ce.metadata)
    if res.success:
        # not re-run because unchanged: report what they last recorded
        for _, key in STAGES[4:]:
            if key not in outcome.metadata:
                last = instance.get_latest_materialization_event(dg.AssetKey(key))
                if last is not None and last.asset_materialization is not None:
                    outcome.skipped.append(key)
                    outcome.metadata[key] = _values(last.asset_materialization.metadata)
    else:
        outcome.failed_stage, outcome.error = _failure(res, outcome)
        outcome.interrupted = _interrupted_at(res)  # issue 51: Ctrl-C, not a failure
    if "extracted_documents" in outcome.metadata:
        for name, key in (
            ("failed", "failed_documents"),
            ("partial", "partial_documents"),
            ("skipped", "skipped_documents"),
        ):
            table = outcome.metadata["extracted_documents"].get(key)
            if table is not None:
                outcome.metadata["extracted_documents"][f"{name}_list"] = [
                    r.data for r in getattr(table, "records", [])
                ]
    if "retrieval_eval" in outcome.metadata:
        outcome.evaluation = str(outcome.metadata["retrieval_eval"].get("results", ""))
    return outcome


def _execute(
    job: Any, instance: Any, run_id: str, tags: dict[str, str], log_level: str, bar: Any
) -> Any:
    """One in-process run of ``job`` (Dagster's console log at ``log_level``, failures in the
    result, not raised); ``bar`` (its :class:`~rag_assets.defs.run_progress.RunProgress`) closed
    after."""
    try:
        return job.execute_in_process(
            run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
            instance=instance,
            run_id=run_id,
            tags=tags,
            raise_on_error=False,
        )
    finally:
        bar.close()


def _adapted_model_waits(outcome: Outcome) -> bool:
    """Issue 32: the run proposed an adapted model and embedded the base one because nothing
    was published yet (``adapted_encoder``'s ``deferred`` metadata)."""
    return bool(outcome.metadata.get("adapted_encoder", {}).get("deferred"))


class _SkippedCheckNote(logging.Filter):
    """Drops Dagster's note that a blocking check "emitted no result": it is logged when the
    checked asset was not re-run (unchanged), and what it gates is then skipped as well."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "emitted no result" not in record.getMessage()


def _values(metadata: Any) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in metadata.items()}


def _failure(res: Any, outcome: Outcome) -> tuple[str, str]:
    """(stage, one line naming the root cause) of the first failed step of the run."""
    for ev in res.all_events:
        if not (ev.is_failure and ev.step_failure_data is not None):
            continue
        step = ev.step_key or ""
        stage = next((k for _, k in STAGES if step == k or step.startswith(k + "_")), step)
        if step != stage:  # a blocking check of `stage`
            check = step[len(stage) + 1 :]
            if check not in outcome.check_metadata:  # it raised: no result, its error says why
                why = root_cause(ev.step_failure_data.error)
                return stage, f"blocking check {check} failed: {why}"
            meta = outcome.check_metadata[check]
            why = meta.get("reason") or "; ".join(
                f"{k}={v}" for k, v in meta.items() if isinstance(v, int | float | str)
            )
            return stage, f"blocking check {check} failed: {why}"
        return stage, root_cause(ev.step_failure_data.error)
    return "run", "run failed"


def _interrupted_at(res: Any) -> str:
    """The step Ctrl-C stopped ("" when none did): Dagster turns SIGINT into
    ``DagsterExecutionInterruptedError`` in the running step and fails the run."""
    for ev in res.all_events:
        if not (ev.is_step_failure and ev.step_failure_data is not None):
            continue
        err = ev.step_failure_data.error
        while err is not None:
            if err.cls_name in ("DagsterExecutionInterruptedError", "KeyboardInterrupt"):
                return ev.step_key or "run"
            err = err.cause
    return ""


def failure_of(res: Any) -> tuple[str, str]:
    """(what failed, why) of a failed in-process Dagster result: the first failed step and its
    root cause, else the run's own failure (a run can fail before any step, e.g. while its
    resources start), never a bare StopIteration."""
    failed = next((e for e in res.all_events if e.is_step_failure), None)
    if failed is not None:
        return failed.step_key, root_cause(failed.step_failure_data.error)
    run_failed = next((e for e in res.all_events if e.event_type_value == "PIPELINE_FAILURE"), None)
    why = (run_failed.message if run_failed is not None else "") or "the run failed"
    return "run", " ".join(why.split())[:500]


def root_cause(err: Any) -> str:
    """The innermost error of a Dagster error chain, as one line ("Error occurred while
    executing op" wraps the exception that says what went wrong)."""
    if err is None:
        return "step failed"
    while err.cause is not None:
        err = err.cause
    text = " ".join((err.message or err.cls_name or "step failed").split())
    text = re.sub(r"^(\w+\.)*\w*(Error|Exception|Failure): ", "", text)
    text = re.sub(r"^(?:\w+\.)+(\w+: )", r"\1", text)  # a module path before a class name
    return re.sub(r"\[Errno \d+\] ", "", text)


def run_adapt(
    settings: Settings,
    *,
    force: bool = False,
    instance: Any = None,
    log_level: str = "CRITICAL",
    progress: bool = False,
    stage_lines: bool = False,
) -> tuple[bool, dict[str, Any], str]:
    """``rag-assets adapt`` (issue 32): one run of ``adapt_job`` (extract, chunk,
    ``adapted_encoder``, rag_assets/defs/adapt.py) under the index's writer lease, adaptation
    switched on for it. Returns (success, the asset's metadata, a summary to print).
    ``progress`` / ``stage_lines``: bars on stderr (a terminal) / timed lines (issue 44: a line
    per stage as it ends and a line each tenth of the training), as ``index`` shows its run."""
    import sys

    from dagster._core.utils import make_new_run_id

    from rag_assets.defs.adapt import ADAPT_JOB, FORCE_TAG, adapt_config, summary
    from rag_assets.defs.build import build_definitions
    from rag_assets.defs.run_progress import RunProgress
    from rag_assets.lib.index.store import IndexStore

    given = settings
    config = adapt_config(settings)
    if config is None or config.auto is not None:  # asked for: no floor, no budget (issue 44)
        settings = dataclasses.replace(settings, adapt="on")
    defs = build_definitions(settings)
    job = defs.resolve_job_def(ADAPT_JOB)
    run_id = make_new_run_id()
    store = IndexStore(settings.index_uri)
    tags = {**run_tags(settings), FORCE_TAG: "1" if force else "0"}
    if instance is None:
        instance = index_instance(settings)
    bar = RunProgress(sys.stderr, ADAPT_STAGES, live=progress, lines=stage_lines, name="adapt")
    instance.add_event_listener(run_id, bar.on_event)
    with store.hold(run_id, ttl_s=settings.lease_seconds, wait_s=settings.lease_wait):
        res = _execute(job, instance, run_id, tags, log_level, bar)
    if not res.success:
        step, why = failure_of(res)
        return False, {}, f"adapt: {step} failed: {why}"
    md: dict[str, Any] = {}
    for ev in res.get_asset_materialization_events():
        if ev.asset_key and ev.asset_key.to_user_string() == "adapted_encoder":
            md = {k: getattr(v, "value", v) for k, v in ev.materialization.metadata.items()}
    return True, md, summary(md, given)
