"""Tests for marker mapping and OpenAI-compatible generation (rag_assets.lib.query.generate).

The endpoint tests run a real HTTP server on 127.0.0.1 (ephemeral port, daemon thread) that
speaks the chat-completions protocol with scripted replies; every request is bounded by a
client timeout and the server is shut down by the fixture.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_assets.lib.query.cite import PROMPT_INSTRUCTION, Context, build_context
from rag_assets.lib.query.generate import (
    GenerationError,
    chat_endpoint,
    generate_answer,
    map_markers,
)
from rag_assets.lib.types import Hit
from rag_assets_tests.helpers import send_json, serving_in_thread

# ---------------------------------------------------------------- map_markers


def test_valid_single_and_adjacent_markers() -> None:
    a = map_markers("Models are cached [2]. Pipelines hide steps [1][3].", 4)
    assert a.text == "Models are cached [2]. Pipelines hide steps [1][3]."
    assert a.used == [2, 1, 3] and a.invalid_markers == [] and not a.uncited


def test_invalid_markers_removed_and_flagged() -> None:
    a = map_markers("Cached [9]. Extracts [0]. Fine [4]. Again [9].", 4)
    assert a.text == "Cached. Extracts. Fine [4]. Again."
    assert a.invalid_markers == ["[9]", "[0]", "[9]"] and a.used == [4]


def test_grouped_markers_keep_valid_members() -> None:
    a = map_markers("Both say so [1, 2]. Mixed [3,7; 2]. Range [2-4]. Dup [1, 1].", 4)
    assert a.text == "Both say so [1, 2]. Mixed [3, 2]. Range [2, 3, 4]. Dup [1]."
    assert a.used == [1, 2, 3, 4] and a.invalid_markers == ["[7]"]
    bad = map_markers("Backwards [3-1] and wide [1-99].", 4)
    assert bad.text == "Backwards and wide." and bad.invalid_markers == ["[3-1]", "[1-99]"]


def test_missing_markers_is_uncited() -> None:
    a = map_markers("The model is cached after the first download.", 4)
    assert a.uncited and a.used == [] and a.text == a.raw
    only_bad = map_markers("Claim [5].", 4)
    assert only_bad.uncited and only_bad.invalid_markers == ["[5]"] and only_bad.text == "Claim."


def test_model_urls_flagged_and_link_targets_dropped() -> None:
    raw = (
        "See [the docs](https://invented.example/docs) and [2](https://evil.example/x). "
        "Also https://made.up/page."
    )
    a = map_markers(raw, 2)
    assert a.urls == [
        "https://invented.example/docs",
        "https://evil.example/x",
        "https://made.up/page",
    ]
    assert "invented.example" not in a.text and "evil.example" not in a.text
    assert a.text.startswith("See the docs and [2]. ") and a.used == [2]


def test_brackets_in_code_and_indexing_are_not_markers() -> None:
    raw = "Use `x[7]` or a[0] as shown [1].\n```python\nbatch[9]\n```\nDone [8]."
    a = map_markers(raw, 2)
    assert a.text == "Use `x[7]` or a[0] as shown [1].\n```python\nbatch[9]\n```\nDone."
    assert a.used == [1] and a.invalid_markers == ["[8]"]


_WORD = st.sampled_from(["alpha", "beta.", "x", "the", "\n", "a,", "(b)"])
_NUM = st.integers(0, 9)


@given(
    st.lists(
        st.one_of(
            _WORD,
            _NUM.map(lambda n: f"[{n}]"),
            st.lists(_NUM, min_size=1, max_size=3).map(
                lambda ns: "[" + ", ".join(map(str, ns)) + "]"
            ),
        )
    ),
    st.integers(1, 6),
)
def test_map_markers_properties(tokens: list[str], n_sources: int) -> None:
    raw = " ".join(tokens)
    a = map_markers(raw, n_sources)
    left = [int(n) for m in re.findall(r"\[([\d, ]+)\]", a.text) for n in m.split(", ")]
    assert all(1 <= n <= n_sources for n in left)  # no invalid number survives
    assert a.used == list(dict.fromkeys(left))  # used = surviving numbers, first-use order
    numbers = [int(n) for t in tokens if t.startswith("[") for n in t[1:-1].split(", ")]
    assert len(a.invalid_markers) == sum(not 1 <= n <= n_sources for n in numbers)
    assert a.uncited == (not a.used)
    again = map_markers(a.text, n_sources)  # idempotent once cleaned
    assert (again.text, again.used, again.invalid_markers) == (a.text, a.used, [])


# ---------------------------------------------------------------- endpoint

CANON = {
    "ch1.md": "Intro.\nThe cached model will be used instead of downloading it again.\n",
    "ch2.md": "The question-answering pipeline extracts answers from the context.\n",
}


def _hit(doc: str, needle: str, distance: float, rank: int) -> Hit:
    start = CANON[doc].index(needle)
    return Hit(
        chunk_id=f"{doc}:{start}",
        document_id=doc,
        section="Pipelines",
        start=start,
        end=start + len(needle),
        content=needle,
        text=f"[Course > Pipelines]\n{needle}",
        page=None,
        score=1.0,
        rank=rank,
        retriever="rerank",
        cosine_distance=distance,
        title="Course",
    )


@pytest.fixture
def context() -> Context:
    hits = [
        _hit("ch1.md", "The cached model will be used instead of downloading it again.", 0.3, 1),
        _hit("ch2.md", "The question-answering pipeline extracts answers", 0.4, 2),
    ]
    return build_context(
        "Does the pipeline download the model again?",
        hits,
        threshold=0.675,
        canonical_text=CANON.__getitem__,
        base_url="https://docs.example",
    )


SCRIPT = (
    "No, the cached model is reused [1]. The QA pipeline extracts answers [2, 9]. "
    "It never generates text [0]. See [docs](https://invented.example/x)."
)


class ChatServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ChatHandler)
        self.requests: list[dict[str, Any]] = []


class ChatHandler(BaseHTTPRequestHandler):
    """Routes on the first path segment: /ok, /uncited, /500, /garbage, /empty, /slow."""

    server: ChatServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append(
            {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
        )
        mode, _, rest = self.path.lstrip("/").partition("/")
        if rest != "v1/chat/completions":
            return self._send(404, b'{"error": "not found"}')
        if mode == "slow":
            time.sleep(1.5)
        if mode == "500":
            return self._send(500, b'{"error": {"message": "model crashed"}}')
        if mode == "garbage":
            return self._send(200, b"<html>not json")
        if mode == "empty":
            return self._send(200, b'{"choices": []}')
        text = SCRIPT if mode in ("ok", "slow") else "The model is reused."
        reply = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
        }
        self._send(200, json.dumps(reply).encode())

    def _send(self, code: int, payload: bytes) -> None:
        send_json(self, code, payload)


@pytest.fixture
def server() -> Iterator[ChatServer]:
    srv = ChatServer()
    with serving_in_thread(srv):
        yield srv


def _base(srv: ChatServer, mode: str) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/{mode}"


def test_generate_answer_against_real_server(server: ChatServer, context: Context) -> None:
    answer = generate_answer(context, _base(server, "ok"), model="tiny", timeout=5, api_key="k")
    assert len(server.requests) == 1
    req = server.requests[0]
    assert req["path"] == "/ok/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer k"
    body = req["body"]
    assert body["temperature"] == 0 and body["model"] == "tiny" and body["stream"] is False
    system, user = body["messages"]
    assert system == {"role": "system", "content": PROMPT_INSTRUCTION}
    assert user["role"] == "user" and user["content"] == context.user_message
    assert user["content"].startswith(
        "[1] (ch1.md — Course > Pipelines)\n"
        "The cached model will be used instead of downloading it again.\n\n"
        "[2] (ch2.md — Course > Pipelines)\n"
        "The question-answering pipeline extracts answers\n\n"
    )
    assert user["content"].endswith("Question: Does the pipeline download the model again?")
    assert "[Course > Pipelines]" not in user["content"]  # header text never sent

    assert answer.raw == SCRIPT
    assert answer.text == (
        "No, the cached model is reused [1]. The QA pipeline extracts answers [2]. "
        "It never generates text. See docs."
    )
    assert answer.used == [1, 2] and answer.invalid_markers == ["[9]", "[0]"]
    assert not answer.uncited and answer.urls == ["https://invented.example/x"]
    cited = [context.citations[i - 1].url for i in answer.used]  # links come from the server
    assert cited == [
        "https://docs.example/ch1.md#char=7,69",
        "https://docs.example/ch2.md#char=0,48",
    ]


def test_url_with_v1_and_missing_markers(server: ChatServer, context: Context) -> None:
    answer = generate_answer(context, _base(server, "uncited") + "/v1/", timeout=5)
    req = server.requests[0]
    assert req["path"] == "/uncited/v1/chat/completions"
    assert "model" not in req["body"] and "Authorization" not in req["headers"]
    assert answer.uncited and answer.used == [] and answer.text == "The model is reused."


@pytest.mark.parametrize(
    ("mode", "pattern"),
    [
        ("500", r"RAG_LLM_URL=.*HTTP 500.*model crashed"),
        ("garbage", r"RAG_LLM_URL=.*malformed JSON"),
        ("empty", r"RAG_LLM_URL=.*no choices"),
        ("nowhere/x", r"RAG_LLM_URL=.*HTTP 404"),
    ],
)
def test_server_errors_become_generation_error(
    server: ChatServer, context: Context, mode: str, pattern: str
) -> None:
    with pytest.raises(GenerationError, match=pattern):
        generate_answer(context, _base(server, mode), timeout=5)


def test_timeout_becomes_generation_error(server: ChatServer, context: Context) -> None:
    t0 = time.monotonic()
    with pytest.raises(GenerationError, match=r"RAG_LLM_URL=.*did not answer within 0.3 s"):
        generate_answer(context, _base(server, "slow"), timeout=0.3)
    assert time.monotonic() - t0 < 1.4


def test_refused_connection_becomes_generation_error(context: Context) -> None:
    with socket.socket() as s:  # reserve an ephemeral port, then free it: nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(GenerationError, match=r"cannot reach RAG_LLM_URL=http://127\.0\.0\.1"):
        generate_answer(context, f"http://127.0.0.1:{port}", timeout=5)


def test_refused_context_is_never_sent() -> None:
    empty = Context(question="q", prompt="", citations=[], no_answer=True, threshold=0.675)
    with pytest.raises(ValueError, match="no_answer"):
        generate_answer(empty, "http://127.0.0.1:9")


def test_chat_endpoint_forms() -> None:
    want = "http://h:8080/v1/chat/completions"
    for url in ("http://h:8080", "http://h:8080/", "http://h:8080/v1", "http://h:8080/v1/", want):
        assert chat_endpoint(url) == want
    with pytest.raises(GenerationError, match="RAG_LLM_URL"):
        chat_endpoint("  ")
