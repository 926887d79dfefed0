"""Issue 22: a re-added document reuses its vectors from the table's history (content hash,
matching stamps) instead of being embedded again, and the sync report counts documents and
chunks as new / changed / unchanged / removed. Plumbing with the deterministic fake encoder;
the real-model run is in ``rag_assets_tests/test_operator_week.py``."""

from __future__ import annotations

import numpy as np

from rag_assets.lib.index.indexer import _stamp_filter
from rag_assets.lib.index.store import IndexStore, scan, vectors
from rag_assets_tests.lib.index.fake_index import HashEmbedder, _corpus, _sync


def test_readded_document_reuses_vectors_from_the_history(tmp_path):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    first, chunks, stamps = _sync(store, emb, root)
    doc = root / "doc3.md"
    text = doc.read_text()
    mine = [c for c in chunks if c.document_id == "doc3.md"]
    doc.unlink()
    gone, _, _ = _sync(store, emb, root)
    assert gone.documents_deleted == ["doc3.md"] and gone.chunks_removed == len(mine)
    assert (gone.chunks_new, gone.chunks_changed) == (0, 0)
    assert gone.chunks_unchanged == len(chunks) - len(mine)
    encoded = len(emb.encoded)
    doc.write_text(text)
    back, _, _ = _sync(store, emb, root)
    assert back.documents_new == ["doc3.md"] and back.documents_changed == []
    assert back.embedded == 0 and len(emb.encoded) == encoded  # nothing sent to the encoder
    assert back.reused == back.reused_from_history == len(mine)
    assert back.chunks_new == len(mine) and back.chunks_removed == 0
    # the reused vectors are the ones first written, bit for bit
    tbl = store.chunk_table(stamps)
    rows = scan(tbl, ["chunk_id", "vector"], "document_id = 'doc3.md'")
    old = store.open_table(tbl.name, first.version)
    before = scan(old, ["chunk_id", "vector"], "document_id = 'doc3.md'")
    a = dict(zip(rows["chunk_id"].to_pylist(), vectors(rows["vector"], emb.dims), strict=True))
    b = dict(zip(before["chunk_id"].to_pylist(), vectors(before["vector"], emb.dims), strict=True))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_history_rows_of_other_stamps_are_not_reused(tmp_path):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    _, chunks, stamps = _sync(store, emb, root)
    tbl = store.chunk_table(stamps)
    n = len(scan(tbl, ["chunk_id"], _stamp_filter(stamps)))
    assert n == len(chunks)  # the filter selects this table's own rows ...
    other = type(stamps)(**{**stamps.__dict__, "revision": "another-revision"})
    assert len(scan(tbl, ["chunk_id"], _stamp_filter(other))) == 0  # ... and only those


def test_edit_counts_changed_and_unchanged_documents_and_chunks(tmp_path):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    _, before, _ = _sync(store, emb, root)
    path = root / "doc2.md"
    path.write_text(path.read_text().replace("Paragraph 5 of document 2", "A new paragraph"))
    report, after, _ = _sync(store, emb, root)
    assert report.documents_changed == ["doc2.md"] and report.documents_new == []
    assert len(report.documents_unchanged) == 4
    old = {c.chunk_id: c.text for c in before}
    new = {c.chunk_id: c.text for c in after}
    assert report.chunks_new == len(new.keys() - old.keys())
    assert report.chunks_removed == len(old.keys() - new.keys())
    assert report.chunks_changed == sum(1 for k in new.keys() & old.keys() if new[k] != old[k])
    assert report.chunks_unchanged == sum(1 for k in new.keys() & old.keys() if new[k] == old[k])
    assert report.chunks_changed + report.chunks_new >= 1
    meta = report.as_metadata()
    assert meta["documents_changed"] == 1 and meta["chunks_unchanged"] == report.chunks_unchanged
