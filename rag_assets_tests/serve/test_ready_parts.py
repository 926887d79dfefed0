"""``/ready`` on an object-store index embedded by a model server (issue 52): one real service
on an ``s3://`` index in the S3 emulator (moto, authentication on), its queries embedded by a
real local OpenAI-compatible server. ``/ready`` turns 503 naming the model server when that
server stops and the object store when the store stops answering (its process stopped with
SIGSTOP), 200 again when each comes back, with ``/healthz`` 200 throughout; the model server's
failed requests are counted; with ``RAG_TRACE_QUERIES=on`` a span carries the question.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

from rag_assets_tests.helpers import SAMPLE_DOCS, start_server, stop_process
from rag_assets_tests.model_servers import (
    EmbeddingServer,
    direct_to_local_servers,  # noqa: F401 (autouse)
)
from rag_assets_tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.slow

QUESTION = "how do I roll back a publish"


def _until(url: str, status: int, timeout: float = 30) -> httpx.Response:
    """``/ready`` until it answers ``status``; ``/healthz`` must answer 200 all along."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{url}/ready", timeout=10)
        health = httpx.get(f"{url}/healthz", timeout=5)
        assert health.status_code == 200 and health.json()["ok"] is True
        if r.status_code == status:
            return r
        assert time.monotonic() < deadline, f"/ready stayed {r.status_code}: {r.text}"
        time.sleep(0.3)


def test_ready_follows_the_model_server_and_the_object_store(tmp_path: Path, s3_env):
    from rag_assets.lib.index.endpoint import EndpointConfig, connect
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets_tests.s3_server import PROCESSES

    docs = tmp_path / "documents"
    shutil.copytree(SAMPLE_DOCS, docs, ignore=shutil.ignore_patterns("*.pdf"))
    uri = f"s3://rag/ready-{uuid.uuid4().hex[:8]}"
    emb = EmbeddingServer(model="fake-embed")
    port = emb.httpd.server_address[1]
    with OtlpReceiver() as receiver:
        try:
            index_folder(docs, uri, strategy("E"), connect(EndpointConfig(url=emb.url + "/v1")))
            env = {k: v for k, v in os.environ.items() if not k.startswith(("RAG_", "OTEL_"))}
            env |= {
                "RAG_WORK_DIR": str(tmp_path / "work"),
                "RAG_EMBED_URL": emb.url + "/v1",
                "RAG_EMBED_RETRIES": "0",
                "RAG_EMBED_PROBE_INTERVAL": "0",
                "RAG_TRACE_QUERIES": "on",
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            }
            url, proc = start_server(uri, env, tmp_path / "serve.log")  # type: ignore[arg-type]
            try:
                assert _until(url, 200).json() == {"ready": True}
                assert httpx.get(f"{url}/search", params={"q": QUESTION}).status_code == 200
                # RAG_TRACE_QUERIES=on: the question is in the request's span, nowhere else
                spans = receiver.wait_for(lambda ss: any(s["name"] == "GET /search" for s in ss))
                search = next(s for s in spans if s["name"] == "GET /search")
                assert search["attributes"]["rag.query"] == QUESTION
                scrape = httpx.get(f"{url}/metrics")  # no token anywhere: open, as every route
                assert scrape.status_code == 200 and QUESTION not in scrape.text

                # the model server stops: not ready, naming it; its failures are counted
                emb.close()
                down = _until(url, 503).json()
                assert down["error"].startswith("model server: not answering (connect")
                unseen = {"q": "where are the evaluation reports kept"}  # not a cached vector
                assert httpx.get(f"{url}/search", params=unseen).status_code == 503
                metrics = httpx.get(f"{url}/metrics").text
                assert 'rag_model_server_errors_total{kind="connect",server="embed"}' in metrics
                assert "rag_ready 0.0" in metrics
                emb = EmbeddingServer(model="fake-embed", port=port)  # the same model, back
                _until(url, 200)
                assert httpx.get(f"{url}/search", params=unseen).status_code == 200

                # the object store stops answering: not ready, naming it; back when it resumes
                moto = PROCESSES[s3_env["AWS_ENDPOINT"]]
                os.kill(moto.pid, signal.SIGSTOP)
                try:
                    down = _until(url, 503).json()
                    assert down["error"].startswith("object store: "), down
                    assert "127.0.0.1" not in down["error"] and "s3://" not in down["error"]
                finally:
                    os.kill(moto.pid, signal.SIGCONT)
                assert _until(url, 200).json() == {"ready": True}
            finally:
                stop_process(proc)
        finally:
            emb.close()
