"""The LanceDB index: stamped chunk tables, a documents table, and the published pointer.

Layout of an index directory (``RAG_INDEX_URI``):

- ``chunks_<model>_<dims>d_<pipeline>_<hash>``: one LanceDB table per stamp set
  (:attr:`Stamps.table_name`); every row carries the stamps, the schema metadata too.
- ``documents``: canonical text of the last good extraction of each document (quotes are
  verified against it).
- ``bm25/<table>@<version>/``: the lexical index of one table version (``lexical.py``).
- ``published.json``: which table *version* (and documents version) queries use, with the
  calibrated threshold; ``published-history.jsonl`` logs every publish and rollback, one JSON
  object a line. Replaying it gives the rollback *stack* of distinct versions (:meth:`IndexStore.
  rollback_stack`). A damaged pointer is named and recovered from the stack's top (or refused
  with the command that repairs it); a damaged history line is skipped and named.
- ``staging.json``: the table version just embedded, awaiting evaluation.
- ``manifests/<table>@<version>.json``: the document manifest (status and reason of every
  document) and the chunks-over-window count of one table version, so ``status`` reports what
  belongs to the index it is asked about, without loading a model.

Pointer, staging and manifest files are written atomically (temp file, fsync, rename) and created
with the umask's mode, like the rest of the index.

On object storage (issue 13: ``RAG_INDEX_URI=s3://…``, ``gs://``, ``az://``) there are no files
beside the tables: everything the query side needs lives in the LanceDB database itself.

- ``_rag_meta``: a small LanceDB table, one row per publish / rollback / staging / manifest
  write (``seq``, ``kind``, ``key``, ``at``, ``body`` JSON). Each write is one ``add`` commit, so
  it is atomic on any object store; the pointer is the newest publish/rollback row, the history
  is those rows oldest first, staging and a manifest are the newest row of their kind/key.
- ``_rag_bm25``: the BM25 index of each table version, its files as binary rows keyed by
  ``table@version`` (written in one commit, see :meth:`IndexStore.save_bm25`).
- ``_rag_files``: everything else the graph writes beside the tables (evaluation reports, the
  calibrated threshold, the distance plot, the generated question set, doc2query views), one
  row per file write, a folder in one commit (:mod:`.files`; on a local index these are the
  files ``evaluation/…`` and ``views/…`` under the directory).

A local directory keeps the files (identical behaviour) unless it already holds ``_rag_meta``
or the store is opened with ``meta="lance"``; the first such open imports the old files once
(history, pointer, staging, manifests) into ``_rag_meta`` in one commit and reads only the table
afterwards. Credentials and endpoints for object stores come from ``storage_options`` or the
object store's own environment variables (``AWS_ENDPOINT``, ``AWS_ALLOW_HTTP``, ...), which
LanceDB reads itself.

Writes are per document and atomic: one ``merge_insert`` commit replaces all rows of the
documents of a batch, so a crash leaves either a document's old rows or its new ones.

The parts, one responsibility a module: :mod:`.schema` (schemas, scans), :mod:`.tables` (chunk
tables and documents), :mod:`.records` (:class:`Published`, pointer file I/O), :mod:`.meta`
(``_rag_meta`` rows), :mod:`.pointer` (publish, staging, history, rollback, manifests),
:mod:`.bm25` (BM25 persistence), :mod:`.files` (the graph's other files), :mod:`.lease` (one
writer at a time: ``_rag_lease``),
:mod:`.remote` (a missing bucket, refused credentials or an unreachable endpoint in one line),
:mod:`.querylog` (issue 33: the questions asked and their reviews, ``_rag_queries`` and
``_rag_feedback``),
:mod:`.tokens` (API tokens: hashes and revocations as event files, issue 34).
:class:`IndexStore` is all of them over one connection.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import lancedb

from rag_assets.lib.index.store.bm25 import BM25_SCHEMA, BM25_TABLE, Bm25Files, bm25_dir
from rag_assets.lib.index.store.files import FILES_SCHEMA, FILES_TABLE
from rag_assets.lib.index.store.lease import (
    DEFAULT_TTL_S,
    DEFAULT_WAIT_S,
    LEASE_TABLE,
    Holder,
    IndexBusy,
    hold_index,
    holders,
)
from rag_assets.lib.index.store.meta import (
    HISTORY_FILE,
    HISTORY_KINDS,
    MANIFESTS_DIR,
    META_SCHEMA,
    META_TABLE,
    POINTER_FILE,
    STAGING_FILE,
)
from rag_assets.lib.index.store.pointer import Pointer
from rag_assets.lib.index.store.records import FILE_MODE, HistoryRecord, PointerDamaged, Published
from rag_assets.lib.index.store.remote import ObjectStoreError, object_store_error, shown_uri
from rag_assets.lib.index.store.schema import (
    DOCUMENT_SCHEMA,
    DOCUMENTS_TABLE,
    StampMismatch,
    check_stamps,
    chunk_schema,
    document_row,
    is_remote,
    join_uri,
    now_iso,
    scan,
    sql_in,
    vectors,
)
from rag_assets.lib.index.store.tokens import TokenError, TokenFiles, TokenRecord, TokenState

__all__ = [
    "BM25_SCHEMA",
    "BM25_TABLE",
    "DOCUMENT_SCHEMA",
    "DOCUMENTS_TABLE",
    "FILES_SCHEMA",
    "FILES_TABLE",
    "FILE_MODE",
    "LEASE_TABLE",
    "Holder",
    "IndexBusy",
    "HISTORY_FILE",
    "HISTORY_KINDS",
    "MANIFESTS_DIR",
    "ObjectStoreError",
    "META_SCHEMA",
    "META_TABLE",
    "POINTER_FILE",
    "STAGING_FILE",
    "HistoryRecord",
    "IndexStore",
    "PointerDamaged",
    "Published",
    "StampMismatch",
    "TokenError",
    "TokenRecord",
    "TokenState",
    "bm25_dir",
    "check_stamps",
    "chunk_schema",
    "document_row",
    "is_remote",
    "join_uri",
    "now_iso",
    "scan",
    "shown_uri",
    "sql_in",
    "vectors",
]


class IndexStore(Pointer, Bm25Files, TokenFiles):
    """A LanceDB directory holding chunk tables, the documents table and the pointer."""

    def __init__(
        self,
        uri: str | Path,
        storage_options: dict[str, str] | None = None,
        meta: str | None = None,
    ):
        """``storage_options``: LanceDB's object-store options (endpoint, keys, ...).
        ``meta``: where the pointer, staging, history and manifests live: ``"files"`` (beside
        the tables), ``"lance"`` (the ``_rag_meta`` table), or None: ``"lance"`` for an
        object-store URI or a directory that already has ``_rag_meta``, else ``"files"``."""
        self.uri = str(uri)
        self.remote = is_remote(self.uri)
        self.storage_options = dict(storage_options or {})
        if not self.remote:
            Path(self.uri).mkdir(parents=True, exist_ok=True)
        if meta not in (None, "files", "lance"):
            raise ValueError(f"meta={meta!r}: give 'files' or 'lance'")
        if meta == "files" and self.remote:
            raise ValueError(f"{self.uri}: an object-store index keeps its pointer in LanceDB")
        try:
            self.db = lancedb.connect(self.uri, storage_options=self.storage_options or None)
            names = self.table_names()  # on object storage: the first request, checked here
        except Exception as exc:  # a missing bucket, refused keys, no endpoint: one line
            clear = object_store_error(self.uri, exc) if self.remote else None
            if clear is None:
                raise
            raise clear from None
        if meta is None:
            meta = "lance" if self.remote or META_TABLE in names else "files"
        self.meta = meta
        if meta == "lance" and META_TABLE not in names:
            self._create_meta()

    def hold(
        self, run: str = "", *, ttl_s: float = DEFAULT_TTL_S, wait_s: float = DEFAULT_WAIT_S
    ) -> AbstractContextManager[object]:
        """The writer lease of this index for a ``with`` block (:mod:`.lease`); raises
        :class:`IndexBusy` naming the holder when another writer has it after ``wait_s``."""
        return hold_index(self.db, self.uri, run, ttl_s=ttl_s, wait_s=wait_s)

    def lease_holders(self) -> list[Holder]:
        """Live holders of the writer lease (for ``status``)."""
        return holders(self.db)
