"""One real ``rag-assets serve`` process (uvicorn) on a real sample index, shared by the tests.

The index is built from a private copy of ``data/documents`` with the real embedder; the server
runs with ``RAG_API_TOKEN`` set, so every request here carries the bearer token (the auth test
checks what happens without it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from rag_assets_tests.helpers import (
    SAMPLE_DOCS,
    TOKEN,
    Served,
    start_server,
    stop_process,
)


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
