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
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from rag_assets.lib.index.store import (
    BM25_TABLE,
    DOCUMENTS_TABLE,
    META_TABLE,
    IndexStore,
    Published,
)

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
    for name in (META_TABLE, BM25_TABLE):  # issue 13: one small fragment per write otherwise
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


def _dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0
