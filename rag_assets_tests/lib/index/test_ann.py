# mypy: disable-error-code="arg-type,operator"
"""The automatic switch to the ANN index (issue 13) at a small N: the threshold is lowered so a
few hundred rows get a real LanceDB IVF-SQ index; below it queries stay exact.

Real LanceDB tables in tmp_path; vectors from ``bench --scale``'s synthetic generator
(clustered, deterministic) or the deterministic hash embedder for the pipeline path."""

from __future__ import annotations

from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from rag_assets.bench import scale as bench
from rag_assets.lib.index import ann
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.retrieve import Index
from rag_assets_tests.lib.index.fake_index import HashEmbedder

DIMS = 32
ROWS = 600


def _table(tmp_path: Path, n: int = ROWS):  # type: ignore[no-untyped-def]
    ids, texts, vecs = bench.synthetic_chunks(n, DIMS, n)
    flat = pa.array(vecs.reshape(-1), type=pa.float32())
    data = pa.table(
        {
            "chunk_id": ids,
            "text": texts,
            "vector": pa.FixedSizeListArray.from_arrays(flat, DIMS),
        }
    )
    return lancedb.connect(tmp_path / "db").create_table("chunks", data=data)


def test_index_parameters_follow_the_documented_rule():
    assert ann.index_params(100_000, 384) == {"num_partitions": 13}
    assert ann.index_params(1_000_000, 384) == {"num_partitions": 123}
    assert ann.index_params(10, 768)["num_partitions"] == 1
    assert (
        ann.nprobes_for(13) == ann.ANN_MIN_NPROBES
        and ann.nprobes_for(123) == 41
        and ann.nprobes_for(800) == 267
    )


def test_synthetic_chunks_are_deterministic_unit_vectors_in_topics():
    a = bench.synthetic_chunks(50, DIMS, 1000, start=100)
    b = bench.synthetic_chunks(50, DIMS, 1000, start=100)
    assert a[0] == b[0] and a[1] == b[1] and np.array_equal(a[2], b[2])
    assert a[0][0] == "syn00000100" and len(a[1][0].split()) == bench.SCALE_WORDS_PER_CHUNK
    assert np.allclose(np.linalg.norm(a[2], axis=1), 1.0, atol=1e-5)
    other = bench.synthetic_chunks(50, DIMS, 1000, start=150)[2]
    assert not np.array_equal(a[2], other)  # another slice of the same corpus


@pytest.mark.slow
def test_below_the_threshold_nothing_is_built_and_search_is_exact(tmp_path):
    tbl = _table(tmp_path)
    assert ann.ensure_vector_index(tbl, min_rows=ROWS + 1) is None
    assert ann.vector_index(tbl) is None
    assert ann.search_mode(tbl, ROWS, min_rows=ROWS + 1) == (False, 0)
    # an index built anyway is not used below the threshold: the ranking stays exact
    tbl.create_index("vector", config=lancedb.index.IvfSq(distance_type="cosine"))
    assert ann.search_mode(tbl, ROWS, min_rows=ROWS + 1) == (False, 0)
    q = bench.synthetic_chunks(1, DIMS, ROWS, start=ROWS)[2][0]
    got = ann.dense_search(tbl, q, 10, ann=False)
    vecs = bench.synthetic_chunks(ROWS, DIMS, ROWS)[2]
    dist = 1.0 - vecs @ q
    want = sorted(((f"syn{i:08d}", float(dist[i])) for i in range(ROWS)), key=lambda x: x[1])
    assert [c for c, _ in got] == [c for c, _ in want[:10]]
    assert max(abs(d - w) for (_, d), (_, w) in zip(got, want[:10], strict=True)) < 1e-5


@pytest.mark.slow
def test_above_the_threshold_the_ivf_sq_index_is_built_used_and_recalls(tmp_path):
    tbl = _table(tmp_path)
    before = tbl.version
    built = ann.ensure_vector_index(tbl, min_rows=ROWS)
    assert built == {"index_type": "IVF_SQ", "rows": ROWS, **ann.index_params(ROWS, DIMS)}
    assert tbl.version > before and ann.vector_index(tbl) is not None
    assert ann.ensure_vector_index(tbl, min_rows=ROWS) is None  # already indexed: kept
    use, partitions = ann.search_mode(tbl, ROWS, min_rows=ROWS)
    assert use and partitions == 1
    queries = bench.synthetic_chunks(20, DIMS, ROWS, start=ROWS)[2]
    recall = []
    for q in queries:
        exact = {c for c, _ in ann.dense_search(tbl, q, 10, ann=False)}
        approx = ann.dense_search(tbl, q, 10, ann=True, partitions=partitions)
        assert [d for _, d in approx] == sorted(d for _, d in approx)
        recall.append(len(exact & {c for c, _ in approx}) / 10)
    assert np.mean(recall) >= 0.95, recall
    # rows added after the index are still found (LanceDB scans the unindexed part)
    extra = bench.synthetic_chunks(1, DIMS, ROWS, start=ROWS + 100)
    flat = pa.array(extra[2].reshape(-1), type=pa.float32())
    tbl.add(
        pa.table(
            {
                "chunk_id": ["new-row"],
                "text": extra[1],
                "vector": pa.FixedSizeListArray.from_arrays(flat, DIMS),
            }
        )
    )
    hits = ann.dense_search(tbl, extra[2][0], 1, ann=True, partitions=partitions)
    assert hits[0][0] == "new-row" and hits[0][1] < 1e-5


class _QueryHashEmbedder(HashEmbedder):
    def encode_query(self, query: str):  # type: ignore[no-untyped-def]
        return self.encode([query])[0]


@pytest.mark.slow
def test_the_pipeline_and_the_query_side_switch_at_the_threshold(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        paras = "\n\n".join(f"Note {i}.{j} about subject {i * 10 + j}." for j in range(10))
        (docs / f"d{i:02d}.md").write_text(f"# Doc {i}\n\n{paras}\n")
    emb = _QueryHashEmbedder(dims=16)
    strat = strategy("E", 40)  # one short paragraph a chunk: a few hundred rows
    small = index_folder(docs, tmp_path / "exact", strat, emb).entry
    assert small.rows >= 256
    monkeypatch.setattr(ann, "ANN_MIN_ROWS", small.rows)  # this many rows and more: ANN
    entry = index_folder(docs, tmp_path / "ann", strat, emb).entry
    store = IndexStore(tmp_path / "ann")
    tbl = store.open_table(entry.table, entry.version)
    assert ann.vector_index(tbl) is not None  # the published version carries the index
    index = Index(store, store.published(), emb)
    assert index.search("subject 123", retriever="bm25", k=1)  # BM25 of the indexed version
    assert index._ann_mode is None
    dense = index.search("Note 12.3 about subject 123.", retriever="dense", k=5)
    assert index._ann_mode[0] is True  # the query side used the ANN index
    exact = Index(IndexStore(tmp_path / "exact"), small, emb)
    want = exact.search("Note 12.3 about subject 123.", retriever="dense", k=5)
    assert exact._ann_mode == (False, 0)
    assert [h.chunk_id for h in dense][:1] == [h.chunk_id for h in want][:1]
    assert abs(dense[0].cosine_distance - want[0].cosine_distance) < 1e-5


@pytest.mark.slow
def test_bench_scale_json_has_the_documented_keys(capsys):
    from rag_assets.cli import main

    assert main(["bench", "--scale", "300", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    (row,) = out["scale"]
    keys = {"chunks", "index_type", "build_s", "p50_ms", "p95_ms", "recall@10", "bm25_p50_ms"}
    assert keys | {"peak_mb"} <= set(row)
    assert row["chunks"] == 300 and row["index_type"] == "exact"  # below ANN_MIN_ROWS
    assert row["recall@10"] == 1.0 and row["exact_vs_numpy"] == 1.0 and row["peak_mb"] > 0
    assert out["ann_min_rows"] == ann.ANN_MIN_ROWS


def test_bench_scale_follows_the_products_lexical_index_at_each_size(capsys, monkeypatch):
    """Above NATIVE_FTS_MIN_ROWS (lowered here) the scale bench measures LanceDB's own index,
    as embed_chunks builds it at that size, not bm25s."""
    import json

    from rag_assets.cli import main
    from rag_assets.lib.index import lexical

    monkeypatch.setattr(lexical, "NATIVE_FTS_MIN_ROWS", 400)
    assert main(["bench", "--scale", "300", "--scale", "500", "--json"]) == 0
    small, large = json.loads(capsys.readouterr().out)["scale"]
    assert (small["lexical"], large["lexical"]) == ("bm25s", "native")
    assert large["bm25_mb"] > 0 and large["bm25_p50_ms"] > 0 and large["bm25_build_s"] > 0
