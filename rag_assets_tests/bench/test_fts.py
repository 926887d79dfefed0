"""``python -m rag_assets.bench.fts`` (issue 23): the scale child, small."""

from __future__ import annotations

from pathlib import Path

from rag_assets.bench.fts import _lance_table, fts_search, scale_child
from rag_assets.bench.scale import synthetic_chunks


def test_the_batched_table_holds_every_chunk_once_and_is_searchable(tmp_path: Path) -> None:
    from rag_assets.lib.index.lexical import NATIVE_FTS_CONFIG

    tbl, queries = _lance_table(tmp_path, 2500, 1000, synthetic_chunks)
    ids = tbl.to_arrow()["chunk_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 2500 and len(queries) == 50
    tbl.create_fts_index("text", replace=True, **NATIVE_FTS_CONFIG)
    first = tbl.to_arrow().slice(0, 1).to_pylist()[0]
    assert first["chunk_id"] in fts_search(tbl, " ".join(first["text"].split()[:6]))


def test_scale_child_reports_build_peak_and_latency() -> None:
    for engine in ("bm25s", "lance-plain"):
        row = scale_child(engine, 2000)
        assert row["engine"] == engine and row["n"] == 2000
        assert row["build_s"] > 0 and row["peak_mb"] >= row["base_mb"] > 0
        assert row["query_p50_ms"] > 0
