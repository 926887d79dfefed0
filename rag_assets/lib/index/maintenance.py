"""Index maintenance: compact the LanceDB tables and clean their old versions, keeping every
version that ``published.json``, ``published-history.jsonl`` (the rollback stack) and
``staging.json`` can still point to.

Every LanceDB write makes a version (one per document batch, per delete), and old versions keep
their data files, so an index grows with each run. ``compact_index`` runs LanceDB's
``optimize`` (merge small files, then remove old versions) on the chunk tables and the documents
table:

- each referenced version is tagged ``rag-keep-v<N>`` (tags of versions no longer referenced are
  removed). A tagged version cannot be cleaned: LanceDB's cleanup *fails* rather than delete it
  (``../shared/design/toolchain-findings.md``), so an ``optimize()`` run by anyone else cannot
  take a version a rollback needs;
- the cleanup cut is set just before the oldest referenced version: every older version goes;
  referenced versions and everything newer stay (LanceDB cleans by age, not by a version list);
- the BM25 directories of versions that no longer exist are removed (they are derived caches).

Run it when no ``index`` run is writing to the same directory. Other tables (e.g. expansion
views) are left alone.

``repair_index`` (``rag-assets repair``, issue 25) fixes an index that two concurrent writers
damaged before the writer lease existed: chunk ids (or document ids) stored more than once.
Under the writer lease it rewrites the latest version of each damaged table with one row per id
in one ``overwrite`` commit (a new version: every older version, published ones included, stays
readable and rollback-able); the next ``rag-assets index`` evaluates and publishes the repaired
version.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from rag_assets.lib.index.store import (
    BM25_TABLE,
    DOCUMENTS_TABLE,
    FILES_TABLE,
    META_TABLE,
    IndexStore,
    Published,
)
from rag_assets.lib.index.store.querylog import FEEDBACK_TABLE, QUERIES_TABLE

KEEP_TAG_PREFIX = "rag-keep-v"
#: How far before the oldest referenced version the cleanup cut lies. LanceDB measures the cut
#: from when its cleanup starts, so files are compacted first (a cleanup of nothing) and the cut
#: only has to cover the cleanup call's start; when it does not, cleanup fails on the tagged
#: version (nothing is lost) and is retried with a 10x margin.
CLEANUP_MARGIN = timedelta(milliseconds=200)
#: A cleanup cut that removes nothing: used for the compaction pass.
NOTHING_OLDER_THAN = timedelta(days=36500)
#: For a table nothing points to: every version but the latest is removed.
UNREFERENCED_CUT = timedelta(milliseconds=1)


@dataclass
class TableCompaction:
    """What compaction did to one table."""

    table: str
    kept: list[int]  # referenced versions, all still readable afterwards
    missing: list[int]  # referenced versions that were already gone before compaction
    versions_before: int
    versions_after: int
    bytes_before: int
    bytes_after: int
    bm25_removed: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def line(self) -> str:
        mib = (self.bytes_after - self.bytes_before) / 2**20
        kept = ", ".join(f"v{v}" for v in self.kept) or "latest only"
        return (
            f"{self.table}: {self.versions_before} -> {self.versions_after} versions, "
            f"size {mib:+.2f} MiB; kept {kept}"
            + (f"; already gone: {self.missing}" if self.missing else "")
        )


def referenced_versions(store: IndexStore) -> dict[str, set[int]]:
    """table name -> versions the pointer, its history and staging can point to."""
    entries: list[Published] = list(store.history())
    for get in (lambda: store.published(strict=False), store.staging):
        try:
            entry = get()
        except Exception:  # noqa: BLE001 - absent or damaged: nothing to keep for it
            entry = None
        if entry is not None:
            entries.append(entry)
    refs: dict[str, set[int]] = {}
    for e in entries:
        refs.setdefault(e.table, set()).add(int(e.version))
        refs.setdefault(DOCUMENTS_TABLE, set()).add(int(e.documents_version))
    return refs


def compact_index(store: IndexStore) -> list[TableCompaction]:
    """Compact the chunk tables and the documents table of ``store``; see the module doc."""
    refs = referenced_versions(store)
    names = [n for n in store.table_names() if n.startswith("chunks_") or n == DOCUMENTS_TABLE]
    out = [_compact_table(store, name, refs.get(name, set())) for name in names]
    if store.remote:  # issue 23: rows no read sees any more (older copies of a file)
        store.prune_files()
    # one small fragment per write otherwise (issue 33: the query log's batches too)
    for name in (META_TABLE, BM25_TABLE, FILES_TABLE, QUERIES_TABLE, FEEDBACK_TABLE):
        if name in store.table_names():
            store.db.open_table(name).optimize()
    return out


def _compact_table(store: IndexStore, name: str, keep: set[int]) -> TableCompaction:
    tbl = store.db.open_table(name)
    stamps = {int(v["version"]): v["timestamp"] for v in tbl.list_versions()}
    present = sorted(keep & set(stamps))
    missing = sorted(keep - set(stamps))
    root = Path(store.uri) / f"{name}.lance"
    before = _dir_bytes(root)
    _sync_tags(tbl, set(present))
    tbl.optimize(cleanup_older_than=NOTHING_OLDER_THAN)  # compaction only
    margin = CLEANUP_MARGIN
    for attempt in range(3):
        if present:
            oldest: datetime = min(stamps[v] for v in present)
            cut = datetime.now() - oldest + margin
        else:
            cut = UNREFERENCED_CUT
        try:
            tbl.optimize(cleanup_older_than=cut)
            break
        except RuntimeError as exc:
            if "tagged version" not in str(exc) or attempt == 2:
                raise
            margin *= 10  # the cut passed a kept version while compacting: nothing was lost
            time.sleep(0.01)
    tbl = store.db.open_table(name)
    after_versions = {int(v["version"]) for v in tbl.list_versions()}
    lost = [v for v in present if v not in after_versions]
    if lost:  # cannot happen with tags in place; say so loudly if it ever does
        raise RuntimeError(f"compaction removed referenced versions {lost} of {name}")
    removed = _drop_stale_bm25(store, name, after_versions)
    return TableCompaction(
        table=name,
        kept=present,
        missing=missing,
        versions_before=len(stamps),
        versions_after=len(after_versions),
        bytes_before=before,
        bytes_after=_dir_bytes(root),
        bm25_removed=removed,
    )


def _sync_tags(tbl: Any, keep: set[int]) -> None:
    """Tag every referenced version; untag versions nothing points to any more."""
    tags = tbl.tags.list()
    for tag, info in tags.items():
        if tag.startswith(KEEP_TAG_PREFIX) and int(info["version"]) not in keep:
            tbl.tags.delete(tag)
    have = {t for t in tags if t.startswith(KEEP_TAG_PREFIX)}
    for v in sorted(keep):
        tag = f"{KEEP_TAG_PREFIX}{v}"
        if tag not in have:
            tbl.tags.create(tag, v)


def _drop_stale_bm25(store: IndexStore, table: str, versions: set[int]) -> list[str]:
    if store.remote:  # issue 13: rows of _rag_bm25 on object storage
        return store.drop_bm25(table, keep=versions)
    removed = []
    for d in sorted((Path(store.uri) / "bm25").glob(f"{table}@*")):
        try:
            version = int(d.name.rsplit("@", 1)[1])
        except ValueError:
            continue
        if version not in versions and d.is_dir():
            shutil.rmtree(d)
            removed.append(d.name)
    return removed


@dataclass
class TableRepair:
    """What ``repair_index`` found (and did) in one table."""

    table: str
    key: str  # the id column
    rows_before: int
    duplicates: int  # rows removed: extra copies of an id
    version_before: int
    version_after: int  # == version_before when nothing was wrong
    published_damaged: bool = False  # the published version itself holds duplicate ids

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def line(self) -> str:
        if not self.duplicates:
            return f"{self.table}: {self.rows_before} rows, no duplicate {self.key}s"
        out = (
            f"{self.table}: removed {self.duplicates} duplicate rows ({self.rows_before} -> "
            f"{self.rows_before - self.duplicates}) in v{self.version_after}; "
            f"v{self.version_before} and older kept"
        )
        if self.published_damaged:
            out += "; the published version has duplicates: run `rag-assets index` to publish"
        return out


def duplicate_ids(tbl: Any, key: str) -> int:
    """How many rows of ``tbl`` repeat an id of column ``key`` (0 for a sound table)."""
    ids = tbl.to_arrow().column(key) if tbl.count_rows() else None
    if ids is None:
        return 0
    return len(ids) - len(ids.unique())


def repair_index(store: IndexStore, run: str = "repair") -> list[TableRepair]:
    """Remove duplicate ids from the latest version of every chunk table and the documents
    table (see the module docstring); holds the writer lease while it writes."""
    pub = store.published(strict=False)
    out: list[TableRepair] = []
    with store.hold(run):
        names = [n for n in store.table_names() if n.startswith("chunks_")]
        names += [DOCUMENTS_TABLE] if DOCUMENTS_TABLE in store.table_names() else []
        for name in names:
            key = "document_id" if name == DOCUMENTS_TABLE else "chunk_id"
            out.append(_repair_table(store, name, key, pub))
    return out


def _repair_table(store: IndexStore, name: str, key: str, pub: Published | None) -> TableRepair:
    import pyarrow.compute as pc

    tbl = store.db.open_table(name)
    data = tbl.to_arrow()
    before = int(tbl.version)
    dups = len(data) - len(data.column(key).unique())
    damaged = False
    if pub is not None and (name == pub.table or name == DOCUMENTS_TABLE):
        version = pub.version if name == pub.table else pub.documents_version
        old = store.open_table(name, version)
        damaged = duplicate_ids(old, key) > 0
    report = TableRepair(name, key, len(data), dups, before, before, damaged)
    if not dups:
        return report
    # one row per id, deterministically the first in (id, row order): copies of an id written
    # by two racing runs of one configuration hold the same content
    order = pc.sort_indices(
        data.append_column("_pos", pa.array(range(len(data)))),
        sort_keys=[(key, "ascending"), ("_pos", "ascending")],
    )
    ordered = data.take(order)
    ids = ordered.column(key).to_pylist()
    keep = [i for i in range(len(ids)) if i == 0 or ids[i] != ids[i - 1]]
    fixed = ordered.take(pa.array(keep, type=pa.int64())).cast(tbl.schema)
    report.version_after = int(tbl.add(fixed, mode="overwrite").version)
    return report


def _dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0
