"""``rag-assets bench``: speed measured side by side in one run, reported as ratios.

The machines are noisy (2 shared cores), so every figure that matters is a ratio of two
things timed in the same process a moment apart, never an absolute threshold.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings


def run_bench(
    documents: Path, n_queries: int, settings: Settings, questions: Path | None = None
) -> tuple[dict[str, Any], str]:
    from rag_assets.lib.chunk import chunk_documents
    from rag_assets.lib.chunk import strategy as chunk_strategy
    from rag_assets.lib.embed import Embedder, configured_model
    from rag_assets.lib.extract import extract_folder
    from rag_assets.lib.pipeline import index_folder
    from rag_assets.lib.rerank import load_reranker
    from rag_assets.lib.retrieve import Index
    from rag_assets.lib.store import IndexStore

    strat = chunk_strategy(settings.chunk_strategy, settings.chunk_target)
    embedder = Embedder(
        configured_model(settings),
        batch_size=settings.embed_batch_size,
        threads=settings.embed_threads or None,
    )
    model = embedder.model  # load once, outside every timing
    out: dict[str, Any] = {"documents": str(documents), "strategy": strat.pipeline_version}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "docs"
        shutil.copytree(documents, corpus)
        texts = [c.text for c in chunk_documents(extract_folder(corpus).documents, strat)]
        out["chunks"] = len(texts)

        def plain_encode() -> float:
            t = time.perf_counter()
            model.encode(texts, batch_size=embedder.batch_size, normalize_embeddings=True)
            return time.perf_counter() - t

        # encode / build / encode: the build is compared with the mean of its neighbours
        enc1 = plain_encode()
        t = time.perf_counter()
        built = index_folder(corpus, Path(tmp) / "index", strat, embedder)
        build = time.perf_counter() - t
        enc2 = plain_encode()
        encode = (enc1 + enc2) / 2
        out["full_build_s"] = round(build, 3)
        out["plain_encode_s"] = round(encode, 3)
        out["build_over_encode"] = round(build / encode, 3)
        out["chunks_per_s"] = round(len(texts) / build, 1)
        out["embedded_first_run"] = built.sync.embedded

        t = time.perf_counter()
        again = index_folder(corpus, Path(tmp) / "index", strat, embedder)
        out["unchanged_rerun_s"] = round(time.perf_counter() - t, 3)
        out["embedded_unchanged_rerun"] = again.sync.embedded

        first = sorted(p for p in corpus.rglob("*.md"))[:1]
        if first:
            with first[0].open("a", encoding="utf-8") as f:
                f.write("\n\nA paragraph added by the benchmark to change this document.\n")
            touched = index_folder(corpus, Path(tmp) / "index", strat, embedder)
            out["touched_document"] = first[0].name
            out["touched_document_chunks"] = sum(
                1 for c in touched.chunks if c.document_id == first[0].name
            )
            out["embedded_after_touch"] = touched.sync.embedded
            out["rows_rewritten_after_touch"] = touched.sync.embedded + touched.sync.reused

        index = Index(
            IndexStore(Path(tmp) / "index"),
            IndexStore(Path(tmp) / "index").published() or touched.entry,
            embedder,
            load_reranker(settings.rerank_model or None),
        )
        queries = _queries(index, n_queries, questions)
        stages: dict[str, list[float]] = {}
        for retriever in ["hybrid"] + (["rerank"] if index.reranker else []):
            for q in queries:
                index.search(q, retriever, k=20)
                for stage, ms in index.timings.stages.items():
                    stages.setdefault(f"{retriever}:{stage}", []).append(ms)
        out["query_p50_ms"] = {k: round(statistics.median(v), 2) for k, v in stages.items()}
        out["queries"] = len(queries)
    return out, _text(out)


def _queries(index: Any, n: int, questions: Path | None) -> list[str]:
    """A question set's queries (in-domain and out-of-domain), else the first sentence of
    evenly spaced chunks: realistic lengths, deterministic."""
    if questions is not None:
        from rag_assets.lib.questions import load_needle_set

        qset = load_needle_set(questions)
        return [q.text for q in qset.queries()] + [o.query for o in qset.out_of_domain]
    contents = sorted(index.chunk_contents())
    step = max(1, len(contents) // max(1, n))
    return [c.split(". ")[0][:200] for c in contents[::step][:n]]


def _text(o: dict[str, Any]) -> str:
    lines = [
        f"corpus {o['documents']}: {o['chunks']} chunks ({o['strategy']})",
        f"full build {o['full_build_s']} s = {o['build_over_encode']}x a plain "
        f"SentenceTransformer.encode of the same texts ({o['plain_encode_s']} s, mean of one run "
        f"before and one after); {o['chunks_per_s']} chunks/s",
        f"unchanged re-run: {o['unchanged_rerun_s']} s, embedded {o['embedded_unchanged_rerun']}",
    ]
    if "touched_document" in o:
        lines.append(
            f"one document edited ({o['touched_document']}, {o['touched_document_chunks']} "
            f"chunks): embedded {o['embedded_after_touch']}"
        )
    lines.append(f"query stages, p50 over {o['queries']} queries (ms):")
    lines += [f"  {k:18} {v}" for k, v in o["query_p50_ms"].items()]
    return "\n".join(lines)


# -- bench --serve: the service over real HTTP ------------------------------------------------
SERVE_CLIENTS = (1, 20)
"""Concurrent clients timed by ``bench --serve`` (one assistant; a busy application)."""

SERVE_REQUESTS = 60
"""Requests per endpoint timed in-process and at one client (after 5 warm-up requests)."""

SERVE_PER_CLIENT = 10
"""Requests each of the concurrent clients sends (20 clients: 200 per endpoint)."""


def _pcts(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {
        "p50_ms": round(statistics.median(s), 2),
        "p95_ms": round(s[min(len(s) - 1, int(0.95 * len(s)))], 2),
        "n": len(s),
    }


def run_serve_bench(
    settings: Settings, n_queries: int = 30, questions: Path | None = None
) -> tuple[dict[str, Any], str]:
    """p50/p95 of ``/search`` and ``/ask`` over real HTTP (a ``rag-assets serve`` subprocess)
    at 1 and 20 concurrent clients, beside the same calls in-process."""
    import os
    import socket
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from rag_assets.serve.service import Service

    service = Service.open(settings)
    index = service.index()
    # distinct queries for every timed request (the embedder caches repeated queries), the
    # question set's first, then the first sentences of chunks
    pool = _queries(index, n_queries, questions) + _queries(index, 10**6, None)
    queries = list(dict.fromkeys(pool))
    cursor = [0]

    def take(n: int) -> list[str]:
        start = cursor[0]
        cursor[0] += n
        return [queries[(start + i) % len(queries)] for i in range(n)]

    out: dict[str, Any] = {
        "index": settings.index_uri,
        "table": index.published.table,
        "version": index.published.version,
        "queries": len(queries),
    }
    calls = {
        "search": lambda q: service.search(q, "hybrid", 20),
        "ask": lambda q: service.ask(q),
    }
    inproc: dict[str, Any] = {}
    for name, call in calls.items():
        for q in take(5):
            call(q)
        ms = []
        for q in take(SERVE_REQUESTS):
            t = time.perf_counter()
            call(q)
            ms.append((time.perf_counter() - t) * 1000)
        inproc[name] = _pcts(ms)
    out["in_process"] = inproc
    out["distinct_queries"] = len(queries)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, RAG_INDEX_URI=settings.index_uri)
    headers = {"Authorization": f"Bearer {settings.api_token}"} if settings.api_token else {}
    cmd = [sys.executable, "-m", "rag_assets.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"rag-assets serve exited {proc.returncode}: {err[-500:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("rag-assets serve did not become healthy within 300 s")
            time.sleep(0.3)
        http: dict[str, Any] = {}
        for clients in SERVE_CLIENTS:
            for name in calls:
                n = SERVE_REQUESTS + 5 if clients == 1 else clients * SERVE_PER_CLIENT
                http[f"{name}@{clients}"] = _http_round(
                    url, name, take(n), clients, headers, ThreadPoolExecutor
                )
        out["http"] = http
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out, _serve_text(out)


def _http_round(
    url: str,
    name: str,
    queries: list[str],
    clients: int,
    headers: dict[str, str],
    pool_cls: Any,
) -> dict[str, Any]:
    """``clients`` threads, each with its own keep-alive connection, share the requests."""
    import httpx

    per_client = SERVE_REQUESTS if clients == 1 else SERVE_PER_CLIENT

    def one_client(c: int) -> tuple[list[float], int]:
        ms: list[float] = []
        errors = 0
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            for i in range(per_client + (5 if c == 0 and clients == 1 else 0)):
                q = queries[(c * per_client + i) % len(queries)]
                t = time.perf_counter()
                try:
                    if name == "search":
                        r = http.get("/search", params={"q": q, "retriever": "hybrid", "k": 20})
                    else:
                        r = http.post("/ask", json={"question": q})
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                ms.append((time.perf_counter() - t) * 1000)
                errors += 0 if ok else 1
        return (ms[5:] if c == 0 and clients == 1 else ms), errors

    with pool_cls(max_workers=clients) as pool:
        results = list(pool.map(one_client, range(clients)))
    all_ms = [m for ms, _ in results for m in ms]
    return {**_pcts(all_ms), "errors": sum(e for _, e in results), "clients": clients}


def _serve_text(o: dict[str, Any]) -> str:
    lines = [
        f"served {o['table']} @ v{o['version']} from {o['index']} "
        f"({o['distinct_queries']} distinct queries, none timed twice while they last)",
        f"{'endpoint':10} {'where':14} {'clients':>7} {'p50 ms':>8} {'p95 ms':>8} {'n':>5} errors",
    ]
    for name in ("search", "ask"):
        ip = o["in_process"][name]
        lines.append(
            f"/{name:9} {'in-process':14} {1:>7} {ip['p50_ms']:>8} {ip['p95_ms']:>8} {ip['n']:>5} -"
        )
        for clients in SERVE_CLIENTS:
            h = o["http"][f"{name}@{clients}"]
            lines.append(
                f"/{name:9} {'HTTP':14} {clients:>7} {h['p50_ms']:>8} {h['p95_ms']:>8} "
                f"{h['n']:>5} {h['errors']}"
            )
    return "\n".join(lines)
