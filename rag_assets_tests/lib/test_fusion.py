"""Reciprocal rank fusion: hand-computed scores, tie rules, properties."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_assets.lib.fusion import RRF_K, rrf


def test_default_k_is_cormack_60() -> None:
    assert RRF_K == 60
    assert rrf([["a"]]) == [("a", 1 / 61)]


def test_hand_computed_two_rankings() -> None:
    # a: 1/61 + 1/62 = 0.0325225; c: 1/63 + 1/61 = 0.0322665; b: 1/62; d: 1/63
    fused = rrf([["a", "b", "c"], ["c", "a", "d"]])
    assert [d for d, _ in fused] == ["a", "c", "b", "d"]
    assert [s for _, s in fused] == pytest.approx(
        [0.03252247488101534, 0.032266458495966696, 0.016129032258064516, 0.015873015873015872],
        rel=1e-12,
    )
    assert rrf([["a", "b", "c"], ["c", "a", "d"]], top=2) == fused[:2]
    assert rrf([["a", "b", "c"], ["c", "a", "d"]], top=0) == []


def test_hand_computed_small_k() -> None:
    # k = 1: x: 1/2 + 1/4 = 0.75; y: 1/3 + 1/2 = 0.8333; z: 1/4 + 1/3 = 0.5833
    fused = rrf([["x", "y", "z"], ["y", "z", "x"]], k=1)
    assert fused == [("y", pytest.approx(5 / 6)), ("x", 0.75), ("z", pytest.approx(7 / 12))]


def test_equal_scores_tie_by_best_rank_then_id() -> None:
    # symmetric: both 1/61 + 1/62, best rank 1 each -> id order
    assert [d for d, _ in rrf([["y", "x"], ["x", "y"]])] == ["x", "y"]
    assert [d for d, _ in rrf([["x", "y"], ["y", "x"]])] == ["x", "y"]
    # "u" at rank 62 in two rankings: 2/122 == 1/61 exactly == "v" at rank 1 in a third;
    # equal scores, so the better single rank (v: 1 vs u: 62) wins although "u" < "v"
    filler_a = [f"a{i:02d}" for i in range(61)]
    filler_b = [f"b{i:02d}" for i in range(61)]
    fused = dict(rrf([[*filler_a, "u"], [*filler_b, "u"], ["v"]]))
    assert fused["u"] == fused["v"] == 1 / 61
    order = [d for d, _ in rrf([[*filler_a, "u"], [*filler_b, "u"], ["v"]])]
    assert order.index("v") + 1 == order.index("u")
    # equal scores and equal best rank -> id ascending
    assert rrf([["k", "m"], ["j", "n"]]) == [
        ("j", 1 / 61),
        ("k", 1 / 61),
        ("m", 1 / 62),
        ("n", 1 / 62),
    ]


def test_duplicates_within_a_ranking_count_once_at_best_position() -> None:
    assert rrf([["a", "b", "a"]]) == [("a", 1 / 61), ("b", 1 / 62)]


def test_edge_cases() -> None:
    assert rrf([]) == [] and rrf([[], []]) == []
    with pytest.raises(ValueError):
        rrf([["a"]], k=-1)
    with pytest.raises(ValueError):
        rrf([["a"]], top=-1)
    with pytest.raises(TypeError):
        rrf(["abc"])  # a bare string is not a ranking


rankings_st = st.lists(
    st.lists(st.sampled_from([f"d{i}" for i in range(12)]), unique=True, max_size=10),
    max_size=4,
)


@given(rankings=rankings_st, k=st.integers(min_value=0, max_value=100), seed=st.integers(0, 99))
def test_property_matches_definition_and_ignores_ranking_order(
    rankings: list[list[str]], k: int, seed: int
) -> None:
    fused = rrf(rankings, k=k)
    want: dict[str, float] = {}
    for r in rankings:
        for pos, d in enumerate(r, start=1):
            want[d] = want.get(d, 0.0) + 1 / (k + pos)
    assert dict(fused) == pytest.approx(want, rel=1e-12)
    assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)
    shuffled = list(rankings)
    random.Random(seed).shuffle(shuffled)
    assert rrf(shuffled, k=k) == fused  # bit-identical, same order
    for top in (0, 1, 3):
        assert rrf(rankings, k=k, top=top) == fused[:top]


@given(ranking=st.lists(st.text(min_size=1, max_size=3), unique=True, max_size=20))
def test_property_identical_rankings_keep_their_order(ranking: list[str]) -> None:
    assert [d for d, _ in rrf([ranking, ranking, ranking])] == ranking
