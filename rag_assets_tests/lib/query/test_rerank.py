"""Cross-encoder reranker on a real (tiny, trained-here) CrossEncoder model."""

from __future__ import annotations

import math
import random
import socket
from pathlib import Path

import pytest

from rag_assets.lib.query.rerank import NOT_CONFIGURED, Reranker, RerankerLoadError, load_reranker
from rag_assets_tests.lib.tiny_cross_encoder import (  # noqa: F401  (fixture import)
    TOPICS,
    tiny_cross_encoder,
    topic_group,
    train_tiny_cross_encoder,
)

HELD_OUT_QUERY = "animal"
HELD_OUT_PASSAGES = ["mango peach apple", "eagle snake tiger", "flute melody piano", "grape lemon"]


def held_out_stats(reranker: Reranker, n: int = 24) -> tuple[float, float]:
    """(top-1 accuracy, mean margin of the relevant passage over the best other) on held-out."""
    rng = random.Random(1234)
    hits, margins = 0, []
    for _ in range(n):
        query, passages = topic_group(rng, held_out=True)
        scores = reranker.score(query, passages)
        hits += scores[0] > max(scores[1:])
        margins.append(scores[0] - max(scores[1:]))
    return hits / n, sum(margins) / n


def test_not_configured_returns_none() -> None:
    assert NOT_CONFIGURED == "rerank: no model configured"
    assert load_reranker(None) is None and load_reranker("") is None and load_reranker("  ") is None


def test_hub_name_fails_fast_offline_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    attempts: list[object] = []  # an online attempt would connect (and retry for ≈45 s here)
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: object) -> None:
        attempts.append(address)
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    with pytest.raises(RerankerLoadError, match="RAG_RERANK_MODEL=.rag-assets-tests/no-such") as e:
        load_reranker("rag-assets-tests/no-such-cross-encoder")
    assert attempts == []
    assert "HF_HUB_OFFLINE=0" in str(e.value) and "local" in str(e.value)


def test_bad_directories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RerankerLoadError, match="not a loadable CrossEncoder") as e:
        Reranker(str(tmp_path))
    assert "RAG_RERANK_MODEL" in str(e.value)
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from rag_assets_tests.lib.tiny_cross_encoder import minilm_dir

    two = tmp_path / "two-labels"
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=2,
    )
    BertForSequenceClassification(cfg).save_pretrained(two)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(two)
    with pytest.raises(RerankerLoadError, match="2 labels"):
        Reranker(str(two))
    with pytest.raises(ValueError):
        Reranker(str(two), batch_size=0)


@pytest.mark.slow
def test_trained_model_ranks_held_out_passages_first(
    tiny_cross_encoder: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    reranker = load_reranker(str(tiny_cross_encoder))
    assert reranker is not None
    ranked = reranker.rerank(HELD_OUT_QUERY, HELD_OUT_PASSAGES, text_of=lambda p: p)
    assert ranked[0][0] == "eagle snake tiger"  # both animal words never seen in training
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)
    accuracy, margin = held_out_stats(reranker)
    assert accuracy >= 0.9
    untrained = Reranker(str(train_tiny_cross_encoder(tmp_path / "untrained", max_steps=0)))
    untrained_accuracy, untrained_margin = held_out_stats(untrained)
    assert untrained_accuracy < accuracy and margin > untrained_margin + 1.0


@pytest.mark.slow
def test_scores_are_the_cross_encoders_logits(tiny_cross_encoder: Path) -> None:  # noqa: F811
    from sentence_transformers import CrossEncoder

    reranker = Reranker(str(tiny_cross_encoder), batch_size=1)
    passages = HELD_OUT_PASSAGES + ["", "tiger " * 300]  # empty and truncated passages too
    scores = reranker.score(HELD_OUT_QUERY, passages)
    probs = CrossEncoder(str(tiny_cross_encoder)).predict(
        [(HELD_OUT_QUERY, p) for p in passages], show_progress_bar=False
    )
    assert [1 / (1 + math.exp(-s)) for s in scores] == pytest.approx(list(probs), abs=1e-5)
    # order follows the input; batch size and thread count do not change the numbers
    assert reranker.score(HELD_OUT_QUERY, passages[::-1]) == pytest.approx(scores[::-1], abs=1e-4)
    batched = Reranker(str(tiny_cross_encoder), batch_size=25, threads=1)
    import torch

    before = torch.get_num_threads()
    assert batched.score(HELD_OUT_QUERY, passages) == pytest.approx(scores, abs=1e-4)
    assert torch.get_num_threads() == before  # threads restored
    assert reranker.score(HELD_OUT_QUERY, []) == []


@pytest.mark.slow
def test_rerank_is_stable_and_cuts_top(tiny_cross_encoder: Path) -> None:  # noqa: F811
    reranker = Reranker(str(tiny_cross_encoder))
    items = [
        {"id": "a", "text": "piano violin guitar"},
        {"id": "b", "text": "tiger zebra wolf"},
        {"id": "c", "text": "piano violin guitar"},  # same text as a: a tie, a stays first
        {"id": "d", "text": "tiger zebra wolf"},
    ]
    ranked = reranker.rerank("music", items, text_of=lambda it: it["text"])
    assert [it["id"] for it, _ in ranked] == ["a", "c", "b", "d"]
    assert ranked[0][1] == ranked[1][1]
    top = reranker.rerank("music", items, text_of=lambda it: it["text"], top=1)
    assert [it["id"] for it, _ in top] == ["a"]
    assert reranker.rerank("music", [], text_of=str) == []
    assert sorted(TOPICS) == ["animal", "fruit", "music"]
