"""The LanceDB index: stamped chunk tables, a documents table, and the published pointer.

Layout of an index directory (``RAG_INDEX_URI``):

- ``chunks_<model>_<dims>d_<pipeline>_<hash>``: one LanceDB table per stamp set
  (:attr:`Stamps.table_name`); every row carries the stamps, the schema metadata too.
- ``documents``: canonical text of the last good extraction of each document (quotes are
  verified against it).
- ``bm25/<table>@<version>/``: the lexical index of one table version (``lexical.py``).
- ``published.json``: which table *version* (and documents version) queries use, with the
  calibrated threshold; ``published-history.jsonl`` keeps earlier pointers for rollback.

Writes are per document and atomic: one ``merge_insert`` commit replaces all rows of the
documents of a batch, so a crash leaves either a document's old rows or its new ones.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lancedb
import numpy as np
import pyarrow as pa

from rag_assets.lib.types import ExtractedDocument
from rag_assets.lib.versioning import Stamps

if TYPE_CHECKING:
    from collections.abc import Iterable

DOCUMENTS_TABLE = "documents"
POINTER_FILE = "published.json"
HISTORY_FILE = "published-history.jsonl"
STAGING_FILE = "staging.json"  # the table version just embedded, awaiting evaluation


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
    ]
)


def sql_in(column: str, values: Iterable[str]) -> str:
    """``column IN ('a', 'b')`` with quotes escaped (document ids are file paths)."""
    quoted = ", ".join("'" + v.replace("'", "''") + "'" for v in sorted(set(values)))
    return f"{column} IN ({quoted})"


@dataclass(frozen=True)
class Published:
    """The pointer queries follow."""

    table: str
    version: int
    documents_version: int
    stamps: Stamps
    threshold: float | None
    threshold_policy: str | None
    rows: int
    published_at: str

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["stamps"] = self.stamps.as_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Published:
        d = dict(d)
        d["stamps"] = Stamps.from_dict(d["stamps"])
        return cls(**d)


class IndexStore:
    """A LanceDB directory holding chunk tables, the documents table and the pointer."""

    def __init__(self, uri: str | Path):
        self.uri = str(uri)
        Path(self.uri).mkdir(parents=True, exist_ok=True)
        self.db = lancedb.connect(self.uri)

    # -- tables ---------------------------------------------------------------------------
    def table_names(self) -> list[str]:
        return sorted(self.db.list_tables().tables)

    def chunk_table_names(self) -> list[str]:
        return [n for n in self.table_names() if n.startswith("chunks_")]

    def chunk_table(self, stamps: Stamps, create: bool = True) -> Any:
        """The table for these stamps, created empty if missing; refuses a stamp mismatch."""
        name = stamps.table_name
        if name in self.table_names():
            tbl = self.db.open_table(name)
            check_stamps(tbl, stamps)
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
            return self.db.open_table(DOCUMENTS_TABLE)
        return self.db.create_table(DOCUMENTS_TABLE, schema=DOCUMENT_SCHEMA)

    # -- documents ------------------------------------------------------------------------
    def sync_documents(
        self, ok_docs: list[ExtractedDocument], keep_ids: set[str]
    ) -> tuple[int, list[str], list[str]]:
        """Store canonical texts of ``ok_docs``; delete rows not in ``ok_docs`` nor ``keep_ids``.

        Returns (table version, written ids, deleted ids).
        """
        tbl = self.documents_table()
        have = {
            r["document_id"]: r["text_hash"]
            for r in scan(tbl, ["document_id", "text_hash"]).to_pylist()
        }
        changed = [d for d in ok_docs if have.get(d.document_id) != d.text_hash]
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

    def canonical_texts(self, version: int | None = None) -> dict[str, dict[str, Any]]:
        """document_id → {text, title, path, kind, page_starts} at a documents-table version."""
        if DOCUMENTS_TABLE not in self.table_names():
            return {}
        tbl = self.open_table(DOCUMENTS_TABLE, version)
        cols = ["document_id", "text", "title", "path", "kind", "page_starts"]
        return {r["document_id"]: r for r in scan(tbl, cols).to_pylist()}

    # -- publishing -----------------------------------------------------------------------
    def published(self) -> Published | None:
        p = Path(self.uri) / POINTER_FILE
        if not p.exists():
            return None
        return Published.from_dict(json.loads(p.read_text()))

    def publish(self, entry: Published) -> Published:
        """Atomically switch the pointer (write a temp file, then rename over the old one)."""
        root = Path(self.uri)
        _atomic_write(root / POINTER_FILE, json.dumps(entry.to_dict(), indent=2))
        with (root / HISTORY_FILE).open("a") as f:
            f.write(json.dumps(entry.to_dict()) + "\n")
        return entry

    def write_staging(self, entry: Published) -> None:
        _atomic_write(Path(self.uri) / STAGING_FILE, json.dumps(entry.to_dict(), indent=2))

    def staging(self) -> Published:
        p = Path(self.uri) / STAGING_FILE
        if not p.exists():
            raise FileNotFoundError(
                f"nothing embedded yet in {self.uri}: materialise chunk_embeddings"
            )
        return Published.from_dict(json.loads(p.read_text()))

    def history(self) -> list[Published]:
        p = Path(self.uri) / HISTORY_FILE
        if not p.exists():
            return []
        return [Published.from_dict(json.loads(line)) for line in p.read_text().splitlines()]

    def rollback(self) -> Published:
        """Point queries back at the previously published table version."""
        current = self.published()
        for entry in reversed(self.history()):
            if current is None or (entry.table, entry.version) != (current.table, current.version):
                return self.publish(entry)
        raise RuntimeError(f"nothing to roll back to in {self.uri}")


def bm25_dir(uri: str | Path, table: str, version: int) -> Path:
    """Where the lexical index of one table version lives."""
    return Path(uri) / "bm25" / f"{table}@{version}"


def check_stamps(tbl: Any, expected: Stamps) -> Stamps:
    """Raise :class:`StampMismatch` naming both stamp sets when the table's differ."""
    found = Stamps.from_schema_metadata(tbl.schema.metadata)
    if found is None:
        raise StampMismatch(f"table {tbl.name} carries no rag_assets stamps")
    diff = found.differences(expected)
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
    }


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
