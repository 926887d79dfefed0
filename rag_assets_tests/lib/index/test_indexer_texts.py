"""Issue 31: the sync report says what happened by text, not by chunk id: a one-paragraph edit is
one chunk re-embedded and the rest reused, whatever the ids did; a first sync says where every
vector came from (encoded, or a text repeated in the same run), and the embedding progress
counts the texts sent to the encoder. Plumbing with the deterministic fake encoder; the
summary wording on a real run is in ``rag_assets_tests/test_ui.py``."""

from __future__ import annotations

from rag_assets.lib.index.store import IndexStore
from rag_assets_tests.lib.index.fake_index import HashEmbedder, _corpus, _sync


def test_a_one_paragraph_edit_is_one_chunk_reembedded_the_rest_reused(tmp_path):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    first, chunks, _ = _sync(store, emb, root)
    path = root / "doc2.md"
    path.write_text(path.read_text().replace("Paragraph 0 of document 2", "An edited opening"))
    report, after, _ = _sync(store, emb, root)
    mine = [c for c in after if c.document_id == "doc2.md"]
    t = report.texts
    assert report.embedded == 1  # one text went through the encoder
    assert t["changed_documents_reembedded"] == 1
    assert t["changed_documents_reused"] == len(mine) - 1  # the document's other chunks
    assert t["changed_documents_dropped"] == 1  # the paragraph's old text, replaced
    assert t["chunks_in_unchanged_documents"] == len(after) - len(mine)
    assert t["chunks_in_new_documents"] == 0 == t["chunks_of_deleted_documents"]
    assert report.reused_from_table == len(mine) - 1 and report.reused_in_run == 0
    assert report.rows_before == len(chunks) and report.version_before == first.version
    # by id, the same edit moved every later chunk of the document: "new" and "removed"
    assert report.chunks_new + report.chunks_changed >= 1


def test_a_first_sync_counts_repeated_texts_apart_from_reuse(tmp_path):
    root = _corpus(tmp_path / "docs", n=2)
    (root / "copy.md").write_text((root / "doc1.md").read_text())  # the same texts twice
    store, emb = IndexStore(tmp_path / "idx"), HashEmbedder()
    progress: list[tuple[int, int]] = []
    report, chunks, _ = _sync(store, emb, root, embed_progress=lambda d, t: progress.append((d, t)))
    twins = sum(1 for c in chunks if c.document_id == "copy.md")
    assert report.rows_before == 0 and report.version_before == 1  # a table this sync created
    assert report.embedded == len(chunks) - twins
    assert report.reused_in_run == twins and report.reused_from_table == 0
    assert report.texts["chunks_in_new_documents"] == len(chunks)
    # the encoder's progress: texts encoded out of the distinct texts to encode
    assert progress and progress[-1] == (report.embedded, report.embedded)
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)


def test_a_deleted_document_is_its_rows_removed(tmp_path):
    root, store, emb = _corpus(tmp_path / "docs"), IndexStore(tmp_path / "idx"), HashEmbedder()
    _, chunks, _ = _sync(store, emb, root)
    gone = [c for c in chunks if c.document_id == "doc4.md"]
    (root / "doc4.md").unlink()
    report, _, _ = _sync(store, emb, root)
    assert report.texts["chunks_of_deleted_documents"] == len(gone)
    assert report.texts["chunks_in_unchanged_documents"] == len(chunks) - len(gone)
    assert report.embedded == 0 and report.commits == 1
