"""The plumbing of issue 52 in one process (fast tier): the core's hooks (stage timings,
model-server errors, query-log failures) reach an installed observer and cost nothing without
one; the series map gates, stages and verdicts to their labels; JSON log lines; the readiness
cache and its wait on a hung part; route templates. The real service: test_operate.py and
test_ready_parts.py.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from typing import Any

import pytest

from rag_assets.lib import observe
from rag_assets.serve import logs


class Recorder:
    def __init__(self) -> None:
        self.stages: list[tuple[str, float]] = []
        self.events: list[tuple[str, float, dict[str, str]]] = []

    def stage(self, name: str, seconds: float) -> None:
        self.stages.append((name, seconds))

    def event(self, name: str, value: float, labels: dict[str, str]) -> None:
        self.events.append((name, value, labels))


@pytest.fixture
def recorder() -> Any:
    rec = Recorder()
    previous = observe.install(rec)
    try:
        yield rec
    finally:
        observe.install(previous)


def test_without_an_observer_the_hooks_do_nothing():
    previous = observe.install(None)
    try:
        observe.stage_done("embed", 0.1)
        observe.event("model_server_error", server="RAG_EMBED_URL", kind="connect")
        with observe.timed("verify"):
            pass
        assert observe.installed() is None
    finally:
        observe.install(previous)


def test_stages_are_reported_where_they_run(recorder):
    from rag_assets.lib.query.retrieve import Timings

    t = Timings()
    t.add("embed", time.perf_counter() - 0.01)
    with pytest.raises(ValueError), observe.timed("verify"):
        raise ValueError("a stage that fails is still timed")
    names = [n for n, _ in recorder.stages]
    assert names == ["embed", "verify"] and recorder.stages[0][1] >= 0.01
    assert t.stages["embed"] >= 10.0  # the core's own milliseconds are unchanged


def test_an_observer_that_fails_never_fails_the_work():
    class Broken:
        def stage(self, name: str, seconds: float) -> None:
            raise RuntimeError("broken")

        def event(self, name: str, value: float, labels: dict[str, str]) -> None:
            raise RuntimeError("broken")

    previous = observe.install(Broken())
    try:
        observe.stage_done("embed", 0.1)
        observe.event("query_log_dropped")
    finally:
        observe.install(previous)


def test_a_failed_model_server_request_is_an_event_naming_its_setting(recorder):
    from rag_assets.lib.models.http import HttpError, send
    from rag_assets_tests.helpers import free_port

    where = f"RAG_EMBED_URL=http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(HttpError):
        send(where.split("=", 1)[1] + "/embeddings", {"input": ["x"]}, where=where, timeout=2)
    assert recorder.events == [
        ("model_server_error", 1.0, {"server": "RAG_EMBED_URL", "kind": "connect"})
    ]


def test_query_log_write_failures_and_drops_are_events(recorder):
    from rag_assets.lib.query.log import LogWriter

    class Failing:
        uri = "memory://log"

        def add_entries(self, rows: list[dict[str, Any]]) -> None:
            raise OSError("disk full")

    writer = LogWriter(Failing(), flush_s=0.01, max_queue=2)
    for i in range(2):
        writer.submit({"id": str(i)})
        writer.flush(5)
    writer.close(5)
    names = [n for n, _, _ in recorder.events]
    assert names.count("query_log_write_failed") >= 2 and "query_log_dropped" in names
    assert sum(v for n, v, _ in recorder.events if n == "query_log_dropped") == writer.dropped


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    "refused_by,gate",
    [(None, "none"), ("distance", "distance"), ("judge", "judge"),
     ("verification", "verification"), ("verify", "verification"), ("a question?", "other")],
)  # fmt: skip
def test_outcomes_are_counted_by_the_gate_that_refused(refused_by, gate):
    from rag_assets.serve.metrics import metrics

    outcome = "answered" if refused_by is None else "refused"
    before = _sample("rag_ask_outcomes_total", outcome=outcome, gate=gate)
    metrics().outcome(refused_by)
    assert _sample("rag_ask_outcomes_total", outcome=outcome, gate=gate) == before + 1


def test_verdicts_model_servers_and_the_served_version_have_fixed_labels():
    from rag_assets.serve.metrics import metrics

    m = metrics()
    before = _sample("rag_feedback_total", verdict="other")
    m.verdict("<script>free text</script>")  # never a label of its own
    assert _sample("rag_feedback_total", verdict="other") == before + 1
    m.event("model_server_error", 1, {"server": "RAG_EXPAND_LLM_URL", "kind": "timeout"})
    assert _sample("rag_model_server_errors_total", server="other", kind="timeout") >= 1
    m.serving("chunks_a", 3, "m")
    m.serving("chunks_a", 4, "m")
    assert _sample("rag_index_info", table="chunks_a", version="3", model="m") == 0
    assert _sample("rag_index_info", table="chunks_a", version="4", model="m") == 1


def test_json_lines_one_object_a_line():
    raw = io.StringIO()
    stream = logs.JsonLines(raw, {"run_id": "r1"})
    stream.write("rag-assets: warning: something\nhalf ")
    stream.write("a line\n" + json.dumps({"time": "t", "level": "info", "message": "m"}) + "\n")
    stream.write("rag-assets: error: no index at /x")
    stream.flush()
    lines = [json.loads(x) for x in raw.getvalue().splitlines()]
    assert [x["level"] for x in lines] == ["warning", "info", "info", "error"]
    assert lines[1]["message"] == "half a line" and lines[1]["run_id"] == "r1"
    assert lines[2] == {"time": "t", "level": "info", "message": "m"}  # passed as it was
    assert not stream.isatty()


def test_log_records_as_json_with_their_fields():
    record = logging.LogRecord("rag_assets.access", logging.INFO, "", 0, "GET /x 200", None, None)
    record.route, record.status = "/search", 200
    out = json.loads(logs.JsonFormatter().format(record))
    assert out["level"] == "info" and out["route"] == "/search" and out["status"] == 200
    assert out["time"].endswith("Z") and out["message"] == "GET /x 200"


def test_configure_is_undone():
    import sys

    before = sys.stderr
    stream = logs.configure("json", run_id="r")
    assert stream is not None and sys.stderr is stream
    stream.restore()
    assert sys.stderr is before and logs.configure("text") is None


class _Service:
    """Plumbing for :class:`Readiness`: its ``check`` is replaced."""

    settings = None


def test_readiness_is_cached_and_a_hung_part_is_named(monkeypatch):
    from rag_assets.serve import ready

    calls: list[int] = []
    release = threading.Event()

    def fake_check(service: Any, run: Any) -> None:
        calls.append(1)
        run.part = "object store"
        if len(calls) == 1:
            raise ready.NotReady("object store: not answering")
        release.wait(10)  # hangs until released

    monkeypatch.setattr(ready, "check", fake_check)
    r = ready.Readiness(_Service(), cache_s=0.3, wait_s=0.2)
    first = r.state()
    assert not first.ready and first.down == "object store: not answering"
    assert r.state() is first and len(calls) == 1  # cached
    time.sleep(0.35)
    hung = r.state()
    assert hung.down == "object store: no answer within 0.2 s" and len(calls) == 2
    release.set()
    deadline = time.monotonic() + 5
    while r.state().ready is not True:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_routes_are_labelled_by_template():
    from fastapi import FastAPI

    from rag_assets.serve.operate import route_of

    app = FastAPI()

    @app.get("/documents/{document_id:path}")
    def doc(document_id: str) -> str:
        return document_id

    scope = {"type": "http", "method": "GET", "path": "/documents/hr/pay.md", "app": app}
    assert route_of(scope) == "/documents/{document_id}"
    assert route_of({**scope, "path": "/no/such/secret.md"}) == "unmatched"


class _Access:
    def __init__(self, tokens: dict[str, Any]) -> None:
        self.tokens = tokens

    def required(self) -> bool:
        return bool(self.tokens)

    def resolve(self, secret: str) -> Any:
        return self.tokens.get(secret)


class _Request:
    def __init__(self, token: str | None) -> None:
        self.headers = {"authorization": f"Bearer {token}"} if token else {}


@pytest.mark.parametrize(
    "api,metrics,group,given,status",
    [
        ("", "", False, None, None),  # no token anywhere: open, as every route
        ("", "", False, "anything", None),
        ("", "m", False, None, 401),  # RAG_METRICS_TOKEN alone closes /metrics
        ("", "m", False, "m", None),
        ("", "m", False, "x", 401),
        ("a", "", False, "a", None),
        ("a", "", False, None, 401),
        ("a", "m", True, "g", 403),  # a group token: known, not allowed
        ("a", "m", True, "m", None),
        ("", "", True, "g", 403),  # tokens of the index only: the administrator has none
        ("", "", True, None, 401),
    ],
)
def test_who_may_read_metrics(api, metrics, group, given, status):
    from dataclasses import replace

    from rag_assets.serve.operate import metrics_refusal
    from rag_assets.settings import Settings

    tokens = {"g": object()} if group else {}
    if api:
        tokens[api] = object()

    class Svc:
        settings = replace(Settings(), api_token=api, metrics_token=metrics)

        def access(self) -> _Access:
            return _Access(tokens)

    refused = metrics_refusal(_Request(given), Svc())
    assert (refused[0] if refused else None) == status
