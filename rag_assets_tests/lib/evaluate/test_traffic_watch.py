"""The log's figures, the drift rule and the content-gap grouping (issue 33)."""

from __future__ import annotations

import math

import numpy as np

from rag_assets.lib.evaluate import traffic_watch as watch

HOUR = 3600 * 10**9


def asks(n, *, refused_every=4, distance=0.45, start=0, step=HOUR // 10, prefix="q"):
    """``n`` asks, one in ``refused_every`` refused (0: none), nearest distance ``distance``
    (answered) or ``distance + 0.3`` (refused)."""
    out = []
    for i in range(n):
        refused = refused_every and i % refused_every == 0
        out.append(
            {
                "id": f"{prefix}{i}",
                "at_ns": start + i * step,
                "interface": "http/ask",
                "decision": "refused" if refused else "answered",
                "nearest_distance": distance + (0.3 if refused else 0.0) + 0.001 * (i % 7),
                "latency_ms": 20.0 + i % 5,
                "question": f"question {i}",
            }
        )
    return out


def test_metrics_over_the_last_day_week_and_log():
    now = 100 * 24 * HOUR
    entries = asks(40, start=now - 2 * HOUR, step=HOUR // 40) + asks(
        10, start=now - 3 * 24 * HOUR, prefix="old"
    )
    m = watch.log_metrics(entries, {"q1": {"verdict": "wrong"}}, now)
    assert m["entries"] == 50 and m["queries_last_24h"] == 40 and m["asks_last_24h"] == 40
    assert m["refusal_rate_24h"] == 10 / 40
    assert m["queries_per_day_7d"] == round(50 / 7, 2)
    assert 0.45 <= m["nearest_distance_p10_24h"] <= m["nearest_distance_p50_24h"]
    assert m["latency_ms_p50_24h"] == 22.0 and m["reviews_wrong"] == 1 and m["unreviewed"] == 49
    empty = watch.log_metrics([], {}, now)
    assert empty["entries"] == 0 and math.isnan(empty["refusal_rate_24h"])


def test_drift_waits_for_enough_traffic_and_stays_quiet_when_steady():
    few = watch.drift(asks(3 * watch.DRIFT_WINDOW))
    assert few.status == "not enough traffic" and "needs" in few.reasons[0]
    steady = watch.drift(asks(10 * watch.DRIFT_WINDOW))
    assert steady.status == "ok" and steady.windows == 9 and not steady.reasons


def test_a_burst_of_off_topic_questions_warns():
    base = asks(6 * watch.DRIFT_WINDOW)
    burst = asks(
        watch.DRIFT_WINDOW,
        refused_every=1,  # all refused, far from the corpus
        distance=0.55,
        start=base[-1]["at_ns"] + 1,
        prefix="burst",
    )
    d = watch.drift(base + burst)
    assert d.status == "warn"
    assert d.current["refusal_rate"] == 1.0 and abs(d.trailing_mean["refusal_rate"] - 0.25) < 0.02
    assert any(r.startswith("refusal rate 1.000") for r in d.reasons)
    assert any(r.startswith("median nearest distance") for r in d.reasons)


def test_a_small_move_in_a_very_steady_history_does_not_warn():
    base = asks(6 * watch.DRIFT_WINDOW, refused_every=0, distance=0.40)
    nudge = asks(watch.DRIFT_WINDOW, refused_every=0, distance=0.43, start=10**15, prefix="n")
    d = watch.drift(base + nudge)  # sd ~0.002 would flag 0.03; the floor is 0.05
    assert d.status == "ok"


def test_gaps_group_refused_and_should_refuse_questions_most_asked_first():
    entries = [
        {"id": "1", "question": "How much does the cloud plan cost?", "decision": "refused"},
        {"id": "2", "question": "how much does the cloud plan cost? ", "decision": "refused"},
        {"id": "3", "question": "What is the price of the cloud plan?", "decision": "answered"},
        {"id": "4", "question": "Does it run on Windows?", "decision": "refused"},
        {"id": "5", "question": "Answered and fine", "decision": "answered"},
        {"id": "6", "question": "Refused but the answer was there", "decision": "refused"},
    ]
    reviews = {"3": {"verdict": "should_refuse"}, "6": {"verdict": "missed"}}
    qs = watch.gap_questions(entries, reviews)
    assert qs[0] == ("How much does the cloud plan cost?", 2, "refused")
    assert ("What is the price of the cloud plan?", 1, "should_refuse") in qs
    assert all("answer was there" not in q for q, _, _ in qs)  # a missed refusal is no gap

    def embed(texts):  # cloud-plan questions on one axis, the rest on another
        v = np.array([[1.0, 0.0] if "cloud plan" in t else [0.0, 1.0] for t in texts])
        return v

    groups = watch.content_gaps(qs, embed)
    assert [g["asked"] for g in groups] == [3, 1]
    assert groups[0]["example"] == "How much does the cloud plan cost?"
    md = watch.gaps_markdown(groups, "2026-01-01", "test embeddings")
    assert "## 1. How much does the cloud plan cost?" in md and "Asked 3 times" in md
    by_words = watch.content_gaps(qs)  # no model: shared words
    assert by_words[0]["asked"] >= 2


def test_refusals_caused_by_access_are_split_off_the_gaps():
    """Issue 43: a group token's refusal the unrestricted index answers is not a content gap;
    the administrator's refusals and unanswerable ones stay, and each question is asked once."""
    entries = [
        {"id": "1", "question": "Salary bands?", "decision": "refused", "caller": "fin"},
        {"id": "2", "question": "salary  bands?", "decision": "refused", "caller": "fin"},
        {"id": "3", "question": "Moons of Neptune?", "decision": "refused", "caller": "hr"},
        {"id": "4", "question": "Salary bands?", "decision": "refused", "caller": None},
        {"id": "5", "question": "Salary bands?", "decision": "answered", "caller": "hr"},
    ]
    asked: list[str] = []

    def answers(q: str) -> bool:
        asked.append(q)
        return "salary" in q.lower()

    kept, access = watch.access_refusals(entries, answers)
    assert access == 2 and [e["id"] for e in kept] == ["3", "4", "5"]
    assert asked == ["Salary bands?", "Moons of Neptune?"]
    assert watch.access_refusals(entries, None) == (entries, 0)
    assert watch.refused_for_a_token(entries) and not watch.refused_for_a_token(kept[1:])
    md = watch.gaps_markdown([], "2026-01-01", "words", refused_for_access=2)
    assert "Refused for access: 2" in md
