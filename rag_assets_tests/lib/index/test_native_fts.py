"""LanceDB's own full-text index (issue 23) against the bm25s oracle: with NATIVE_FTS_CONFIG it
scores the design's BM25 exactly on ASCII text (same ids, same order, same scores), in a real
LanceDB directory; the index lives in the table's own versions."""

from __future__ import annotations

import random

import lancedb
import pyarrow as pa
import pytest

from rag_assets.lib.index.lexical import BM25Index, NativeFTS

WORDS = [f"{a}{b}" for a in ("lan", "riv", "tea", "map", "bel", "ora") for b in "aeiouxyz"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = random.Random(7)
    texts = []
    for _ in range(300):
        vocab = WORDS[: rng.randint(6, len(WORDS))]  # uneven document frequencies
        words = [rng.choice(vocab) for _ in range(rng.randint(3, 40))]
        texts.append(" ".join(w.upper() if rng.random() < 0.1 else w for w in words) + ".")
    ids = [f"c{i:04d}" for i in range(len(texts))]
    db = lancedb.connect(str(tmp_path_factory.mktemp("fts")))
    tbl = db.create_table("chunks", pa.table({"chunk_id": ids, "text": texts}))
    return ids, texts, tbl, NativeFTS.build(tbl)


QUERIES = ["lana rive", "teax", "bele bele orau", "MAPI, lanz!", "oray tea lana riva", "zzz"]


@pytest.mark.parametrize("query", QUERIES)
def test_native_fts_ranks_and_scores_as_the_oracle(corpus, query):
    ids, texts, _, native = corpus
    oracle = BM25Index.build(ids, texts)
    want = oracle.search(query, 10)
    got = native.search(query, 10)
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-5)
    assert bool(want) == (query != "zzz")


def test_blank_or_tokenless_query_and_k0_find_nothing(corpus):
    native = corpus[3]
    assert native.search("", 10) == [] and native.search("?!", 10) == []
    assert native.search("lana", 0) == []


def test_index_is_a_table_version_and_survives_reopening(corpus):
    _, _, tbl, native = corpus
    assert any(i.index_type == "FTS" for i in tbl.list_indices())
    reopened = NativeFTS(lancedb.connect(tbl._conn.uri).open_table("chunks"))
    assert reopened.search("teax lana", 5) == native.search("teax lana", 5)


def test_a_large_table_indexes_and_queries_through_the_native_index(tmp_path, monkeypatch):
    """At ``NATIVE_FTS_MIN_ROWS`` rows (lowered here to fit a test) the indexer builds LanceDB's
    own index as a new table version, writes no bm25s files, and queries search that index,
    ranking as the bm25s oracle over the same rows does; a re-index after an edit keeps it
    right (rows added since it was built are found too)."""
    from rag_assets.lib.index import lexical
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.query.retrieve import Index
    from rag_assets_tests.lib.index.fake_index import HashEmbedder, _corpus

    class QueryHash(HashEmbedder):
        def encode_query(self, query):  # type: ignore[no-untyped-def]
            return self.encode([query])[0]

    monkeypatch.setattr(lexical, "NATIVE_FTS_MIN_ROWS", 10)
    docs = _corpus(tmp_path / "docs", n=4)
    emb = QueryHash()
    first = index_folder(docs, tmp_path / "index", strategy("E", 300), emb).entry
    assert first.rows >= 10
    store = IndexStore(tmp_path / "index")
    tbl = store.open_table(first.table, first.version)
    assert lexical.fts_index(tbl) is not None and not store.has_bm25(first.table, first.version)
    assert not (tmp_path / "index" / "bm25").exists()
    index = Index(store, store.published(), emb)
    assert isinstance(index.bm25, lexical.NativeFTS)
    rows = tbl.to_arrow().select(["chunk_id", "text"])
    oracle = BM25Index.build(rows["chunk_id"].to_pylist(), rows["text"].to_pylist())
    for q in ("topic 12", "paragraph 3 document 2", "document"):
        got, want = index.bm25.search(q, 5), oracle.search(q, 5)
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-4)
        cut = want[-1][1] * (1 + 1e-4)  # above the 5th score no tie can reorder the two
        assert {c for c, s in got if s > cut} == {c for c, s in want if s > cut}
    hits = index.search("topic 31", retriever="bm25", k=3)
    assert hits and hits[0].document_id == "doc3.md"

    (docs / "doc1.md").write_text("# Document 1\n\n## Part\n\nZebrafish glossary, edition two.\n")
    second = index_folder(docs, tmp_path / "index", strategy("E", 300), emb).entry
    again = Index(IndexStore(tmp_path / "index"), second, emb)
    assert isinstance(again.bm25, lexical.NativeFTS)
    assert again.search("zebrafish glossary", retriever="bm25", k=1)[0].document_id == "doc1.md"
    old_words = again.search("topic 12", retriever="bm25", k=20)
    assert old_words and all(h.document_id != "doc1.md" for h in old_words)  # the edit is seen
