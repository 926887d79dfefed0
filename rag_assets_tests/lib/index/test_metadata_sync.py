"""Metadata in the tables (issue 34): every chunk row carries its document's metadata, a
metadata-only change rewrites those columns and embeds nothing (its own kind of change in the
report and the pointer), and a table from before the columns is brought up to date the same
way."""

from __future__ import annotations

import json
from pathlib import Path

from rag_assets.lib.index.metadata import (
    PUBLIC,
    column_index,
    ensure_filter_indexes,
    label_index,
)
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore, scan
from rag_assets.lib.ingest.chunk import strategy
from rag_assets_tests.lib.index.fake_index import HashEmbedder


def _corpus(root: Path) -> Path:
    (root / "hr").mkdir(parents=True)
    (root / "pub").mkdir()
    for i in range(3):
        paras = "\n\n".join(f"Paragraph {j} of staff note {i} on leave {j}." * 6 for j in range(4))
        (root / "hr" / f"note{i}.md").write_text(f"# Note {i}\n\n{paras}\n")
        (root / "pub" / f"page{i}.md").write_text(
            f"---\ntags: [public, page{i}]\n---\n# Page {i}\n\n{paras}\n"
        )
    (root / ".ragmeta").write_text("hr/** access=hr\n")
    return root


def _rows(store: IndexStore, table: str, version: int) -> dict[str, dict]:
    tbl = store.open_table(table, version)
    cols = ["chunk_id", "document_id", "content_hash", "meta", "access", "meta_hash", "size"]
    return {r["chunk_id"]: r for r in scan(tbl, cols).to_pylist()}


def test_rows_carry_metadata_and_a_metadata_edit_embeds_nothing(tmp_path):
    root, emb = _corpus(tmp_path / "docs"), HashEmbedder()
    store = IndexStore(tmp_path / "idx")
    first = index_folder(root, store, strategy("E", 200), emb)
    assert first.entry.change == "content" and first.sync.embedded > 0
    rows = _rows(store, first.entry.table, first.entry.version)
    for r in rows.values():
        if r["document_id"].startswith("hr/"):
            assert r["access"] == ["hr"] and "access=hr" in r["meta"]
        else:
            assert r["access"] == [PUBLIC] and "tags=public" in r["meta"]
        assert f"document={r['document_id']}" in r["meta"] and r["size"] > 0

    # an access change (.ragmeta), a tag edit (front matter) and one real text edit
    (root / ".ragmeta").write_text("hr/** access=hr,legal\n")
    page = (root / "pub" / "page0.md").read_text()
    (root / "pub" / "page0.md").write_text(page.replace("page0]", "page0, archived]"))
    emb.encoded.clear()
    second = index_folder(root, store, strategy("E", 200), emb)
    s = second.sync
    assert emb.encoded == [] and s.embedded == 0  # nothing re-embedded
    assert sorted(s.documents_metadata) == [
        "hr/note0.md",
        "hr/note1.md",
        "hr/note2.md",
        "pub/page0.md",
    ]
    assert s.chunks_metadata == sum(
        1 for r in rows.values() if r["document_id"] in s.documents_metadata
    )
    assert s.documents_written == [] and s.chunks_changed == 0 and s.chunks_new == 0
    assert second.entry.change == "metadata" and second.entry.version > first.entry.version
    after = _rows(store, second.entry.table, second.entry.version)
    assert set(after) == set(rows)  # the same chunks: ids and texts
    assert all(after[c]["content_hash"] == rows[c]["content_hash"] for c in rows)
    for r in after.values():
        if r["document_id"].startswith("hr/"):
            assert (
                r["access"] == ["hr", "legal"]
                and r["meta_hash"] != rows[r["chunk_id"]]["meta_hash"]
            )
    assert "tags=archived" in next(
        r["meta"] for r in after.values() if r["document_id"] == "pub/page0.md"
    )
    # the documents table and the history record it too
    docs = store.canonical_texts(second.entry.documents_version)
    assert docs["hr/note0.md"]["access"] == ["hr", "legal"]
    assert json.loads(docs["pub/page0.md"]["metadata_json"])["tags"] == [
        "public",
        "page0",
        "archived",
    ]
    assert [e.change for e in store.history()][-2:] == ["content", "metadata"]
    manifest = store.manifest(second.entry)
    assert {r["document_id"]: r["metadata"].get("access") for r in manifest["documents"]}[
        "hr/note1.md"
    ] == ["hr", "legal"]
    # nothing changed: nothing written
    third = index_folder(root, store, strategy("E", 200), emb)
    assert third.entry.change == "none" and third.entry.version == second.entry.version


def test_a_table_from_before_the_metadata_columns_is_labelled_without_embedding(tmp_path):
    root, emb = _corpus(tmp_path / "docs"), HashEmbedder()
    store = IndexStore(tmp_path / "idx")
    first = index_folder(root, store, strategy("E", 200), emb)
    tbl = store.open_table(first.entry.table)
    tbl.drop_columns(["meta", "access", "size", "modified", "meta_hash"])  # as issue 33 left it
    assert "meta" not in store.open_table(first.entry.table).schema.names
    emb.encoded.clear()
    again = index_folder(root, store, strategy("E", 200), emb)
    assert emb.encoded == [] and again.sync.embedded == 0
    assert len(again.sync.documents_metadata) == 6 and again.entry.change == "metadata"
    rows = _rows(store, again.entry.table, again.entry.version)
    assert all(r["access"] for r in rows.values())


def test_label_indexes_on_meta_and_access(tmp_path):
    root, emb = _corpus(tmp_path / "docs"), HashEmbedder()
    store = IndexStore(tmp_path / "idx")
    built = index_folder(root, store, strategy("E", 200), emb)
    tbl = store.open_table(built.entry.table)
    assert label_index(tbl, "meta") is None  # below FILTER_INDEX_MIN_ROWS: a scan is cheap
    assert ensure_filter_indexes(tbl, min_rows=1)
    assert label_index(tbl, "meta") is not None and label_index(tbl, "access") is not None
    assert column_index(tbl, "chunk_id", "btree") is not None  # issue 40: hits read by id
    assert not ensure_filter_indexes(tbl, min_rows=1)  # up to date: nothing rebuilt
    n = tbl.count_rows("array_has_any(access, ['hr'])")
    assert n == sum(
        1 for r in _rows(store, tbl.name, tbl.version).values() if r["access"] == ["hr"]
    )
