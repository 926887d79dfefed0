"""``rag-assets serve`` with model servers (issue 35): a real service process whose queries are
embedded by a real local OpenAI-compatible server and reranked by a real local ``/rerank``
server over the tests' tiny cross-encoder. A failing reranker degrades each answer to the
hybrid order with a note (``X-RAG-Note``, ``notes``) and a counter (``/healthz``); the service
re-probes the embedding server every ``RAG_EMBED_PROBE_INTERVAL`` seconds and, once the served
model is another, refuses queries with one line (503) until the old model is back."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rag_assets.lib.index.endpoint import EndpointConfig, connect
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.ingest.chunk import strategy
from rag_assets_tests.helpers import SAMPLE_DOCS, start_server, stop_process
from rag_assets_tests.model_servers import (
    EmbeddingServer,
    RerankServer,
    direct_to_local_servers,  # noqa: F401 (autouse)
)

EMBED_KEY = "sk-embed-serve-0123456789"
TOKEN = "svc-token-35"


def _until(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_the_service_degrades_reranking_and_refuses_a_changed_model(
    tmp_path: Path, tiny_cross_encoder: Path, monkeypatch: pytest.MonkeyPatch
):
    with (
        EmbeddingServer(model="nomic-embed-text-v1.5", api_key=EMBED_KEY) as emb,
        RerankServer(str(tiny_cross_encoder), shape="tei") as rr,
    ):
        config = EndpointConfig(url=emb.url + "/v1", api_key=EMBED_KEY)
        index = tmp_path / "index"
        built = index_folder(SAMPLE_DOCS, index, strategy("E"), connect(config))
        table_fp = built.entry.stamps.revision
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")} | {
            "RAG_INDEX_URI": str(index),
            "RAG_WORK_DIR": str(tmp_path / "work"),
            "RAG_API_TOKEN": TOKEN,
            "RAG_EMBED_URL": emb.url + "/v1",
            "RAG_EMBED_API_KEY": EMBED_KEY,
            "RAG_EMBED_PROBE_INTERVAL": "0.5",
            "RAG_RERANK_URL": rr.url,
            "RAG_RERANK_TIMEOUT": "20",
            "no_proxy": "127.0.0.1,localhost",
        }
        log = tmp_path / "serve.log"
        url, proc = start_server(index, env, log)
        try:
            c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
            health = c.get("/healthz").json()
            assert health["query_encoder"] == "endpoint"
            assert health["embedding_endpoint"]["fingerprint"] == table_fp
            assert health["rerank"]["fallbacks"] == 0

            # the reranker scores ...
            r = c.get("/search", params={"q": "roll back the model", "retriever": "rerank"})
            assert r.status_code == 200 and "x-rag-note" not in r.headers
            hits = r.json()
            assert hits[0]["retriever"] == "rerank" and hits[0]["rerank_score"] is not None
            # ... and when it fails, the answer keeps the hybrid order, saying so
            rr.fail.extend([("500", 0)] * 2)
            r = c.get("/search", params={"q": "roll back the model", "retriever": "rerank"})
            assert r.status_code == 200 and "HTTP 500" in r.headers["x-rag-note"]
            assert {h["retriever"] for h in r.json()} == {"hybrid"}
            assert all(h["rerank_score"] is None for h in r.json())
            rr.fail.extend([("500", 0)] * 2)
            ask = c.post("/ask", json={"question": "How do I roll back the model?"})
            assert ask.status_code == 200 and "rerank skipped" in ask.json()["notes"][0]
            health = c.get("/healthz").json()
            assert health["rerank"]["fallbacks"] == 2 and health["rerank"]["requests"] >= 5
            # /healthz needs no token: counters only, no server URL, no server error text
            shown = json.dumps(health)
            assert rr.url not in shown and emb.url not in shown and "HTTP 500" not in shown
            # issue 43: a NaN or Infinity score is a failed rerank (was a 500 on both routes)
            real = rr.reranker.score
            for bad in (float("nan"), float("inf")):
                rr.reranker.score = lambda q, ps, bad=bad: [bad, *real(q, ps)[1:]]
                r = c.get("/search", params={"q": "roll back the model", "retriever": "rerank"})
                assert r.status_code == 200, r.text
                assert "non-finite score" in r.headers["x-rag-note"]
                assert {h["retriever"] for h in r.json()} == {"hybrid"}
                ask = c.post("/ask", json={"question": "How do I roll back the model?"})
                assert ask.status_code == 200, ask.text
                assert "non-finite score" in ask.json()["notes"][0]
            rr.reranker.score = real

            # the provider swaps the model: the periodic probe sees it, queries are refused
            emb.seed = 2
            _until(
                lambda: c.get("/healthz").json()["embedding_endpoint"]["fingerprint_changes"],
                "the re-probe to see the new model",
            )
            r = c.get("/search", params={"q": "roll back the model"})
            assert r.status_code == 503
            err = r.json()["error"]
            assert f"fingerprint {table_fp}" in err and "refused rather than mixed" in err
            assert c.post("/ask", json={"question": "roll back?"}).status_code == 503
            # the old model back: answers again
            emb.seed = 1
            _until(
                lambda: c.get("/search", params={"q": "roll back"}).status_code == 200,
                "the re-probe to see the old model",
            )
            shown = json.dumps(c.get("/healthz").json()) + log.read_text(errors="replace")
            assert EMBED_KEY not in shown and "Traceback" not in shown
        finally:
            stop_process(proc)
