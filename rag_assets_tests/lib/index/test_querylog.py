"""The query log's tables (issue 33): appends from several processes, reviews, and purges that
leave no trace of the removed text in the files, on a local directory and on a real S3 server
(the ``index_uri`` fixture runs the marked tests on both)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import FEEDBACK_TABLE, QUERIES_TABLE, QueryLog
from rag_assets.lib.query.log import new_query_id


def entry(question: str, at_ns: int | None = None, qid: str | None = None) -> dict:
    return {
        "id": qid or new_query_id(),
        "at": "2026-01-01T00:00:00.000Z",
        "at_ns": at_ns if at_ns is not None else time.time_ns(),
        "interface": "http/ask",
        "question": question,
        "decision": "answered",
        "nearest_distance": 0.4,
        "hits": "[]",
        "citations": "[]",
    }


def verdict(qid: str, v: str, seq: int) -> dict:
    return {"query_id": qid, "seq": seq, "at": "x", "verdict": v, "interface": "http"}


def test_entries_feedback_and_reviews_round_trip(index_uri):
    log = QueryLog(IndexStore(index_uri))
    assert log.entries() == [] and log.reviews() == {} and not log.exists(QUERIES_TABLE)
    empty = log.reviews_digest()
    a, b = entry("first question", 1), entry("second question", 2)
    log.add_entries([b, a])
    assert [e["question"] for e in log.entries()] == ["first question", "second question"]
    assert log.entry(a["id"])["question"] == "first question"
    assert log.entry("no-such-id-but-valid-xx") is None
    assert log.entry("x' OR '1'='1") is None  # never reaches SQL
    log.add_feedback(verdict(a["id"], "wrong", 10))
    first = log.reviews_digest()
    assert first != empty
    log.add_feedback(verdict(a["id"], "answered", 20))  # replaces the first (issue 43)
    assert log.reviews()[a["id"]]["verdict"] == "answered"
    assert [r["verdict"] for r in log.reviews_of(a["id"])] == ["answered"]
    assert log.reviews_digest() not in (first, empty)
    assert QueryLog(IndexStore(index_uri)).reviews_digest() == log.reviews_digest()  # stable


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_purge_by_id_and_date_leaves_no_text_in_the_files(tmp_path):
    uri = tmp_path / "index"
    log = QueryLog(IndexStore(uri))
    old = entry("OLDSECRET question about payroll", at_ns=1_000)
    gone = entry("IDSECRET question asked once")
    kept = entry("a question that stays")
    for row in (old, gone, kept):  # one commit each: several fragments and versions
        log.add_entries([row])
    log.add_feedback(verdict(gone["id"], "should_refuse", 5))
    log.add_feedback(verdict(kept["id"], "wrong", 6))
    assert b"IDSECRET" in _all_bytes(uri)
    assert log.purge(ids=[gone["id"]]) == (1, 1)
    assert log.purge(before_ns=2_000) == (1, 0)
    assert [e["id"] for e in log.entries()] == [kept["id"]]
    assert set(log.reviews()) == {kept["id"]}
    data = _all_bytes(uri)
    assert b"IDSECRET" not in data and b"OLDSECRET" not in data  # no old version keeps them
    assert b"a question that stays" in data
    with pytest.raises(ValueError, match="not a query id"):
        log.purge(ids=["../../etc"])


def test_retention_removes_only_old_unreviewed_entries(tmp_path):
    log = QueryLog(IndexStore(tmp_path / "index"))
    day = 86_400 * 10**9
    now = 100 * day
    old_plain, old_reviewed, fresh = (
        entry("a", now - 91 * day),
        entry("b", now - 91 * day),
        entry("c", now),
    )
    log.add_entries([old_plain, old_reviewed, fresh])
    log.add_feedback(verdict(old_reviewed["id"], "right_refusal", 1))
    assert log.expire(0, now) == 0  # 0 days: keep everything
    assert log.expire(90, now) == 1
    assert {e["id"] for e in log.entries()} == {old_reviewed["id"], fresh["id"]}


WRITER = textwrap.dedent(
    """
    import sys, time
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.index.store.querylog import QueryLog
    uri, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    log = QueryLog(IndexStore(uri))
    for i in range(n):  # every 4th row is old: the purges running meanwhile remove it
        at_ns = 1 if i % 4 == 0 else time.time_ns()
        log.add_entries([{"id": f"{name}-{i:04d}", "at": "x", "at_ns": at_ns,
                          "question": f"q {name} {i}", "decision": "refused"}])
    """
)


@pytest.mark.slow
def test_several_processes_append_and_a_purge_in_between_loses_nothing(tmp_path):
    """Four writer processes (as four `serve --workers`) append while this process purges
    again and again (each purge an Overwrite commit racing their appends): every row not
    purged is there exactly once."""
    uri = str(tmp_path / "index")
    log = QueryLog(IndexStore(uri))
    log.ensure()
    log.add_entries([entry("purge me", at_ns=1, qid=f"old-{i:04d}") for i in range(20)])
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, uri, f"w{p}", "40"], env=env)
        for p in range(4)
    ]
    purged, rounds = 0, 0
    while any(p.poll() is None for p in procs):
        n = log.purge(before_ns=2)[0]
        purged, rounds = purged + n, rounds + (n > 0)
    assert all(p.wait(timeout=120) == 0 for p in procs)
    purged += log.purge(before_ns=2)[0]
    ids = [e["id"] for e in QueryLog(IndexStore(uri)).entries()]
    assert len(ids) == len(set(ids)) == 120  # 4 x 30 kept rows, none lost, none doubled
    assert purged == 20 + 40 and rounds > 1


def test_tables_are_created_empty_and_only_when_written(tmp_path):
    log = QueryLog(IndexStore(tmp_path / "index"))
    log.entries(), log.feedback(), log.reviews_digest()  # reading creates nothing
    assert not log.exists(QUERIES_TABLE) and not log.exists(FEEDBACK_TABLE)
    log.ensure()
    assert log.count() == 0 and log.exists(FEEDBACK_TABLE)


def test_one_verdict_per_query_and_caller_and_compaction_on_a_commit_count(tmp_path):
    """Issue 43: a loop of verdicts on one query keeps one row per (query, caller), only the
    administrator's verdicts are the trusted reviews, and a burst of commits is compacted
    (fragments stay bounded) without waiting for the daily round."""
    log = QueryLog(IndexStore(tmp_path / "index"), compact_every=16)
    a = entry("a question")
    log.add_entries([a])
    for seq in range(1, 41):  # a token's loop, then the administrator
        v = ("answered", "should_refuse")[seq % 2]
        log.add_feedback(verdict(a["id"], v, seq) | {"caller": "eve"})
    log.add_feedback(verdict(a["id"], "wrong", 100))
    log.add_feedback(verdict(a["id"], "answered", 101) | {"caller": "o'brien"})  # quoted in SQL
    rows = log.reviews_of(a["id"])
    assert [(r["caller"], r["verdict"]) for r in rows] == [
        ("eve", "answered"),  # its 40th verdict, the only one of its 40 kept
        (None, "wrong"),
        ("o'brien", "answered"),
    ]
    assert log.reviews()[a["id"]]["caller"] == "o'brien"  # the newest, shown for review
    assert log.reviews(trusted=True)[a["id"]]["verdict"] == "wrong"  # what calibrates
    fragments = log.db.open_table(FEEDBACK_TABLE).stats()["fragment_stats"]["num_fragments"]
    assert fragments <= 16 + 1  # 84 commits, compacted every 16


def test_verdicts_that_arrive_together_share_one_write():
    """Issue 43: :class:`GroupCommit`: each submit returns once its row is written, rows that
    wait while a write runs go together in the next one, and a failed write fails its rows."""
    import threading

    from rag_assets.lib.index.store.querylog import GroupCommit

    written: list[list[int]] = []
    started = threading.Event()

    def write(rows: list[dict]) -> None:
        started.set()
        deadline = time.monotonic() + 10
        while not written and len(batcher._waiting) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)  # the first commit lasts until the other 8 wait for it
        if any(r["n"] < 0 for r in rows):
            raise RuntimeError("disk full")
        written.append([r["n"] for r in rows])

    batcher = GroupCommit(write)
    first = threading.Thread(target=batcher.submit, args=({"n": 0},))
    first.start()
    started.wait(5)
    threads = [threading.Thread(target=batcher.submit, args=({"n": i},)) for i in range(1, 9)]
    for t in threads:
        t.start()
    for t in [first, *threads]:
        t.join(10)
    assert sorted(n for batch in written for n in batch) == list(range(9))
    assert batcher.commits == len(written) == 2 and written[0] == [0]  # 9 rows, 2 writes
    with pytest.raises(RuntimeError, match="disk full"):
        batcher.submit({"n": -1})
    batcher.submit({"n": 9})  # the next write goes on
    assert written[-1] == [9]
