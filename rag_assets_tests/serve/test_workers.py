"""``rag-assets serve --workers 2`` (issue 20): two real uvicorn worker processes on one port
share one index read-only, answer concurrent clients alike, and each follows a publish on its own
(no state passes between them, so every request after the publish names the new version); a
group token's verdicts are limited once for both (issue 43)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rag_assets.lib.index.store import IndexStore
from rag_assets_tests.helpers import (
    SAMPLE_DOCS,
    STARTUP_S,
    cli_here,
    free_port,
    stop_process,
    wait_healthy,
)

pytestmark = pytest.mark.slow

QUERY = "how do I roll back to the previous version"
QUERY_IDS: list[str] = []
AUTH: dict[str, str] = {}  # a group token's bearer header (issue 43: the feedback limit)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == str(pid):
            out.append(int(stat.parent.name))
    return out


def _fresh_requests(url: str, n: int) -> list[tuple[int, str, list[str]]]:
    """``n`` /search requests from 10 threads, each on a new connection (so the kernel hands
    them to either worker): status, X-RAG-Version, chunk ids."""

    def one(_: int) -> tuple[int, str, list[str]]:
        r = httpx.get(f"{url}/search", params={"q": QUERY, "k": 5}, headers=AUTH, timeout=60)
        QUERY_IDS.append(r.headers.get("X-RAG-Query-Id", ""))  # issue 33: each one logged
        ids = [h["chunk_id"] for h in r.json()] if r.status_code == 200 else []
        return r.status_code, r.headers.get("X-RAG-Version", ""), ids

    with ThreadPoolExecutor(max_workers=10) as pool:
        return list(pool.map(one, range(n)))


def _verdict(url: str, query_id: str) -> int:
    """One verdict on a new connection (either worker takes it): its status."""
    body = {"query_id": query_id, "verdict": "wrong"}
    return httpx.post(url, json=body, headers=AUTH, timeout=60).status_code


def test_two_workers_share_one_index_and_both_follow_a_publish(tmp_path, real_embedder):
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy

    docs, index = tmp_path / "documents", tmp_path / "index"
    shutil.copytree(SAMPLE_DOCS, docs)
    index_folder(docs, index, strategy("E"), real_embedder)
    env = dict(os.environ) | {
        "RAG_INDEX_URI": str(index),
        "RAG_WORK_DIR": str(tmp_path / "work"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for var in ("RAG_API_TOKEN", "RAG_BASE_URL", "RAG_RERANK_MODEL", "RAG_DISTANCE_CUT"):
        env.pop(var, None)
    env["RAG_FEEDBACK_PER_MINUTE"] = "30"
    made = cli_here(env, "token", "add", "w", "--groups", "g")  # every request carries it
    AUTH["Authorization"] = f"Bearer {made.stdout.strip()}"
    port, log = free_port(), tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "rag_assets.cli", "serve", "--port", str(port), "--workers", "2"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log, STARTUP_S)
        workers = _children(proc.pid)
        assert len([w for w in workers if Path(f"/proc/{w}").exists()]) >= 2, workers
        store = IndexStore(index)
        before = store.published()
        assert before is not None
        first = _fresh_requests(url, 40)
        assert {s for s, _, _ in first} == {200}, log.read_text()[-2000:]
        assert {v for _, v, _ in first} == {str(before.version)}
        assert len({tuple(ids) for _, _, ids in first}) == 1  # every worker ranks alike
        # a publish while both serve: every request afterwards names the new version
        doc = docs / "06-operations-runbook.md"
        doc.write_text(doc.read_text(encoding="utf-8") + "\n## Rollback drill\n\nPractise it.\n")
        index_folder(docs, index, strategy("E"), real_embedder)
        after = store.published()
        assert after is not None and after.version != before.version
        later = _fresh_requests(url, 40)
        assert {s for s, _, _ in later} == {200}, log.read_text()[-2000:]
        assert {v for _, v, _ in later} == {str(after.version)}
        assert all(Path(f"/proc/{w}").exists() for w in workers)  # no worker died on the way
        # issue 43: RAG_FEEDBACK_PER_MINUTE is one bucket for both workers (it was one each)
        with ThreadPoolExecutor(max_workers=10) as pool:
            codes = list(pool.map(_verdict, [f"{url}/feedback"] * 40, QUERY_IDS[:40]))
        assert set(codes) <= {200, 429} and 30 <= codes.count(200) <= 31, codes
    finally:
        stop_process(proc, timeout=30)
    # issue 33: both workers appended to one query log, each entry once, written on shutdown
    from rag_assets.lib.index.store.querylog import QueryLog

    logged = [e["id"] for e in QueryLog(IndexStore(index)).entries()]
    assert len(QUERY_IDS) == 80 and all(QUERY_IDS) and sorted(logged) == sorted(QUERY_IDS)
