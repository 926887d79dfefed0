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
