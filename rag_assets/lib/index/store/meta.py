"""The ``_rag_meta`` table: pointer, staging, history and manifests as rows (object storage)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from rag_assets.lib.index.store.records import (
    HistoryRecord,
    PointerDamaged,
    Published,
    _read_pointer,
)
from rag_assets.lib.index.store.schema import _warn_once, _why, now_iso, scan, sql_in
from rag_assets.lib.index.store.tables import Tables

META_TABLE = "_rag_meta"  # pointer/staging/history/manifests inside LanceDB (object storage)


HISTORY_KINDS = ("publish", "rollback")  # _rag_meta rows that make the history (and pointer)


META_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),  # time.time_ns() of the write: orders rows (ties: at, then body)
        ("kind", pa.string()),  # publish | rollback | staging | manifest | migrated
        ("key", pa.string()),  # table@version for a manifest, "" otherwise
        ("at", pa.string()),  # ISO time of the action (history's "at")
        ("body", pa.string()),  # the JSON a file would hold
    ]
)


POINTER_FILE = "published.json"


HISTORY_FILE = "published-history.jsonl"


STAGING_FILE = "staging.json"  # the table version just embedded, awaiting evaluation


MANIFESTS_DIR = "manifests"  # <table>@<version>.json: documents + window count of one version


class MetaRows(Tables):
    """Append-only ``_rag_meta`` rows, one LanceDB commit each."""

    def _meta_table(self) -> Any:
        return self.db.open_table(META_TABLE)

    def _append(self, kind: str, key: str, body: str) -> None:
        """One row, one LanceDB commit: atomic on a local disk and on object storage."""
        row = {"seq": time.time_ns(), "kind": kind, "key": key, "at": now_iso(), "body": body}
        self._meta_table().add(pa.Table.from_pylist([row], schema=META_SCHEMA))

    def _rows(self, kinds: list[str], key: str | None = None) -> list[dict[str, Any]]:
        """Rows of some kinds (and key), oldest first (seq, then at, then body: deterministic)."""
        where = sql_in("kind", kinds) + (
            f" AND key = '{key.replace(chr(39), chr(39) * 2)}'" if key is not None else ""
        )
        rows = scan(self._meta_table(), ["seq", "kind", "key", "at", "body"], where).to_pylist()
        return sorted(rows, key=lambda r: (r["seq"], r["at"], r["body"]))

    def _row_name(self, row: dict[str, Any]) -> str:
        return f"{self.uri.rstrip('/')}/{META_TABLE} row {row['kind']} seq {row['seq']}"

    def _meta_history(self) -> list[HistoryRecord]:
        records: list[HistoryRecord] = []
        bad: list[int] = []
        for n, row in enumerate(self._rows(list(HISTORY_KINDS)), start=1):
            try:
                entry = Published.from_dict(json.loads(row["body"]))
            except (ValueError, KeyError, TypeError) as exc:
                bad.append(n)
                last_error = _why(exc)
                continue
            records.append(HistoryRecord(row["kind"], entry, row["at"], n))
        if bad:
            _warn_once(
                f"{self.uri.rstrip('/')}/{META_TABLE}: skipped {len(bad)} damaged history "
                f"row(s) {bad[:10]} ({last_error}); the other entries are used"
            )
        return records

    def _create_meta(self) -> None:
        """Create ``_rag_meta``; a local directory's old pointer files are imported in the
        same (first) commit, so they are read once and the table is the truth afterwards."""
        rows = self._legacy_rows() if not self.remote else []
        rows.append(
            {
                "seq": time.time_ns(),
                "kind": "migrated",
                "key": "",
                "at": now_iso(),
                "body": json.dumps({"files": len(rows)}),
            }
        )
        data = pa.Table.from_pylist(rows, schema=META_SCHEMA)
        try:
            self.db.create_table(META_TABLE, data=data)
        except (ValueError, OSError, RuntimeError):
            if META_TABLE not in self.table_names():  # not a create race: a real failure
                raise

    def _legacy_rows(self) -> list[dict[str, Any]]:
        """The old files as ``_rag_meta`` rows: history lines in order, then the pointer when
        it is newer than the history's top (a crash between pointer and log), staging and
        manifests. Damaged lines/files are named (as when reading them) and skipped."""
        root = Path(self.uri)
        seq = time.time_ns() - 10**9  # older than anything written from now on
        rows: list[dict[str, Any]] = []

        def add(kind: str, key: str, at: str, body: dict[str, Any]) -> None:
            rows.append(
                {
                    "seq": seq + len(rows),
                    "kind": kind,
                    "key": key,
                    "at": at,
                    "body": json.dumps(body),
                }
            )

        from rag_assets.lib.index.store import IndexStore

        files_store = object.__new__(IndexStore)
        files_store.__dict__.update(self.__dict__, meta="files")
        records = files_store.history_records()
        for rec in records:
            add(rec.action, "", rec.at, rec.entry.to_dict())
        pointer_path = root / POINTER_FILE
        if pointer_path.exists():
            try:
                pointer = _read_pointer(pointer_path)
            except PointerDamaged as exc:
                _warn_once(f"{exc}; not imported into {META_TABLE} (the history's top is used)")
            else:
                if not records or records[-1].entry.key != pointer.key:
                    add("publish", "", pointer.published_at, pointer.to_dict())
        staging_path = root / STAGING_FILE
        if staging_path.exists():
            try:
                add("staging", "", now_iso(), _read_pointer(staging_path).to_dict())
            except PointerDamaged as exc:
                _warn_once(f"{exc}; not imported into {META_TABLE}")
        for path in sorted((root / MANIFESTS_DIR).glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                _warn_once(f"{path} is damaged ({_why(exc)}); not imported into {META_TABLE}")
                continue
            if isinstance(data, dict):
                add("manifest", path.name.removesuffix(".json"), now_iso(), data)
        return rows
