"""A real llama.cpp server on 127.0.0.1 for the tests that need a local model.

The weights come from ``../shared/models/fetch DEST qwen qwen05`` into ``RAG_MODELS_DIR``
(default ``~/.cache/rag-assets/models``); the runtime is the ``llama-cpp-python[server]`` wheel in
``../shared/wheels`` (``.ci/run`` installs it where present). Either missing: the test is skipped
with the reason. One server per model per test session.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_assets_tests.helpers import free_port, stop_process

MODELS_DIR = Path(os.environ.get("RAG_MODELS_DIR", "~/.cache/rag-assets/models")).expanduser()
QWEN_15B = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_05B = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
MPNET = "all-mpnet-base-v2"
GEMMA = "embeddinggemma-300m"


def model_file(name: str) -> Path:
    """The fetched model ``name`` under RAG_MODELS_DIR, or skip the test saying how to get it."""
    path = MODELS_DIR / name
    if not path.exists():
        pytest.skip(
            f"needs {path} (run ../shared/models/fetch {MODELS_DIR} ... or set RAG_MODELS_DIR)"
        )
    return path


def start_llama_server(
    model: Path, n_ctx: int = 4096, threads: int = 2
) -> tuple[str, subprocess.Popen]:
    """Start ``python -m llama_cpp.server`` on a free loopback port; return (base URL, process)."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip(
            "needs llama-cpp-python[server] (pip install "
            "../shared/wheels/llama_cpp_python-*.whl[server])"
        )
    port = free_port()
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads),
        "--logits_all", "true", "--verbose", "false",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            pytest.fail(f"llama.cpp server exited with {proc.returncode}: {err}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                return url, proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    pytest.fail("llama.cpp server did not answer within 120 s")


def _serve(name: str) -> Iterator[str]:
    url, proc = start_llama_server(model_file(name))
    try:
        yield url
    finally:
        stop_process(proc, timeout=10)


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    """Base URL of a real llama.cpp server with Qwen2.5-Coder 1.5B Instruct (the judge)."""
    yield from _serve(QWEN_15B)


@pytest.fixture(scope="session")
def llama_server_small() -> Iterator[str]:
    """Base URL of a real llama.cpp server with Qwen2.5-Coder 0.5B Instruct (the writer)."""
    yield from _serve(QWEN_05B)
