"""Cross-run paired tests (models, fusion choices) and the side-by-side encoder cost."""

from __future__ import annotations

import json

import pytest

from rag_assets.bench.compare import cost, main, paired


def _needle_run(path, retriever: str, ranks: dict[str, int | None]):
    path.write_text(json.dumps({"retrievers": {retriever: {"ranks": ranks}}}))
    return f"{path}:{retriever}"


def test_paired_needle_runs_hand_counted(tmp_path):
    base = _needle_run(tmp_path / "minilm.json", "hybrid", {"q1": 1, "q2": 9, "q3": None, "q4": 2})
    other = _needle_run(tmp_path / "mpnet.json", "dense", {"q1": 3, "q2": 2, "q3": 1, "q4": 5})
    rows, text = paired([base, other])
    assert rows[0]["system"] == "minilm:hybrid" and rows[0]["wins"] == rows[0]["losses"] == 0
    r = rows[1]
    # hit@4: base hits q1, q4; other hits q1, q2, q3 -> wins q2, q3; loses q4
    assert (r["wins"], r["losses"], r["mean"], r["queries"]) == (2, 1, 0.75, 4)
    assert r["p"] == pytest.approx(1.0)  # binomial two-sided, 2 vs 1
    assert "| mpnet:dense | 0.750 | 2 | 1 |" in text


def test_paired_beir_runs_compare_per_query_ndcg(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"retrievers": {"dense": {"per_query_ndcg@10": {"x": 0.5, "y": 0.2}}}}))
    b.write_text(json.dumps({"retrievers": {"dense": {"per_query_ndcg@10": {"x": 0.7, "y": 0.2}}}}))
    rows, _ = paired([f"{a}:dense", f"{b}:dense"])
    assert (rows[1]["wins"], rows[1]["losses"], rows[1]["mean"]) == (1, 0, 0.45)


def _refusal_run(path, answerable: dict[str, str], ood: dict[str, str]) -> str:
    outcomes = {"answerable": answerable, "out_of_domain": ood}
    path.write_text(json.dumps({"retrievers": {}, "refusal": {"outcomes": outcomes}}))
    return f"{path}:refusal"


def test_paired_refusal_outcomes_hand_counted(tmp_path):
    base = _refusal_run(
        tmp_path / "minilm.json",
        {"q1": "correct", "q2": "refused", "q3": "wrong", "q4": "correct"},
        {"o1": "bluff", "o2": "refused", "o3": "refused"},
    )
    other = _refusal_run(
        tmp_path / "gemma.json",
        {"q1": "correct", "q2": "correct", "q3": "correct", "q4": "refused"},
        {"o1": "refused", "o2": "refused", "o3": "bluff"},
    )
    rows, text = paired([base, other])
    r = rows[1]
    # answered with the needle: wins q2, q3; loses q4. Bluffs: fewer on o1, more on o3
    assert (r["metric"], r["wins"], r["losses"], r["mean"], r["queries"]) == (
        "answered",
        2,
        1,
        0.75,
        7,
    )
    assert (r["bluffs"], r["out_of_domain"], r["bluff_wins"], r["bluff_losses"]) == (1, 3, 1, 1)
    assert "| gemma:refusal | 0.750 | 2 | 1 | 1 | 1/3 | 1 | 1 | 1 |" in text
    with pytest.raises(ValueError, match="different kinds"):
        paired([base, _needle_run(tmp_path / "n.json", "hybrid", {"q1": 1})])


def test_paired_refuses_mismatched_runs_in_one_line(tmp_path, capsys):
    base = _needle_run(tmp_path / "a.json", "hybrid", {"q1": 1})
    other = _needle_run(tmp_path / "b.json", "hybrid", {"q2": 1})
    with pytest.raises(ValueError, match="answered other queries"):
        paired([base, other])
    assert main(["paired", base, f"{tmp_path / 'a.json'}:rerank"]) == 2
    err = capsys.readouterr().err
    assert "no retriever 'rerank'" in err and err.count("\n") == 1


@pytest.mark.slow
def test_cost_measures_the_real_model_on_the_same_chunks(sample_docs):
    rows, text = cost(sample_docs, ["minilm"], sample=8, rounds=1)
    (r,) = rows
    assert r["model"] == "sentence-transformers/all-MiniLM-L6-v2" and r["window"] == 256
    assert r["chunks_per_s"] > 0 and r["corpus_chunks"] >= 8
    assert 0 < r["wordpieces_p50"] <= r["wordpieces_max"]
    assert "1.00x" in text
