"""Real local HTTP servers that speak the model-server protocols (issue 35), for the tests.

- :class:`EmbeddingServer`: OpenAI-compatible ``/v1/models``, ``/v1/embeddings`` and
  llama-cpp-python's ``/extras/tokenize``. Its vectors are deterministic (a hashed bag of words,
  unnormalised like llama.cpp's, so similar texts are near and retrieval works), ``seed`` is
  "the model": another seed under the same name is the silent model swap a fingerprint must
  catch. A script of faults (``fail``) makes it answer 429 with ``Retry-After``, 500, slowly,
  or refuse inputs over ``max_chars`` as llama.cpp's server does; every request is recorded
  with its time and the number in flight.
- :class:`RerankServer`: ``/rerank`` over a real cross-encoder directory (the tests' tiny one,
  :mod:`rag_assets_tests.lib.tiny_cross_encoder`), in the text-embeddings-inference shape
  (``texts`` → ``[{"index", "score"}]``) or the Cohere/Jina/llama.cpp one (``documents`` →
  ``{"results": [{"index", "relevance_score"}]}``), with the same fault script.

Both bind 127.0.0.1 on a free port, serve from daemon threads and stop with ``close()``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from rag_assets_tests.helpers import direct_to_loopback

WORD = re.compile(r"[a-z0-9]+")


@pytest.fixture(autouse=True)
def direct_to_local_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test module that imports it: the servers on 127.0.0.1 reached directly (urllib
    honours proxy variables), and no fingerprint probe cached by an earlier test (a new server
    may reuse an old one's port)."""
    from rag_assets.lib.index import endpoint

    direct_to_loopback(monkeypatch)
    endpoint._probe_cache.clear()


def bag_vector(text: str, seed: int, dims: int) -> np.ndarray:
    """A deterministic unnormalised vector: the sum of one pseudo-random vector per word (and a
    small one for the whole text, so no two texts coincide)."""
    out = np.zeros(dims, dtype=np.float64)
    for w in WORD.findall(text.lower()) or [""]:
        h = int(hashlib.sha256(f"{seed}|{w}".encode()).hexdigest()[:8], 16)
        out += np.random.default_rng(h).standard_normal(dims)
    h = int(hashlib.sha256(f"{seed}|text|{text}".encode()).hexdigest()[:8], 16)
    out += 0.05 * np.random.default_rng(h).standard_normal(dims)
    return out * 7.0  # not unit length, as llama.cpp's Python server returns them


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class _Base:
    """Shared machinery: the fault script, the request log, in-flight counting."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0) -> None:
        self.httpd = _Server(("127.0.0.1", port), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.fail: deque[tuple[str, float]] = (
            deque()
        )  # ("429", retry_after) / ("500", 0) / ("slow", s)
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay = 0.0  # seconds every request takes (to see concurrency)
        self.overlap = 0  # hold each request until this many are in flight (at most 5 s)
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def posts(self, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"] == path]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def owner(self) -> Any:
        return self.server.owner  # type: ignore[attr-defined]

    def _send(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self._leave()  # before the body: the client may send its next request once it has it
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n)) if n else None

    def _fault(self) -> bool:
        """Apply the next scripted fault; True when the request was answered by it."""
        owner = self.owner
        with owner.lock:
            fault = owner.fail.popleft() if owner.fail else None
        if fault is None:
            return False
        kind, value = fault
        if kind == "429":
            self._send(429, {"error": "busy"}, {"Retry-After": f"{value:g}"})
            return True
        if kind == "500":
            self._send(500, {"error": "internal error"})
            return True
        if kind == "slow":
            time.sleep(value)
            return False  # then answers normally (after the client gave up)
        raise AssertionError(kind)

    def _enter(self, body: Any) -> None:
        owner = self.owner
        self._left = False  # one handler serves every request of a kept-alive connection
        with owner.lock:
            owner.in_flight += 1
            owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
            owner.requests.append(
                {
                    "path": self.path,
                    "t": time.monotonic(),
                    "body": body,
                    "auth": self.headers.get("Authorization"),
                }
            )

    def _leave(self) -> None:
        if getattr(self, "_left", True):  # left already (the answer was sent), or never entered
            return
        self._left = True
        with self.owner.lock:
            self.owner.in_flight -= 1


class EmbeddingServer(_Base):
    """An OpenAI-compatible embeddings server with deterministic vectors (see module doc)."""

    def __init__(
        self,
        model: str = "fake-embed",
        dims: int = 64,
        seed: int = 1,
        api_key: str | None = None,
        max_chars: int | None = None,
        port: int = 0,  # issue 52: a server started again where a stopped one was
    ) -> None:
        self.model = model
        self.models: list[str] | None = None  # what /v1/models lists (None: [model])
        self.dims = dims
        self.seed = seed
        self.api_key = api_key
        self.max_chars = max_chars  # longer inputs are refused as llama.cpp's server does
        self.tokenize = True
        super().__init__(_EmbedHandler, port)

    def vector(self, text: str) -> np.ndarray:
        return bag_vector(text, self.seed, self.dims)


class _EmbedHandler(_Handler):
    def _authorised(self) -> bool:
        key = self.owner.api_key
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self._send(401, {"detail": "Invalid API key"})
            return False
        return True

    def do_GET(self) -> None:
        self._enter(None)
        try:
            if not self._authorised():
                return
            if self.path == "/v1/models":
                ids = self.owner.models if self.owner.models is not None else [self.owner.model]
                self._send(200, {"object": "list", "data": [{"id": i} for i in ids]})
            else:
                self._send(404, {"detail": "Not Found"})
        finally:
            self._leave()

    def do_POST(self) -> None:
        body = self._body()
        self._enter(body)
        try:
            if not self._authorised():
                return
            if self.path == "/extras/tokenize" and self.owner.tokenize:
                words = WORD.findall(str(body.get("input", "")).lower())
                self._send(200, {"tokens": [101, *range(1000, 1000 + len(words)), 102]})
                return
            if self.path != "/v1/embeddings":
                self._send(404, {"detail": "Not Found"})
                return
            if self._fault():
                return
            time.sleep(self.owner.delay)
            deadline = time.monotonic() + 5
            while self.owner.in_flight < self.owner.overlap and time.monotonic() < deadline:
                time.sleep(0.01)
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            limit = self.owner.max_chars
            if limit is not None and any(len(t) > limit for t in texts):
                self._send(
                    500,
                    {"error": {"code": 500, "message": "input is too large to process. increase "
                               "the physical batch size", "type": "server_error"}},
                )  # fmt: skip
                return
            data = [
                {"object": "embedding", "index": i, "embedding": self.owner.vector(t).tolist()}
                for i, t in enumerate(texts)
            ]
            self._send(200, {"object": "list", "data": data[::-1], "model": body.get("model")})
        finally:
            self._leave()


class RerankServer(_Base):
    """``/rerank`` over a real CrossEncoder directory (``shape``: ``tei`` or ``cohere``)."""

    def __init__(self, model_dir: str, shape: str = "cohere", api_key: str | None = None) -> None:
        from rag_assets.lib.query.rerank import Reranker

        self.reranker = Reranker(model_dir)
        self.shape = shape
        self.api_key = api_key
        super().__init__(_RerankHandler)


class _RerankHandler(_Handler):
    def do_POST(self) -> None:
        body = self._body()
        self._enter(body)
        try:
            owner = self.owner
            if owner.api_key and self.headers.get("Authorization") != f"Bearer {owner.api_key}":
                self._send(
                    401, {"message": "invalid api token " + str(self.headers.get("Authorization"))}
                )
                return
            if self.path not in ("/rerank", "/v1/rerank"):
                self._send(404, {"detail": "Not Found"})
                return
            if self._fault():
                return
            time.sleep(owner.delay)
            field = "texts" if owner.shape == "tei" else "documents"
            if field not in body:
                self._send(
                    422, {"error": f"Failed to deserialize the JSON body: missing field `{field}`"}
                )
                return
            with owner.lock:  # one torch forward at a time
                scores = owner.reranker.score(body["query"], body[field])
            order = sorted(range(len(scores)), key=lambda i: -scores[i])
            if owner.shape == "tei":
                self._send(200, [{"index": i, "score": scores[i]} for i in order])
            else:
                top = body.get("top_n") or len(order)
                results = [{"index": i, "relevance_score": scores[i]} for i in order[:top]]
                self._send(200, {"results": results, "model": body.get("model")})
        finally:
            self._leave()
