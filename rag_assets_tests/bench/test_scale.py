"""``rag-assets bench --scale`` (issues 13, 34), small: the published synthetic index, the
filtered search in a separate serving process, its recall against the exact filtered answer."""

from __future__ import annotations

import pytest

from rag_assets.bench.scale import SCALE_FILTERS, SCALE_TOKEN, run_scale_bench
from rag_assets.settings import Settings

pytestmark = pytest.mark.slow


def test_scale_bench_measures_filtered_search_in_a_serving_process() -> None:
    out, text = run_scale_bench([2000], Settings(), n_queries=20)
    row = out["scale"][0]
    assert row["chunks"] == 2000 and row["recall@10"] == 1.0
    served = row["serve"]
    assert served["resident"] and served["peak_mb"] > 0  # its own figure, not the harness's
    # 200 documents of 10 chunks: 2 under sel=p1, 20 under p10, 100 under p50, 20 the token sees
    cases = (("all", 2000), ("1%", 20), ("10%", 200), ("50%", 1000), (SCALE_TOKEN[0], 200))
    for label, matching in cases:
        f = served[label]
        assert f["matching_rows"] == matching and f["queries"] == 20
        assert f["recall@10"] == 1.0  # exact below ANN_MIN_ROWS: the exact filtered answer
        assert f["hits_min"] == 10 and f["k_when_k_match"] == 1.0
    assert set(SCALE_FILTERS) <= set(served)
    assert "the serving process" in text and "serve_MB" in text
