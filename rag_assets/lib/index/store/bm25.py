"""BM25 persistence: a directory per table version, or ``_rag_bm25`` rows on object storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from rag_assets.lib.index.store.schema import scan, sql_in
from rag_assets.lib.index.store.tables import Tables

BM25_TABLE = "_rag_bm25"  # BM25 index files of each table version, as rows (object storage)


BM25_SCHEMA = pa.schema([("key", pa.string()), ("name", pa.string()), ("data", pa.large_binary())])


class Bm25Files(Tables):
    """The lexical index of each table version, saved and loaded."""

    def bm25_location(self, table: str, version: int) -> str:
        """Where the BM25 index of one table version is (a directory, or ``_rag_bm25`` rows)."""
        if not self.remote:
            return str(bm25_dir(self.uri, table, version))
        return f"{self.uri.rstrip('/')}/{BM25_TABLE}[{table}@{version}]"

    def has_bm25(self, table: str, version: int) -> bool:
        if not self.remote:
            return bm25_dir(self.uri, table, version).exists()
        if BM25_TABLE not in self.table_names():
            return False
        key = f"{table}@{version}".replace("'", "''")
        return bool(self.db.open_table(BM25_TABLE).count_rows(f"key = '{key}'"))

    def save_bm25(self, index: Any, table: str, version: int) -> str:
        """Persist ``index`` (a :class:`~rag_assets.lib.index.lexical.BM25Index`) for one table
        version: a directory beside the tables, or on object storage its files as rows of
        ``_rag_bm25`` added in one commit (a crash leaves all of them or none)."""
        if not self.remote:
            out = bm25_dir(self.uri, table, version)
            index.save(out)
            return self.bm25_location(table, version)
        key = f"{table}@{version}"
        rows = [{"key": key, "name": n, "data": b} for n, b in sorted(index.to_files().items())]
        data = pa.Table.from_pylist(rows, schema=BM25_SCHEMA)
        if BM25_TABLE in self.table_names():
            self.db.open_table(BM25_TABLE).add(data)
        else:
            try:
                self.db.create_table(BM25_TABLE, data=data)
            except (ValueError, OSError, RuntimeError):
                if BM25_TABLE not in self.table_names():
                    raise
                self.db.open_table(BM25_TABLE).add(data)
        return self.bm25_location(table, version)

    def drop_bm25(self, table: str, keep: set[int]) -> list[str]:
        """Remove the ``_rag_bm25`` rows of ``table``'s versions not in ``keep`` (object
        storage; a local index removes directories instead); returns the keys removed."""
        if not self.remote or BM25_TABLE not in self.table_names():
            return []
        tbl = self.db.open_table(BM25_TABLE)
        keys = set(scan(tbl, ["key"]).column("key").to_pylist())
        gone = sorted(
            k
            for k in keys
            if k.rpartition("@")[0] == table and int(k.rpartition("@")[2]) not in keep
        )
        if gone:
            tbl.delete(sql_in("key", gone))
        return gone

    def load_bm25(
        self, table: str, version: int, expect_stamps: dict[str, Any] | None = None
    ) -> Any:
        """The BM25 index saved by :meth:`save_bm25` (refused when stale, as ``load``)."""
        from rag_assets.lib.index.lexical import BM25Index

        if not self.remote:
            return BM25Index.load(bm25_dir(self.uri, table, version), expect_stamps)
        key = f"{table}@{version}"
        where = f"key = '{key.replace(chr(39), chr(39) * 2)}'"
        rows = []
        if BM25_TABLE in self.table_names():
            rows = scan(self.db.open_table(BM25_TABLE), ["name", "data"], where).to_pylist()
        files: dict[str, bytes] = {}
        for r in rows:  # a key written twice (a re-run racing another) holds identical files
            files.setdefault(r["name"], r["data"])
        return BM25Index.from_files(files, self.bm25_location(table, version), expect_stamps)


def bm25_dir(uri: str | Path, table: str, version: int) -> Path:
    """Where the lexical index of one table version lives."""
    return Path(uri) / "bm25" / f"{table}@{version}"
