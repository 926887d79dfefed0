"""Table schemas and the small helpers every part of the store uses (scans, SQL, stamps)."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rag_assets.lib.index.metadata import (
    CHUNK_META_FIELDS,
    DOCUMENT_META_FIELDS,
    document_meta_values,
)
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.types import ExtractedDocument, locators_to_json

if TYPE_CHECKING:
    from collections.abc import Iterable


DOCUMENTS_TABLE = "documents"


def is_remote(uri: str | Path) -> bool:
    """True for an object-store URI (``s3://``, ``gs://``, ``az://``, ...); False for a path."""
    text = str(uri)
    return "://" in text and not text.startswith("file://")


def join_uri(base: str | Path, name: str) -> str:
    """``base/name`` for a folder or an object-store URI (``Path`` would fold ``s3://``)."""
    if is_remote(base):
        return f"{str(base).rstrip('/')}/{name}"
    return str(Path(base) / name)


class StampMismatch(RuntimeError):
    """A table was made with another model/pipeline than the one asked for."""


def chunk_schema(stamps: Stamps) -> pa.Schema:
    return pa.schema(
        [
            ("chunk_id", pa.string()),
            ("document_id", pa.string()),
            ("document_title", pa.string()),
            ("document_kind", pa.string()),
            ("content_hash", pa.string()),  # sha256 of `text` (what was embedded)
            ("text", pa.string()),
            ("content", pa.string()),
            ("section", pa.string()),
            ("from", pa.int64()),
            ("to", pa.int64()),
            ("page", pa.int32()),
            ("model", pa.string()),
            ("model_revision", pa.string()),
            ("dims", pa.int32()),
            ("normalized", pa.bool_()),
            ("pipeline_version", pa.string()),
            ("extractor_version", pa.string()),
            ("vector", pa.list_(pa.float32(), stamps.dims)),
            *CHUNK_META_FIELDS,  # issue 34: metadata the table prefilters on (index/metadata.py)
        ],
        metadata=stamps.schema_metadata(),
    )


DOCUMENT_SCHEMA = pa.schema(
    [
        ("document_id", pa.string()),
        ("path", pa.string()),
        ("kind", pa.string()),
        ("title", pa.string()),
        ("extractor", pa.string()),
        ("extractor_version", pa.string()),
        ("source_hash", pa.string()),
        ("text_hash", pa.string()),
        ("text", pa.string()),
        ("page_starts", pa.list_(pa.int64())),
        ("headings_json", pa.string()),
        ("locators_json", pa.string()),  # issue 14: OCR pages, cues, sheet rows, furniture
        *DOCUMENT_META_FIELDS,  # issue 34: metadata_json, access, meta_hash
    ]
)


def sql_in(column: str, values: Iterable[str]) -> str:
    """``column IN ('a', 'b')`` with quotes escaped (document ids are file paths)."""
    quoted = ", ".join("'" + v.replace("'", "''") + "'" for v in sorted(set(values)))
    return f"{column} IN ({quoted})"


def check_stamps(tbl: Any, expected: Stamps) -> Stamps:
    """Raise :class:`StampMismatch` naming both stamp sets when the table's differ."""
    found = Stamps.from_schema_metadata(tbl.schema.metadata)
    if found is None:
        raise StampMismatch(f"table {tbl.name} carries no rag_assets stamps")
    # The extractor does not define the vector space: after an extractor upgrade the same table
    # is brought up to date by content hash (changed chunks re-embedded, each row keeping the
    # extractor stamp it was written with), instead of refusing every existing index.
    diff = [d for d in found.differences(expected) if not d.startswith("extractor:")]
    if diff:
        raise StampMismatch(
            f"table {tbl.name} was built with {found.model} (rev {found.revision}, "
            f"{found.dims} dims, pipeline {found.pipeline}) but the configured model is "
            f"{expected.model} (rev {expected.revision}, {expected.dims} dims, pipeline "
            f"{expected.pipeline}); differences: {'; '.join(diff)}. Re-index with the "
            "configured model, or configure the table's model."
        )
    return found


def scan(tbl: Any, columns: list[str], where: str | None = None) -> pa.Table:
    """All rows (optionally filtered) of some columns, without loading vectors."""
    q = tbl.search().select(columns)
    if where:
        q = q.where(where)
    return q.limit(None).to_arrow()


def vectors(column: pa.ChunkedArray | pa.Array, dims: int) -> np.ndarray:
    """A fixed-size-list vector column as a (rows, dims) float32 matrix, without Python lists."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    flat = arr.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(-1, dims)


def document_row(d: ExtractedDocument) -> dict[str, Any]:
    return {
        "document_id": d.document_id,
        "path": d.path,
        "kind": d.kind,
        "title": d.title,
        "extractor": d.extractor,
        "extractor_version": d.extractor_version,
        "source_hash": d.source_hash,
        "text_hash": d.text_hash,
        "text": d.text,
        "page_starts": list(d.page_starts),
        "headings_json": json.dumps([h.__dict__ for h in d.headings]),
        "locators_json": locators_to_json(d.locators),
        **document_meta_values(d),
    }


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _why(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc}"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text: {exc.reason} at byte {exc.start}"
    if isinstance(exc, KeyError):
        return f"missing field {exc}"
    return f"{type(exc).__name__}: {exc}"


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """One warning per message and process (a query server reads the pointer often)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
