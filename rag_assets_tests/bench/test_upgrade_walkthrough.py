"""The model-upgrade runbook followed end to end on a real Dagster instance (sample corpus, the
packaged MiniLM → a second real model): only the embedding asset is stale, the sensor requests
exactly the embedding chain, the old table serves every query meanwhile, then rollback."""

from __future__ import annotations

import pytest

from rag_assets.bench.upgrade_walkthrough import walkthrough
from rag_assets_tests.conftest import SAMPLE_EVAL

pytestmark = pytest.mark.slow


def test_walkthrough_on_the_sample_corpus(tmp_path, sample_docs, second_model_dir, monkeypatch):
    monkeypatch.delenv("RAG_EMBEDDING_MODEL", raising=False)
    monkeypatch.setenv("RAG_RECALL_FLOOR", "0.3")
    out = walkthrough(sample_docs, SAMPLE_EVAL, str(second_model_dir), tmp_path / "w")
    steps = {s["step"].split(".")[0].strip(): s for s in out["steps"]}
    assert steps["1"]["success"]
    assert steps["2"]["stale"] == ["chunk_embeddings"]
    assert steps["3"]["requested"] == [
        "chunk_embeddings",
        "retrieval_eval",
        "refusal_threshold",
        "published_index",
    ]
    run = steps["4"]
    assert run["success"] and run["embedded"] > 0 and run["published"] != steps["1"]["table"]
    loop = next(s for s in out["steps"] if s["step"].strip().startswith("queries"))
    assert loop["queries"] >= 1 and loop["errors"] == 0
    assert list(loop["served_from"]) == [f"{steps['1']['table']}@v{_v(loop)}"]
    assert steps["5"]["answers"] and "StampMismatch" in steps["5"]["refused"]
    assert steps["6"]["published"] == steps["1"]["table"] and steps["6"]["answers"]
    assert all(s["s"] >= 0 for s in out["steps"])


def _v(loop: dict) -> str:
    (key,) = loop["served_from"]
    return key.rsplit("@v", 1)[1]
