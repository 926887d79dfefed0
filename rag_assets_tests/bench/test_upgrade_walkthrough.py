"""The model-upgrade runbook followed end to end on a real Dagster instance (sample corpus, the
packaged MiniLM → a second real model): only the embedding asset is stale, the sensor requests
exactly the embedding chain, the old table serves every query meanwhile, then rollback."""

from __future__ import annotations

import pytest

from rag_assets.bench.upgrade_walkthrough import walkthrough
from rag_assets_tests.helpers import SAMPLE_EVAL

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


def test_walkthrough_to_the_adapted_encoder(tmp_path, sample_docs, monkeypatch):
    """Issue 32: the same runbook with RAG_ADAPT=on as the upgrade (a short real training)."""
    from rag_assets.defs import adapt as adapt_defs
    from rag_assets.lib.index.adapt import Recipe

    monkeypatch.setattr(
        adapt_defs, "BASE_RECIPE", Recipe(batch_size=4, train_max_length=64, lr=1e-4)
    )
    for k in ("RAG_EMBEDDING_MODEL", "RAG_ADAPT", "RAG_ADAPT_STEPS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RAG_RECALL_FLOOR", "0.3")
    monkeypatch.setenv("RAG_EMBED_THREADS", "1")
    out = walkthrough(sample_docs, SAMPLE_EVAL, "", tmp_path / "w", adapt=True, adapt_steps=3)
    steps = {s["step"].split(".")[0].strip(): s for s in out["steps"]}
    assert steps["1"]["success"]
    # switching adaptation on is a code change of the embedding step; the new asset is missing
    assert steps["2"]["stale"] == ["adapted_encoder", "chunk_embeddings"]
    assert steps["3"]["requested"] == [
        "adapted_encoder",
        "chunk_embeddings",
        "retrieval_eval",
        "refusal_threshold",
        "published_index",
    ]
    run = steps["4"]
    assert run["success"] and run["adapted"] == "proposed" and run["steps"] == 3
    assert run["self_mrr"][1] > run["self_mrr"][0]
    assert "-adapted-" in run["published"]  # the adapted model's own table
    loop = next(s for s in out["steps"] if s["step"].strip().startswith("queries"))
    assert loop["errors"] == 0
    assert "@adapted-" in steps["5"]["query_model"] and "StampMismatch" in steps["5"]["refused"]
    assert steps["6"]["published"] == steps["1"]["table"] and steps["6"]["answers"]
    assert "@adapted-" not in steps["6"]["query_model"]
