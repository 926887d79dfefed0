"""Tests for rag_assets.lib.evaluate.metrics: hand-computed values, oracles and properties."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from rag_assets.lib.evaluate.metrics import (
    beir_scores,
    destroyed,
    mrr,
    ndcg_at_k,
    needle_rank,
    normalize_ws,
    paired_table,
    recall_at_k,
    recall_at_k_docs,
    sign_test,
    summarise,
    wilson_interval,
)

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared"
needs_shared = pytest.mark.skipif(
    not (SHARED / "eval" / "course-dev").is_dir(), reason="needs ../shared (eval sets, corpus)"
)

RANKS = [1, 3, None, 5, 2]


def test_recall_at_k_hand_values():
    assert recall_at_k(RANKS, 1) == pytest.approx(1 / 5)
    assert recall_at_k(RANKS, 4) == pytest.approx(3 / 5)  # ranks 1, 3, 2
    assert recall_at_k(RANKS, 5) == pytest.approx(4 / 5)
    assert recall_at_k(RANKS, 100) == pytest.approx(4 / 5)  # the miss never counts


def test_mrr_hand_values_and_cutoff():
    assert mrr(RANKS) == pytest.approx((1 + 1 / 3 + 0 + 1 / 5 + 1 / 2) / 5)
    assert mrr(RANKS, cutoff=4) == pytest.approx((1 + 1 / 3 + 1 / 2) / 5)
    assert mrr([None, None]) == 0.0


@pytest.mark.parametrize("bad", [[], [0], [-1, 2], [True]])
def test_rank_metrics_reject_bad_input(bad):
    with pytest.raises(ValueError):
        recall_at_k(bad, 1)


def test_wilson_hand_values():
    lo, hi = wilson_interval(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


@given(st.integers(1, 400).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_matches_closed_form(kn):
    k, n = kn
    z = norm.ppf(0.975)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(max(0.0, centre - half), abs=1e-9)
    assert hi == pytest.approx(min(1.0, centre + half), abs=1e-9)
    assert lo <= p <= hi


def test_sign_test_hand_values():
    # 3 wins, 0 losses, 1 tie (both right), 1 tie (both wrong): p = 2 * 0.5**3
    t = sign_test([True, True, True, False, True], [False, False, False, False, True])
    assert (t.wins, t.losses) == (3, 0)
    assert t.p == pytest.approx(0.25)
    # 8 wins, 1 loss: p = 2 * (C(9,0) + C(9,1)) / 2**9 = 20/512
    t = sign_test([True] * 8 + [False], [False] * 8 + [True])
    assert (t.wins, t.losses, t.p) == (8, 1, pytest.approx(20 / 512))
    # losses are symmetric
    assert sign_test([False] * 8 + [True], [True] * 8 + [False]).p == pytest.approx(20 / 512)
    assert sign_test([True, False], [True, False]) == (0, 0, 1.0)
    with pytest.raises(ValueError):
        sign_test([True], [True, False])


def test_summarise_overall_and_per_phrasing():
    ranks = {"d01/course": 1, "d01/ticket": None, "d02/course": 3, "d02/ticket": 2}
    s = summarise(ranks, ks=(1, 4))
    json.dumps(s)  # JSON-ready
    assert s["n"] == 4
    assert s["recall@1"]["value"] == pytest.approx(0.25)
    assert s["recall@1"]["hits"] == 1 and s["recall@1"]["n"] == 4
    assert s["recall@1"]["ci95"] == pytest.approx(list(wilson_interval(1, 4)))
    assert s["recall@4"]["value"] == pytest.approx(0.75)
    assert s["mrr"] == pytest.approx((1 + 0 + 1 / 3 + 1 / 2) / 4)
    assert sorted(s["groups"]) == ["course", "ticket"]
    course, ticket = s["groups"]["course"], s["groups"]["ticket"]
    assert (course["recall@1"]["value"], course["recall@4"]["value"]) == (0.5, 1.0)
    assert (ticket["recall@1"]["value"], ticket["recall@4"]["value"]) == (0.0, 0.5)
    assert course["mrr"] == pytest.approx((1 + 1 / 3) / 2)
    assert "groups" not in summarise(ranks, groups={})
    explicit = summarise(ranks, ks=(1,), groups={q: "all" for q in ranks})
    assert explicit["groups"]["all"]["recall@1"] == s["recall@1"]
    with pytest.raises(ValueError, match="without a group"):
        summarise(ranks, groups={"d01/course": "x"})
    assert "groups" not in summarise({"q1": 1, "q2": None})  # ids without phrasing


def test_paired_table_all_pairs_and_baseline():
    systems = {
        "bm25": {"a": 1, "b": None, "c": 9, "d": 2},
        "dense": {"a": 1, "b": 3, "c": 2, "d": None},
        "hybrid": {"a": 2, "b": 1, "c": 1, "d": 1},
    }
    rows = paired_table(systems, k=4)
    assert [(r["a"], r["b"]) for r in rows] == [
        ("bm25", "dense"),
        ("bm25", "hybrid"),
        ("dense", "hybrid"),
    ]
    # hit@4: bm25 a,d; dense a,b,c; hybrid a,b,c,d
    assert (rows[0]["wins"], rows[0]["losses"]) == (1, 2)
    assert (rows[1]["wins"], rows[1]["losses"]) == (0, 2)
    assert (rows[2]["wins"], rows[2]["losses"]) == (0, 1)
    assert rows[0]["p"] == pytest.approx(1.0) and rows[0]["k"] == 4
    vs = paired_table(systems, k=4, baseline="bm25")
    assert [(r["a"], r["b"], r["wins"], r["losses"]) for r in vs] == [
        ("dense", "bm25", 2, 1),
        ("hybrid", "bm25", 2, 0),
    ]
    assert vs[1]["p"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="different set"):
        paired_table({"x": {"a": 1}, "y": {"b": 1}}, k=1)
    with pytest.raises(ValueError, match="baseline"):
        paired_table(systems, k=1, baseline="nope")


def test_ndcg_hand_values():
    qrels = {"a": 1, "b": 2, "c": 1, "z": 0}
    dcg = 0 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)  # x, b, a
    idcg = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)  # b, a, c
    assert ndcg_at_k(["x", "b", "a", "c"], qrels, k=3) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["x", "b", "a", "c"], qrels, k=3) == pytest.approx(0.562727, abs=1e-6)
    assert ndcg_at_k(["b", "c", "a"], qrels, k=10) == pytest.approx(1.0)
    assert ndcg_at_k(["z", "y"], qrels, k=10) == 0.0  # grade 0 gives no gain
    assert ndcg_at_k(["a"], {"a": 0}, k=10) == 0.0  # nothing relevant
    with pytest.raises(ValueError, match="duplicates"):
        ndcg_at_k(["a", "a"], qrels)


def test_recall_docs_hand_values():
    qrels = {"a": 1, "b": 2, "c": 0}
    assert recall_at_k_docs(["c", "a", "x"], qrels, k=2) == pytest.approx(0.5)
    assert recall_at_k_docs(["c", "x", "a", "b"], qrels, k=3) == pytest.approx(0.5)
    assert recall_at_k_docs(["b", "a"], qrels, k=100) == 1.0
    assert recall_at_k_docs(["a"], {"a": 0}) == 0.0


def test_beir_scores_means_over_judged_queries():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    out = beir_scores({"q1": ["a"], "q3": ["b"]}, qrels, ndcg_k=10, recall_k=100)
    assert out == {"ndcg@10": 0.5, "recall@100": 0.5, "queries": 2}  # q2 has no run


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 2), min_size=12, max_size=12),
    st.permutations(range(12)),
    st.integers(1, 10),
)
def test_ndcg_matches_sklearn(grades, order, k):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    docs = [f"d{i}" for i in range(12)]
    qrels = {d: g for d, g in zip(docs, grades, strict=True)}
    ranked = [docs[i] for i in order]
    scores = [0.0] * 12
    for pos, i in enumerate(order):
        scores[i] = float(12 - pos)
    expected = (
        sklearn_metrics.ndcg_score([grades], [scores], k=k) if any(grades) else 0.0
    )  # sklearn: linear gains, log2 discount, ideal over all judged docs
    assert ndcg_at_k(ranked, qrels, k=k) == pytest.approx(expected, abs=1e-12)


def test_needle_rank():
    hits = ["nothing here", "the needle is here.", "needle"]
    assert needle_rank(hits, "needle is here.") == 2
    assert needle_rank(hits, "needle") == 2
    assert needle_rank(hits, "Needle") is None  # case-sensitive
    assert needle_rank(hits, "the needle is here. And more") is None  # partial does not count
    pdf = ["x", "Gas does not\nexist   outside\tof it.  "]
    assert needle_rank(pdf, "Gas does not exist outside of it.") is None
    assert needle_rank(pdf, "Gas does not exist outside of it.", collapse_ws=True) == 2
    assert needle_rank(pdf, " Gas does not\n exist outside of it.", collapse_ws=True) == 2
    assert needle_rank([], "x") is None
    with pytest.raises(ValueError):
        needle_rank(hits, "")


def test_normalize_ws():
    assert normalize_ws("  a\n\tb \u00a0 c\r\n") == "a b c"


def test_destroyed_does_not_match_across_chunks():
    chunks = ["The answer is", " forty-two. Next sentence."]
    assert destroyed(["The answer is forty-two.", "Next sentence."], chunks) == [
        "The answer is forty-two."
    ]
    pdf_chunks = ["first  chunk\nends here. ", "second"]
    assert destroyed(["chunk ends here."], pdf_chunks) == ["chunk ends here."]
    assert destroyed(["chunk ends here."], pdf_chunks, collapse_ws=True) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text("ab \n", max_size=8), max_size=6),
    st.lists(st.text("ab \n", min_size=1, max_size=4), max_size=6),
    st.booleans(),
)
def test_destroyed_matches_brute_force(chunks, needles, collapse):
    def norm(s: str) -> str:
        return normalize_ws(s) if collapse else s

    needles = [n for n in needles if norm(n)]
    expected = [n for n in needles if not any(norm(n) in norm(c) for c in chunks)]
    assert destroyed(needles, chunks, collapse_ws=collapse) == expected


def test_destroyed_reads_each_chunk_once_at_scale(monkeypatch):
    """The work is linear: the chunks are read in one pass (a one-shot iterator, so a scan per
    needle would find nothing after the first) and each text is normalised once."""
    from rag_assets.lib.evaluate import metrics

    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)]
    chunks = [" ".join(rng.choices(words, k=180)) for _ in range(5000)]  # ~5.7 MB
    needles = [" ".join(c.split()[50:62]) for c in rng.sample(chunks, 150)]
    needles += [" ".join(rng.choices(words, k=12)) + "." for _ in range(150)]
    assert destroyed(needles, iter(chunks)) == needles[150:]  # invented sentences reported
    calls = []

    def counting(s: str) -> str:
        calls.append(len(s))
        return normalize_ws(s)

    monkeypatch.setattr(metrics, "normalize_ws", counting)
    assert destroyed(needles, iter(chunks), collapse_ws=True) == needles[150:]
    assert len(calls) == len(chunks) + len(needles)


@pytest.mark.shared
@needs_shared
def test_destroyed_on_real_corpus_with_fixed_windows():
    from rag_assets.lib.evaluate.questions import load_needle_set

    questions = load_needle_set(SHARED / "eval" / "course-dev").questions
    docs = sorted((SHARED / "corpus" / "course").glob("[0-9]*.md"))
    texts = [p.read_text(encoding="utf-8") for p in docs]
    needles = [q.needle for q in questions]
    assert destroyed(needles, texts) == []  # whole documents keep every needle
    windows = [t[i : i + 300] for t in texts for i in range(0, len(t), 300)]
    expected = [n for n in needles if not any(n in w for w in windows)]
    got = destroyed(needles, windows)
    assert got == expected
    assert 0 < len(got) < len(needles)  # 300-char cuts destroy some needles, not all
