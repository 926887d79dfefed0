"""``python -m rag_assets.bench.filtered`` (issue 40), small: every way of a filtered search is
timed against the exact filtered answer, and the product's choice finds it."""

from __future__ import annotations

import pytest

from rag_assets.bench.filtered import main, run_filtered_bench
from rag_assets.bench.scale import SCALE_FILTERS, SCALE_TOKEN

pytestmark = pytest.mark.slow


def test_filtered_bench_compares_probes_with_the_exact_scan(tmp_path, capsys):
    out, text = run_filtered_bench(3000, tmp_path / "t", queries=8)
    assert set(out["filters"]) == {*SCALE_FILTERS, SCALE_TOKEN[0]}
    # 300 documents of 10 chunks: 3 under sel=p1, 30 under p10 and the token, 150 under p50
    want = {"1%": 30, "10%": 300, "50%": 1500, SCALE_TOKEN[0]: 300}
    for label, f in out["filters"].items():
        assert f["matching_rows"] == want[label]
        assert f["exact scan"]["recall@10"] == 1.0  # the oracle and LanceDB's scan agree
        assert f["product"]["recall@10"] == 1.0  # <= FILTER_EXACT_MAX_ROWS rows: scanned
        assert f[f"probe all {out['partitions']}"]["recall@10"] >= 0.9
    assert out["fetch_20_ms_with_btree"] > 0 and "fetch_20_ms_without_btree" in out
    # a second run reuses the table (and its BTREE, so the "without" figure is gone)
    assert main(["--rows", "3000", "--dir", str(tmp_path / "t"), "--queries", "4"]) == 0
    printed = capsys.readouterr().out
    assert "with it" in printed and "without a BTREE" not in printed
