"""Reciprocal rank fusion: hand-computed scores, tie rules, properties."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_assets.lib.query.fusion import RRF_K, rrf


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


# -- weighted RRF and the RAG_FUSION choice (issue 8) -------------------------------------------
def test_weighted_rrf_hand_computed() -> None:
    # dense weight 2: a = 2/61 + 1/62 = 0.0489178; c = 2/63 + 1/61 = 0.0481391; b = 2/62; d = 1/63
    fused = rrf([["a", "b", "c"], ["c", "a", "d"]], weights=[2, 1])
    assert [d for d, _ in fused] == ["a", "c", "b", "d"]
    assert [s for _, s in fused] == pytest.approx(
        [2 / 61 + 1 / 62, 2 / 63 + 1 / 61, 2 / 62, 1 / 63], rel=1e-12
    )
    # a heavy enough weight lets one ranking decide: bm25's top "e" falls below dense's b, c
    assert [d for d, _ in rrf([["a", "b", "c"], ["e", "d", "a"]])][:2] == ["a", "e"]
    heavy = [d for d, _ in rrf([["a", "b", "c"], ["e", "d", "a"]], weights=[5, 1])]
    assert heavy == ["a", "b", "c", "e", "d"]
    # weights of 1 are the unweighted definition, bit for bit
    assert rrf([["a", "b"], ["b", "c"]], weights=[1, 1]) == rrf([["a", "b"], ["b", "c"]])
    with pytest.raises(ValueError, match="2 weights for 1 rankings"):
        rrf([["a"]], weights=[1, 2])


def test_parse_fusion_choices_and_labels() -> None:
    from rag_assets.lib.query.fusion import FUSION_DEPTH, Fusion, parse_fusion

    assert parse_fusion(None) == parse_fusion("") == parse_fusion("rrf") == Fusion()
    f = parse_fusion("rrf:dense=2")
    assert f.weights == {"dense": 2.0, "bm25": 1.0} and f.k == RRF_K and f.depth == FUSION_DEPTH
    g = parse_fusion(" RRF:dense=1.5,bm25=0.5,k=10,depth=20 ")
    assert (g.weights["dense"], g.weights["bm25"], g.k, g.depth) == (1.5, 0.5, 10, 20)
    for spec in ("rrf", "rrf:dense=2", "rrf:bm25=0.5,k=10,depth=20", "dense", "bm25"):
        assert parse_fusion(parse_fusion(spec).label) == parse_fusion(spec)
    assert parse_fusion("dense").method == "dense"


@pytest.mark.parametrize(
    "spec",
    ["rfr", "rrf:dense", "rrf:dense=-1", "rrf:colbert=2", "rrf:k=x", "rrf:depth=0", "dense:k=1"],
)
def test_bad_fusion_setting_is_one_line_naming_it(spec: str) -> None:
    from rag_assets.lib.query.fusion import parse_fusion

    with pytest.raises(ValueError, match="RAG_FUSION=") as e:
        parse_fusion(spec)
    assert "\n" not in str(e.value)


def test_fusion_fuse_depth_and_single_sides() -> None:
    from rag_assets.lib.query.fusion import parse_fusion

    dense, bm25 = ["a", "b", "c", "d"], ["d", "c", "e"]
    assert [d for d, _ in parse_fusion("dense").fuse(dense, bm25)] == dense
    assert [d for d, _ in parse_fusion("bm25").fuse(dense, bm25)] == bm25
    # depth=2: only the first two of each side take part
    assert {d for d, _ in parse_fusion("rrf:depth=2").fuse(dense, bm25)} == {"a", "b", "c", "d"}
    assert "e" not in dict(parse_fusion("rrf:depth=2").fuse(dense, bm25))
    assert parse_fusion("rrf").fuse(dense, bm25) == rrf([dense, bm25])


@given(
    rankings=st.lists(
        st.lists(st.sampled_from([f"d{i}" for i in range(12)]), unique=True, max_size=10),
        min_size=2,
        max_size=2,
    ),
    w=st.floats(min_value=0, max_value=10, allow_nan=False),
)
def test_property_weighted_matches_definition(rankings: list[list[str]], w: float) -> None:
    fused = rrf(rankings, weights=[w, 1.0])
    want: dict[str, float] = {}
    for weight, r in zip([w, 1.0], rankings, strict=True):
        for pos, d in enumerate(r, start=1):
            want[d] = want.get(d, 0.0) + weight / (RRF_K + pos)
    assert dict(fused) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)
