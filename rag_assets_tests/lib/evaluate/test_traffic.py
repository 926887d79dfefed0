"""Reviewed traffic as a question set (issue 33): needles from citations and quotes, re-located
after edits or dropped and counted, duplicates once, merged with a hand-written set, and the
counts the calibration still needs."""

from __future__ import annotations

import json
from pathlib import Path

from rag_assets.lib.evaluate import traffic
from rag_assets.lib.evaluate.question_source import traffic_decision
from rag_assets.lib.evaluate.questions import load_needle_set
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import QueryLog
from rag_assets.lib.query.log import new_query_id

TEXTS = {
    "a.md": "Alpha explains rollback.\nRun the rollback command to go back one version.",
    "b.md": "Beta covers chunking. Chunks are about 512 characters long.",
}


def add(log, question, verdict, *, quote=None, document=None, seq=0, decision=None):
    qid = new_query_id()
    log.add_entries(
        [
            {
                "id": qid,
                "at": f"2026-01-01T00:00:{seq:02d}.000Z",
                "at_ns": seq,
                "question": question,
                "decision": decision
                or ("refused" if verdict in ("right_refusal", "missed") else "answered"),
            }
        ]
    )
    log.add_feedback(
        {
            "query_id": qid,
            "seq": 1000 + seq,
            "at": "x",
            "verdict": verdict,
            "document": document,
            "quote": quote,
        }
    )
    return qid


def test_verdicts_become_needles_and_out_of_domain_questions(tmp_path):
    log = QueryLog(IndexStore(tmp_path / "index"))
    q1 = add(
        log,
        "How do I go back?",
        "answered",
        quote="Run the rollback command",
        document="a.md",
        seq=1,
    )
    q2 = add(
        log, "undo a publish?", "missed", quote="Run the rollback command", document="a.md", seq=2
    )
    q3 = add(
        log,
        "Chunk size?",
        "answered",
        quote="Chunks are about 512 characters long.",
        document="b.md",
        seq=3,
    )
    add(log, "How do I GO back?  ", "wrong", seq=4)  # same text as q1, newer: q1's review loses
    q5 = add(log, "Weather in Paris?", "right_refusal", seq=5)
    q6 = add(log, "Pricing of the cloud plan?", "should_refuse", seq=6)
    add(log, "Is it gone?", "missed", quote="a sentence deleted since", document="a.md", seq=7)
    out = tmp_path / "set"
    made = traffic.write_traffic_set(log, TEXTS, out)
    qset = load_needle_set(out)  # the project's own loader reads it
    by_needle = {q.needle: q for q in qset.questions}
    assert set(by_needle) == {"Run the rollback command", "Chunks are about 512 characters long."}
    rollback = by_needle["Run the rollback command"]
    assert rollback.document == "a.md" and set(rollback.queries) == {q2}  # q1 lost to "wrong"
    assert set(by_needle["Chunks are about 512 characters long."].queries) == {q3}
    kinds = {o.id: o.kind for o in qset.out_of_domain}
    assert kinds == {q5: "unrelated", q6: "near"}
    assert made.counts["queries"] == 2 and made.counts["dropped"] == 1 and len(made.dropped) == 1
    assert made.progress["answerable"] == 3 and made.progress["wrong"] == 1  # before relocation
    assert q1 not in json.dumps(json.loads((out / "state.json").read_text()))


def test_needles_are_relocated_after_edits_and_dropped_when_gone(tmp_path):
    log = QueryLog(IndexStore(tmp_path / "index"))
    add(log, "q one", "missed", quote="Run the rollback command", document="a.md", seq=1)
    add(
        log,
        "q two",
        "answered",
        quote="Chunks are about 512 characters long.",
        document="b.md",
        seq=2,
    )
    edited = {
        "a.md": "Alpha was rewritten.",  # the sentence moved to another document, re-wrapped
        "c.md": "Run the\nrollback   command to go back.",
        "b.md": "Beta no longer says how long chunks are.",
    }
    made = traffic.write_traffic_set(log, edited, tmp_path / "set")
    qset = load_needle_set(tmp_path / "set")
    (q,) = qset.questions
    assert q.document == "c.md" and q.needle == "Run the\nrollback   command"  # its own characters
    assert made.counts["dropped"] == 1


def test_progress_says_how_many_more_reviews_of_each_kind(tmp_path):
    log = QueryLog(IndexStore(tmp_path / "index"))
    for i in range(3):
        add(
            log,
            f"answerable {i}",
            "answered",
            quote="Run the rollback command",
            document="a.md",
            seq=i,
        )
    add(log, "off topic", "right_refusal", seq=10)
    p = traffic.review_progress(log)
    assert p["needed"] == {
        "answerable": traffic.MIN_ANSWERABLE - 3,
        "out_of_domain": traffic.MIN_OUT_OF_DOMAIN - 1,
    }
    assert not p["ready"]
    line = traffic.progress_line(p)
    assert f"{traffic.MIN_ANSWERABLE - 3} more answered/missed" in line
    decision, progress = traffic_decision(log, TEXTS, tmp_path / "set", None)
    assert decision is None and progress["answerable"] == 3  # the model-free cut stays


def test_enough_reviews_make_the_traffic_source_and_a_hand_written_set_is_merged(tmp_path):
    log = QueryLog(IndexStore(tmp_path / "index"))
    for i in range(traffic.MIN_ANSWERABLE):
        add(
            log,
            f"how to go back {i}",
            "answered",
            quote="Run the rollback command",
            document="a.md",
            seq=i,
        )
    for i in range(traffic.MIN_OUT_OF_DOMAIN):
        add(log, f"unrelated thing {i}", "right_refusal", seq=100 + i)
    decision, progress = traffic_decision(log, TEXTS, tmp_path / "set", None)
    assert decision is not None and decision.source == "traffic" and progress["ready"]
    assert decision.counts["queries"] == traffic.MIN_ANSWERABLE
    assert decision.counts["unrelated"] == traffic.MIN_OUT_OF_DOMAIN
    # a hand-written set wins: merged, its rows first, a repeated question left out
    hand = tmp_path / "hand"
    hand.mkdir()
    row = {
        "id": "h1",
        "document": "b.md",
        "needle": "Chunks are about 512 characters long.",
        "queries": {"course": "How long is a chunk?", "ticket": "how to go back 0"},
    }
    (hand / "questions.jsonl").write_text(json.dumps(row) + "\n")
    (hand / "out_of_domain.jsonl").write_text(
        json.dumps({"id": "o1", "kind": "near", "query": "Who wrote Dagster?"}) + "\n"
    )
    from rag_assets.lib.evaluate.question_source import configured_set

    configured = configured_set(hand, TEXTS)
    assert configured is not None and configured.source == "hand-written"
    merged, _ = traffic_decision(log, TEXTS, tmp_path / "merged", configured)
    assert merged is not None and merged.source == "hand-written+traffic"
    qset = load_needle_set(tmp_path / "merged")
    assert qset.questions[0].id == "h1" and len(qset.questions) == 2
    assert merged.counts["queries"] == 2 + traffic.MIN_ANSWERABLE - 1  # "how to go back 0" once
    assert len(qset.out_of_domain) == 1 + traffic.MIN_OUT_OF_DOMAIN


def test_entries_for_review_newest_first_with_history(tmp_path):
    log = QueryLog(IndexStore(tmp_path / "index"))
    first = add(log, "older", "wrong", seq=1)
    log.add_entries([{"id": new_query_id(), "at": "y", "at_ns": 5, "question": "newest"}])
    rows = traffic.entries_for_review(log, limit=10)
    assert [r["question"] for r in rows] == ["newest", "older"]
    assert rows[1]["review"] == "wrong" and rows[1]["history"][0]["verdict"] == "wrong"
    assert [r["question"] for r in traffic.entries_for_review(log, unreviewed=True)] == ["newest"]
    assert first == rows[1]["id"]


def test_the_loader_still_wants_both_phrasings_of_a_hand_written_question(tmp_path: Path):
    from rag_assets.lib.evaluate.questions import QuestionFileError, load_needle_set

    row = {"id": "x", "document": "a.md", "needle": "n", "queries": {"course": "c"}}
    (tmp_path / "questions.jsonl").write_text(json.dumps(row) + "\n")
    try:
        load_needle_set(tmp_path)
    except QuestionFileError as e:
        assert "queries.ticket" in str(e)
    else:
        raise AssertionError("a hand-written question with one phrasing was accepted")
    row = row | {"queries": {}, "traffic": {}}
    (tmp_path / "questions.jsonl").write_text(json.dumps(row) + "\n")
    try:
        load_needle_set(tmp_path)
    except QuestionFileError as e:
        assert "at least one phrasing" in str(e)


def test_only_the_administrators_verdicts_calibrate_the_shared_cut(tmp_path):
    """Issue 43's attack: one group token marks 20 of its questions answered and 20
    should_refuse, enough to calibrate on; none of it reaches the evaluation set (nor the
    reviews' digest that makes the graph re-evaluate) until the administrator gives them."""
    log = QueryLog(IndexStore(tmp_path / "index"))
    rows = [
        {"id": new_query_id(), "at": "x", "at_ns": i, "question": f"question {i}",
         "decision": "answered"}
        for i in range(40)
    ]  # fmt: skip
    log.add_entries(rows)
    empty = log.reviews_digest()
    for i, r in enumerate(rows):
        v = {"verdict": "answered", "document": "a.md", "quote": "Run the rollback command"}
        if i % 2:
            v = {"verdict": "should_refuse"}
        log.add_feedback({"query_id": r["id"], "seq": 100 + i, "at": "x", "caller": "eve", **v})
    assert traffic.review_progress(log)["reviewed"] == 0
    assert traffic_decision(log, TEXTS, tmp_path / "set", None)[0] is None
    assert log.reviews_digest() == empty  # the sensor sees nothing to re-evaluate
    queue = traffic.entries_for_review(log, unreviewed=True, limit=100)
    assert len(queue) == 40 and queue[0]["history"][0]["caller"] == "eve"  # shown, to confirm
    for i, r in enumerate(rows):  # the administrator confirms them: now they count
        review = log.reviews_of(r["id"])[-1]
        log.add_feedback(review | {"seq": 1000 + i, "caller": None, "interface": "review"})
    assert traffic.review_progress(log)["ready"] and log.reviews_digest() != empty
