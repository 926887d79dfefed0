"""LanceDB store + incremental sync: reuse, atomic per-document replacement, deletions,
failed-document policy, crash safety (an exception and a real kill -9), stamps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from rag_assets.lib.index.indexer import sync_chunks
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore, StampMismatch, scan
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import chunk_documents, strategy
from rag_assets.lib.ingest.extract import extract_folder
from rag_assets_tests.lib.index.fake_index import HashEmbedder, _corpus, _sync


def _rows(store, stamps):
    return scan(store.chunk_table(stamps), ["chunk_id", "document_id", "content_hash"]).to_pylist()


def test_first_sync_then_unchanged_rerun_embeds_nothing(tmp_path):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    first, chunks, stamps = _sync(store, emb, root, batch_rows=10)
    assert first.rows == len(chunks) == first.embedded > 0
    assert first.commits > 1  # batched commits of whole documents
    n_encoded = len(emb.encoded)
    again, _, _ = _sync(store, emb, root)
    assert (again.embedded, again.commits, again.version) == (0, 0, first.version)
    assert len(emb.encoded) == n_encoded
    assert len(again.documents_unchanged) == 5


def test_edit_reembeds_only_changed_texts_and_replaces_the_documents_rows(tmp_path):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    _, before, stamps = _sync(store, emb, root)
    path = root / "doc2.md"
    path.write_text(
        path.read_text().replace("Paragraph 5 of document 2", "A new closing paragraph")
    )
    report, after, _ = _sync(store, emb, root)
    changed = {c.text for c in after} - {c.text for c in before}
    assert report.embedded == len(changed) >= 1
    assert report.documents_written == ["doc2.md"]
    rows = _rows(store, stamps)
    assert len(rows) == len(after) == report.rows
    assert {r["chunk_id"] for r in rows} == {c.chunk_id for c in after}


def test_deleted_document_loses_its_rows(tmp_path):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    _sync(store, emb, root)
    (root / "doc0.md").unlink()
    report, chunks, stamps = _sync(store, emb, root)
    assert report.documents_deleted == ["doc0.md"]
    assert "doc0.md" not in {r["document_id"] for r in _rows(store, stamps)}
    assert report.rows == len(chunks)
    assert "doc0.md" not in store.canonical_texts()


@pytest.mark.parametrize("policy", ["keep", "drop"])
def test_failed_document_policy(tmp_path, policy):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    _, chunks, stamps = _sync(store, emb, root, failed_policy=policy)
    old = sum(1 for c in chunks if c.document_id == "doc1.md")
    (root / "doc1.md").write_bytes(b"\xff\xfe not utf-8 \x00\x00")
    report, now, _ = _sync(store, emb, root, failed_policy=policy)
    stored = Counter(r["document_id"] for r in _rows(store, stamps))
    if policy == "keep":
        assert stored["doc1.md"] == old and report.documents_kept_failed == ["doc1.md"]
        assert report.rows == len(now) + old
    else:
        assert stored["doc1.md"] == 0 and report.rows == len(now)


def test_exception_mid_sync_leaves_each_document_old_or_new(tmp_path):
    root, store = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx")
    _, old_chunks, stamps = _sync(store, HashEmbedder(), root)
    for i in range(5):  # every document changes
        p = root / f"doc{i}.md"
        p.write_text(p.read_text().replace("talks about", "discusses"))
    crashing = HashEmbedder(fail_after=20)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _sync(store, crashing, root, batch_rows=10)
    new_chunks = chunk_documents(extract_folder(root).documents, strategy("E", 300))
    rows = _rows(store, stamps)
    for doc in {c.document_id for c in old_chunks}:
        ids = {r["chunk_id"] for r in rows if r["document_id"] == doc}
        old = {c.chunk_id for c in old_chunks if c.document_id == doc}
        new = {c.chunk_id for c in new_chunks if c.document_id == doc}
        assert ids in (old, new), f"{doc} is half-written"
    report, chunks, _ = _sync(store, HashEmbedder(), root)
    rows = _rows(store, stamps)
    assert report.rows == len(rows) == len(chunks) == len({r["chunk_id"] for r in rows})


def test_table_per_stamp_set_and_mismatch_refused(tmp_path):
    root, store = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx")
    _, _, stamps_a = _sync(store, HashEmbedder(name="a"), root)
    _, _, stamps_b = _sync(store, HashEmbedder(name="b"), root)
    assert stamps_a.table_name != stamps_b.table_name
    assert set(store.chunk_table_names()) == {stamps_a.table_name, stamps_b.table_name}
    tbl = store.chunk_table(stamps_a)
    assert Stamps.from_schema_metadata(tbl.schema.metadata) == stamps_a
    forged = Stamps(**{**stamps_b.as_dict(), "dims": 9})
    with pytest.raises(StampMismatch, match="test/b"):
        from rag_assets.lib.index.store import check_stamps

        check_stamps(tbl, forged)


def test_extractor_upgrade_updates_the_same_table_by_content_hash(tmp_path):
    """A new extractor version (a rag_assets upgrade) must not make existing indexes refuse to
    re-index: the vector space is the same, so unchanged chunks keep their vectors."""
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    first, chunks, stamps = _sync(store, emb, root)
    newer = Stamps(**{**stamps.as_dict(), "extractor": stamps.extractor + "+pdf-next"})
    assert newer.table_name == stamps.table_name
    docs = extract_folder(root).documents
    again = sync_chunks(store, newer, chunks, docs, emb)
    assert again.embedded == 0 and again.rows == first.rows == len(chunks)
    (root / "doc4.md").write_text("# Four\n\nA changed document, re-extracted.\n")
    docs = extract_folder(root).documents
    changed = chunk_documents(docs, strategy("E", 300))
    third = sync_chunks(store, newer, changed, docs, emb)
    assert third.embedded > 0 and third.documents_written == ["doc4.md"]
    rows = scan(store.chunk_table(newer), ["extractor_version"]).to_pylist()
    assert {r["extractor_version"] for r in rows} == {"markdown-3"}  # each row: its document's
    from rag_assets.lib.index.store import check_stamps

    tbl = store.chunk_table(newer)
    with pytest.raises(StampMismatch, match="revision"):  # the vector space still is checked
        check_stamps(tbl, Stamps(**{**newer.as_dict(), "revision": "other"}))


def test_publish_pins_a_version_and_rollback_returns_to_the_previous(tmp_path):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    strat = strategy("E", 300)
    first = index_folder(root, store.uri, strat, emb)
    (root / "doc4.md").unlink()
    second = index_folder(root, store.uri, strat, emb, publish=False)
    assert store.published().version == first.entry.version  # not switched yet
    pinned = store.open_table(first.entry.table, first.entry.version)
    assert pinned.count_rows() == first.sync.rows > second.sync.rows
    store.publish(second.entry)
    assert store.published().version == second.entry.version
    assert store.rollback().version == first.entry.version


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.index.embed import Embedder, resolve_model
    from rag_assets.lib.index.pipeline import index_folder

    class Slow(Embedder):
        def encode(self, texts):
            time.sleep(0.3)
            return super().encode(texts)

    index_folder(sys.argv[1], sys.argv[2], strategy("E", 200), Slow(resolve_model()), batch_rows=4)
    """
)


def test_kill_9_mid_embedding_then_rerun_is_consistent(tmp_path, real_embedder):
    """A real process with the real model is SIGKILLed between commits; the re-run repairs."""
    root, uri = _corpus(tmp_path / "docs", n=8), tmp_path / "idx"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(root), str(uri)])
    store = None
    deadline = time.time() + 120
    while time.time() < deadline:
        time.sleep(0.2)
        if proc.poll() is not None:
            break
        try:
            store = store or IndexStore(uri)
            names = store.chunk_table_names()
            if names and store.open_table(names[0]).count_rows() > 0:
                break
        except Exception:  # the child is still creating the table
            continue
    assert proc.poll() is None, "the child finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = IndexStore(uri)
    name = partial.chunk_table_names()[0]
    rows_before = partial.open_table(name).count_rows()
    result = index_folder(root, uri, strategy("E", 200), real_embedder, batch_rows=4)
    rows = scan(IndexStore(uri).open_table(name), ["chunk_id", "model", "pipeline_version"])
    ids = rows["chunk_id"].to_pylist()
    assert 0 < rows_before < len(result.chunks)
    assert len(ids) == len(set(ids)) == len(result.chunks) == result.sync.rows
    assert set(rows["model"].to_pylist()) == {real_embedder.spec.model_id}
    assert len(set(rows["pipeline_version"].to_pylist())) == 1
