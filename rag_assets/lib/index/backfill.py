"""Fan-out embedding (issue 13), Dagster-free: plan document batches, write each batch's rows in
one commit (any worker, any order, retried freely), then complete the table exactly as the
single-run path (:func:`rag_assets.lib.index.pipeline.embed_chunks`) leaves it.

- :func:`plan_batches` groups whole documents (sorted by id) into batches of about
  ``batch_rows`` chunks; a batch's key derives from its document ids, so the same corpus plans
  the same keys on every machine.
- :func:`write_batch` embeds the chunks of one batch (reusing stored vectors whose text hash is
  unchanged, as the single run does) and replaces those documents' rows in one ``merge_insert``
  commit; a batch already stored as planned is not written again.
- :func:`complete` refuses while a planned document's rows are missing or stale (naming the
  batches to re-run), then runs the single-run sync over the now complete table: it embeds
  nothing, removes documents that left the corpus, builds the ANN index (above
  ``ANN_MIN_ROWS``) and BM25, and records the manifest, so both paths give the same table.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np

from rag_assets.lib.index.embed import Embedder
from rag_assets.lib.index.indexer import SyncReport, _batches, _rows, _vectors_for
from rag_assets.lib.index.pipeline import digest, embed_chunks
from rag_assets.lib.index.store import IndexStore, Published, scan, sql_in
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.types import Chunk, ExtractedDocument, sha256_text

BACKFILL_BATCH_ROWS = 2048
"""Chunks per batch (one run, one commit each): about a minute of CPU encoding for MiniLM on
one core, few enough commits that a 1 M-chunk backfill makes ~500 table versions."""


@dataclass(frozen=True)
class Batch:
    key: str  # "<index>-<hash of the document ids>": a Dagster partition key
    document_ids: tuple[str, ...]
    rows: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_batches(
    documents: Sequence[ExtractedDocument],
    chunks: Sequence[Chunk],
    batch_rows: int = BACKFILL_BATCH_ROWS,
) -> list[Batch]:
    """The batches of the ok documents (whole documents, sorted by id, ~``batch_rows`` rows)."""
    by_doc = _by_doc(chunks)
    ok = sorted(d.document_id for d in documents if d.ok)
    out = []
    for i, ids in enumerate(_batches(ok, by_doc, batch_rows)):
        rows = sum(len(by_doc.get(d, [])) for d in ids)
        out.append(Batch(f"{i:05d}-{digest(ids)[:10]}", tuple(ids), rows))
    return out


def write_batch(
    store: IndexStore,
    stamps: Stamps,
    batch: Batch,
    chunks: Sequence[Chunk],
    documents: Sequence[ExtractedDocument],
    embedder: Embedder,
) -> dict[str, int]:
    """Embed and store one batch in one commit; ``{"rows", "embedded", "reused", "version",
    "commits"}`` (no commit when the batch is already stored as planned)."""
    tbl = store.chunk_table(stamps)
    ids = list(batch.document_ids)
    by_doc = _by_doc(chunks)
    batch_chunks = [c for d in ids for c in by_doc.get(d, [])]
    want = {c.chunk_id: sha256_text(c.text) for c in batch_chunks}
    have = {
        r["chunk_id"]: r["content_hash"]
        for r in scan(tbl, ["chunk_id", "content_hash"], sql_in("document_id", ids)).to_pylist()
    }
    if want == have:
        return {"rows": len(want), "embedded": 0, "reused": len(want), "version": tbl.version,
                "commits": 0}  # fmt: skip
    docs = {d.document_id: d for d in documents}
    vectors, embedded, _ = _vectors_for(store, tbl, batch_chunks, embedder, stamps)
    (
        tbl.merge_insert("chunk_id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete(sql_in("document_id", ids))
        .execute(_rows(batch_chunks, vectors, docs, stamps))
    )
    return {
        "rows": len(batch_chunks),
        "embedded": embedded,
        "reused": len(batch_chunks) - embedded,
        "version": int(tbl.version),
        "commits": 1,
    }


def missing_batches(
    store: IndexStore, stamps: Stamps, batches: Sequence[Batch], chunks: Sequence[Chunk]
) -> list[str]:
    """Keys of the batches whose rows are not (all, or not as planned) in the table."""
    if stamps.table_name not in store.table_names():
        return [b.key for b in batches]
    tbl = store.chunk_table(stamps, create=False)
    have = {
        r["chunk_id"]: r["content_hash"]
        for r in scan(tbl, ["chunk_id", "content_hash"]).to_pylist()
    }
    by_doc = _by_doc(chunks)
    return [
        b.key
        for b in batches
        if any(
            have.get(c.chunk_id) != sha256_text(c.text)
            for d in b.document_ids
            for c in by_doc.get(d, [])
        )
    ]


class _NoEncoding:
    """Stands in for the embedder once every batch is stored: encoding anything is a bug."""

    def __init__(self, embedder: Any) -> None:
        self._embedder = embedder

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError(f"backfill: {len(texts)} chunks were not embedded by any batch")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._embedder, name)


def complete(
    store: IndexStore,
    stamps: Stamps,
    batches: Sequence[Batch],
    chunks: Sequence[Chunk],
    documents: Sequence[ExtractedDocument],
    embedder: Any,
    *,
    failed_policy: str = "keep",
) -> tuple[SyncReport, Published]:
    """Finish the table once every batch is stored (else ``RuntimeError`` naming the batches to
    re-run); returns what :func:`embed_chunks` returns for the single run."""
    missing = missing_batches(store, stamps, batches, chunks)
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise RuntimeError(
            f"backfill: {len(missing)} of {len(batches)} batches are not stored yet ({shown}); "
            "materialise those partitions of embedding_batch, then run this step again"
        )
    return embed_chunks(
        store,
        stamps,
        chunks,
        documents,
        cast(Embedder, _NoEncoding(embedder)),
        failed_policy=failed_policy,
    )


def _by_doc(chunks: Sequence[Chunk]) -> dict[str, list[Chunk]]:
    by_doc: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        by_doc[c.document_id].append(c)
    return by_doc
