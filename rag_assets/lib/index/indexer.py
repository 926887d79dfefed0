"""Incremental, crash-safe writing of chunk embeddings into a stamped LanceDB table.

``sync_chunks`` makes the table for a stamp set hold exactly the chunks given (plus, under the
``keep`` policy, the last good rows of documents whose extraction now fails):

- a document whose (chunk id, content hash) set is already stored is left alone;
- a changed document's rows are replaced in one ``merge_insert`` commit per batch of whole
  documents; vectors of unchanged texts are reused, only new texts are embedded;
- a text no current row has is looked up by content hash in the table's earlier versions
  (:data:`HISTORY_VERSIONS`, rows whose stamps match): a re-added document, or an edit undone,
  reuses the vectors it had instead of being embedded again;
- documents gone from the folder lose their rows in one delete commit;
- a document whose chunks are stored already but whose metadata changed (issue 34: tags,
  access, front matter, a ``.ragmeta`` line, its mtime) gets only its metadata columns
  rewritten: one partial ``merge_insert`` per batch, no vector read, nothing embedded.

The report counts documents and chunks as new / changed / metadata-only / unchanged / removed
(what the CLI's summary prints), and texts as encoded / reused (from current rows or from the
history). The counts compare with a :class:`Baseline` (issue 30: what is *published*, so a
re-run after a run killed between writing and publishing reports the edit it publishes, not
"0 changed"), by default the table's rows before this sync. A document with no chunks is new
when the baseline does not know it (a brand-new index never reports it "unchanged").

The row count it reports is read back from LanceDB after the last commit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from rag_assets.lib.index.embed import Embedder
from rag_assets.lib.index.metadata import CHUNK_META_COLUMNS, CHUNK_META_FIELDS, chunk_meta_values
from rag_assets.lib.index.store import IndexStore, chunk_schema, scan, sql_in, vectors
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.types import Chunk, ExtractedDocument, sha256_text

HISTORY_VERSIONS = 50
"""How many earlier versions of a chunk table (newest first) are searched for the vectors of
texts that no current row has, stopping as soon as every text is found. Each look-up is one
filtered scan of that version (content hash ``IN`` the missing hashes, vectors only for
matches); compaction's cleanup of old versions bounds what is there to search."""

FAILED_POLICIES = ("keep", "drop")
"""What happens to the rows of a document whose extraction now fails.

``keep`` (default): its last good rows stay searchable, and status lists it as failed; a file
caught mid-write by a scheduled run does not vanish from search. ``drop``: its rows are deleted.
"""


@dataclass(frozen=True)
class Baseline:
    """What a sync's counts compare with: ``rows`` (document -> chunk id -> content hash) and
    ``documents`` (every document it holds, those without chunks included)."""

    rows: dict[str, dict[str, str]]
    documents: frozenset[str]

    @classmethod
    def empty(cls) -> Baseline:
        return cls({}, frozenset())


@dataclass
class SyncReport:
    table: str
    version: int
    rows: int  # read back from LanceDB after the last commit
    embedded: int = 0  # texts sent through the encoder
    reused: int = 0  # written rows whose vectors were reused (current rows or the history)
    reused_from_history: int = 0  # of those, found only in an earlier table version
    documents_written: list[str] = field(default_factory=list)  # new + changed
    documents_new: list[str] = field(default_factory=list)  # no rows before this sync
    documents_changed: list[str] = field(default_factory=list)  # rows replaced
    documents_unchanged: list[str] = field(default_factory=list)
    documents_metadata: list[str] = field(default_factory=list)  # only metadata rewritten
    documents_deleted: list[str] = field(default_factory=list)  # rows deleted by this sync
    documents_removed: list[str] = field(default_factory=list)  # gone since the baseline
    documents_kept_failed: list[str] = field(default_factory=list)
    # chunks by (chunk id, content hash) against the rows before this sync
    chunks_new: int = 0  # chunk id not stored
    chunks_changed: int = 0  # chunk id stored with another text
    chunks_unchanged: int = 0  # same id, same text
    chunks_removed: int = 0  # stored ids no longer produced (kept rows of failed ones aside)
    chunks_metadata: int = 0  # same id, same text, new metadata (not counted as unchanged)
    commits: int = 0
    # issue 31: what happened, by text rather than by chunk id (an edit shifts the ids of every
    # later chunk of its document, not their texts): see :func:`_count_texts`
    rows_before: int = 0  # rows of the table before this sync
    version_before: int = 0  # its version then (1 for a table this sync created)
    reused_from_table: int = 0  # written rows whose text the table already held
    reused_in_run: int = 0  # written rows repeating a text encoded earlier in this sync
    texts: dict[str, int] = field(default_factory=dict)

    def as_metadata(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "table_version": self.version,
            "rows": self.rows,
            "embedded": self.embedded,
            "reused": self.reused,
            "reused_from_history": self.reused_from_history,
            "documents_written": len(self.documents_written),
            "documents_new": len(self.documents_new),
            "documents_changed": len(self.documents_changed),
            "documents_unchanged": len(self.documents_unchanged),
            "documents_metadata": len(self.documents_metadata),
            "documents_deleted": len(self.documents_removed),  # against the baseline
            "documents_kept_failed": len(self.documents_kept_failed),
            "chunks_new": self.chunks_new,
            "chunks_changed": self.chunks_changed,
            "chunks_unchanged": self.chunks_unchanged,
            "chunks_removed": self.chunks_removed,
            "chunks_metadata": self.chunks_metadata,
            "commits": self.commits,
            "rows_before": self.rows_before,
            "version_before": self.version_before,
            "reused_from_table": self.reused_from_table,
            "reused_in_run": self.reused_in_run,
            **self.texts,
        }


def sync_chunks(
    store: IndexStore,
    stamps: Stamps,
    chunks: Sequence[Chunk],
    documents: Sequence[ExtractedDocument],
    embedder: Embedder,
    *,
    failed_policy: str = "keep",
    batch_rows: int = 256,
    progress: Callable[[int, int], None] | None = None,
    embed_progress: Callable[[int, int], None] | None = None,
    baseline: Baseline | None = None,
) -> SyncReport:
    """Bring the stamped table in line with ``chunks`` (see the module docstring); the report's
    counts compare with ``baseline`` (default: the table's rows before this sync).
    ``progress(rows written, rows to write)`` follows the commits; ``embed_progress(texts
    encoded, texts to encode)`` (issue 31) the encoder, a few batches at a time."""
    if failed_policy not in FAILED_POLICIES:
        raise ValueError(f"failed policy must be one of {FAILED_POLICIES}, not {failed_policy!r}")
    tbl = store.chunk_table(stamps)
    by_doc: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        by_doc[c.document_id].append(c)
    docs = {d.document_id: d for d in documents}
    stored: dict[str, dict[str, str]] = defaultdict(dict)
    stored_meta: dict[str, set[str | None]] = defaultdict(set)  # a document's meta_hash values
    for r in scan(tbl, ["chunk_id", "document_id", "content_hash", "meta_hash"]).to_pylist():
        stored[r["document_id"]][r["chunk_id"]] = r["content_hash"]
        stored_meta[r["document_id"]].add(r["meta_hash"])

    base = baseline or Baseline(dict(stored), frozenset(stored))
    report = SyncReport(table=tbl.name, version=int(tbl.version), rows=0)
    report.version_before = report.version
    to_write: list[str] = []
    relabel: list[str] = []  # issue 34: same chunks, new metadata
    meta_only: list[str] = []  # of those, the ones the baseline holds with the same chunks
    for doc_id in sorted(d.document_id for d in documents if d.ok):
        want = {c.chunk_id: sha256_text(c.text) for c in by_doc.get(doc_id, [])}
        if want != stored.get(doc_id, {}):  # what to write: against the rows in the table
            to_write.append(doc_id)
        elif want and stored_meta[doc_id] != {chunk_meta_values(docs[doc_id])["meta_hash"]}:
            relabel.append(doc_id)  # issue 34: same chunks, new metadata: nothing embedded
        if doc_id not in base.rows and doc_id not in base.documents:  # what to report
            report.documents_new.append(doc_id)
        elif want == base.rows.get(doc_id, {}):
            if not relabel or relabel[-1] != doc_id:
                report.documents_unchanged.append(doc_id)
            else:
                meta_only.append(doc_id)  # reported as documents_metadata once relabelled
        else:
            report.documents_changed.append(doc_id)
    failed = {d.document_id for d in documents if d.status == "failed"}  # not skipped links
    keep = failed if failed_policy == "keep" else set()
    report.documents_kept_failed = sorted(keep & set(stored))
    ok_now = {d for d in docs if docs[d].ok}
    gone = sorted(set(stored) - ok_now - keep)
    report.documents_removed = sorted((set(base.rows) | base.documents) - ok_now - keep)
    _count_chunks(report, base.rows, by_doc, {d.document_id for d in documents if d.ok}, keep)
    report.rows_before = sum(len(rows) for rows in stored.values())
    report.chunks_metadata = sum(len(by_doc[d]) for d in meta_only)
    report.chunks_unchanged -= report.chunks_metadata

    total = sum(len(by_doc[d]) for d in to_write)
    done = 0
    # texts no current row has: looked up once in the table's history (not once per batch)
    have = {h for rows in stored.values() for h in rows.values()}
    missing = {sha256_text(c.text) for d in to_write for c in by_doc[d]} - have
    history = _from_history(store, tbl, missing, stamps) if missing else {}
    texts = _TextCount(have, history, set(report.documents_new))
    on_encoded = None
    if embed_progress is not None:  # issue 31: texts encoded out of the texts to encode
        to_encode, encoded = len(missing - history.keys()), [0]

        def on_encoded(n: int) -> None:
            encoded[0] += n
            embed_progress(encoded[0], max(to_encode, encoded[0]))

    for batch in _batches(to_write, by_doc, batch_rows):
        batch_chunks = [c for d in batch for c in by_doc[d]]
        vectors, embedded, from_history = _vectors_for(
            store, tbl, batch_chunks, embedder, stamps, history, on_encoded
        )
        rows = _rows(batch_chunks, vectors, docs, stamps)
        (
            tbl.merge_insert("chunk_id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete(sql_in("document_id", batch))
            .execute(rows)
        )
        report.commits += 1
        texts.add(batch_chunks)
        report.embedded += embedded
        report.reused += len(batch_chunks) - embedded
        report.reused_from_history += from_history
        report.documents_written.extend(batch)
        done += len(batch_chunks)
        if progress:
            progress(done, total)
    for batch in _batches(relabel, by_doc, METADATA_BATCH_ROWS):  # issue 34: no vectors
        rows = _meta_rows([c for d in batch for c in by_doc[d]], docs)
        tbl.merge_insert("chunk_id").when_matched_update_all().execute(rows)
        report.commits += 1
        report.documents_metadata.extend(batch)
    if gone:
        tbl.delete(sql_in("document_id", gone))
        report.commits += 1
        report.documents_deleted = gone
    report.reused_from_table = texts.counts["table"]
    report.reused_in_run = texts.counts["run"]
    report.texts = _count_texts(texts, report, stored, by_doc, gone)
    report.version = int(tbl.version)
    report.rows = int(tbl.count_rows())
    return report


METADATA_BATCH_ROWS = 50_000
"""Rows per commit of a metadata-only update (a partial ``merge_insert`` of the metadata
columns: an access change under a folder of many documents is a few commits, not one per
document)."""


def _meta_rows(chunks: list[Chunk], docs: dict[str, ExtractedDocument]) -> pa.Table:
    """``chunk_id`` and the metadata columns of ``chunks`` (a partial update's source rows)."""
    values = {d: chunk_meta_values(docs[d]) for d in {c.document_id for c in chunks}}
    cols: dict[str, Any] = {"chunk_id": [c.chunk_id for c in chunks]}
    for name in CHUNK_META_COLUMNS:
        cols[name] = [values[c.document_id][name] for c in chunks]
    schema = pa.schema([pa.field("chunk_id", pa.string()), *CHUNK_META_FIELDS])
    return pa.table(cols, schema=schema)


def _batches(
    doc_ids: list[str], by_doc: dict[str, list[Chunk]], batch_rows: int
) -> list[list[str]]:
    """Group whole documents into commits of about ``batch_rows`` rows (never split one)."""
    batches: list[list[str]] = []
    current: list[str] = []
    size = 0
    for d in doc_ids:
        n = len(by_doc.get(d, []))
        if current and size + n > batch_rows:
            batches.append(current)
            current, size = [], 0
        current.append(d)
        size += n
    if current:
        batches.append(current)
    return batches


def _count_chunks(
    report: SyncReport,
    stored: dict[str, dict[str, str]],
    by_doc: dict[str, list[Chunk]],
    ok: set[str],
    keep: set[str],
) -> None:
    """New / changed / unchanged / removed chunks: the wanted (id, hash) pairs of the documents
    extracted now against the stored ones (the kept rows of failed documents are neither)."""
    before = {cid: h for doc, rows in stored.items() if doc not in keep for cid, h in rows.items()}
    after = {c.chunk_id: sha256_text(c.text) for d in ok for c in by_doc.get(d, [])}
    for cid, h in after.items():
        if cid not in before:
            report.chunks_new += 1
        elif before[cid] != h:
            report.chunks_changed += 1
        else:
            report.chunks_unchanged += 1
    report.chunks_removed = sum(1 for cid in before if cid not in after)


class _TextCount:
    """Where each written row's vector comes from, by text: ``table`` (a text the table held
    before the sync), ``history`` (an earlier table version), ``encoded`` (first seen in this
    sync), ``run`` (a text encoded earlier in this sync); per kind of document (new/changed)."""

    def __init__(self, have: set[str], history: dict[str, Any], new_docs: set[str]) -> None:
        self.have, self.history, self.new_docs = have, history, new_docs
        self.seen: set[str] = set()
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, chunks: Sequence[Chunk]) -> None:
        for c in chunks:
            h = sha256_text(c.text)
            if h in self.have:
                where = "table"
            elif h in self.history:
                where = "history"
            elif h in self.seen:
                where = "run"
            else:
                self.seen.add(h)
                where = "encoded"
            self.counts[where] += 1
            self.counts[("new" if c.document_id in self.new_docs else "changed") + "/" + where] += 1


def _count_texts(
    count: _TextCount,
    report: SyncReport,
    stored: dict[str, dict[str, str]],
    by_doc: dict[str, list[Chunk]],
    gone: list[str],
) -> dict[str, int]:
    """The chunks of this sync by what happened to their text (issue 31; the summary's
    ``chunks:`` line): in new documents; in changed documents re-embedded (a text no vector
    existed for), from an earlier table version, or reused (a vector the table or this run
    already had), and the stored texts a changed document no longer has; in unchanged
    documents; and the rows removed with deleted documents."""
    c = count.counts
    dropped = 0
    for d in report.documents_changed:
        now = {sha256_text(ch.text) for ch in by_doc.get(d, [])}
        dropped += sum(1 for h in stored.get(d, {}).values() if h not in now)
    return {
        "chunks_in_new_documents": sum(len(by_doc.get(d, [])) for d in report.documents_new),
        "changed_documents_reembedded": c["changed/encoded"],
        "changed_documents_from_history": c["changed/history"],
        "changed_documents_reused": c["changed/table"] + c["changed/run"],
        "changed_documents_dropped": dropped,
        "chunks_in_unchanged_documents": sum(
            len(by_doc.get(d, [])) for d in report.documents_unchanged
        ),
        "chunks_of_deleted_documents": sum(len(stored.get(d, {})) for d in gone),
    }


def _stamp_filter(stamps: Stamps) -> str:
    """The rows of an earlier table version whose vectors may be reused: written with these
    stamps (model, revision, dims, normalisation, pipeline)."""

    def q(v: str) -> str:
        return "'" + v.replace("'", "''") + "'"

    return (
        f"model = {q(stamps.model)} AND model_revision = {q(stamps.revision)} AND "
        f"dims = {int(stamps.dims)} AND normalized = {str(bool(stamps.normalized)).lower()} AND "
        f"pipeline_version = {q(stamps.pipeline)}"
    )


def _known_vectors(tbl: Any, hashes: set[str], dims: int, where: str = "") -> dict[str, Any]:
    if not hashes:
        return {}
    cond = sql_in("content_hash", hashes) + (f" AND {where}" if where else "")
    old = scan(tbl, ["content_hash", "vector"], where=cond)
    matrix = vectors(old["vector"], dims)
    return dict(zip(old["content_hash"].to_pylist(), matrix, strict=True))


def _from_history(store: IndexStore, tbl: Any, missing: set[str], stamps: Stamps) -> dict[str, Any]:
    """Vectors of ``missing`` hashes from earlier versions of ``tbl`` (newest first, at most
    :data:`HISTORY_VERSIONS`), rows with matching stamps only."""
    found: dict[str, Any] = {}
    current = int(tbl.version)
    try:
        versions = sorted((int(v["version"]) for v in tbl.list_versions()), reverse=True)
    except (AttributeError, KeyError, TypeError, ValueError):  # an engine without the listing
        return found
    where = _stamp_filter(stamps)
    for v in [v for v in versions if v < current][:HISTORY_VERSIONS]:
        if not missing - found.keys():
            break
        try:
            old = store.open_table(tbl.name, v)
            found.update(_known_vectors(old, missing - found.keys(), stamps.dims, where))
        except Exception:  # noqa: BLE001 - a version cleaned up meanwhile (LanceDB raises several)
            continue
    return found


def _vectors_for(
    store: IndexStore,
    tbl: Any,
    chunks: list[Chunk],
    embedder: Embedder,
    stamps: Stamps,
    history: dict[str, Any] | None = None,
    on_encoded: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, int, int]:
    """Vectors for ``chunks``: reused from stored rows with the same text hash (the current
    version, then the table's history: ``history`` when looked up already, else here), else
    encoded. Returns (vectors, texts encoded, rows whose vector came from the history)."""
    hashes = [sha256_text(c.text) for c in chunks]
    known: dict[str, np.ndarray] = {}
    if tbl.count_rows() and hashes:
        known.update(_known_vectors(tbl, set(hashes), embedder.dims))
    missing = set(hashes) - known.keys()
    if history is None:
        history = _from_history(store, tbl, missing, stamps) if missing else {}
    known.update({h: history[h] for h in missing if h in history})
    todo = sorted(
        {h: c.text for h, c in zip(hashes, chunks, strict=True) if h not in known}.items()
    )
    if todo:
        texts = [t for _, t in todo]
        if on_encoded is None:
            fresh = embedder.encode(texts)
        else:
            fresh = embedder.encode(texts, progress=on_encoded)
        for (h, _), v in zip(todo, fresh, strict=True):
            known[h] = v
    out = np.stack([known[h] for h in hashes]) if hashes else np.zeros((0, embedder.dims))
    from_history = sum(1 for h in hashes if h in missing and h in history)
    return out.astype(np.float32), len(todo), from_history


def _rows(
    chunks: list[Chunk], vectors: np.ndarray, docs: dict[str, ExtractedDocument], stamps: Stamps
) -> pa.Table:
    norms = np.linalg.norm(vectors, axis=1) if len(vectors) else np.zeros(0)
    if len(vectors) and (vectors.shape[1] != stamps.dims or np.abs(norms - 1).max() >= 1e-5):
        raise ValueError(
            f"vectors must be L2-normalised with {stamps.dims} dims; got shape {vectors.shape}, "
            f"max |norm-1| = {float(np.abs(norms - 1).max()):.2e}"
        )
    schema = chunk_schema(stamps)
    n = len(chunks)
    cols: dict[str, Any] = {
        "chunk_id": [c.chunk_id for c in chunks],
        "document_id": [c.document_id for c in chunks],
        "document_title": [docs[c.document_id].title for c in chunks],
        "document_kind": [docs[c.document_id].kind for c in chunks],
        "content_hash": [sha256_text(c.text) for c in chunks],
        "text": [c.text for c in chunks],
        "content": [c.content for c in chunks],
        "section": [c.section for c in chunks],
        "from": [c.start for c in chunks],
        "to": [c.end for c in chunks],
        "page": [c.page for c in chunks],
        "model": [stamps.model] * n,
        "model_revision": [stamps.revision] * n,
        "dims": [stamps.dims] * n,
        "normalized": [stamps.normalized] * n,
        "pipeline_version": [stamps.pipeline] * n,
        "extractor_version": [docs[c.document_id].extractor_version for c in chunks],
        "vector": pa.FixedSizeListArray.from_arrays(
            pa.array(vectors.reshape(-1), type=pa.float32()), stamps.dims
        ),
    }
    values = {d: chunk_meta_values(docs[d]) for d in {c.document_id for c in chunks}}
    for name in CHUNK_META_COLUMNS:  # issue 34: the document's metadata on each of its rows
        cols[name] = [values[c.document_id][name] for c in chunks]
    return pa.table(cols, schema=schema)
