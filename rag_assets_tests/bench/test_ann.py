"""``python -m rag_assets.bench.ann`` (issue 23): its generator and its sweep, small."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rag_assets.bench.ann import _text, run_synthetic, synthetic_vectors
from rag_assets.bench.scale import synthetic_chunks


def test_synthetic_vectors_are_the_scale_bench_vectors() -> None:
    for n, total, start in ((300, 1000, 200), (50, 1000, 1000)):
        assert np.array_equal(
            synthetic_vectors(n, 16, total, start), synthetic_chunks(n, 16, total, start)[2]
        )


def test_sweep_on_a_small_index_probes_every_partition_for_recall_one(tmp_path: Path) -> None:
    """3000 rows: 1 IVF partition (8192 rows each), so every setting probes all of it and
    re-ranks exactly; recall@10 against the numpy brute force must then be 1.0."""
    out = run_synthetic(3000, tmp_path / "ann", probes=[1, 20], refines=[1, 10])
    assert out["partitions"] == 1 and out["rows"] == 3000
    assert {(s["nprobes"], s["refine_factor"]) for s in out["settings"]} == {(1, 1), (1, 10)}
    assert all(s["recall@10"] == 1.0 for s in out["settings"] if s["refine_factor"] == 10)
    assert all(0 < s["p50_ms"] <= s["p95_ms"] for s in out["settings"])
    again = run_synthetic(3000, tmp_path / "ann", probes=[1], refines=[10])  # table reused
    assert again["index_build_s"] == 0.0
    assert "recall@10" in _text([out])


def test_write_peak_builds_what_the_product_builds_at_that_size(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    import lancedb

    from rag_assets.bench.ann import write_peak
    from rag_assets.lib.index import ann, lexical

    monkeypatch.setattr(lexical, "NATIVE_FTS_MIN_ROWS", 1000)
    monkeypatch.setattr(ann, "ANN_MIN_ROWS", 1000)
    out = write_peak(1500, tmp_path)
    assert out["rows"] == 1500 and out["lexical"] == "native"
    assert 0 < out["peak_mb_after_write"] <= out["peak_mb_after_ann"] <= out["peak_mb_after_fts"]
    tbl = lancedb.connect(tmp_path).open_table("chunks")
    assert tbl.count_rows() == 1500
    assert ann.vector_index(tbl) is not None and lexical.fts_index(tbl) is not None
