"""The query log and feedback on the real service (issue 33): a real ``rag-assets serve``
(uvicorn) over real HTTP. Every verdict, every bad input, and what must not be observable
without the token: no entry, no question, no count, no error text that says anything."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import QueryLog
from rag_assets.lib.query.log import new_query_id
from rag_assets_tests.helpers import start_server, stop_process

pytestmark = pytest.mark.slow

ANSWERED = "How do I roll back to the previous embedding model?"
REFUSED = "What is the boiling point of tungsten?"


def _quote(served) -> tuple[str, str]:
    """A sentence of a real document of the index (the "missed" answer)."""
    text = (served.docs / "06-operations-runbook.md").read_text()
    m = re.search(r"The UI answers on port 3000 after about ten seconds\.", text)
    assert m is not None
    return "06-operations-runbook.md", m.group(0)


def test_every_verdict_is_recorded_and_a_second_replaces_the_first(served):
    with served.client() as c:
        answered = c.post("/ask", json={"question": ANSWERED}).json()
        refused = c.post("/ask", json={"question": REFUSED}).json()
        search = c.get("/search", params={"q": "stale assets", "k": 3})
        qa, qr, qs = answered["query_id"], refused["query_id"], search.headers["X-RAG-Query-Id"]
        assert len({qa, qr, qs}) == 3 and all(len(q) == 22 for q in (qa, qr, qs))

        r = c.post("/feedback", json={"query_id": qa, "verdict": "answered", "source": 1})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["verdict"] == "answered" and out["replaced"] is None and out["history"] == 1
        assert out["calibration"]["needed"]["answerable"] >= 0  # the administrator sees counts
        r = c.post("/feedback", json={"query_id": qa, "verdict": "should_refuse"})
        assert r.json()["replaced"] == "answered" and r.json()["history"] == 1  # issue 43
        r = c.post("/feedback", json={"query_id": qa, "verdict": "wrong", "note": "stale"})
        assert r.status_code == 200 and r.json()["replaced"] == "should_refuse"
        assert c.post("/feedback", json={"query_id": qr, "verdict": "right_refusal"}).is_success
        doc, quote = _quote(served)
        r = c.post(
            "/feedback",
            json={"query_id": qr, "verdict": "missed", "document": doc, "quote": quote},
        )
        assert r.status_code == 200 and r.json()["document"] == doc
        r = c.post("/feedback", json={"query_id": qs, "verdict": "answered", "source": 2})
        assert r.status_code == 200  # a search's hits are numbered by rank

        entry = c.get(f"/log/{qa}").json()
        # issue 43: one verdict per (query, caller) is kept: a later one replaces it
        assert [h["verdict"] for h in entry["history"]] == ["wrong"]
        assert entry["review"] == "wrong" and entry["history"][-1]["note"] == "stale"
        # what the entry records: stamps, retriever, fusion, hits, cut, decision, citations
        assert entry["interface"] == "http/ask" and entry["question"] == ANSWERED
        assert entry["table"] == answered["published"]["table"]
        assert entry["version"] == answered["published"]["version"] and entry["model"]
        assert entry["retriever"] == "hybrid" and entry["fusion"] == "rrf"
        assert entry["decision"] == "answered" and entry["cut"] == answered["threshold"]
        assert entry["caller"] is None and entry["latency_ms"] > 0
        assert [h["rank"] for h in entry["hits"]][:3] == [1, 2, 3]
        assert entry["hits"][0]["chunk_id"] and entry["hits"][0]["distance"] is not None
        shown = [(x["n"], x["chunk_id"]) for x in entry["citations"]]
        assert shown == [(x["index"], x["chunk_id"]) for x in answered["citations"]]
        assert entry["nearest_distance"] == min(h["distance"] for h in entry["hits"])
        missed = c.get(f"/log/{qr}").json()
        assert missed["decision"] == "refused" and missed["history"][-1]["quote"] == quote
        listed = c.get("/log", params={"limit": 500}).json()
        assert {qa, qr, qs} <= {e["id"] for e in listed}


def _feedback_version(index) -> int:
    """The current version of the index's verdict table: one per commit to it."""
    return int(IndexStore(index).db.open_table("_rag_feedback").version)


def test_verdicts_posted_together_share_commits_and_a_read_sees_each_at_once(served):
    """Issue 43: every verdict was one append and one delete (2 commits each). Verdicts that
    arrive together are now stored in one merge_insert commit; each POST answers once its
    verdict is stored, so the read right after it sees it, and the latest per caller wins."""
    from concurrent.futures import ThreadPoolExecutor

    n = 12
    with served.client() as c:
        ids = [
            c.get("/search", params={"q": f"stale assets {i}", "k": 3}).headers["X-RAG-Query-Id"]
            for i in range(n)
        ]
        c.post("/feedback", json={"query_id": ids[0], "verdict": "wrong"})  # the table exists
    before = _feedback_version(served.index)

    def judge(qid: str) -> tuple[int, int, str | None, list[str]]:
        with served.client() as c:
            first = c.post("/feedback", json={"query_id": qid, "verdict": "wrong"})
            second = c.post("/feedback", json={"query_id": qid, "verdict": "answered", "source": 1})
            seen = c.get(f"/log/{qid}").json()  # right after the answer
        return (
            first.status_code,
            second.status_code,
            second.json().get("replaced"),
            [h["verdict"] for h in seen["history"]],
        )

    with ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(judge, ids))
    commits = _feedback_version(served.index) - before
    print(f"{2 * n} verdicts posted by {n} threads: {commits} commits to _rag_feedback")
    assert all(r[:2] == (200, 200) for r in results), results
    assert all(r[2] == "wrong" and r[3] == ["answered"] for r in results), results
    assert commits <= n, commits  # was 2 per verdict: 4n
    with served.client() as c:
        for qid in ids:
            assert [h["verdict"] for h in c.get(f"/log/{qid}").json()["history"]] == ["answered"]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"query_id": "x" * 22, "verdict": "wrong"}, 404, "no query xxxxxxxxxxxxxxxxxxxxxx"),
        ({"query_id": "not-an-id", "verdict": "wrong"}, 400, "query_id is missing or malformed"),
        ({"verdict": "wrong"}, 400, "query_id is missing"),
        ({"query_id": "@answered", "verdict": "great"}, 400, "verdict 'great' is not one of"),
        ({"query_id": "@answered", "verdict": "answered", "source": 9}, 400, "(shown: 1"),
        ({"query_id": "@answered", "verdict": "answered"}, 400, "answered needs source"),
        ({"query_id": "@answered", "verdict": "right_refusal"}, 400, "was answered, not refused"),
        ({"query_id": "@refused", "verdict": "should_refuse"}, 400, "got NO ANSWER"),
        (
            {
                "query_id": "@refused",
                "verdict": "missed",
                "document": "06-operations-runbook.md",
                "quote": "this sentence is in no document at all",
            },  # fmt: skip
            400,
            "quote not found in 06-operations-runbook.md",
        ),
        (
            {
                "query_id": "@refused",
                "verdict": "missed",
                "document": "nope.md",
                "quote": "The UI answers on port 3000",
            },  # fmt: skip
            400,
            "no document 'nope.md'",
        ),
        ({"query_id": "@answered", "verdict": "wrong", "extra": 1}, 400, "unknown field 'extra'"),
        ("[1, 2", 400, "not valid JSON"),
        # issue 43: a note follows a question's rules (was a 500, and a NUL was stored)
        (
            '{"query_id": "' + "x" * 22 + '", "verdict": "wrong", "note": "a \\ud800"}',
            400,
            "note contains a lone surrogate U+D800",
        ),
        (
            '{"query_id": "' + "x" * 22 + '", "verdict": "wrong", "note": "a\\u0000b"}',
            400,
            "note contains the control character U+0000",
        ),
        (["a list"], 400, "send a JSON object"),
    ],
)
def test_bad_feedback_gets_a_4xx_line_and_stores_nothing(served, body, status, needle):
    with served.client() as c:
        ids = {
            "@answered": c.post("/ask", json={"question": ANSWERED}).json()["query_id"],
            "@refused": c.post("/ask", json={"question": REFUSED}).json()["query_id"],
        }
        if isinstance(body, dict) and body.get("query_id") in ids:
            body = body | {"query_id": ids[body["query_id"]]}
        before = c.get("/log", params={"limit": 500}).json()
        kwargs = {"content": body} if isinstance(body, str) else {"json": body}
        r = c.post("/feedback", headers={"Content-Type": "application/json"}, **kwargs)
        assert r.status_code == status, r.text
        err = r.json()
        assert set(err) == {"error"} and "\n" not in err["error"] and needle in err["error"]
        after = c.get("/log", params={"limit": 500}).json()
        hist = {e["id"]: len(e["history"]) for e in after}
        assert all(hist[e["id"]] == len(e["history"]) for e in before)  # no verdict stored
        assert c.post("/ask", json={"question": ANSWERED}).status_code == 200  # still serves


def test_without_the_token_nothing_of_the_log_is_observable(served):
    with served.client() as c:
        qid = c.post("/ask", json={"question": "UNIQUEMARKER how do I roll back?"}).json()
        qid = qid["query_id"]
    anon = httpx.Client(base_url=served.url, timeout=60)
    wrong = httpx.Client(base_url=served.url, timeout=60, headers={"Authorization": "Bearer no"})
    for client in (anon, wrong):
        for method, path, body in (
            ("GET", "/log", None),
            ("GET", f"/log/{qid}", None),
            ("GET", f"/log/{new_query_id()}", None),
            ("GET", "/log?unreviewed=true&limit=5", None),
            ("POST", "/feedback", {"query_id": qid, "verdict": "wrong"}),
            ("POST", "/feedback", {"query_id": new_query_id(), "verdict": "wrong"}),
            ("POST", "/feedback", {"query_id": "bad", "verdict": "bad"}),
            ("GET", "/status", None),
        ):
            r = client.request(method, path, json=body)
            assert r.status_code == 401, (path, r.text)
            # one generic line: no question, no count, no id, no word about the log's contents
            assert r.json() == {
                "error": "missing or wrong bearer token: send Authorization: Bearer <token> "
                "(RAG_API_TOKEN or a token from `rag-assets token add`)"
            }
            assert "UNIQUEMARKER" not in r.text and qid not in r.text
        r = client.get("/search", params={"q": "stale assets"})
        assert r.status_code == 401 and "X-RAG-Query-Id" not in r.headers
    with served.client() as c:  # the entry was never judged by those requests
        assert c.get(f"/log/{qid}").json()["history"] == []


@pytest.fixture(scope="module")
def open_served(served, tmp_path_factory):
    """A second real server on the same index without a token, redaction on."""
    log = tmp_path_factory.mktemp("open") / "serve.log"
    env = served.env() | {"RAG_QUERY_LOG_REDACT": "on"}
    env.pop("RAG_API_TOKEN", None)
    url, proc = start_server(served.index, env, log)
    try:
        yield url
    finally:
        stop_process(proc)


def test_a_service_without_a_token_shows_no_log_and_redacts(open_served, served):
    with httpx.Client(base_url=open_served, timeout=60) as c:
        asked = c.post("/ask", json={"question": "mail ops@example.com about 0612345678 rollback"})
        qid = asked.json()["query_id"]
        for path in ("/log", f"/log/{qid}"):
            r = c.get(path)
            assert r.status_code == 403 and "RAG_API_TOKEN" in r.json()["error"]
            assert "example" not in r.text and not re.search(r"\d{3,}", r.json()["error"])
        status = c.get("/status").json()
        assert status["query_log"] == {"enabled": True}  # no counts for anyone
        fb = c.post("/feedback", json={"query_id": qid, "verdict": "answered", "source": 1})
        assert fb.status_code == 200 and "calibration" not in fb.json()
    deadline = time.monotonic() + 30
    while True:  # the writer's batch lands within a second or two
        row = QueryLog(IndexStore(served.index)).entry(qid)
        if row is not None or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert row is not None and row["redacted"] is True
    assert row["question"] == "mail [email] about [number] rollback"
    assert "example.com" not in json.dumps(row) and "0612345678" not in json.dumps(row)


def test_status_names_the_log_and_the_reviews_still_needed(served):
    with served.client() as c:
        q = c.get("/status").json()["query_log"]
    assert q["enabled"] is True and q["entries"] > 0
    need = q["calibration"]["needed"]
    assert set(need) == {"answerable", "out_of_domain"} and need["answerable"] >= 0


def test_replay_command_on_the_served_index(served, monkeypatch, capsys):
    """`rag-assets replay --fusion …`: the logged questions asked again with another fusion."""
    from rag_assets.cli import main

    fresh = f"What does a blocking asset check do? ({new_query_id()})"  # asked here only
    with served.client() as c:
        qid = c.post("/ask", json={"question": fresh}).json()["query_id"]
    deadline = time.monotonic() + 30
    while QueryLog(IndexStore(served.index)).entry(qid) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    for var, value in served.env().items():
        if var.startswith("RAG_"):
            monkeypatch.setenv(var, value)
    monkeypatch.setenv("RAG_QUERY_ENCODER", "torch")
    assert main(["replay", "--fusion", "rrf", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["candidate"]["fusion"] == "rrf" and same["questions"] >= 1
    (row,) = [r for r in same["rows"] if r["query_id"] == qid]
    assert row["agreement"] == 1.0 and row["decision"][0] == row["decision"][1]
    assert fresh not in json.dumps(same)  # ids and figures, no question text
    assert main(["replay", "--fusion", "bm25"]) == 0
    table = capsys.readouterr().out
    assert "top-4 agreement" in table and "fusion bm25" in table
    assert main(["replay", "--candidate", "nope@1"]) == 1
    assert "not a staged or published table version" in capsys.readouterr().err


def test_the_pages_search_for_a_verdicts_passage_is_not_logged(served):
    """Issue 43: the page's "the answer is elsewhere → Find" searches filled the review queue
    and the drift figures; they now ask /search with log=false."""
    from rag_assets.serve.app import STATIC

    assert 'log: "false"' in (STATIC / "feedback.js").read_text()
    with served.client() as c:
        r = c.get("/search", params={"q": "UNLOGGEDMARKER stale assets", "k": 3, "log": "false"})
        assert r.status_code == 200 and r.json() and "x-rag-query-id" not in r.headers
        logged = c.get("/search", params={"q": "LOGGEDMARKER stale assets", "k": 3})
        assert logged.headers["x-rag-query-id"]
        questions = [e["question"] for e in c.get("/log", params={"limit": 500}).json()]
        assert "LOGGEDMARKER stale assets" in questions
        assert not any("UNLOGGEDMARKER" in q for q in questions)
