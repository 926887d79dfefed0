"""The stages end to end, without Dagster, plus the intermediate artefacts they hand on.

The Dagster assets call these same functions one stage at a time; the CLI's ``eval`` and
``bench`` call :func:`build_index` to make an index for any folder.

Artefacts (Parquet via pyarrow): ``extracted/documents.parquet`` (every document with its
canonical text, status and reason) and ``chunks/<pipeline>.parquet`` (the chunks of one pipeline
version), under the work directory; the Dagster graph keeps them where
:mod:`rag_assets.lib.index.artefacts` says (an object-store index: in the bucket, issue 42).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rag_assets.lib.index.ann import ensure_vector_index
from rag_assets.lib.index.embed import Embedder
from rag_assets.lib.index.indexer import Baseline, SyncReport, sync_chunks
from rag_assets.lib.index.lexical import BM25Index, ensure_fts_index, uses_native_fts
from rag_assets.lib.index.metadata import ensure_filter_indexes
from rag_assets.lib.index.store import IndexStore, Published, now_iso, scan
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import ChunkStrategy, chunk_documents
from rag_assets.lib.ingest.extract import EXTRACTOR_SUITE_VERSION, FolderExtraction, extract_folder
from rag_assets.lib.types import Chunk, ExtractedDocument, sha256_text


def extractor_suite_version() -> str:
    """One string for all extractors' versions (a table-level stamp)."""
    return EXTRACTOR_SUITE_VERSION


def digest(obj: Any) -> str:
    """Stable short hash of a JSON-able object (data versions, cache keys)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


# -- artefacts ---------------------------------------------------------------------------------
DOCUMENTS_FILE = "extracted/documents.parquet"
MANIFEST_FILE = "extracted/manifest.json"


def save_documents(work_dir: str | Path, docs: Sequence[ExtractedDocument]) -> Path:
    path = Path(work_dir) / DOCUMENTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_parquet(documents_table(docs), path)
    (Path(work_dir) / MANIFEST_FILE).write_text(manifest_text(docs))
    return path


def load_documents(work_dir: str | Path) -> list[ExtractedDocument]:
    path = Path(work_dir) / DOCUMENTS_FILE
    if not path.exists():
        return []
    return documents_from_table(pq.read_table(path))


def documents_table(docs: Sequence[ExtractedDocument]) -> pa.Table:
    """The extracted documents as the Parquet table the artefact holds."""
    rows = [_document_record(d) for d in docs]
    return pa.Table.from_pylist(rows) if rows else pa.table({})


def documents_from_table(table: pa.Table) -> list[ExtractedDocument]:
    out = []
    for r in table.to_pylist():
        r["headings"] = json.loads(r["headings"])
        for key in ("front_matter", "metadata"):  # JSON text (files before issue 34: none)
            r[key] = json.loads(r.get(key) or "{}")
        out.append(ExtractedDocument.from_dict(r))
    return out


def manifest_text(docs: Sequence[ExtractedDocument]) -> str:
    """``extracted/manifest.json``: one row per document (status, reason), for people."""
    return json.dumps([d.manifest_row() for d in docs], indent=2)


def _document_record(d: ExtractedDocument) -> dict[str, Any]:
    """One Parquet row: nested fields (headings, metadata) as JSON text."""
    row = d.to_dict()
    for key in ("headings", "front_matter", "metadata"):
        row[key] = json.dumps(row[key], ensure_ascii=False)
    return row


def chunks_file(pipeline: str) -> str:
    """The chunks artefact of one pipeline version, relative to the artefacts' root."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in pipeline)
    return f"chunks/{safe}.parquet"


def chunks_path(work_dir: str | Path, pipeline: str) -> Path:
    return Path(work_dir) / chunks_file(pipeline)


def save_chunks(work_dir: str | Path, pipeline: str, chunks: Sequence[Chunk]) -> Path:
    path = chunks_path(work_dir, pipeline)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_parquet(chunks_table(chunks), path)
    return path


def chunks_table(chunks: Sequence[Chunk]) -> pa.Table:
    """The chunks as the Parquet table the artefact holds."""
    schema = pa.schema(
        [
            ("chunk_id", pa.string()),
            ("document_id", pa.string()),
            ("section", pa.string()),
            ("start", pa.int64()),
            ("end", pa.int64()),
            ("content", pa.string()),
            ("text", pa.string()),
            ("page", pa.int32()),
        ]
    )
    return pa.Table.from_pylist([c.__dict__ for c in chunks], schema=schema)


def chunks_from_table(table: pa.Table) -> list[Chunk]:
    return [Chunk(**r) for r in table.to_pylist()]


def load_chunks(work_dir: str | Path, pipeline: str) -> list[Chunk]:
    path = chunks_path(work_dir, pipeline)
    if not path.exists():
        raise FileNotFoundError(f"no chunks for pipeline {pipeline} at {path}: materialise chunks")
    return chunks_from_table(pq.read_table(path))


def _write_parquet(table: pa.Table, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)  # atomic: readers see the old file or the new one


def extraction_data_version(docs: Sequence[ExtractedDocument]) -> str:
    """Content-based: the extracted texts of ok documents only (failures change nothing), and
    their metadata (issue 34: a ``.ragmeta`` or front-matter change is a new version too)."""
    from rag_assets.lib.ingest.metadata import metadata_digest

    return digest(
        {
            "extractor": extractor_suite_version(),
            "texts": {d.document_id: d.text_hash for d in docs if d.ok},
            "metadata": {d.document_id: metadata_digest(d.metadata) for d in docs if d.ok},
        }
    )


def chunks_data_version(pipeline: str, chunks: Sequence[Chunk]) -> str:
    return digest(
        {"pipeline": pipeline, "chunks": [(c.chunk_id, sha256_text(c.text)) for c in chunks]}
    )


def build_bm25(store: IndexStore, table: str, version: int, stamps: dict[str, Any]) -> str:
    """Build and persist the BM25 index of one table version (kept if already there): a
    directory beside the tables, or rows of ``_rag_bm25`` on object storage (issue 13). A
    version searched through its native full-text index (:func:`uses_native_fts`, issue 23)
    needs none: that index is part of the table."""
    if store.has_bm25(table, version):
        return store.bm25_location(table, version)
    tbl = store.open_table(table, version)
    if uses_native_fts(tbl, int(tbl.count_rows())):
        return f"native full-text index of {table}@{version}"
    rows = scan(tbl, ["chunk_id", "text"])
    index = BM25Index.build(
        rows["chunk_id"].to_pylist(),
        rows["text"].to_pylist(),
        stamps={**stamps, "table": table, "version": version},
    )
    return store.save_bm25(index, table, version)


# -- the folder an index is built from (issue 22) ---------------------------------------------
SOURCE_KEY = "source"
"""The manifest field naming what a table version was built from: ``{"documents": absolute
folder, "strategy": chunking strategy name, "target": its target}``. The published version's
record is the index's folder; ``status`` shows it, and a run from another folder is refused
(:func:`check_source`) unless forced."""

FORCE_FOLDER_TAG = "rag/force-folder"
"""A Dagster run tag: "1" (e.g. set in the UI's launchpad) lets that one run replace the folder an
index is built from, like ``RAG_FORCE_FOLDER=1`` or ``rag-assets index --force-folder``."""

FORCE_HINT = f"--force-folder (RAG_FORCE_FOLDER=1, or the run tag {FORCE_FOLDER_TAG}=1)"
"""What the refusal names to replace an index's folder on purpose."""


class FolderMismatch(ValueError):
    """A run would publish another documents folder into an index built from one."""


@dataclass(frozen=True)
class IndexSource:
    """What an index is built from: the documents folder (resolved) and the chunking."""

    documents: str
    strategy: str
    target: int

    @classmethod
    def of(cls, documents: str | Path, strategy: ChunkStrategy) -> IndexSource:
        """``documents``: a folder, or (issue 41) a sources file or location as
        :func:`~rag_assets.lib.ingest.sources.config.documents_label` writes it."""
        text = str(documents)
        if "://" in text or text.startswith("sources:"):
            return cls(text, strategy.name, strategy.target)
        return cls(str(Path(documents).expanduser().resolve()), strategy.name, strategy.target)

    def as_dict(self) -> dict[str, Any]:
        return {"documents": self.documents, "strategy": self.strategy, "target": self.target}


def recorded_source(store: IndexStore) -> IndexSource | None:
    """The source recorded with the published table version (else the one just embedded);
    None for an empty index or one built before sources were recorded."""
    from rag_assets.lib.index.store import PointerDamaged

    entries: list[Published] = []
    try:
        pub = store.published()
    except PointerDamaged:
        pub = None
    if pub is not None:
        entries.append(pub)
    else:
        with contextlib.suppress(FileNotFoundError, PointerDamaged):  # nothing embedded yet
            entries.append(store.staging())
    for entry in entries:
        src = (store.manifest(entry) or {}).get(SOURCE_KEY)
        if isinstance(src, dict) and isinstance(src.get("documents"), str):
            return IndexSource(
                src["documents"], str(src.get("strategy", "")), int(src.get("target", 0))
            )
    return None


def check_source(store: IndexStore, source: IndexSource, force: bool = False) -> None:
    """Refuse (one line, :class:`FolderMismatch`) to write ``source``'s folder into an index
    whose recorded folder is another one, unless ``force``. A strategy change is allowed: it
    writes another table, and the index's folder stays the same."""
    recorded = recorded_source(store)
    if force or recorded is None or recorded.documents == source.documents:
        return
    raise FolderMismatch(
        f"index {store.uri} is built from {recorded.documents} (strategy {recorded.strategy}); "
        f"this run would publish {source.documents} into it: pass --documents "
        f"{recorded.documents} (or set RAG_DOCUMENTS_DIR), use another --index, or replace "
        f"its folder with {FORCE_HINT}"
    )


def change_kind(report: SyncReport) -> str:
    """What a sync changed in its table (recorded in the pointer and the history, issue 34):
    ``content`` (texts written or rows removed), ``metadata`` (only documents' metadata
    rewritten: nothing embedded), or ``none``."""
    if report.documents_written or report.documents_deleted:
        return "content"
    return "metadata" if report.documents_metadata else "none"


# -- whole pipeline -----------------------------------------------------------------------------
@dataclass
class BuildResult:
    extraction: FolderExtraction
    chunks: list[Chunk]
    stamps: Stamps
    sync: SyncReport
    entry: Published  # pointer to the table version just written (published if asked)


def index_folder(
    documents_dir: str | Path,
    index_uri: str | Path | IndexStore,
    strategy: ChunkStrategy,
    embedder: Embedder,
    *,
    failed_policy: str = "keep",
    publish: bool = True,
    threshold: float | None = None,
    batch_rows: int = 256,
    progress: Callable[[int, int], None] | None = None,
    expand: Callable[[list[Chunk]], tuple[Any, dict[str, list[str]]]] | None = None,
) -> BuildResult:
    """Extract, chunk, embed (incrementally) and optionally publish one folder into one index.

    ``expand`` (issue 15, doc2query): chunks → (ExpansionStamp, chunk id → questions); the
    table's pipeline stamp then carries the expansion and its views are written beside it.
    ``index_uri`` may be an open :class:`IndexStore` (e.g. one with object-store options)."""
    store = index_uri if isinstance(index_uri, IndexStore) else IndexStore(index_uri)
    source = IndexSource.of(documents_dir, strategy)  # recorded; the graph and CLI check it
    extraction = extract_folder(Path(documents_dir))
    docs = extraction.documents
    chunks = chunk_documents(docs, strategy)
    expansion, questions = expand(chunks) if expand is not None else (None, {})
    from rag_assets.lib.index.expand import expanded_pipeline

    pipeline = expanded_pipeline(strategy.pipeline_version, expansion)
    stamps = embedder.stamps(pipeline, extractor_suite_version())
    report, entry = embed_chunks(
        store,
        stamps,
        chunks,
        docs,
        embedder,
        failed_policy=failed_policy,
        batch_rows=batch_rows,
        progress=progress,
        source=source,
    )
    if expansion is not None:
        from rag_assets.lib.index.views import write_views_for

        write_views_for(
            store,
            report.table,
            report.version,
            stamps.as_dict(),
            chunks,
            questions,
            embedder,
            expansion.as_dict(),
        )
    if publish:
        if threshold is not None:
            entry = replace(entry, threshold=threshold, threshold_policy="given")
        store.publish(entry)
    return BuildResult(extraction, chunks, stamps, report, entry)


def embed_chunks(
    store: IndexStore,
    stamps: Stamps,
    chunks: Sequence[Chunk],
    docs: Sequence[ExtractedDocument],
    embedder: Embedder,
    *,
    failed_policy: str = "keep",
    batch_rows: int = 256,
    progress: Callable[[int, int], None] | None = None,
    source: IndexSource | None = None,
    embed_progress: Callable[[int, int], None] | None = None,
) -> tuple[SyncReport, Published]:
    """Store canonical texts, sync the stamped chunk table, build its BM25 index; return the
    report and an (unpublished) pointer to the table version just written. ``source`` (the
    folder and strategy) is recorded in that version's manifest (:data:`SOURCE_KEY`)."""
    failed = {d.document_id for d in docs if d.status == "failed"}  # skipped links: dropped
    keep = failed if failed_policy == "keep" else set()
    register = getattr(embedder, "register", None)  # issue 35: a model server's fingerprint
    if register is not None:
        register(store)  # recorded in the index before rows stamped with it are written
    baseline = published_baseline(store)  # issue 30: report against what is published
    docs_version, _, _ = store.sync_documents([d for d in docs if d.ok], keep)
    report = sync_chunks(
        store,
        stamps,
        chunks,
        docs,
        embedder,
        failed_policy=failed_policy,
        batch_rows=batch_rows,
        progress=progress,
        embed_progress=embed_progress,  # issue 31: texts encoded / to encode
        baseline=baseline,
    )
    # issue 13: above ann.ANN_MIN_ROWS the table gets its IVF-SQ index, and (issue 23) above
    # lexical.NATIVE_FTS_MIN_ROWS LanceDB's own full-text index: each a new table version
    tbl = store.open_table(report.table)
    if tbl.version == report.version:
        built = ensure_vector_index(tbl) is not None
        built = ensure_fts_index(tbl) or built
        built = ensure_filter_indexes(tbl) or built  # issue 34: LabelList on meta and access
        if built:
            report.version = int(tbl.version)
    build_bm25(store, report.table, report.version, stamps.as_dict())
    entry = Published(
        table=report.table,
        version=report.version,
        documents_version=docs_version,
        stamps=stamps,
        threshold=None,
        threshold_policy=None,
        rows=report.rows,
        published_at=now_iso(),
        change=change_kind(report),
    )
    # the document manifest travels with the table version it describes (read by `status`)
    extra = {SOURCE_KEY: source.as_dict()} if source is not None else {}
    store.update_manifest(
        entry, documents_version=docs_version, documents=[d.manifest_row() for d in docs], **extra
    )
    return report, entry


def published_baseline(store: IndexStore) -> Baseline | None:
    """What is published, as a sync's report compares with it (issue 30): the chunk rows of the
    published table version and the documents of its documents version; empty when nothing is
    published yet. None (compare with the table's own rows) when it cannot be read."""
    from collections import defaultdict

    from rag_assets.lib.index.store import DOCUMENTS_TABLE, scan

    pub = store.published(strict=False)
    if pub is None:
        return Baseline.empty()
    try:
        tbl = store.open_table(pub.table, pub.version)
        rows: dict[str, dict[str, str]] = defaultdict(dict)
        for r in scan(tbl, ["chunk_id", "document_id", "content_hash"]).to_pylist():
            rows[r["document_id"]][r["chunk_id"]] = r["content_hash"]
        documents: set[str] = set()
        if DOCUMENTS_TABLE in store.table_names():
            docs = store.open_table(DOCUMENTS_TABLE, pub.documents_version)
            documents = set(scan(docs, ["document_id"])["document_id"].to_pylist())
    except (OSError, ValueError, RuntimeError):  # compacted away or damaged: the table's rows
        return None
    return Baseline(dict(rows), frozenset(documents))
