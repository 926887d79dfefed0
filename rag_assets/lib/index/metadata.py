"""Document metadata in the tables (issue 34): the columns a chunk row and a document row carry,
their values, schema evolution of older tables, and the scalar indexes that make a prefilter
cheap at scale.

Chunk rows (so that LanceDB can prefilter, ``.where(..., prefilter=True)``):

- ``meta`` (``list<string>``): one ``key=value`` label per value of the document's metadata
  (:func:`rag_assets.lib.ingest.metadata.labels`); ``key=a`` or ``key=b`` is
  ``array_has_any(meta, ['key=a', 'key=b'])``;
- ``access`` (``list<string>``): the groups the document is restricted to, or ``["*"]``
  (:data:`PUBLIC`) when it has no ``access`` key; what a caller with groups G sees is
  ``array_has_any(access, ['*', G...])``;
- ``size`` (``int64``), ``modified`` (ISO 8601 UTC ``string``): for range filters;
- ``meta_hash``: a digest of the document's metadata, the stamp a sync compares to tell a
  metadata-only change from an unchanged document.

Document rows: ``metadata_json`` (the whole mapping), ``access`` and ``meta_hash``.

A table made before these columns gets them added, empty (``add_columns``: a schema-only
version, no data rewritten); the next sync fills them without re-embedding (every document
reads as a metadata-only change once).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from rag_assets.lib.index.due import index_due
from rag_assets.lib.ingest.metadata import access_groups, labels, metadata_digest
from rag_assets.lib.types import ExtractedDocument

PUBLIC = "*"
"""The ``access`` value of a document without an ``access`` key: visible to every caller."""

CHUNK_META_FIELDS = [
    pa.field("meta", pa.list_(pa.string())),
    pa.field("access", pa.list_(pa.string())),
    pa.field("size", pa.int64()),
    pa.field("modified", pa.string()),
    pa.field("meta_hash", pa.string()),
]
DOCUMENT_META_FIELDS = [
    pa.field("metadata_json", pa.string()),
    pa.field("access", pa.list_(pa.string())),
    pa.field("meta_hash", pa.string()),
]
CHUNK_META_COLUMNS = [f.name for f in CHUNK_META_FIELDS]

FILTER_INDEX_MIN_ROWS = 50_000
"""Rows from which the ``meta`` and ``access`` columns get LanceDB ``LabelList`` scalar indexes
(the rows of ``array_has_any`` come from the index instead of a scan of every list); the ANN
index starts at the same size (``ann.ANN_MIN_ROWS``)."""
FILTER_INDEX_REINDEX_FRACTION = 0.1


def access_values(doc: ExtractedDocument) -> list[str]:
    """The ``access`` column of a document's rows: its groups, or ``["*"]`` when unrestricted."""
    groups = access_groups(doc.metadata)
    return [PUBLIC] if groups is None else groups


def chunk_meta_values(doc: ExtractedDocument) -> dict[str, Any]:
    """The metadata columns of every chunk row of ``doc`` (one document's rows share them)."""
    md = doc.metadata
    size = md.get("size", [])
    return {
        "meta": labels(md),
        "access": access_values(doc),
        "size": int(size[0]) if size and size[0].isdigit() else None,
        "modified": md["modified"][0] if md.get("modified") else None,
        "meta_hash": metadata_digest(md),
    }


def document_meta_values(doc: ExtractedDocument) -> dict[str, Any]:
    """The metadata columns of a document row."""
    return {
        "metadata_json": json.dumps(doc.metadata, sort_keys=True, ensure_ascii=False),
        "access": access_values(doc),
        "meta_hash": metadata_digest(doc.metadata),
    }


def ensure_columns(tbl: Any, fields: list[pa.Field]) -> bool:
    """Add the missing ``fields`` to ``tbl`` (null in existing rows); True when it added any."""
    names = set(tbl.schema.names)
    missing = [f for f in fields if f.name not in names]
    if missing:
        tbl.add_columns(missing)
    return bool(missing)


def column_index(tbl: Any, column: str, kind: str) -> Any | None:
    """The table's index of type ``kind`` (``labellist``, ``btree``) on ``column`` alone."""
    for idx in tbl.list_indices():
        if list(idx.columns) == [column] and str(idx.index_type).lower() == kind:
            return idx
    return None


def label_index(tbl: Any, column: str) -> Any | None:
    """The table's ``LabelList`` index on ``column``, if any."""
    return column_index(tbl, column, "labellist")


def ensure_filter_indexes(tbl: Any, min_rows: int | None = None) -> bool:
    """``LabelList`` indexes on ``meta`` and ``access`` when ``tbl`` has ``min_rows`` rows or
    more (default :data:`FILTER_INDEX_MIN_ROWS`) and has none, or more than
    :data:`FILTER_INDEX_REINDEX_FRACTION` of its rows are outside one; a new table version.
    Also (issue 40) a ``BTREE`` on ``chunk_id``: a service that does not hold a large table's
    rows reads each answer's hits by id, a scan of every row without it (1 M rows: 93 ms
    for 20 ids, 15 ms with it). Returns whether it built."""
    from lancedb.index import BTree, LabelList

    least = FILTER_INDEX_MIN_ROWS if min_rows is None else min_rows
    built = False
    for column in ("meta", "access"):
        if column not in tbl.schema.names:
            continue
        if index_due(tbl, label_index(tbl, column), least, FILTER_INDEX_REINDEX_FRACTION):
            tbl.create_index(column, config=LabelList(), replace=True)
            built = True
    if "chunk_id" in tbl.schema.names and index_due(
        tbl, column_index(tbl, "chunk_id", "btree"), least, FILTER_INDEX_REINDEX_FRACTION
    ):
        tbl.create_index("chunk_id", config=BTree(), replace=True)
        built = True
    return built
