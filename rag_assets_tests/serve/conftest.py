"""One real ``rag-assets serve`` process (uvicorn) on a real sample index, shared by the tests.

The index is built from a private copy of ``data/documents`` with the real embedder; the server
runs with ``RAG_API_TOKEN`` set, so every request here carries the bearer token (the auth test
checks what happens without it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rag_assets_tests.conftest import SAMPLE_DOCS
from rag_assets_tests.processes import stop_process

TOKEN = "test-token-7f3a"
STARTUP_S = 180  # model load on 2 shared, busy cores


@dataclass
class Served:
    url: str
    token: str
    docs: Path
    index: Path
    work: Path
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.auth, timeout=60)

    def env(self) -> dict[str, str]:
        """Environment for another process on the same index (CLI, MCP over stdio)."""
        env = dict(os.environ)
        env.update(
            RAG_INDEX_URI=str(self.index),
            RAG_WORK_DIR=str(self.work),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )
        for var in ("RAG_BASE_URL", "RAG_LLM_URL", "RAG_RERANK_MODEL", "RAG_DISTANCE_CUT"):
            env.pop(var, None)
        return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.terminate()
    raise RuntimeError(f"server not healthy after {timeout} s: {log.read_text()[-2000:]}")


def start_server(
    index: Path, env: dict[str, str], log: Path
) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    cli = [sys.executable, "-m", "rag_assets.cli"]
    cmd = [*cli, "serve", "--index", str(index), "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log, STARTUP_S)
    return url, proc


@pytest.fixture(scope="session")
def served(tmp_path_factory, real_embedder) -> Iterator[Served]:
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy

    root = tmp_path_factory.mktemp("serve")
    docs = root / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    index_folder(docs, root / "index", strategy("E"), real_embedder)
    s = Served("", TOKEN, docs, root / "index", root / "work", None, root / "serve.log")  # type: ignore[arg-type]
    env = s.env() | {"RAG_API_TOKEN": TOKEN}
    s.url, s.proc = start_server(s.index, env, s.log)
    try:
        yield s
    finally:
        stop_process(s.proc)
