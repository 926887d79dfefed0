"""`compact_index` on a real LanceDB directory built by the real model: old versions go, every
version the pointer and its history point to stays readable, and rollback still works."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from rag_assets.lib.index.maintenance import KEEP_TAG_PREFIX, compact_index, referenced_versions
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import DOCUMENTS_TABLE, IndexStore
from rag_assets.lib.ingest.chunk import strategy as chunk_strategy
from rag_assets.lib.query.retrieve import Index

MARKER = "Zebrafish migrate across the glossary every Thursday."


def _write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(text)


@pytest.mark.slow
def test_compaction_keeps_published_versions_and_rollback_still_works(tmp_path, real_embedder):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(4):
        _write(
            docs, f"d{i}.md", f"# Note {i}\n\nPlain note number {i} about rollback and indexes.\n"
        )
    uri = tmp_path / "index"
    strat = chunk_strategy("E", 512)
    # unpublished drafts first: versions nothing points to, older than any published one
    for i in range(2):
        _write(docs, "d0.md", f"# Note 0\n\nDraft {i} of the first note.\n")
        index_folder(docs, uri, strat, real_embedder, publish=False)
    time.sleep(1.0)  # LanceDB cleans by age: the drafts are clearly older than the first publish
    _write(docs, "d0.md", "# Note 0\n\nPlain note number 0 about rollback and indexes.\n")
    first = index_folder(docs, uri, strat, real_embedder).entry  # published first
    _write(docs, "d1.md", f"# Note 1\n\n{MARKER}\n")
    second = index_folder(docs, uri, strat, real_embedder).entry  # published v2: has the marker
    store = IndexStore(uri)
    refs = referenced_versions(store)
    assert refs[first.table] >= {first.version, second.version}
    assert refs[DOCUMENTS_TABLE] >= {first.documents_version, second.documents_version}
    before = {n: len(store.db.open_table(n).list_versions()) for n in store.table_names()}

    report = {r.table: r for r in compact_index(store)}

    chunks = report[first.table]
    assert chunks.versions_before == before[first.table]
    assert chunks.versions_after < chunks.versions_before  # the drafts' versions are gone
    remaining = {int(v["version"]) for v in store.db.open_table(first.table).list_versions()}
    assert min(remaining) == first.version and second.version in remaining
    assert set(chunks.kept) >= {first.version, second.version} and not chunks.missing
    assert report[DOCUMENTS_TABLE].versions_after < report[DOCUMENTS_TABLE].versions_before
    tbl = store.db.open_table(first.table)
    assert {f"{KEEP_TAG_PREFIX}{first.version}", f"{KEEP_TAG_PREFIX}{second.version}"} <= set(
        tbl.tags.list()
    )
    # the published version still serves, with the marker
    index = Index.open(uri, embedder=real_embedder)
    assert any(MARKER in h.content for h in index.search("zebrafish", "bm25", k=3))
    # rollback to the first published version: readable, and without the marker
    back = store.rollback()
    assert (back.table, back.version) == (first.table, first.version)
    old = Index.open(uri, embedder=real_embedder)
    hits = old.search("zebrafish glossary Thursday", "dense", k=10)  # every chunk of v1
    assert len(hits) >= 4 and not any(MARKER in h.content for h in hits)
    assert any("Plain note number 1" in h.content for h in hits)
    assert "rollback" in old.search("rollback", "dense", k=1)[0].content.lower()
    # a second compaction finds nothing more to remove and keeps the same versions
    again = {r.table: r for r in compact_index(store)}
    assert set(again[first.table].kept) == set(chunks.kept)


def _three_document_commits(store: IndexStore) -> Any:
    """The documents table of ``store`` after three commits of one row each."""
    import pyarrow as pa

    from rag_assets.lib.index.store import DOCUMENT_SCHEMA

    tbl = store.documents_table()
    for i in range(3):
        row: dict[str, object] = {f.name: None for f in DOCUMENT_SCHEMA}
        row |= {"document_id": f"d{i}", "text": "x", "page_starts": [], "headings_json": "[]"}
        tbl.add(pa.Table.from_pylist([row], schema=DOCUMENT_SCHEMA))
    return tbl


def test_an_index_with_nothing_published_keeps_only_the_latest_version(tmp_path):
    store = IndexStore(tmp_path / "index")
    tbl = _three_document_commits(store)
    assert len(tbl.list_versions()) == 4
    (report,) = compact_index(store)
    assert report.kept == [] and report.versions_after <= 2  # latest (+ the compaction commit)
    assert store.db.open_table(DOCUMENTS_TABLE).count_rows() == 3


def test_compact_command_prints_one_line_per_table(tmp_path, capsys):
    from rag_assets.cli import main

    store = IndexStore(tmp_path / "index")
    _three_document_commits(store)
    assert main(["compact", "--index", str(tmp_path / "index")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("documents: 4 -> ")
    assert store.db.open_table(DOCUMENTS_TABLE).count_rows() == 3
