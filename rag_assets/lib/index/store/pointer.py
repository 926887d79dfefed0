"""The publish pointer, staging, the history, the rollback stack and the manifests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rag_assets.lib.index.store.meta import (
    HISTORY_FILE,
    MANIFESTS_DIR,
    META_TABLE,
    POINTER_FILE,
    STAGING_FILE,
    MetaRows,
)
from rag_assets.lib.index.store.records import (
    HistoryRecord,
    PointerDamaged,
    Published,
    _atomic_write,
    _read_pointer,
)
from rag_assets.lib.index.store.schema import _warn_once, _why, now_iso


class Pointer(MetaRows):
    """What queries follow, and every publish and rollback before it."""

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
        self.check_opens(target, "roll back to")
        self._switch("rollback", target)
        return target

    def check_opens(self, entry: Published, doing: str = "publish") -> None:
        """Raise ``RuntimeError`` (one line) unless everything a query opens for ``entry`` is
        there (issue 30, before a rollback moves the pointer): the chunk table version, the
        documents version and the lexical index (its BM25 files, with matching stamps, or
        LanceDB's own full-text index)."""
        from rag_assets.lib.index.lexical import uses_native_fts
        from rag_assets.lib.index.store.schema import DOCUMENTS_TABLE

        def fail(what: str, exc: BaseException) -> RuntimeError:
            why = " ".join(f"{type(exc).__name__}: {exc}".split())
            return RuntimeError(f"cannot {doing} {entry.key}: {what} ({why[:300]})")

        try:
            tbl = self.open_table(entry.table, entry.version)
            rows = int(tbl.count_rows())
        except Exception as exc:  # noqa: BLE001 - LanceDB raises several types here
            raise fail(f"that table version is no longer in {self.uri}", exc) from None
        try:
            if DOCUMENTS_TABLE in self.table_names():
                self.open_table(DOCUMENTS_TABLE, entry.documents_version).count_rows()
        except Exception as exc:  # noqa: BLE001
            raise fail(f"its documents (version {entry.documents_version}) are gone", exc) from None
        try:
            if not uses_native_fts(tbl, rows):
                self.load_bm25(  # type: ignore[attr-defined]
                    entry.table,
                    entry.version,
                    expect_stamps={
                        **entry.stamps.as_dict(),
                        "table": entry.table,
                        "version": entry.version,
                    },
                )
        except Exception as exc:  # noqa: BLE001
            raise fail(
                "its lexical (BM25) index is missing or damaged: restore it, or pick another "
                "version (`rag-assets status` lists the rollback stack)",
                exc,
            ) from None

    def _find(self, to: str, stack: list[Published]) -> Published:
        """``VERSION``: the index's own version (issue 51: the number ``status`` shows, 1 for
        the first publish); ``TABLE@V``: LanceDB's version ``V`` of ``TABLE`` (``--json``)."""
        from rag_assets.lib.index.store.records import index_versions

        table, at, version = to.rpartition("@")
        if not version.strip().lstrip("v").isdigit():
            raise ValueError(
                f"--to {to!r}: give the index's version (2, as `status` shows it) or TABLE@V "
                "(LanceDB's version of a table, as `status --json` shows it)"
            )
        v = int(version.strip().lstrip("v"))
        records = self.history_records()
        if not at:  # the index's own count
            keys = {n: k for k, n in index_versions(records).items()}
            entries = {e.key: e for e in [*stack, *(r.entry for r in records)]}
            if v in keys and keys[v] in entries:
                return entries[keys[v]]
            known = ", ".join(str(n) for n in sorted(keys)) or "none"
            raise ValueError(
                f"--to {to}: the index has no version {v} (its versions: {known}; "
                "`rag-assets status` lists them)"
            )
        candidates = [*reversed(stack), *(r.entry for r in reversed(records))]
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
