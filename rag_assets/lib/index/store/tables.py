"""Chunk tables (one per stamp set) and the documents table."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rag_assets.lib.index.metadata import CHUNK_META_FIELDS, DOCUMENT_META_FIELDS, ensure_columns
from rag_assets.lib.index.store.schema import (
    DOCUMENT_SCHEMA,
    DOCUMENTS_TABLE,
    check_stamps,
    chunk_schema,
    document_row,
    scan,
    sql_in,
)
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.types import ExtractedDocument


class Tables:
    """The LanceDB connection, its chunk tables and the documents table."""

    uri: str
    remote: bool
    storage_options: dict[str, str]
    db: Any
    meta: str

    def table_names(self) -> list[str]:
        return sorted(self.db.list_tables().tables)

    def chunk_table_names(self) -> list[str]:
        return [n for n in self.table_names() if n.startswith("chunks_")]

    def chunk_table(self, stamps: Stamps, create: bool = True) -> Any:
        """The table for these stamps (to write), created empty if missing; refuses a stamp
        mismatch. A table from before issue 34 gets its metadata columns here (empty; the next
        sync fills them, a metadata-only change)."""
        name = stamps.table_name
        if name in self.table_names():
            tbl = self.db.open_table(name)
            check_stamps(tbl, stamps)
            ensure_columns(tbl, CHUNK_META_FIELDS)
            return tbl
        if not create:
            raise KeyError(f"no table {name} in {self.uri}")
        return self.db.create_table(name, schema=chunk_schema(stamps))

    def open_table(self, name: str, version: int | None = None) -> Any:
        tbl = self.db.open_table(name)
        if version is not None:
            tbl.checkout(version)
        return tbl

    def documents_table(self) -> Any:
        if DOCUMENTS_TABLE in self.table_names():
            tbl = self.db.open_table(DOCUMENTS_TABLE)
            if "locators_json" not in tbl.schema.names:  # a store from before locator maps
                tbl.add_columns(pa.field("locators_json", pa.string()))
            ensure_columns(tbl, DOCUMENT_META_FIELDS)  # a store from before issue 34
            return tbl
        return self.db.create_table(DOCUMENTS_TABLE, schema=DOCUMENT_SCHEMA)

    # -- documents ------------------------------------------------------------------------
    def sync_documents(
        self, ok_docs: list[ExtractedDocument], keep_ids: set[str]
    ) -> tuple[int, list[str], list[str]]:
        """Store canonical texts and metadata of ``ok_docs``; delete rows not in ``ok_docs`` nor
        ``keep_ids``. A document whose text and metadata are stored already is not written.

        Returns (table version, written ids, deleted ids).
        """
        tbl = self.documents_table()
        have = {
            r["document_id"]: (r["text_hash"], r["meta_hash"], r["path"])
            for r in scan(tbl, ["document_id", "text_hash", "meta_hash", "path"]).to_pylist()
        }
        # issue 30: the path too, so a document reused after the folder moved
        # (--force-folder) cites the new folder's file, not the old one
        changed = [
            d
            for d in ok_docs
            if have.get(d.document_id) != (d.text_hash, document_row(d)["meta_hash"], d.path)
        ]
        if changed:
            rows = pa.Table.from_pylist([document_row(d) for d in changed], schema=DOCUMENT_SCHEMA)
            (
                tbl.merge_insert("document_id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(rows)
            )
        wanted = {d.document_id for d in ok_docs} | keep_ids
        gone = sorted(set(have) - wanted)
        if gone:
            tbl.delete(sql_in("document_id", gone))
        return int(tbl.version), [d.document_id for d in changed], gone

    def canonical_texts(
        self, version: int | None = None, text: bool = True
    ) -> dict[str, dict[str, Any]]:
        """document_id → {text, title, path, kind, page_starts, metadata_json, access} at a
        documents-table version (``text=False``: without the texts, the locators and pages)."""
        if DOCUMENTS_TABLE not in self.table_names():
            return {}
        tbl = self.open_table(DOCUMENTS_TABLE, version)
        cols = ["document_id", "title", "path", "kind"]
        extra = ("text", "page_starts", "locators_json") if text else ()
        cols += [c for c in (*extra, "metadata_json", "access") if c in tbl.schema.names]
        return {r["document_id"]: r for r in scan(tbl, cols).to_pylist()}
