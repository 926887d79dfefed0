"""Generation endpoint hygiene, against a real local HTTP server: credentials in the URL are
sent (Basic) but never printed, the API key is sent as a bearer token and never printed (not even
when the server echoes it back), and plain http:// to a non-loopback host is warned about once."""

from __future__ import annotations

import base64
import json
import logging
import socket
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rag_assets.lib.models import llm
from rag_assets.lib.models.llm import LLMClient, LLMError, redact, warn_if_insecure
from rag_assets.lib.query.cite import Citation, Context
from rag_assets.lib.query.generate import GenerationError, generate_answer
from rag_assets_tests.helpers import send_json, serving_in_thread

PASSWORD = "pa55-w0rd-XYZ"
API_KEY = "sk-test-0123456789abcdef"


class Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict[str, Any]] = []


class Handler(BaseHTTPRequestHandler):
    """/ok answers; /echo500 and /echojson echo the request's headers back (as a badly behaved
    proxy might); /401 refuses."""

    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append(
            {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
        )
        sent = {"Authorization": self.headers.get("Authorization"), "path": self.path}
        echo = json.dumps({"you sent": sent}).encode()
        if self.path.startswith("/echo500"):
            return self._send(500, echo)
        if self.path.startswith("/echojson"):
            return self._send(200, b"not json: " + echo)
        if self.path.startswith("/401"):
            return self._send(401, b'{"error": "bad key ' + API_KEY.encode() + b'"}')
        reply = {"choices": [{"message": {"role": "assistant", "content": "Cached [1]."}}]}
        self._send(200, json.dumps(reply).encode())

    def _send(self, code: int, payload: bytes) -> None:
        send_json(self, code, payload)


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    with serving_in_thread(srv):
        yield srv


@pytest.fixture
def context() -> Context:
    c = Citation(
        index=1,
        document_id="ch1.md",
        document_name="ch1.md",
        locator_label="Course > Pipelines",
        fragment="#char=0,40",
        url="file:///docs/ch1.md#char=0,40",
        quote="The cached model will be used instead.",
        start=0,
        end=40,
        page=None,
        cosine_distance=0.2,
        rerank_score=None,
    )
    return Context(question="Is the model cached?", prompt="", citations=[c], no_answer=False)


def _with_password(srv: Server, mode: str) -> str:
    return f"http://user:{PASSWORD}@127.0.0.1:{srv.server_address[1]}/{mode}"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_credentials_in_the_url_are_sent_as_basic_auth_never_in_the_path(server, context):
    answer = generate_answer(context, _with_password(server, "ok"), timeout=5)
    assert answer.used == [1]
    req = server.requests[0]
    assert req["path"] == "/ok/v1/chat/completions" and PASSWORD not in req["path"]
    expected = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert req["headers"]["Authorization"] == f"Basic {expected}"


@pytest.mark.parametrize("mode", ["echo500", "echojson", "unreachable"])
def test_no_error_message_carries_a_credential(server, context, mode, caplog):
    url = (
        f"http://user:{PASSWORD}@127.0.0.1:{_closed_port()}/?key={API_KEY}"
        if mode == "unreachable"
        else _with_password(server, mode) + f"?token={API_KEY}"
    )
    caplog.set_level(logging.DEBUG)
    with pytest.raises(GenerationError) as err:
        generate_answer(context, url, timeout=5, api_key=API_KEY)
    text = str(err.value)
    assert "RAG_LLM_URL=http://***@127.0.0.1" in text, text
    assert PASSWORD not in text and API_KEY not in text, text
    assert base64.b64encode(f"user:{PASSWORD}".encode()).decode() not in text
    if mode != "unreachable":
        assert server.requests[-1]["headers"]["Authorization"] == f"Bearer {API_KEY}"
        assert "***" in text.split("RAG_LLM_URL=", 1)[1].split(" ", 1)[1]  # the echo, scrubbed
    assert PASSWORD not in caplog.text and API_KEY not in caplog.text


def test_api_key_is_a_bearer_token_and_a_refusal_does_not_print_it(server, context):
    base = f"http://127.0.0.1:{server.server_address[1]}"
    generate_answer(context, base + "/ok", timeout=5, api_key=API_KEY)
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {API_KEY}"
    assert API_KEY not in json.dumps(server.requests[0]["body"])  # header only, not the body
    with pytest.raises(GenerationError, match=r"HTTP 401: .*bad key \*\*\*") as err:
        generate_answer(context, base + "/401", timeout=5, api_key=API_KEY)
    assert API_KEY not in str(err.value)
    assert API_KEY not in repr(LLMClient(base, api_key=API_KEY).where)


def test_redact_removes_userinfo_and_query_values():
    assert redact(f"https://u:{PASSWORD}@h:8/v1?api_key={API_KEY}&x=1") == (
        "https://***@h:8/v1?api_key=***&x=***"
    )
    assert redact("http://127.0.0.1:8091") == "http://127.0.0.1:8091"


@pytest.mark.parametrize(
    ("url", "warns"),
    [
        ("http://192.0.2.10:8080/v1", True),
        ("http://llm.example.net", True),
        ("https://192.0.2.11:8080", False),
        ("http://127.0.0.1:8091", False),
        ("http://localhost:8091", False),
        ("http://[::1]:8091", False),
    ],
)
def test_plain_http_to_a_non_loopback_host_warns_once(url, warns, monkeypatch):
    monkeypatch.setattr(llm, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LLMClient(url)
        LLMClient(url)  # the same endpoint again: no second warning
        warn_if_insecure(url)
    messages = [str(w.message) for w in caught]
    assert len(messages) == (1 if warns else 0), messages
    if warns:
        assert "plain http://" in messages[0] and "RAG_LLM_URL" in messages[0]


def test_generation_warns_about_plain_http_and_never_shows_the_password(context, monkeypatch):
    monkeypatch.setattr(llm, "_warned", set())
    url = f"http://user:{PASSWORD}@192.0.2.1:9/v1"  # TEST-NET-1: never routed
    with pytest.warns(UserWarning, match="plain http://") as caught, pytest.raises(LLMError) as err:
        generate_answer(context, url, timeout=0.3, api_key=API_KEY)
    for text in [str(err.value), *(str(w.message) for w in caught)]:
        assert PASSWORD not in text and API_KEY not in text and "***@192.0.2.1" in text


def test_a_basic_credential_echoed_back_is_scrubbed(server, context):
    with pytest.raises(GenerationError) as err:
        generate_answer(context, _with_password(server, "echo500"), timeout=5)
    token = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert server.requests[-1]["headers"]["Authorization"] == f"Basic {token}"
    assert token not in str(err.value) and "Basic ***" in str(err.value)
