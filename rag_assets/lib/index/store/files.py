"""The files the graph keeps beside the tables (issue 23): evaluation reports, the calibrated
threshold and the judge's calibration, the distance plot, the question-source decision, the
generated question set and the doc2query views.

Names are relative paths (``evaluation/<table>@<version>.json``, ``views/<table>@<version>/…``).
On a local index they are files under the index directory, written atomically (temp file, fsync,
rename). On object storage they are rows of the ``_rag_files`` LanceDB table, in the same
database as the chunk tables and through the same storage options and ``AWS_*`` variables, so
nothing is written into a local folder named ``s3:``:

- a row is ``name``, ``seq`` (``time.time_ns()`` of the write), ``deleted`` and ``data``; the
  newest row of a name is the file (``deleted``: removed);
- :meth:`FileRows.write_files` adds every row of a call in one LanceDB commit, so a folder (the
  views of one table version, a generated question set) is replaced whole or not at all, on
  any object store;
- :meth:`FileRows.read_tree` copies a folder's rows into a local folder for code that reads
  files (LanceDB's own view table, the BM25 files, ``load_needle_set``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from rag_assets.lib.index.store.records import atomic_write_bytes, replace_dir
from rag_assets.lib.index.store.schema import scan
from rag_assets.lib.index.store.tables import Tables

FILES_TABLE = "_rag_files"  # the graph's files as rows (object storage)


FILES_SCHEMA = pa.schema(
    [
        ("name", pa.string()),  # a relative path: evaluation/…, views/<table>@<version>/…
        ("seq", pa.int64()),  # time.time_ns() of the write: the newest row of a name wins
        ("deleted", pa.bool_()),
        ("data", pa.large_binary()),
    ]
)


class FileRows(Tables):
    """Files beside the tables: a directory's files, or ``_rag_files`` rows remotely."""

    def write_file(self, name: str, data: bytes | str) -> None:
        """Write one file (atomic on a local disk and on object storage)."""
        self.write_files({name: data})

    def write_files(self, files: Mapping[str, bytes | str | None]) -> None:
        """Write several files; ``None`` removes one. Remotely all of them are one commit."""
        names = {_clean(n): d for n, d in files.items()}
        if not self.remote:
            for name, data in sorted(names.items()):
                path = self.file_path(name)
                if data is None:
                    path.unlink(missing_ok=True)
                else:
                    atomic_write_bytes(path, data.encode() if isinstance(data, str) else data)
            return
        seq = time.time_ns()
        rows = [
            {
                "name": name,
                "seq": seq,
                "deleted": data is None,
                "data": b"" if data is None else (data.encode() if isinstance(data, str) else data),
            }
            for name, data in sorted(names.items())
        ]
        if rows:
            self._files_table(create=True).add(pa.Table.from_pylist(rows, schema=FILES_SCHEMA))

    def read_file(self, name: str) -> bytes | None:
        """The file's bytes, or None when there is none."""
        name = _clean(name)
        if not self.remote:
            path = self.file_path(name)
            return path.read_bytes() if path.is_file() else None
        return self._newest(f"name = '{_quote(name)}'").get(name)

    def read_text(self, name: str) -> str | None:
        data = self.read_file(name)
        return None if data is None else data.decode("utf-8")

    def delete_file(self, name: str) -> None:
        if self.read_file(name) is not None:
            self.write_files({name: None})

    def file_names(self, prefix: str) -> list[str]:
        """The files under ``prefix`` (a folder name), sorted."""
        prefix = _clean(prefix).rstrip("/") + "/"
        if not self.remote:
            root = self.file_path(prefix)
            if not root.is_dir():
                return []
            base = Path(self.uri)
            return sorted(
                p.relative_to(base).as_posix()
                for p in root.rglob("*")
                if p.is_file() and not p.name.startswith(".")
            )
        return sorted(self._newest(f"starts_with(name, '{_quote(prefix)}')", data=False))

    def write_tree(self, prefix: str, folder: Path) -> None:
        """Replace everything under ``prefix`` by the files of a local ``folder`` (one commit
        remotely; locally the folder is copied beside, then renamed into place)."""
        prefix = _clean(prefix).rstrip("/")
        files = {
            f"{prefix}/{p.relative_to(folder).as_posix()}": p.read_bytes()
            for p in sorted(Path(folder).rglob("*"))
            if p.is_file()
        }
        if not self.remote:
            out = self.file_path(prefix)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
            try:
                shutil.copytree(folder, tmp, dirs_exist_ok=True)
                replace_dir(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return
        gone: dict[str, bytes | str | None] = {
            n: None for n in self.file_names(prefix) if n not in files
        }
        self.write_files({**gone, **files})

    def read_tree(self, prefix: str, dest: Path) -> bool:
        """Copy the files under ``prefix`` into ``dest`` (replacing it); False when none."""
        prefix = _clean(prefix).rstrip("/")
        if not self.remote:
            src = self.file_path(prefix)
            if not src.is_dir():
                return False
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(src, dest)
            return True
        rows = self._newest(f"starts_with(name, '{_quote(prefix + '/')}')")
        if not rows:
            return False
        shutil.rmtree(dest, ignore_errors=True)
        for name, data in rows.items():
            path = Path(dest) / name[len(prefix) + 1 :]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return True

    def file_path(self, name: str) -> Path:
        """The local path of a file of a local index (an object-store index has none)."""
        if self.remote:
            raise ValueError(f"{self.uri}: files of an object-store index are {FILES_TABLE} rows")
        return Path(self.uri) / _clean(name)

    def file_location(self, name: str) -> str:
        """Where a file is, for people: its path, or ``<uri>/_rag_files[<name>]``."""
        if not self.remote:
            return str(self.file_path(name))
        return f"{self.uri.rstrip('/')}/{FILES_TABLE}[{_clean(name)}]"

    # -- rows -----------------------------------------------------------------------------
    def _files_table(self, create: bool = False) -> Any:
        if FILES_TABLE in self.table_names():
            return self.db.open_table(FILES_TABLE)
        if not create:
            return None
        try:
            return self.db.create_table(FILES_TABLE, schema=FILES_SCHEMA)
        except (ValueError, OSError, RuntimeError):
            if FILES_TABLE not in self.table_names():  # not a create race: a real failure
                raise
            return self.db.open_table(FILES_TABLE)

    def _newest(self, where: str, data: bool = True) -> dict[str, bytes]:
        """name → data of the newest row of each name matching ``where`` (deleted: absent);
        ``data=False`` lists names without fetching the bytes (values are then empty)."""
        tbl = self._files_table()
        if tbl is None:
            return {}
        columns = ["name", "seq", "deleted", *(["data"] if data else [])]
        rows = scan(tbl, columns, where).to_pylist()
        newest: dict[str, dict[str, Any]] = {}
        for r in sorted(rows, key=lambda r: (r["seq"], r["deleted"])):
            newest[str(r["name"])] = r
        return {n: bytes(r.get("data") or b"") for n, r in newest.items() if not r["deleted"]}

    def prune_files(self) -> int:
        """Remove the rows no read can see any more (older rows of a name, deletions);
        returns how many went (``compact`` on object storage)."""
        tbl = self._files_table()
        if tbl is None:
            return 0
        rows = scan(tbl, ["name", "seq", "deleted"]).to_pylist()
        newest: dict[str, tuple[int, bool]] = {}
        for r in rows:
            key = (int(r["seq"]), bool(r["deleted"]))
            if r["name"] not in newest or key > newest[r["name"]]:
                newest[r["name"]] = key
        stale = [
            (n, s)
            for n, s, d in ((r["name"], int(r["seq"]), bool(r["deleted"])) for r in rows)
            if (s, d) != newest[n] or newest[n][1]
        ]
        for i in range(0, len(stale), 200):  # a few commits, not one per row
            tbl.delete(
                " OR ".join(f"(name = '{_quote(n)}' AND seq = {s})" for n, s in stale[i : i + 200])
            )
        return len(stale)


def _clean(name: str) -> str:
    """A relative path with no ``..`` (names come from table names and fixed file names)."""
    parts = [p for p in str(name).replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"{name!r}: not a file name inside the index")
    return "/".join(parts) + ("/" if str(name).endswith("/") else "")


def _quote(text: str) -> str:
    return text.replace("'", "''")
