"""Tests for rag_assets.lib.evaluate.calibrate: hand-computed sweeps, both policies, plot, table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_assets.lib.evaluate.calibrate import (
    DEFAULT_CUTS,
    QueryDistances,
    best_distances,
    choose_cut,
    outcomes,
    plot_distributions,
    sweep,
    sweep_table_markdown,
)

# Hits are in final retrieval order (after reranking), so distances are not sorted.
ANSWERABLE = [
    QueryDistances("a1", (0.35, 0.50, 0.70), frozenset({1})),
    QueryDistances("a2", (0.30, 0.45, 0.55), frozenset({3})),  # correct hit is 3rd
    QueryDistances("a3", (0.65, 0.62, 0.80), frozenset({2})),
]
OOD = [
    QueryDistances("o1", (0.42, 0.60), kind="near"),
    QueryDistances("o2", (0.58, 0.52), kind="near"),
    QueryDistances("o3", (0.90, 0.95), kind="unrelated"),
]
CUTS = [1.0, 0.3, 0.4, 0.5, 0.6, 0.7]  # unsorted on purpose

# Worked by hand with keep=2 and the strict gate "distance < cut":
# cut  a1            a2                       a3             o1 o2 o3
# 0.3  refused       refused (0.30 not <)     refused        -  -  -
# 0.4  r1 correct    r1 wrong                 refused        -  -  -
# 0.5  r1 correct    r1,r2 wrong              refused        x  -  -
# 0.6  r1,r2 correct r1,r2 wrong (r3 cut off) refused        x  x  -
# 0.7  r1,r2 correct r1,r2 wrong              r1,r2 correct  x  x  -
# 1.0  r1,r2 correct r1,r2 wrong              r1,r2 correct  x  x  x
EXPECTED = {  # cut: (correct, wrong, refused, bluffs_near, bluffs_unrelated)
    0.3: (0, 0, 3, 0, 0),
    0.4: (1, 1, 1, 0, 0),
    0.5: (1, 1, 1, 1, 0),
    0.6: (1, 1, 1, 2, 0),
    0.7: (2, 1, 0, 2, 0),
    1.0: (2, 1, 0, 2, 1),
}


def test_sweep_hand_computed_counts():
    rows = sweep(ANSWERABLE, OOD, CUTS, keep=2)
    assert [r.cut for r in rows] == sorted(CUTS)
    for r in rows:
        got = (
            r.answered_correct,
            r.answered_wrong,
            r.refused_answerable,
            r.bluffs_near,
            r.bluffs_unrelated,
        )
        assert got == EXPECTED[r.cut], r.cut
        assert (r.n_answerable, r.n_near, r.n_unrelated) == (3, 2, 1)
        assert r.bluff_rate == pytest.approx((got[3] + got[4]) / 3)
        assert r.answer_rate == pytest.approx((got[0] + got[1]) / 3)
        assert r.answered_correct_rate == pytest.approx(got[0] / 3)


def test_keep_limits_hits():
    # with keep=3 the 3rd hit of a2 is kept at 0.6, so a2 becomes correct there
    row = {r.cut: r for r in sweep(ANSWERABLE, OOD, CUTS, keep=3)}[0.6]
    assert (row.answered_correct, row.answered_wrong) == (2, 0)
    assert ANSWERABLE[1].kept_ranks(0.6, keep=2) == [1, 2]
    assert ANSWERABLE[1].kept_ranks(0.6, keep=3) == [1, 2, 3]


def test_choose_cut_max_cut_under_bluff_rate():
    rows = sweep(ANSWERABLE, OOD, CUTS, keep=2)
    c = choose_cut(rows, max_bluff_rate=0.10)
    assert (c.cut, c.policy, c.satisfied) == (0.4, "max_cut_under_bluff_rate", True)
    assert c.row.cut == 0.4
    assert "0/2 near and 0/1 unrelated" in c.reason
    c = choose_cut(rows, max_bluff_rate=0.34)  # 1/3 allowed
    assert c.cut == 0.5 and "1/2 near" in c.reason
    assert choose_cut(rows, max_bluff_rate=1.0).cut == 1.0


def test_choose_cut_youden():
    # J = correct_rate - bluff_rate: 0.3:0, 0.4:1/3, 0.5:0, 0.6:-1/3, 0.7:0, 1.0:-1/3
    c = choose_cut(sweep(ANSWERABLE, OOD, CUTS, keep=2), policy="youden")
    assert (c.cut, c.policy) == (0.4, "youden")
    assert "J = 0.333" in c.reason
    # ties go to the smallest cut: at cuts 0.3, 0.5 and 0.7 J is 0
    tied = sweep(ANSWERABLE, OOD, [0.3, 0.5, 0.7], keep=2)
    assert choose_cut(tied, policy="youden").cut == 0.3


def test_no_cut_satisfies_target():
    rows = sweep(ANSWERABLE, OOD, [0.5, 0.6, 1.0], keep=2)  # every cut bluffs >= 1/3
    c = choose_cut(rows, max_bluff_rate=0.10)
    assert c.satisfied is False
    assert c.cut == 0.5  # smallest, most conservative
    assert "no cut in [0.500, 1.000]" in c.reason and "most conservative" in c.reason


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown policy"):
        choose_cut(sweep(ANSWERABLE, OOD, CUTS), policy="best")
    with pytest.raises(ValueError, match="at least one"):
        sweep(ANSWERABLE, [], CUTS)
    with pytest.raises(ValueError, match="wrong kind"):
        sweep(OOD, ANSWERABLE, CUTS)
    with pytest.raises(ValueError, match="correct rank outside"):
        QueryDistances("x", [0.1], {2})
    with pytest.raises(ValueError, match="NaN"):
        QueryDistances("x", [float("nan")])
    with pytest.raises(ValueError, match="unknown kind"):
        QueryDistances("x", [0.1], kind="far")


def test_default_cuts():
    assert len(DEFAULT_CUTS) == 141
    assert DEFAULT_CUTS[0] == 0.30 and DEFAULT_CUTS[-1] == 1.00 and 0.655 in DEFAULT_CUTS
    rows = sweep(ANSWERABLE, OOD)
    assert len(rows) == 141
    assert choose_cut(rows).cut == 0.42  # last cut below o1's 0.42 is 0.420 (strict gate)


distances = st.lists(st.floats(0.0, 1.2, allow_nan=False), min_size=0, max_size=6)


@st.composite
def answerable_query(draw):
    ds = draw(distances)
    correct = draw(st.sets(st.integers(1, len(ds)), max_size=2)) if ds else set()
    return QueryDistances(f"a{draw(st.integers(0, 10**6))}", ds, correct)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(answerable_query(), min_size=1, max_size=6),
    st.lists(st.tuples(distances, st.sampled_from(["near", "unrelated"])), min_size=1, max_size=6),
    st.integers(1, 4),
)
def test_sweep_properties(answerable, ood_raw, keep):
    ood = [QueryDistances(f"o{i}", ds, kind=k) for i, (ds, k) in enumerate(ood_raw)]
    rows = sweep(answerable, ood, DEFAULT_CUTS[::10], keep=keep)
    for r in rows:
        assert r.answered_correct + r.answered_wrong + r.refused_answerable == len(answerable)
    for lo, hi in zip(rows, rows[1:], strict=False):
        assert hi.refused_answerable <= lo.refused_answerable
        assert hi.bluffs_near >= lo.bluffs_near and hi.bluffs_unrelated >= lo.bluffs_unrelated
    c = choose_cut(rows, max_bluff_rate=0.2)
    assert c.satisfied == (c.row.bluff_rate <= 0.2)
    if c.satisfied:
        assert all(r.bluff_rate > 0.2 for r in rows if r.cut > c.cut)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(answerable_query(), min_size=1, max_size=6, unique_by=lambda q: q.query_id),
    st.lists(st.tuples(distances, st.sampled_from(["near", "unrelated"])), min_size=1, max_size=6),
    st.sampled_from(DEFAULT_CUTS[::7]),
    st.integers(1, 4),
)
def test_outcomes_tally_to_the_sweep_row(answerable, ood_raw, cut, keep):
    ood = [QueryDistances(f"o{i}", ds, kind=k) for i, (ds, k) in enumerate(ood_raw)]
    row = sweep(answerable, ood, [cut], keep=keep)[0]
    o = outcomes(answerable, ood, cut, keep)
    a, b = list(o["answerable"].values()), list(o["out_of_domain"].values())
    assert (a.count("correct"), a.count("wrong"), a.count("refused")) == (
        row.answered_correct,
        row.answered_wrong,
        row.refused_answerable,
    )
    assert b.count("bluff") == row.bluffs_near + row.bluffs_unrelated
    assert set(o["out_of_domain"]) == {q.query_id for q in ood}


def test_outcomes_hand_computed():
    qs = [QueryDistances("a", [0.3, 0.5], {2}), QueryDistances("b", [0.6], {1})]
    ood = [QueryDistances("o", [0.45], kind="near")]
    assert outcomes(qs, ood, 0.4, keep=4) == {
        "answerable": {"a": "wrong", "b": "refused"},  # a keeps rank 1 only (0.5 >= 0.4)
        "out_of_domain": {"o": "refused"},
    }
    assert outcomes(qs, ood, 0.55, keep=4)["answerable"]["a"] == "correct"
    assert outcomes(qs, ood, 0.55, keep=4)["out_of_domain"]["o"] == "bluff"


def test_best_distances():
    assert best_distances(ANSWERABLE) == [0.35, 0.55, 0.62]  # best *correct* hit
    assert best_distances(OOD) == [0.42, 0.52, 0.90]  # best hit
    assert best_distances([QueryDistances("m", (0.2, 0.3))]) == []  # no correct hit: left out


def test_plot_writes_png(tmp_path):
    path = plot_distributions(
        best_distances(ANSWERABLE), best_distances(OOD), 0.4, tmp_path / "sub" / "gate.png"
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 1024
    import matplotlib.image as mpimg

    assert mpimg.imread(path).shape[:2] == (400, 700)


def test_sweep_table_markdown():
    rows = sweep(ANSWERABLE, OOD, CUTS, keep=2)
    table = sweep_table_markdown(rows, every=3, chosen=0.5)
    lines = table.splitlines()
    assert lines[0].startswith("| cut | answered correct")
    body = lines[2:]
    assert [ln.split("|")[1].strip().strip("*") for ln in body] == [
        "0.300",
        "0.500",
        "0.600",
        "1.000",
    ]
    assert body[1] == (
        "| **0.500** | **1/3** | **1** | **1** | **1/2** | **0/1** | **0.667** | **0.333** |"
    )
    assert all("|" in ln and ln.count("|") == 9 for ln in lines)


def test_a_calibration_on_traffic_moves_the_cut_by_a_bounded_step():
    """Issue 43: the poisoned calibration (0.475 -> 0.300) is held at 0.375 and named; the
    newcomer's legitimate one (0.475 -> 0.560) passes, as does any rise."""
    from rag_assets.lib.evaluate.calibrate import MAX_TRAFFIC_CUT_MOVE, bounded_traffic_cut

    assert bounded_traffic_cut(0.560, 0.475) == (0.560, "")
    assert bounded_traffic_cut(0.700, 0.475) == (0.700, "")  # a rise: the bluff target bounds it
    assert bounded_traffic_cut(0.300, None) == (0.300, "")
    cut, why = bounded_traffic_cut(0.300, 0.475)
    assert cut == pytest.approx(0.475 - MAX_TRAFFIC_CUT_MOVE)
    assert "asked for 0.300" in why and "RAG_DISTANCE_CUT=0.300" in why
