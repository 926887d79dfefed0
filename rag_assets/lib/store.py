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

A local directory keeps the files (identical behaviour) unless it already holds ``_rag_meta``
or the store is opened with ``meta="lance"``; the first such open imports the old files once
(history, pointer, staging, manifests) into ``_rag_meta`` in one commit and reads only the table
afterwards. Credentials and endpoints for object stores come from ``storage_options`` or the
object store's own environment variables (``AWS_ENDPOINT``, ``AWS_ALLOW_HTTP``, ...), which
LanceDB reads itself.

Writes are per document and atomic: one ``merge_insert`` commit replaces all rows of the
documents of a batch, so a crash leaves either a document's old rows or its new ones.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lancedb
import numpy as np
import pyarrow as pa

from rag_assets.lib.types import ExtractedDocument, locators_to_json
from rag_assets.lib.versioning import Stamps

if TYPE_CHECKING:
    from collections.abc import Iterable

DOCUMENTS_TABLE = "documents"
POINTER_FILE = "published.json"
HISTORY_FILE = "published-history.jsonl"
STAGING_FILE = "staging.json"  # the table version just embedded, awaiting evaluation
MANIFESTS_DIR = "manifests"  # <table>@<version>.json: documents + window count of one version
FILE_MODE = 0o666  # pointer/manifest files: this, less the umask (like LanceDB's own files)
META_TABLE = "_rag_meta"  # pointer/staging/history/manifests inside LanceDB (object storage)
BM25_TABLE = "_rag_bm25"  # BM25 index files of each table version, as rows (object storage)
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
BM25_SCHEMA = pa.schema([("key", pa.string()), ("name", pa.string()), ("data", pa.large_binary())])


def is_remote(uri: str | Path) -> bool:
    """True for an object-store URI (``s3://``, ``gs://``, ``az://``, ...); False for a path."""
    text = str(uri)
    return "://" in text and not text.startswith("file://")


class PointerDamaged(RuntimeError):
    """``published.json`` / ``staging.json`` cannot be read and nothing valid replaces it."""


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
        ("locators_json", pa.string()),  # issue 14: OCR pages, cues, sheet rows, furniture
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
    # issue 11: was the table evaluated against a question set that belongs to its corpus?
    evaluation: str = "evaluated"  # "evaluated" | "unevaluated" (no matching question set)
    evaluation_note: str = ""  # why unevaluated, or the gate's figure when evaluated
    threshold_source: str = ""  # where the cut came from: calibrated | default | override

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["stamps"] = self.stamps.as_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Published:
        """Parse a pointer; unknown keys (history's ``action``/``at``) are ignored. Raises
        ValueError/KeyError/TypeError for a damaged one."""
        if not isinstance(d, dict):
            raise TypeError(f"expected a JSON object, found {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        d["stamps"] = Stamps.from_dict(d["stamps"])
        for key in ("table", "published_at"):
            if not isinstance(d[key], str) or not d[key]:
                raise ValueError(f"{key!r} is not a non-empty string")
        for key in ("version", "documents_version", "rows"):
            if not isinstance(d[key], int) or isinstance(d[key], bool):
                raise ValueError(f"{key!r} is not an integer")
        return cls(**d)

    @property
    def key(self) -> str:
        """``table@version``: what identifies a published version (and ``rollback --to``)."""
        return f"{self.table}@{self.version}"


@dataclass(frozen=True)
class HistoryRecord:
    """One line of ``published-history.jsonl``: a publish or a rollback, and when."""

    action: str  # "publish" | "rollback" (lines written before actions were logged: publish)
    entry: Published
    at: str
    line: int  # 1-based line number in the history file


class IndexStore:
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
        self.db = lancedb.connect(self.uri, storage_options=self.storage_options or None)
        if meta not in (None, "files", "lance"):
            raise ValueError(f"meta={meta!r}: give 'files' or 'lance'")
        if meta == "files" and self.remote:
            raise ValueError(f"{self.uri}: an object-store index keeps its pointer in LanceDB")
        if meta is None:
            meta = "lance" if self.remote or META_TABLE in self.table_names() else "files"
        self.meta = meta
        if meta == "lance" and META_TABLE not in self.table_names():
            self._create_meta()

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
            tbl = self.db.open_table(DOCUMENTS_TABLE)
            if "locators_json" not in tbl.schema.names:  # a store from before locator maps
                tbl.add_columns(pa.field("locators_json", pa.string()))
            return tbl
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
        cols += [c for c in ("locators_json",) if c in tbl.schema.names]
        return {r["document_id"]: r for r in scan(tbl, cols).to_pylist()}

    # -- publishing -----------------------------------------------------------------------
    def published(self, strict: bool = True) -> Published | None:
        """The pointer queries follow; None when nothing was ever published.

        A damaged ``published.json`` is named in a warning and the top of the rollback stack
        (the last valid history entry) is returned instead. With no valid history entry it raises
        :class:`PointerDamaged` naming the file and the repair command, unless ``strict`` is
        False (then None: what ``published_index`` needs to publish over it).
        """
        if self.meta == "lance":
            records = self.history_records()
            return records[-1].entry if records else None
        p = Path(self.uri) / POINTER_FILE
        if not p.exists():
            return None
        try:
            return _read_pointer(p)
        except PointerDamaged as exc:
            stack = self.rollback_stack(current=False)
            if stack:
                top = stack[-1]
                _warn_once(
                    f"{exc}; serving the last valid entry of {Path(self.uri) / HISTORY_FILE} "
                    f"instead: {top.key}. Repair: `rag-assets rollback --index {self.uri} --to "
                    f"{top.key}` (or `rag-assets index --index {self.uri}`)"
                )
                return top
            if not strict:
                return None
            raise PointerDamaged(
                f"{exc}, and {Path(self.uri) / HISTORY_FILE} holds no valid entry to recover "
                f"from. Repair: `rag-assets index --index {self.uri}` publishes anew"
            ) from None

    def publish(self, entry: Published) -> Published:
        """Atomically switch the pointer (write a temp file, then rename over the old one, which
        may be damaged), then log the publish in the history."""
        self._switch("publish", entry)
        return entry

    def _switch(self, action: str, entry: Published) -> None:
        """Point queries at ``entry`` and log ``action``: one commit in ``_rag_meta``, or the
        pointer file (atomic rename) and then a history line."""
        if self.meta == "lance":
            self._append(action, "", json.dumps(entry.to_dict()))
            return
        _atomic_write(Path(self.uri) / POINTER_FILE, json.dumps(entry.to_dict(), indent=2))
        self._log(action, entry)

    def write_staging(self, entry: Published, chunks_over_window: int | None = None) -> None:
        """Point evaluation at ``entry``; record its chunks-over-window count in its manifest."""
        if self.meta == "lance":
            self._append("staging", "", json.dumps(entry.to_dict()))
        else:
            _atomic_write(Path(self.uri) / STAGING_FILE, json.dumps(entry.to_dict(), indent=2))
        if chunks_over_window is not None:
            self.update_manifest(entry, chunks_over_window=int(chunks_over_window))

    def staging(self) -> Published:
        if self.meta == "lance":
            rows = self._rows(["staging"])
            for row in reversed(rows):
                try:
                    return Published.from_dict(json.loads(row["body"]))
                except (ValueError, KeyError, TypeError) as exc:
                    _warn_once(f"{self._row_name(row)} is damaged ({_why(exc)}); skipped")
            raise FileNotFoundError(
                f"nothing embedded yet in {self.uri}: materialise chunk_embeddings"
            )
        p = Path(self.uri) / STAGING_FILE
        if not p.exists():
            raise FileNotFoundError(
                f"nothing embedded yet in {self.uri}: materialise chunk_embeddings"
            )
        try:
            return _read_pointer(p)
        except PointerDamaged as exc:
            raise PointerDamaged(
                f"{exc}. Repair: `rag-assets index --index {self.uri}` (chunk_embeddings "
                "rewrites it)"
            ) from None

    def history_records(self) -> list[HistoryRecord]:
        """Every valid line of the history, oldest first; damaged lines are skipped, named in a
        warning (a crash can leave a torn last line)."""
        if self.meta == "lance":
            return self._meta_history()
        p = Path(self.uri) / HISTORY_FILE
        if not p.exists():
            return []
        records: list[HistoryRecord] = []
        bad: list[int] = []
        for n, line in enumerate(p.read_bytes().split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                d = json.loads(line.decode("utf-8"))
                entry = Published.from_dict(d)
                action = str(d.get("action", "publish"))
                if action not in ("publish", "rollback"):
                    raise ValueError(f"unknown action {action!r}")
            except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
                bad.append(n)
                last_error = _why(exc)
                continue
            records.append(HistoryRecord(action, entry, str(d.get("at", entry.published_at)), n))
        if bad:
            _warn_once(
                f"{p}: skipped {len(bad)} damaged line(s) {bad[:10]} ({last_error}); the other "
                "entries are used"
            )
        return records

    def history(self) -> list[Published]:
        """Entries of the valid history lines, oldest first."""
        return [r.entry for r in self.history_records()]

    def rollback_stack(self, current: bool = True) -> list[Published]:
        """Distinct published versions, bottom first; the top is what is published.

        Replays the history: a publish puts its version on top (moving it there if it was lower
        down), a rollback to a version on the stack removes everything above it (a rollback to a
        version not on it, e.g. back to one rolled back from, puts it on top). With ``current``,
        a valid ``published.json`` that is not the top (a crash between pointer and log) is put
        on top, so the stack always agrees with what queries see.
        """
        stack: list[Published] = []
        for rec in self.history_records():
            key = rec.entry.key
            keys = [e.key for e in stack]
            if rec.action == "rollback" and key in keys:
                at = len(keys) - 1 - keys[::-1].index(key)
                stack = [*stack[:at], rec.entry]
            else:
                stack = [e for e in stack if e.key != key] + [rec.entry]
        if current and self.meta == "files":  # in _rag_meta the pointer is the newest row
            p = Path(self.uri) / POINTER_FILE
            try:
                pointer = _read_pointer(p) if p.exists() else None
            except PointerDamaged:
                pointer = None
            if pointer is not None and (not stack or stack[-1].key != pointer.key):
                stack = [e for e in stack if e.key != pointer.key] + [pointer]
        return stack

    def rollback(self, to: str | int | None = None) -> Published:
        """Point queries at the version below the current one on the rollback stack, or at
        ``to`` (``VERSION`` or ``TABLE@VERSION``, anywhere in the history). The table version
        must still exist. Works over a damaged ``published.json``."""
        stack = self.rollback_stack()
        if to is None:
            if len(stack) < 2:
                what = f"only {stack[-1].key} was ever published" if stack else "nothing published"
                raise RuntimeError(f"nothing to roll back to in {self.uri}: {what}")
            target = stack[-2]
        else:
            target = self._find(str(to), stack)
        try:
            tbl = self.open_table(target.table, target.version)
            tbl.count_rows()
        except Exception as exc:  # noqa: BLE001 - LanceDB raises several types here
            raise RuntimeError(
                f"cannot roll back to {target.key}: that table version is no longer in "
                f"{self.uri} ({type(exc).__name__}: {exc})"
            ) from None
        self._switch("rollback", target)
        return target

    def _find(self, to: str, stack: list[Published]) -> Published:
        table, _, version = to.rpartition("@")
        if not version.strip().lstrip("v").isdigit():
            raise ValueError(f"--to {to!r}: give a table version (7 or v7) or TABLE@VERSION")
        v = int(version.strip().lstrip("v"))
        candidates = [*reversed(stack), *(r.entry for r in reversed(self.history_records()))]
        found: dict[str, Published] = {}
        for e in candidates:
            if e.version == v and (not table or e.table == table):
                found.setdefault(e.key, e)
        if not found:
            known = ", ".join(e.key for e in reversed(stack)) or "none"
            raise ValueError(
                f"--to {to}: no such version in {Path(self.uri) / HISTORY_FILE} (on the rollback "
                f"stack, newest first: {known})"
            )
        if len(found) > 1:
            raise ValueError(
                f"--to {to}: version {v} exists in several tables; give one of "
                + ", ".join(sorted(found))
            )
        return next(iter(found.values()))

    def _log(self, action: str, entry: Published) -> None:
        """Append one history line (after a newline if a crash left a torn last line)."""
        p = Path(self.uri) / HISTORY_FILE
        line = json.dumps({"action": action, "at": now_iso(), **entry.to_dict()}) + "\n"
        with p.open("ab+") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())

    # -- manifests ------------------------------------------------------------------------
    def manifest_path(self, entry: Published) -> Path | str:
        """The manifest file of ``entry`` (or, in ``_rag_meta``, the name of its rows)."""
        if self.meta == "lance":
            return f"{self.uri.rstrip('/')}/{META_TABLE}[manifest {entry.key}]"
        return Path(self.uri) / MANIFESTS_DIR / f"{entry.key}.json"

    def update_manifest(self, entry: Published, **values: Any) -> Path | str:
        """Merge ``values`` (``documents``: manifest rows, ``chunks_over_window``, ...) into the
        manifest of ``entry``'s table version."""
        path = self.manifest_path(entry)
        current = self.manifest(entry) or {}
        current.update({"table": entry.table, "version": entry.version, **values})
        if isinstance(path, str):
            self._append("manifest", entry.key, json.dumps(current))
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, json.dumps(current, indent=1))
        return path

    def manifest(self, entry: Published) -> dict[str, Any] | None:
        """The manifest of ``entry``'s table version, or None when none (or a damaged one) is
        stored."""
        path = self.manifest_path(entry)
        if isinstance(path, str):
            for row in reversed(self._rows(["manifest"], key=entry.key)):
                try:
                    data = json.loads(row["body"])
                except ValueError as exc:
                    _warn_once(f"{self._row_name(row)} is damaged ({_why(exc)}); skipped")
                    continue
                return data if isinstance(data, dict) else None
            return None
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            _warn_once(f"{path} is damaged ({_why(exc)}); re-run `rag-assets index`")
            return None
        return data if isinstance(data, dict) else None

    # -- the _rag_meta table (object storage, or meta="lance") ------------------------------
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

    # -- BM25 persistence -------------------------------------------------------------------
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
        """Persist ``index`` (a :class:`~rag_assets.lib.lexical.BM25Index`) for one table
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
        from rag_assets.lib.lexical import BM25Index

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
    }


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temp file in the same folder (mode :data:`FILE_MODE` less the umask,
    not ``mkstemp``'s owner-only 0600), fsync it, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_pointer(path: Path) -> Published:
    """Parse a pointer file; :class:`PointerDamaged` names the file and what is wrong."""
    raw = path.read_bytes()
    try:
        return Published.from_dict(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        size = f"{len(raw)} bytes" if raw else "empty"
        raise PointerDamaged(f"{path} is damaged ({size}: {_why(exc)})") from None


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
