"""``python -m rag_assets.bench.endpoint rerank`` (issue 40): what a real ``/rerank`` server adds
to a query, beside the same cross-encoder in the process (the tests' tiny one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_assets.bench.endpoint import rerank_latency
from rag_assets.settings import Settings
from rag_assets_tests.helpers import SAMPLE_DOCS
from rag_assets_tests.model_servers import (
    RerankServer,
    direct_to_local_servers,  # noqa: F401 (autouse)
)

pytestmark = pytest.mark.slow


def test_rerank_latency_times_the_server_beside_the_model_in_process(
    tmp_path: Path, tiny_cross_encoder: Path
) -> None:
    with RerankServer(str(tiny_cross_encoder), shape="cohere") as server:
        settings = Settings.from_env(
            {"RAG_RERANK_URL": server.url, "RAG_WORK_DIR": str(tmp_path / "work")}
        )
        out, text = rerank_latency(
            settings, SAMPLE_DOCS, model_dir=str(tiny_cross_encoder), queries=4, max_docs=2
        )
        served = len(server.requests)
    assert out["queries"] == 4
    # every timed query (and the 3 warm-ups) went through the server once, and only that side
    assert served == 4 + 3
    for side in ("server", "in-process"):
        assert out["search_ms"][side]["n"] == out["rerank_ms"][side]["n"] == 4
        assert out["rerank_ms"][side]["p50"] > 0  # the rerank stage ran on both sides
    assert out["protocol_p50_ms"] == pytest.approx(
        out["rerank_ms"]["server"]["p50"] - out["rerank_ms"]["in-process"]["p50"], abs=0.01
    )
    assert "the server adds" in text


def test_rerank_latency_needs_the_server_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="set RAG_RERANK_URL"):
        rerank_latency(Settings(), SAMPLE_DOCS, model_dir=str(tmp_path))
