"""A deterministic OpenAI-compatible chat server on 127.0.0.1 for plumbing tests.

It is a real HTTP server (``http.server`` in a thread); its replies come from a Python function
of the request body, so a test can say exactly what the "model" answers and count requests.
Capabilities are also tested against the real llama.cpp server (``llama_server*`` fixtures).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[str, dict[str, float] | None]  # text, first-token probabilities (or None)


@contextmanager
def fake_llm(
    answer: Callable[[dict[str, Any]], Reply], served: str | None = None
) -> Iterator[tuple[str, list[Any]]]:
    """Serve ``answer(body)`` at ``/v1/chat/completions`` (and, when ``served`` names a model,
    ``GET /v1/models`` listing it); yield (base URL, requests seen)."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if served is None or self.path.rstrip("/") != "/v1/models":
                self.send_error(404)
                return
            data = json.dumps({"object": "list", "data": [{"id": served}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            text, probs = answer(body)
            choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
            if probs is not None and body.get("logprobs"):
                tops = [{"token": t, "logprob": math.log(p)} for t, p in probs.items() if p > 0]
                choice["logprobs"] = {"content": [{"token": text, "top_logprobs": tops}]}
            data = json.dumps({"model": "fake-model", "choices": [choice]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def user_text(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])
