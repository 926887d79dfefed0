"""Operating ``rag-assets serve`` (issue 52) on one real service: two uvicorn workers on a real
sample index, with RAG_API_TOKEN, a group token and RAG_METRICS_TOKEN, answers written by a
plumbing chat server, traces exported to a real OTLP/HTTP receiver and JSON log lines.

A known sequence of requests (answered, refused, a verdict, a 400, a 404, a document shown, a
token's 403s and /search until both workers have answered) is sent once; then: the Prometheus
series count exactly that, added up over both workers' files; every token sees /metrics or not
as it should, and what a refusal shows holds no series; each request is one span with a child
per stage and its attributes, no question text or document name anywhere exported; the log
lines are JSON.
Last, /ready turns 503 naming the index folder when it disappears and 200 when it is back, with
/healthz 200 throughout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from rag_assets_tests.helpers import (
    SAMPLE_DOCS,
    STARTUP_S,
    cli_here,
    direct_to_loopback,
    free_port,
    stop_process,
    wait_healthy,
)
from rag_assets_tests.lib.fake_llm import fake_llm
from rag_assets_tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.slow

ADMIN = "admin-token-52"
METRICS = "metrics-token-52"
ANSWERED = "How do I roll back to the previous embedding model?"
REFUSED = "What is the boiling point of liquid mercury on Jupiter?"
MISSING_DOC = "plans/secret-merger-zq9.md"
ANSWER = "Roll back by publishing the previous version again [1]."


@dataclass
class Ops:
    url: str
    index: Path
    log: Path
    prom: Path
    proc: subprocess.Popen[bytes]
    receiver: OtlpReceiver
    group: str  # the group token's secret
    sent: dict[str, Any] = field(default_factory=dict)  # what the known sequence did

    def get(self, path: str, token: str | None = ADMIN, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + path, headers=headers | kw.pop("headers", {}), timeout=60, **kw)

    def ask(self, question: str, **headers: str) -> httpx.Response:
        auth = {"Authorization": f"Bearer {ADMIN}"}
        body = {"question": question}
        return httpx.post(self.url + "/ask", json=body, headers=auth | headers, timeout=60)


@pytest.fixture(scope="module")
def ops(tmp_path_factory, real_embedder) -> Iterator[Ops]:
    from rag_assets.lib.index.onnx_encoder import query_embedder
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.settings import Settings

    root = tmp_path_factory.mktemp("operate")
    docs, index = root / "documents", root / "index"
    shutil.copytree(SAMPLE_DOCS, docs, ignore=shutil.ignore_patterns("*.pdf"))
    index_folder(docs, index, strategy("E"), real_embedder)
    # the query encoder's ONNX export made once here, not by both workers at once
    settings = Settings(index_uri=str(index), work_dir=str(root / "work"))
    query_embedder(settings)
    with contextlib.ExitStack() as stack:
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        direct_to_loopback(mp)
        llm, _ = stack.enter_context(fake_llm(lambda body: (ANSWER, None)))
        receiver = stack.enter_context(OtlpReceiver())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAG_", "OTEL_"))}
        env |= {
            "RAG_INDEX_URI": str(index),
            "RAG_WORK_DIR": str(root / "work"),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        made = cli_here(env, "token", "add", "reader", "--groups", "staff")
        env |= {
            "RAG_API_TOKEN": ADMIN,
            "RAG_METRICS_TOKEN": METRICS,
            "RAG_LLM_URL": llm,
            "RAG_LOG_FORMAT": "json",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "PROMETHEUS_MULTIPROC_DIR": str(root / "prom"),
        }
        port, log = free_port(), root / "serve.log"
        cmd = [sys.executable, "-m", "rag_assets.cli", "serve", "--port", str(port)]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*cmd, "--workers", "2"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        stack.callback(stop_process, proc, 30)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log, STARTUP_S)
        _both_workers_up(root / "prom", proc, log)
        ops = Ops(url, index, log, root / "prom", proc, receiver, made.stdout.strip())
        _known_sequence(ops)
        yield ops


def _both_workers_up(prom: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Each worker writes its series file once its app is made (then it accepts)."""
    deadline = time.monotonic() + STARTUP_S
    while len({p.stem.rsplit("_", 1)[1] for p in prom.glob("counter_*.db")}) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.3)
    time.sleep(1.0)  # its lifespan started, it accepts


def _known_sequence(ops: Ops) -> None:
    """The requests every test below reads the traces of; the scrape right after them."""
    sent = ops.sent
    answered = ops.ask(ANSWERED, **{"X-Request-ID": "req-answered-1"})
    refused = ops.ask(REFUSED)
    assert answered.status_code == refused.status_code == 200
    sent["answered"], sent["refused"] = answered.json(), refused.json()
    assert not sent["answered"]["no_answer"] and sent["refused"]["refused_by"] == "distance"
    sent["doc"] = sent["answered"]["citations"][0]["document_id"]
    verdict = {"query_id": sent["answered"]["query_id"], "verdict": "answered", "source": 1}
    auth = {"Authorization": f"Bearer {ADMIN}"}
    r = httpx.post(ops.url + "/feedback", json=verdict, headers=auth, timeout=60)
    assert r.status_code == 200, r.text
    assert ops.get("/search", params={"q": ""}).status_code == 400
    assert ops.get(f"/documents/{MISSING_DOC}").status_code == 404
    shown = ops.get(f"/documents/{sent['doc']}", params={"char": "0,20"})
    assert shown.status_code == 200
    assert ops.get("/log", token=ops.group).status_code == 403  # the log is the administrator's
    assert ops.get("/metrics", token=ops.group).status_code == 403
    # /search on new connections until both workers have counted some (the kernel hands each
    # connection to either); every one is counted once, on the worker that answered it
    searches = 0
    with ThreadPoolExecutor(max_workers=10) as pool:
        while searches < 200:
            codes = list(
                pool.map(lambda _: ops.get("/search", params={"q": "rollback"}), range(10))
            )
            assert {r.status_code for r in codes} == {200}
            searches += 10
            if len(_per_worker(ops.prom, "rag_requests_total")) >= 2:
                break
    sent["searches"] = searches
    scrape = ops.get("/metrics", token=METRICS)
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    sent["scrape"] = scrape.text
    sent["per_worker"] = _per_worker(ops.prom, "rag_requests_total")


def _per_worker(folder: Path, name: str) -> dict[str, float]:
    """The total of series ``name`` in each worker's own file (multiprocess mode), less the
    scrapes (a scrape is counted once it is answered: it may be there or not yet)."""
    from prometheus_client.mmap_dict import MmapedDict

    out: dict[str, float] = {}
    for path in folder.glob("counter_*.db"):
        total = 0.0
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            _, series, labels, _ = json.loads(key)
            if series == name and labels != SCRAPE:
                total += value
        if total:
            out[path.stem] = total
    return out


SCRAPE = {"route": "/metrics", "status": "200"}


def _published(ops: Ops) -> Any:
    """The table version the index's pointer names (what the service serves)."""
    from rag_assets.lib.index.store import IndexStore

    pub = IndexStore(ops.index).published()
    assert pub is not None
    return pub


def _series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(series: dict[Any, float], name: str, **labels: str) -> float:
    return series.get((name, tuple(sorted(labels.items()))), 0.0)


def test_the_series_count_the_known_sequence_over_both_workers(ops: Ops):
    s = _series(ops.sent["scrape"])
    n = ops.sent["searches"]
    expected = {
        ("/ask", "200"): 2,
        ("/search", "400"): 1,
        ("/search", "200"): n,
        ("/documents/{document_id}", "404"): 1,
        ("/documents/{document_id}", "200"): 1,
        ("/log", "403"): 1,
        ("/metrics", "403"): 1,
        ("/feedback", "200"): 1,
    }
    for (route, status), count in expected.items():
        assert _value(s, "rag_requests_total", route=route, status=status) == count, route
    assert _value(s, "rag_request_seconds_count", route="/search") == n + 1
    assert _value(s, "rag_request_seconds_count", route="/ask") == 2
    assert _value(s, "rag_ask_outcomes_total", outcome="answered", gate="none") == 1
    assert _value(s, "rag_ask_outcomes_total", outcome="refused", gate="distance") == 1
    assert _value(s, "rag_feedback_total", verdict="answered") == 1
    # every stage where it ran: two asks and n searches embed, search and fuse; the two asks
    # cite; only the answered one is generated
    for stage in ("embed", "dense", "bm25", "fuse"):
        assert _value(s, "rag_stage_seconds_count", stage=stage) == n + 2, stage
    assert _value(s, "rag_stage_seconds_count", stage="cite") == 2
    assert _value(s, "rag_stage_seconds_count", stage="generate") == 1
    assert _value(s, "rag_stage_seconds_bucket", stage="generate", le="+Inf") == 1
    pub = _published(ops)
    info = {"table": pub.table, "version": str(pub.version), "model": pub.stamps.model}
    assert pub.stamps.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert _value(s, "rag_index_info", **info) == 1
    assert _value(s, "rag_ready") == 1
    assert _value(s, "rag_model_server_errors_total", server="llm", kind="connect") == 0
    # the counts are the sum of both workers' own files (read right after the scrape)
    per_worker = ops.sent["per_worker"]
    assert len(per_worker) == 2 and all(v > 0 for v in per_worker.values()), per_worker
    scraped = sum(v for (name, _), v in s.items() if name == "rag_requests_total")
    assert scraped == n + 9  # the sequence and the first /healthz
    assert sum(per_worker.values()) == scraped
    # labels name routes and stages: no question, no document name, no raw path
    for secret in (ANSWERED, REFUSED, "Jupiter", "secret-merger", ops.sent["doc"], "rollback"):
        assert secret not in ops.sent["scrape"], secret


@pytest.mark.parametrize(
    "who,status",
    [("none", 401), ("wrong", 401), ("group", 403), ("admin", 200), ("metrics", 200)],
)
def test_metrics_for_each_token(ops: Ops, who: str, status: int):
    token = {"none": None, "wrong": "not-a-token", "group": ops.group, "admin": ADMIN}.get(
        who, METRICS
    )
    r = ops.get("/metrics", token=token)
    assert r.status_code == status
    if status != 200:  # nothing of what is counted: no series, no count, no route
        assert set(r.json()) == {"error"} and "rag_" not in r.text and "/search" not in r.text
    else:
        assert "rag_requests_total{" in r.text
    if who == "metrics":  # RAG_METRICS_TOKEN opens /metrics only: no results, no status
        assert ops.get("/search", token=METRICS, params={"q": "rollback"}).status_code == 401
        assert ops.get("/status", token=METRICS).status_code == 401
        assert ops.get("/log", token=METRICS).status_code == 401
    # /ready and /healthz need no token and show no counts or errors of requests
    ready = ops.get("/ready", token=token)
    assert ready.status_code == 200 and ready.json() == {"ready": True}


def test_each_request_is_a_span_with_its_stages_and_no_question(ops: Ops):
    parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    r = ops.get("/search", params={"q": "stale assets", "k": 3}, headers={"traceparent": parent})
    assert r.status_code == 200

    def complete(spans: list[dict[str, Any]]) -> bool:
        """Both asks with their stages (made a moment after the request), and the search."""
        asks = [s for s in spans if s["kind"] == 2 and s["name"] == "POST /ask"]  # SERVER
        kids = [sum(c["parent_span_id"] == a["span_id"] for c in spans) for a in asks]
        mine = any(s["trace_id"] == "ab" * 16 and s["kind"] == 2 for s in spans)
        return len(asks) >= 2 and sum(kids) >= 5 + 7 and mine

    spans = ops.receiver.wait_for(complete)
    server = {s["span_id"]: s for s in spans if s["kind"] == 2}
    asks = [s for s in server.values() if s["name"] == "POST /ask"]
    by_refused = {s["attributes"]["rag.refused"]: s for s in asks}
    answered, refused = by_refused[False], by_refused[True]
    assert answered["attributes"]["rag.request_id"] == "req-answered-1"
    pub = _published(ops)
    for span in (answered, refused):
        a = span["attributes"]
        assert a["http.route"] == "/ask" and a["http.response.status_code"] == 200
        assert a["rag.retriever"] == "hybrid" and a["rag.k"] == 25 and a["rag.hits"] > 0
        assert a["rag.table"] == pub.table and a["rag.table_version"] == pub.version
        assert "rag.query" not in a  # RAG_TRACE_QUERIES is off
    assert refused["attributes"]["rag.gate"] == "distance"
    assert answered["attributes"]["rag.query_id"] == ops.sent["answered"]["query_id"]

    def stages(span: dict[str, Any]) -> list[str]:
        kids = [s for s in spans if s["parent_span_id"] == span["span_id"]]
        assert all(s["trace_id"] == span["trace_id"] for s in kids)
        assert all(span["start_ns"] <= s["start_ns"] <= s["end_ns"] <= span["end_ns"] for s in kids)
        return sorted(s["name"] for s in kids)

    assert stages(answered) == sorted(
        ["embed", "dense", "bm25", "fuse", "cite", "generate", "ground", "verify"]
    )
    assert stages(refused) == sorted(["embed", "dense", "bm25", "fuse", "cite"])
    # the caller's trace continues: its trace id, its span as the parent
    mine = next(s for s in server.values() if s["trace_id"] == "ab" * 16)
    assert mine["parent_span_id"] == "cd" * 8 and mine["name"] == "GET /search"
    assert mine["attributes"]["rag.k"] == 3 and mine["attributes"]["rag.retriever"] == "hybrid"
    # routes are templates; nothing a user sent is in any exported byte
    assert {s["name"] for s in server.values()} >= {
        "GET /documents/{document_id}",
        "GET /search",
        "GET /metrics",
        "GET /log",
    }
    exported = b"".join(ops.receiver.bodies)
    for secret in (ANSWERED, REFUSED, "Jupiter", "secret-merger", ops.sent["doc"], "stale assets"):
        assert secret.encode() not in exported, secret
    assert all(s["resource"]["service.name"] == "rag-assets" for s in spans)


def test_log_lines_are_json_with_the_request_and_no_question(ops: Ops):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the access line is written as the answer goes out
        lines = [json.loads(line) for line in ops.log.read_text().splitlines() if line.strip()]
        access = [x for x in lines if x.get("logger") == "rag_assets.access"]
        if any(x["request_id"] == "req-answered-1" for x in access):
            break
        time.sleep(0.2)
    first = next(x for x in access if x["request_id"] == "req-answered-1")
    assert first["route"] == "/ask" and first["status"] == 200 and first["method"] == "POST"
    assert first["query_id"] == ops.sent["answered"]["query_id"]
    assert first["duration_ms"] > 0 and first["level"] == "info" and len(first["trace_id"]) == 32
    assert first["time"].endswith("Z")
    statuses = {(x["route"], x["status"]) for x in access}
    assert {("/search", 400), ("/documents/{document_id}", 404), ("/log", 403)} <= statuses
    text = ops.log.read_text()
    for secret in (ANSWERED, REFUSED, "Jupiter", "secret-merger", ops.sent["doc"]):
        assert secret not in text, secret
    # the command line's own lines too: the run's id and command, and one closing line
    lines = [x for x in lines if x.get("command") == "serve"]
    assert lines and lines[0]["message"].startswith("serving ")


def test_the_command_lines_runs_log_json(ops: Ops, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env |= {"RAG_LOG_FORMAT": "json", "RAG_WORK_DIR": str(tmp_path / "work")}
    done = cli_here(env, "status", "--index", str(ops.index), "--json")
    failed = cli_here(env, "search", "stale", "--index", str(ops.index / "nowhere"), check=False)
    for run, code in ((done, 0), (failed, 1)):
        lines = [json.loads(line) for line in run.stderr.splitlines()]
        assert lines and len({x["run_id"] for x in lines}) == 1
        last = lines[-1]
        assert last["status"] == code and last["duration_ms"] > 0
        assert last["level"] == ("info" if code == 0 else "error")
    assert any(x["level"] == "error" and "no index at" in x["message"] for x in lines[:-1])


def test_ready_follows_the_index_folder_and_healthz_stays(ops: Ops):
    assert ops.get("/ready", token=None).status_code == 200
    time.sleep(2.5)  # the query log's queued entries are written (FLUSH_S) before it goes
    away = ops.index.with_name("index-away")
    ops.index.rename(away)
    try:
        down = _until(ops, 503)
        assert down.json() == {"ready": False, "error": "index folder: missing"}
        assert ops.get("/healthz", token=None).status_code == 200
    finally:
        away.rename(ops.index)
    assert _until(ops, 200).json() == {"ready": True}
    assert ops.get("/healthz", token=None).status_code == 200


def _until(ops: Ops, status: int, timeout: float = 20) -> httpx.Response:
    """/ready (either worker) until it answers ``status`` on two requests in a row."""
    deadline = time.monotonic() + timeout
    streak = 0
    while True:
        r = ops.get("/ready", token=None)
        assert ops.get("/healthz", token=None).status_code == 200
        streak = streak + 1 if r.status_code == status else 0
        if streak >= 2:
            return r
        assert time.monotonic() < deadline, f"/ready stayed {r.status_code}: {r.text}"
        time.sleep(0.3)
