"""Issue 19: where a corpus's evaluation comes from. Stable needle samples, the set-size rule,
the unrelated-only cut, the hand-written / reviewed / generated choice, budgets that stop and
resume from the cache, and a failed endpoint that keeps the last good set."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_assets.lib.evaluate import calibrate
from rag_assets.lib.evaluate import question_source as qs
from rag_assets.lib.evaluate import questions_gen as G
from rag_assets.lib.query.judge import make_client
from rag_assets_tests.lib.fake_llm import fake_llm, user_text


def _needle(doc: str, i: int) -> G.Needle:
    return G.Needle(doc, f"Sentence number {i} of document {doc} is long enough here.", i, "", "")


@settings(max_examples=40, deadline=None)
@given(
    n_docs=st.integers(2, 6),
    per_doc=st.integers(1, 12),
    n=st.integers(1, 20),
    edited=st.integers(0, 5),
    seed=st.integers(0, 3),
)
def test_an_edit_changes_only_the_needles_of_the_edited_document(n_docs, per_doc, n, edited, seed):
    docs = [f"d{k}" for k in range(n_docs)]
    before = [_needle(d, i) for d in docs for i in range(per_doc)]
    target = docs[edited % n_docs]
    # the edited document: half its sentences rewritten, the others untouched
    after = [c for c in before if c.document != target or c.start % 2 == 0] + [
        G.Needle(
            target, f"A rewritten sentence {i} of the edited document, long enough.", i, "", ""
        )
        for i in range(per_doc // 2)
    ]
    a = {(c.document, c.text) for c in G.sample_needles(before, n, seed)}
    b = {(c.document, c.text) for c in G.sample_needles(after, n, seed)}
    changed_elsewhere = {x for x in a ^ b if x[0] != target}
    assert len(changed_elsewhere) <= per_doc  # only boundary moves, never a reshuffle
    # every needle kept from another document keeps its place: those left are a prefix
    assert len(b) == min(n, len(after))


def test_sample_is_the_same_for_the_same_input_and_changes_with_the_seed():
    cands = [_needle(d, i) for d in "abc" for i in range(20)]
    assert G.sample_needles(cands, 10, 0) == G.sample_needles(list(reversed(cands)), 10, 0)
    assert G.sample_needles(cands, 10, 0) != G.sample_needles(cands, 10, 1)


@pytest.mark.parametrize(
    ("chunks", "candidates", "expected"),
    [(10, 500, 32), (800, 500, 32), (825, 500, 33), (2500, 500, 100), (99999, 500, 100),
     (800, 12, 12), (0, 0, 0)],
)  # fmt: skip
def test_set_size_follows_the_corpus(chunks, candidates, expected):
    assert G.set_size(chunks, candidates) == expected


def _ood(dists: list[float]) -> list[calibrate.QueryDistances]:
    return [calibrate.QueryDistances(f"u{i}", (d, d + 0.1), frozenset(), "unrelated")
            for i, d in enumerate(dists)]  # fmt: skip


def test_unrelated_cut_is_the_largest_with_at_most_the_target_share_answered():
    # 20 questions, nearest distances 0.50, 0.52, ..., 0.88; a 10 % target allows 2 answered:
    # a cut answers q iff min distance < cut, so the largest swept cut is 0.54 (0.50 and 0.52)
    dists = [round(0.50 + 0.02 * i, 2) for i in range(20)]
    choice = calibrate.choose_unrelated_cut(_ood(dists), max_bluff_rate=0.10)
    assert choice.cut == pytest.approx(0.54)
    assert choice.row.bluffs_unrelated == 2 and choice.satisfied
    assert "20 unrelated" in choice.reason and "near-misses" in choice.reason
    # a stricter target, a lower cut
    assert calibrate.choose_unrelated_cut(_ood(dists), max_bluff_rate=0.0).cut == 0.5


def test_unrelated_cut_refuses_too_few_questions():
    with pytest.raises(ValueError, match=r"only 19 out-of-domain questions.*at least 20"):
        calibrate.choose_unrelated_cut(_ood([0.8] * 19))


def test_the_shipped_unrelated_list_is_large_and_varied():
    qs_ = G.unrelated_questions()
    assert len(qs_) >= 200 and len(set(qs_)) == len(qs_)
    one_word = [q for q in qs_ if len(q.split()) <= 2]
    no_mark = [q for q in qs_ if not q.endswith("?")]
    long_ = [q for q in qs_ if len(q) > 90]
    non_ascii = [q for q in qs_ if any(ch not in string.printable for ch in q)]
    assert len(one_word) >= 10 and len(no_mark) >= 20 and len(long_) >= 5 and non_ascii


DOCS = {
    "tickets.md": "# Tickets\n\nAdults pay eleven euros for a day ticket at the museum desk.\n\n"
    "Children under twelve enter for free when an adult comes with them.\n",
    "wrecks.md": "# Shipwrecks\n\nThe bell of the Aurora hangs in the entrance hall since 1923.\n\n"
    "Divers found the second anchor of the Aurora near the northern reef.\n",
}


def _corpus() -> dict[str, dict]:
    return {k: {"text": v, "title": k, "headings": []} for k, v in DOCS.items()}


def _writer(body):
    text = user_text(body)
    if "Sentence:" in text:
        return "COURSE: What does the documentation say here?\nTICKET: quick question pls", None
    if "Sections:" in text:
        return (
            "TERM: parking garage | QUESTION: How much does the parking garage cost?\n"
            "TERM: cafeteria | QUESTION: Is the cafeteria open on Mondays?"
        ), None
    return "No", {"Yes": 0.1, "No": 0.9}


def test_generated_set_stops_at_its_budget_and_resumes_from_the_cache(tmp_path):
    ticks = iter(range(0, 10_000, 10))  # every clock reading is 10 s later
    with fake_llm(_writer) as (url, seen):
        llm = make_client(url, cache_dir=tmp_path / "cache")
        first = qs.generate_set(
            _corpus(), 4, llm, tmp_path / "set", budget_s=25, clock=lambda: next(ticks)
        )
        assert not first.complete and "RAG_EVAL_BUDGET_S" in first.notes[0]
        calls_first = len(seen)
        again = qs.generate_set(_corpus(), 4, llm, tmp_path / "set", budget_s=10_000)
        assert again.complete and again.counts["questions"] == 4 and again.counts["near"] >= 1
        # nothing asked twice: the first run's replies came from the cache
        assert again.cost["cached_calls"] >= calls_first
        calls_second = len(seen)
        third = qs.generate_set(_corpus(), 4, llm, tmp_path / "set", budget_s=10_000)
        assert len(seen) == calls_second and third.cost["llm_calls"] == 0
    state = json.loads((tmp_path / "set" / qs.STATE_FILE).read_text())
    assert state["source"] == "generated" and state["label"].startswith("generated (model ")
    assert qs.last_generated(tmp_path / "set").complete


def test_a_hand_written_set_wins_and_an_edited_export_is_reviewed(tmp_path):
    with fake_llm(_writer) as (url, _):
        llm = make_client(url, cache_dir=tmp_path / "cache")
        gen = qs.generate_set(_corpus(), 4, llm, tmp_path / "gen", budget_s=10_000)
    texts = {k: v for k, v in DOCS.items()}
    reviewed = tmp_path / "reviewed"
    reviewed.mkdir()
    lines = (Path(gen.path) / "questions.jsonl").read_text().splitlines()
    (reviewed / "questions.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # one row struck
    (reviewed / "out_of_domain.jsonl").write_text(
        (Path(gen.path) / "out_of_domain.jsonl").read_text()
    )
    d = qs.configured_set(reviewed, texts)
    assert d is not None and d.source == "reviewed" and d.counts["questions"] == 3
    hand = tmp_path / "hand"
    hand.mkdir()
    (hand / "questions.jsonl").write_text(
        json.dumps(
            {
                "id": "h01",
                "document": "tickets.md",
                "needle": "Adults pay eleven euros for a day ticket at the museum desk.",
                "queries": {"course": "How much is an adult ticket?", "ticket": "price adult?"},
            }
        )
        + "\n"
    )
    assert qs.configured_set(hand, texts).source == "hand-written"
    other = qs.configured_set(hand, {"x.md": "nothing about tickets here"})
    assert other.source == "unevaluated" and "does not belong" in other.notes[0]
    assert qs.configured_set(tmp_path / "missing", texts) is None


def _topics(dists: dict[str, list[float]]) -> list[calibrate.QueryDistances]:
    """Questions about other topics as day0.other_topics_distances names them: <domain>/<n>."""
    out, n = [], 0
    for domain, ds in dists.items():
        for d in ds:
            n += 1
            out.append(calibrate.QueryDistances(f"{domain}/{n}", (d,), frozenset(), "unrelated"))
    return out


def test_the_day0_cut_answers_a_tenth_of_the_bluff_rate_of_the_other_topics():
    """Issue 53, hand-computed: 1,000 questions, the bluff-rate target 10 %: at most 1 % (10) may
    find a source. 12 C questions at 0.50, 0.51, ... 0.61 and 988 far ones at 0.95; a question
    keeps a source under a cut above its distance, so the cut 0.600 keeps 0.50 ... 0.59 (10) and
    0.605 keeps 11: the cut is 0.600. The reason names the nearest domains."""
    near = [round(0.50 + 0.01 * i, 2) for i in range(12)]
    c = calibrate.choose_day0_cut(_topics({"c and c++": near, "cooking": [0.95] * 988}), 0.10)
    assert c.cut == pytest.approx(0.600) and c.satisfied and c.warning == ""
    assert c.policy == calibrate.DAY0_POLICY and c.row.bluffs_unrelated == 10
    assert "1.0% of 1000 questions about other topics (2 domains)" in c.reason
    assert "gives one to 10 (nearest: c and c++ 10)" in c.reason
    # a stricter target moves it with the share: 5 % -> 0.5 % -> 5 questions -> cut 0.550
    strict = calibrate.choose_day0_cut(_topics({"c": near, "x": [0.95] * 988}), 0.05)
    assert strict.cut == pytest.approx(0.550) and strict.row.bluffs_unrelated == 5


def test_a_folder_close_to_many_topics_fails_closed_with_a_warning():
    """Issue 53: when even the smallest cut (0.300) answers more than the share, the day-0 cut
    is the smallest one (refusing nearly everything), never a cut from everyday questions
    alone, and the warning says why and what to do."""
    close = _topics({f"d{i}": [0.25] * 5 for i in range(8)} | {"far": [0.9] * 960})
    c = calibrate.choose_day0_cut(close, 0.10)
    assert c.cut == pytest.approx(min(calibrate.DEFAULT_CUTS)) and not c.satisfied
    assert c.warning.startswith("this folder is close to questions on many topics")
    assert "40 of 1000 questions about other topics" in c.warning and "RAG_EVAL_DIR" in c.warning
    assert c.reason == c.warning


def _result(model: str, ranks: dict, outcomes: dict) -> dict:
    summary = {
        "recall@1": {"value": 0.5}, "recall@4": {"value": 0.5}, "recall@20": {"value": 1.0},
        "mrr": 0.5, "ranks": ranks,
    }  # fmt: skip
    return {
        "model": model,
        "retrievers": {"hybrid": summary},
        "refusal": {"answered": 1, "bluffs": 0, "outcomes": {"answerable": outcomes}},
    }


def test_an_upgrade_is_compared_pairwise_on_the_same_questions():
    from rag_assets.lib.evaluate.evaluate import compare_to_published

    ids = [f"q{i:02d}/course" for i in range(12)]
    old = _result("old", dict.fromkeys(ids, 1), dict.fromkeys(ids, "correct"))
    # the new table loses 8 hit@4 (rank 9) and 8 answers, wins none: p = 2 * 0.5**8 = 0.0078
    new_ranks = {q: (9 if i < 8 else 1) for i, q in enumerate(ids)}
    new_out = {q: ("refused" if i < 8 else "correct") for i, q in enumerate(ids)}
    cmp = compare_to_published(_result("new", new_ranks, new_out), old)
    assert cmp["queries"] == 12 and cmp["worse"] == ["hit@4", "answered_with_needle"]
    assert cmp["tests"]["hit@4"]["losses"] == 8 and cmp["tests"]["hit@4"]["p"] == pytest.approx(
        2 * 0.5**8
    )
    assert "| published | old |" in cmp["table"] and "| new | new |" in cmp["table"]
    # 3 losses out of 3 discordant pairs: p = 0.25, not significant: the upgrade may publish
    new_ranks = {q: (9 if i < 3 else 1) for i, q in enumerate(ids)}
    cmp = compare_to_published(_result("new", new_ranks, dict.fromkeys(ids, "correct")), old)
    assert cmp["worse"] == [] and cmp["tests"]["hit@4"]["p"] == pytest.approx(0.25)
