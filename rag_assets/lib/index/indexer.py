"""Incremental, crash-safe writing of chunk embeddings into a stamped LanceDB table.

``sync_chunks`` makes the table for a stamp set hold exactly the chunks given (plus, under the
``keep`` policy, the last good rows of documents whose extraction now fails):

- a document whose (chunk id, content hash) set is already stored is left alone;
- a changed document's rows are replaced in one ``merge_insert`` commit per batch of whole
  documents; vectors of unchanged texts are reused, only new texts are embedded;
- documents gone from the folder lose their rows in one delete commit.

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
from rag_assets.lib.index.store import IndexStore, chunk_schema, scan, sql_in, vectors
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.types import Chunk, ExtractedDocument, sha256_text

FAILED_POLICIES = ("keep", "drop")
"""What happens to the rows of a document whose extraction now fails.

``keep`` (default): its last good rows stay searchable, and status lists it as failed; a file
caught mid-write by a scheduled run does not vanish from search. ``drop``: its rows are deleted.
"""


@dataclass
class SyncReport:
    table: str
    version: int
    rows: int  # read back from LanceDB after the last commit
    embedded: int = 0  # texts sent through the encoder
    reused: int = 0  # rows whose vectors were reused
    documents_written: list[str] = field(default_factory=list)
    documents_unchanged: list[str] = field(default_factory=list)
    documents_deleted: list[str] = field(default_factory=list)
    documents_kept_failed: list[str] = field(default_factory=list)
    commits: int = 0

    def as_metadata(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "table_version": self.version,
            "rows": self.rows,
            "embedded": self.embedded,
            "reused": self.reused,
            "documents_written": len(self.documents_written),
            "documents_unchanged": len(self.documents_unchanged),
            "documents_deleted": len(self.documents_deleted),
            "documents_kept_failed": len(self.documents_kept_failed),
            "commits": self.commits,
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
) -> SyncReport:
    """Bring the stamped table in line with ``chunks`` (see the module docstring)."""
    if failed_policy not in FAILED_POLICIES:
        raise ValueError(f"failed policy must be one of {FAILED_POLICIES}, not {failed_policy!r}")
    tbl = store.chunk_table(stamps)
    by_doc: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        by_doc[c.document_id].append(c)
    docs = {d.document_id: d for d in documents}
    stored: dict[str, dict[str, str]] = defaultdict(dict)
    for r in scan(tbl, ["chunk_id", "document_id", "content_hash"]).to_pylist():
        stored[r["document_id"]][r["chunk_id"]] = r["content_hash"]

    report = SyncReport(table=tbl.name, version=int(tbl.version), rows=0)
    to_write: list[str] = []
    for doc_id in sorted(d.document_id for d in documents if d.ok):
        want = {c.chunk_id: sha256_text(c.text) for c in by_doc.get(doc_id, [])}
        if want == stored.get(doc_id, {}):
            report.documents_unchanged.append(doc_id)
        else:
            to_write.append(doc_id)
    failed = {d.document_id for d in documents if d.status == "failed"}  # not skipped links
    keep = failed if failed_policy == "keep" else set()
    report.documents_kept_failed = sorted(keep & set(stored))
    gone = sorted(set(stored) - {d for d in docs if docs[d].ok} - keep)

    total = sum(len(by_doc[d]) for d in to_write)
    done = 0
    for batch in _batches(to_write, by_doc, batch_rows):
        batch_chunks = [c for d in batch for c in by_doc[d]]
        vectors, embedded = _vectors_for(tbl, batch, batch_chunks, embedder)
        rows = _rows(batch_chunks, vectors, docs, stamps)
        (
            tbl.merge_insert("chunk_id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete(sql_in("document_id", batch))
            .execute(rows)
        )
        report.commits += 1
        report.embedded += embedded
        report.reused += len(batch_chunks) - embedded
        report.documents_written.extend(batch)
        done += len(batch_chunks)
        if progress:
            progress(done, total)
    if gone:
        tbl.delete(sql_in("document_id", gone))
        report.commits += 1
        report.documents_deleted = gone
    report.version = int(tbl.version)
    report.rows = int(tbl.count_rows())
    return report


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


def _vectors_for(
    tbl: Any, doc_ids: list[str], chunks: list[Chunk], embedder: Embedder
) -> tuple[np.ndarray, int]:
    """Vectors for ``chunks``: reused from stored rows with the same text hash, else encoded."""
    hashes = [sha256_text(c.text) for c in chunks]
    known: dict[str, np.ndarray] = {}
    if tbl.count_rows() and hashes:
        old = scan(tbl, ["content_hash", "vector"], where=sql_in("content_hash", hashes))
        matrix = vectors(old["vector"], embedder.dims)
        for h, v in zip(old["content_hash"].to_pylist(), matrix, strict=True):
            known[h] = v
    todo = sorted(
        {h: c.text for h, c in zip(hashes, chunks, strict=True) if h not in known}.items()
    )
    if todo:
        fresh = embedder.encode([t for _, t in todo])
        for (h, _), v in zip(todo, fresh, strict=True):
            known[h] = v
    out = np.stack([known[h] for h in hashes]) if hashes else np.zeros((0, embedder.dims))
    return out.astype(np.float32), len(todo)


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
    return pa.table(cols, schema=schema)
