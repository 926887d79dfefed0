"""Model servers measured and walked through (issue 35).

    # the model server, as the index would use it: RAG_EMBED_URL, RAG_EMBED_MODEL, ...
    python -m rag_assets.bench.endpoint throughput --documents DIR [--concurrency 1,2,4] \\
        [--max-docs N] [--local MODEL_DIR|minilm|gguf:PATH] [--json]
    python -m rag_assets.bench.endpoint latency --documents DIR [--questions DIR] [--queries 30]
    # what RAG_RERANK_URL adds, beside the model it serves in this process (issue 40)
    python -m rag_assets.bench.endpoint rerank --documents DIR --model CROSS_ENCODER_DIR
    # the runbook, performed: served model swapped -> stale -> refused -> upgraded -> rollback
    python -m rag_assets.bench.endpoint walkthrough --documents DIR --questions DIR \\
        --gguf nomic-embed-text-v1.5.f16.gguf --work /tmp/swap [--threads 2] [--json]

``throughput``: one index build (extract, chunk, embed, BM25, into a fresh LanceDB directory;
``index_folder``) of the same documents per number of requests in flight
(``RAG_EMBED_CONCURRENCY``), beside the local encoder (``--local``, default the configured
``RAG_EMBEDDING_MODEL`` or the packaged MiniLM) on the same texts: build seconds, seconds spent
in ``encode`` and chunks/s. The server's own parallelism bounds what more requests in flight
can give (llama-cpp-python's server runs one request at a time; ``llama-server --parallel N``,
text-embeddings-inference and vLLM batch concurrent requests).

``--local gguf:PATH`` (issue 40): the server's own GGUF run in this process by llama-cpp-python's
``Llama``, the same tokens, prompts and batches: what the protocol costs, not another model.

``rerank`` (issue 40): :func:`rerank_latency`.

``latency``: what the endpoint adds to ``/search``: the same documents indexed by the server and
by the local model, each opened as the service opens it (``Service``, what ``GET /search``
calls), the same distinct queries (no cache hit) sent to both in turns; p50/p95 of the whole
search and of its query-embedding stage (``Index.timings["embed"]``).

``walkthrough``: starts llama.cpp's server (``python -m llama_cpp.server``, the
``llama-cpp-python[server]`` wheel) with ``--gguf`` under one name; indexes through the Dagster
graph on a persistent instance; queries; swaps the served model under the same name and port
(``--swap``, default CLS instead of mean pooling for nomic-bert); re-probes; reads what is stale
and what the automation sensor would request; queries (refused, one line); indexes again (a new
table behind the evaluation gate); queries; rolls back (refused while the new model is served);
serves the old model again; queries. Each step is timed; one JSON document and a Markdown table.
No GPU is assumed: the server runs on whatever llama.cpp was built for (here the CPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings

DEFAULT_ALIAS = "nomic-embed-text-v1.5"
DEFAULT_SWAP = ("nomic-bert.pooling_type=int:2",)
"""llama.cpp metadata overrides that make "another model under the same name": CLS pooling
instead of nomic's mean pooling (measured cosine to the original ≈ 0.96)."""

ASSETS = [
    "extracted_documents",
    "chunks",
    "chunk_embeddings",
    "retrieval_eval",
    "refusal_threshold",
    "published_index",
]


# -- llama.cpp's server -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_embedding_server(
    gguf: Path,
    *,
    alias: str = DEFAULT_ALIAS,
    overrides: Sequence[str] = (),
    threads: int = 1,
    n_ctx: int = 2048,
    port: int | None = None,
    api_key: str | None = None,
    log: Path | None = None,
    timeout: float = 180,
) -> tuple[str, subprocess.Popen[bytes]]:
    """``python -m llama_cpp.server --embedding true`` with ``gguf`` named ``alias`` on
    127.0.0.1 (``port``, else a free one); returns (base URL …/v1, process) once it lists its
    model. ``overrides``: GGUF metadata overrides (``key=type:value``)."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        raise RuntimeError(
            "needs llama-cpp-python[server]: pip install "
            "../shared/wheels/llama_cpp_python-*.whl[server]"
        )
    if not Path(gguf).is_file():
        raise FileNotFoundError(f"no GGUF at {gguf} (../shared/models/fetch DEST nomic)")
    port = port or free_port()
    cmd = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
        "--model_alias", alias, "--embedding", "true",
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
        "--n_threads", str(threads), "--n_threads_batch", str(threads), "--verbose", "false",
    ]  # fmt: skip
    if overrides:
        cmd += ["--kv_overrides", *overrides]
    if api_key:
        cmd += ["--api_key", api_key]
    out = log.open("ab") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama.cpp server exited with {proc.returncode} (log: {log})")
        try:
            req = urllib.request.Request(url + "/v1/models", headers=headers)
            with urllib.request.urlopen(req, timeout=2):
                return url + "/v1", proc
        except OSError:
            time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"llama.cpp server did not answer within {timeout:g} s")


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- throughput ---------------------------------------------------------------------------------
def _subset(documents: Path, max_docs: int | None, work: Path) -> Path:
    """``documents`` itself, or a copy of its first ``max_docs`` files (sorted by name)."""
    if not max_docs:
        return documents
    dst = work / "documents"
    dst.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in documents.rglob("*") if p.is_file() and not p.name.startswith("."))
    for p in files[:max_docs]:
        target = dst / p.relative_to(documents)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, target)
    return dst


def _timed_build(documents: Path, root: Path, embedder: Any, settings: Settings) -> dict[str, Any]:
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy

    spent = [0.0]
    encode = embedder.encode

    def timed(texts: Any) -> Any:
        t = time.perf_counter()
        try:
            return encode(texts)
        finally:
            spent[0] += time.perf_counter() - t

    embedder.encode = timed
    t0 = time.perf_counter()
    built = index_folder(
        documents, root, strategy(settings.chunk_strategy, settings.chunk_target), embedder,
        publish=False,
    )  # fmt: skip
    build_s = time.perf_counter() - t0
    n = built.sync.embedded
    return {
        "chunks": len(built.chunks),
        "embedded": n,
        "build_s": round(build_s, 2),
        "encode_s": round(spent[0], 2),
        "chunks_per_s": round(n / spent[0], 2) if spent[0] else None,
        "build_chunks_per_s": round(len(built.chunks) / build_s, 2) if build_s else None,
    }


def throughput(
    settings: Settings,
    documents: Path,
    *,
    concurrency: Sequence[int] = (1, 2, 4),
    max_docs: int | None = None,
    local: str | None = None,
) -> tuple[dict[str, Any], str]:
    """Index builds of ``documents`` through the server at each ``concurrency`` and with the
    local encoder (``local``: a model directory, ``minilm``, or None = the configured one)."""
    from rag_assets.lib.index.embed import Embedder, configured_model, resolve_model
    from rag_assets.lib.index.endpoint import EndpointConfig, connect

    config = EndpointConfig.from_settings(settings)
    if config is None:
        raise ValueError("throughput: set RAG_EMBED_URL (and RAG_EMBED_MODEL) to the server")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rag-endpoint-bench-") as tmp:
        docs = _subset(documents, max_docs, Path(tmp))
        for c in concurrency:
            emb = connect(replace(config, concurrency=c), max_age=0)
            r = _timed_build(docs, Path(tmp) / f"index-{c}", emb, settings)
            r.update(
                encoder=f"{emb.spec.model_id} at the server",
                in_flight=c,
                requests=emb.client.requests,
                retries=dict(emb.client.log.retries),
            )
            rows.append(r)
        if local is not None and local.startswith("gguf:"):  # issue 40: the same model, local
            gguf = Path(local[len("gguf:") :]).expanduser()
            rows.append(_local_gguf_build(docs, Path(tmp) / "index-gguf", config, settings, gguf))
        else:
            local_settings = replace(settings, embed_url="")
            spec = (
                resolve_model(None if local in ("", "minilm") else local)
                if local is not None
                else configured_model(local_settings)
            )
            lemb = Embedder(
                spec,
                batch_size=settings.embed_batch_size,
                threads=settings.embed_threads or None,
                device=settings.device,
            )
            lemb.encode(["a warm-up text, not timed"])  # loading is not part of the rate
            r = _timed_build(docs, Path(tmp) / "index-local", lemb, settings)
            r.update(encoder=f"{spec.model_id} (local, {lemb.device})", in_flight=None)
            rows.append(r)
    out = {
        "documents": str(documents),
        "max_docs": max_docs,
        "batch_size": settings.embed_batch_size,
        "server": config.url,
        "rows": rows,
        "at": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    lines = [
        f"{rows[0]['chunks']} chunks of {documents} ({max_docs or 'all'} files), "
        f"batch {settings.embed_batch_size}, each build into a fresh index",
        "",
        "| encoder | in flight | build s | encode s | chunks/s (encode) | requests | retries |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['encoder']} | {r['in_flight'] or '-'} | {r['build_s']} | {r['encode_s']} "
        f"| {r['chunks_per_s']} | {r.get('requests', '-')} | {r.get('retries') or '-'} |"
        for r in rows
    ]
    return out, "\n".join(lines)


def _local_gguf_build(
    docs: Path, root: Path, config: Any, settings: Settings, gguf: Path
) -> dict[str, Any]:
    """The server's model run in this process (llama-cpp-python's ``Llama``, the engine the
    server wraps, ``settings.embed_threads`` threads or 2): the same tokens, pooling, prompts and
    batches as through the server, with no HTTP in between (issue 40: what the protocol costs).
    The embedder is the server's, its requests answered in-process."""
    import numpy as np
    from llama_cpp import Llama

    from rag_assets.lib.index.endpoint import connect

    threads = settings.embed_threads or 2
    llm = Llama(
        model_path=str(gguf),
        embedding=True,
        n_ctx=max(512, settings.embed_window or 0),
        n_batch=max(512, settings.embed_window or 0),
        n_ubatch=max(512, settings.embed_window or 0),
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    emb = connect(replace(config, concurrency=1), max_age=0)  # stamps, prompts, window: probed

    def in_process(texts: Any, model: str, **_: Any) -> Any:
        return np.asarray(llm.embed(list(texts)), dtype=np.float32)  # as the server does

    emb.client.embed = in_process  # type: ignore[method-assign]
    in_process(["a warm-up text, not timed"], emb.served)
    r = _timed_build(docs, root, emb, settings)
    r.update(encoder=f"{gguf.name} (local llama.cpp, {threads} threads)", in_flight=None)
    return r


# -- latency ------------------------------------------------------------------------------------
def _pcts(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    if not s:
        return {"p50": 0.0, "p95": 0.0, "n": 0}
    return {
        "p50": round(statistics.median(s), 2),
        "p95": round(s[min(len(s) - 1, int(round(0.95 * (len(s) - 1))))], 2),
        "n": len(s),
    }


def latency(
    settings: Settings,
    documents: Path,
    *,
    queries: int = 30,
    max_docs: int | None = None,
    questions: Path | None = None,
) -> tuple[dict[str, Any], str]:
    """p50/p95 of ``Service.search`` (hybrid, k=20) and of its embedding stage, with queries
    embedded by the server and by the local query encoder (``RAG_QUERY_ENCODER``), the same
    distinct queries in turns: a question set's (``questions``), else sentences of the
    chunks."""
    from rag_assets.lib.index.endpoint import configured_embedder
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.serve.service import Service

    if not settings.embed_url:
        raise ValueError("latency: set RAG_EMBED_URL (and RAG_EMBED_MODEL) to the server")
    with tempfile.TemporaryDirectory(prefix="rag-endpoint-latency-") as tmp:
        docs = _subset(documents, max_docs, Path(tmp))
        strat = strategy(settings.chunk_strategy, settings.chunk_target)
        sides = {"endpoint": settings, "local": replace(settings, embed_url="")}
        services: dict[str, Service] = {}
        texts: list[str] = []
        for name, s in sides.items():
            s = replace(s, index_uri=str(Path(tmp) / f"index-{name}"), work_dir=str(tmp))
            built = index_folder(docs, s.index_uri, strat, configured_embedder(s))
            texts = texts or [
                sent.strip()[:200]
                for c in built.chunks
                for sent in re.split(r"(?<=[.?!])\s+|\n+", c.content)
            ]
            services[name] = Service.open(s)
        if questions is not None:
            from rag_assets.lib.evaluate.questions import load_needle_set

            qset = load_needle_set(questions)
            texts = [q.text for q in qset.queries()] + [o.query for o in qset.out_of_domain]
        pool = list(dict.fromkeys(t for t in texts if len(t.split()) >= 3))
        warm, timed = pool[:3], pool[3 : 3 + queries]
        total: dict[str, list[float]] = {n: [] for n in services}
        embed: dict[str, list[float]] = {n: [] for n in services}
        for q in warm:
            for svc in services.values():
                svc.search(q, "hybrid", 20)
        for q in timed:
            for name, svc in services.items():
                t = time.perf_counter()
                index, _ = svc.search(q, "hybrid", 20)
                total[name].append((time.perf_counter() - t) * 1000)
                embed[name].append(index.timings.stages.get("embed", 0.0))
        encoders = {n: svc.query_encoder for n, svc in services.items()}
    out: dict[str, Any] = {
        "documents": str(documents),
        "queries": len(timed),
        "encoders": encoders,
        "search_ms": {n: _pcts(v) for n, v in total.items()},
        "embed_ms": {n: _pcts(v) for n, v in embed.items()},
        "at": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    added = out["search_ms"]["endpoint"]["p50"] - out["search_ms"]["local"]["p50"]
    out["added_p50_ms"] = round(added, 2)
    lines = [
        f"{len(timed)} distinct queries, hybrid k=20, in-process Service.search (what /search "
        "calls), the two sides in turns",
        "",
        "| query encoder | search p50 / p95 ms | of which embedding p50 / p95 ms |",
        "|---|---|---|",
    ]
    for n in services:
        s_, e_ = out["search_ms"][n], out["embed_ms"][n]
        lines.append(
            f"| {n} ({encoders[n]}) | {s_['p50']} / {s_['p95']} | {e_['p50']} / {e_['p95']} |"
        )
    lines.append(f"\nthe endpoint adds {added:.1f} ms at p50")
    return out, "\n".join(lines)


def rerank_latency(
    settings: Settings,
    documents: Path,
    *,
    model_dir: str,
    queries: int = 30,
    max_docs: int | None = None,
) -> tuple[dict[str, Any], str]:
    """Issue 40: what a ``/rerank`` server (``RAG_RERANK_URL``) adds to a query, beside the same
    cross-encoder (``model_dir``, the one the server serves) in this process: one index of
    ``documents`` (the local query encoder), opened twice as the service opens it, the same
    distinct queries in turns; p50/p95 of ``Service.search(q, "rerank", 20)`` and of its rerank
    stage (``Index.timings["rerank"]``), and of the plain hybrid search for the floor."""
    from rag_assets.lib.index.endpoint import configured_embedder
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.serve.service import Service

    if not settings.rerank_url:
        raise ValueError("rerank: set RAG_RERANK_URL to the /rerank server")
    with tempfile.TemporaryDirectory(prefix="rag-rerank-latency-") as tmp:
        docs = _subset(documents, max_docs, Path(tmp))
        base = replace(settings, embed_url="", index_uri=str(Path(tmp) / "index"), work_dir=tmp)
        built = index_folder(
            docs, base.index_uri, strategy(base.chunk_strategy, base.chunk_target),
            configured_embedder(base),
        )  # fmt: skip
        sides = {
            "server": base,
            "in-process": replace(base, rerank_url="", rerank_model=model_dir),
        }
        services = {n: Service.open(s) for n, s in sides.items()}
        texts = [
            sent.strip()[:200]
            for c in built.chunks
            for sent in re.split(r"(?<=[.?!])\s+|\n+", c.content)
        ]
        pool = list(dict.fromkeys(t for t in texts if len(t.split()) >= 3))
        warm, timed = pool[:3], pool[3 : 3 + queries]
        total: dict[str, list[float]] = {n: [] for n in services}
        stage: dict[str, list[float]] = {n: [] for n in services}
        for q in warm:
            for svc in services.values():
                svc.search(q, "rerank", 20)
        for i, q in enumerate(timed):  # who goes first alternates (the second hits the cache
            names = list(services) if i % 2 == 0 else list(reversed(services))  # of query vectors)
            for name in names:
                t = time.perf_counter()
                index, _ = services[name].search(q, "rerank", 20)
                total[name].append((time.perf_counter() - t) * 1000)
                stage[name].append(index.timings.stages.get("rerank", 0.0))
    out: dict[str, Any] = {
        "documents": str(documents),
        "model": model_dir,
        "server": settings.rerank_url,
        "queries": len(timed),
        "search_ms": {n: _pcts(v) for n, v in total.items()},
        "rerank_ms": {n: _pcts(v) for n, v in stage.items()},
        "at": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    over = out["rerank_ms"]["server"]["p50"] - out["rerank_ms"]["in-process"]["p50"]
    out["protocol_p50_ms"] = round(over, 2)
    lines = [
        f"{len(timed)} distinct queries, k=20, in-process Service.search, the sides in turns",
        "",
        "| reranker | search p50 / p95 ms | of which rerank p50 / p95 ms |",
        "|---|---|---|",
    ]
    for n in services:
        s_, r_ = out["search_ms"][n], out["rerank_ms"][n]
        lines.append(f"| {n} | {s_['p50']} / {s_['p95']} | {r_['p50']} / {r_['p95']} |")
    lines.append(f"\nthe server adds {over:.1f} ms at p50 over the same model in-process")
    return out, "\n".join(lines)


# -- the walkthrough ----------------------------------------------------------------------------
def _stale(defs: Any, instance: Any) -> list[str]:
    import dagster as dg
    from dagster._core.definitions.data_version import CachingStaleStatusResolver
    from dagster._core.loader import LoadingContextForTest

    resolver = CachingStaleStatusResolver(
        instance, defs.resolve_asset_graph(), LoadingContextForTest(instance)
    )
    return [k for k in ASSETS if resolver.get_status(dg.AssetKey(k)).name != "FRESH"]


def _ask(settings: Settings, query: str) -> dict[str, Any]:
    """What ``rag-assets search`` does: probe the server, open the published table, search;
    the top hit, or the one-line refusal."""
    from rag_assets.lib.index.onnx_encoder import query_embedder
    from rag_assets.lib.query.retrieve import Index

    try:
        embedder, _ = query_embedder(settings)
        index = Index.open(settings.index_uri, embedder=embedder)
        hit = index.search(query, "hybrid", k=1)[0]
    except Exception as e:  # the refusal is the point of some steps
        return {"refused": f"{type(e).__name__}: {' '.join(str(e).split())}"}
    return {
        "answered_from": f"{hit.stamps['table']}@v{hit.stamps['version']}",
        "top": hit.document_id,
        "fingerprint": hit.stamps["revision"],
    }


def walkthrough(
    documents: Path,
    questions: Path,
    gguf: Path,
    work: Path,
    *,
    alias: str = DEFAULT_ALIAS,
    swap: Sequence[str] = DEFAULT_SWAP,
    threads: int = 1,
    window: int = 512,
    query: str = "How do I roll back to the previous embedding model?",
) -> dict[str, Any]:
    """The runbook of docs/operations.md (a served model swapped), performed and timed."""
    import dagster as dg

    from rag_assets.defs.build import build_definitions
    from rag_assets.defs.run import index_instance, materialize_graph
    from rag_assets.lib.index.endpoint import EndpointConfig, connect
    from rag_assets.lib.index.store import IndexStore

    work.mkdir(parents=True, exist_ok=True)
    home = work / "dagster_home"
    home.mkdir(exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    port = free_port()  # the same URL before and after the swap, as a provider's would be
    log = work / "llama-server.log"
    base = Settings.from_env(os.environ)
    s = replace(
        base,
        documents_dir=str(documents),
        eval_dir=str(questions),
        index_uri=str(work / "index"),
        work_dir=str(work / "work"),
        embedding_model="",
        embed_url=f"http://127.0.0.1:{port}/v1",
        embed_model=alias,
        embed_window=window,
    )
    instance = index_instance(s)  # DAGSTER_HOME's, with a dagster.yaml (no telemetry)
    steps: list[dict[str, Any]] = []

    def step(name: str, t0: float, **info: Any) -> None:
        steps.append({"step": name, "s": round(time.perf_counter() - t0, 1), **info})

    def serve(overrides: Sequence[str]) -> subprocess.Popen[bytes]:
        _, proc = start_embedding_server(
            gguf, alias=alias, overrides=overrides, threads=threads, port=port, log=log
        )
        return proc

    t = time.perf_counter()
    proc = serve(())
    step(f"0. serve {gguf.name} as {alias!r}", t, url=s.embed_url)
    try:
        t = time.perf_counter()
        first = materialize_graph(s, progress=False, instance=instance)
        old = IndexStore(s.index_uri).published()
        step(
            "1. index through the graph",
            t,
            success=first.success,
            error=first.error,
            table=old and old.table,
            fingerprint=old and old.stamps.revision,
            checks=[f"{n}: {'passed' if p else 'FAILED'}" for n, p, _ in first.checks],
        )
        if not first.success or old is None:
            return {"steps": steps, "error": first.error}
        t = time.perf_counter()
        step("2. query", t, **_ask(s, query))

        t = time.perf_counter()
        defs1 = build_definitions(s)
        stop_server(proc)
        proc = serve(swap)
        config = EndpointConfig.from_settings(s)
        assert config is not None
        served = connect(config, store=IndexStore(s.index_uri), work_dir=s.work_dir, max_age=0)
        recorded = next((f for f in served.known() if f.id == old.stamps.revision), None)
        cos = served.probe.min_cosine(recorded) if recorded is not None else None
        step(
            f"3. swap the served model under the same name and URL ({', '.join(swap)})",
            t,
            fingerprint_before=old.stamps.revision,
            fingerprint_now=served.spec.revision,
            min_probe_cosine_to_the_table=None if cos is None else round(cos, 4),
        )

        t = time.perf_counter()
        defs2 = build_definitions(s)  # what every `rag-assets index` and a UI reload do
        now = datetime.datetime.now()
        r1 = dg.evaluate_automation_conditions(defs=defs1, instance=instance, evaluation_time=now)
        r2 = dg.evaluate_automation_conditions(
            defs=defs2,
            instance=instance,
            cursor=r1.cursor,
            evaluation_time=now + datetime.timedelta(seconds=30),
        )
        requested = [k for k in ASSETS if r2.get_num_requested(dg.AssetKey(k))]
        step("4. reload: what is stale, what the sensor requests", t,
             stale=_stale(defs2, instance), requested=requested)  # fmt: skip

        t = time.perf_counter()
        step("5. query the old table", t, **_ask(s, query))

        t = time.perf_counter()
        second = materialize_graph(s, progress=False, instance=instance)
        new = IndexStore(s.index_uri).published()
        m = second.metadata.get("chunk_embeddings", {})
        step(
            "6. index again: a new table, evaluated (the gate), published",
            t,
            success=second.success,
            error=second.error,
            table=new and new.table,
            fingerprint=new and new.stamps.revision,
            embedded=m.get("embedded"),
            checks=[f"{n}: {'passed' if p else 'FAILED'}" for n, p, _ in second.checks],
        )
        t = time.perf_counter()
        step("7. query", t, **_ask(s, query))

        t = time.perf_counter()
        back = IndexStore(s.index_uri).rollback()
        step("8. rollback, the new model still served: query", t,
             published=back.table, **_ask(s, query))  # fmt: skip

        t = time.perf_counter()
        stop_server(proc)
        proc = serve(())
        step("9. serve the previous model again: query", t, **_ask(s, query))
    finally:
        stop_server(proc)
    return {
        "documents": str(documents),
        "model": alias,
        "gguf": str(gguf),
        "swap": list(swap),
        "steps": steps,
        "at": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def _table(out: dict[str, Any]) -> str:
    lines = ["| step | s | what happened |", "|---|---|---|"]
    for st in out["steps"]:
        info = {k: v for k, v in st.items() if k not in ("step", "s")}
        lines.append(f"| {st['step']} | {st['s']} | {json.dumps(info, default=str)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag_assets.bench.endpoint")
    sub = ap.add_subparsers(dest="what", required=True)
    tp = sub.add_parser("throughput", help="index builds through the server vs the local model")
    tp.add_argument("--documents", type=Path, required=True)
    tp.add_argument("--concurrency", default="1,2,4", help="requests in flight, comma-separated")
    tp.add_argument("--max-docs", type=int, default=None, help="only the first N files")
    tp.add_argument(
        "--local",
        default=None,
        help="local model directory, 'minilm', or gguf:PATH (the server's model in-process)",
    )
    tp.add_argument("--json", action="store_true")
    la = sub.add_parser("latency", help="what the endpoint adds to /search")
    la.add_argument("--documents", type=Path, required=True)
    la.add_argument("--queries", type=int, default=30)
    la.add_argument("--max-docs", type=int, default=None)
    la.add_argument("--questions", type=Path, default=None, help="a needle-format set's queries")
    la.add_argument("--json", action="store_true")
    rr = sub.add_parser("rerank", help="what a /rerank server adds, beside the model in-process")
    rr.add_argument("--documents", type=Path, required=True)
    rr.add_argument("--model", required=True, help="the cross-encoder directory the server serves")
    rr.add_argument("--queries", type=int, default=30)
    rr.add_argument("--max-docs", type=int, default=None)
    rr.add_argument("--json", action="store_true")
    wt = sub.add_parser("walkthrough", help="served model swapped -> stale -> refused -> ...")
    wt.add_argument("--documents", type=Path, required=True)
    wt.add_argument("--questions", type=Path, required=True)
    wt.add_argument("--gguf", type=Path, required=True)
    wt.add_argument("--work", type=Path, required=True, help="an empty folder for this run")
    wt.add_argument("--alias", default=DEFAULT_ALIAS)
    wt.add_argument("--swap", nargs="+", default=list(DEFAULT_SWAP))
    wt.add_argument("--threads", type=int, default=1)
    wt.add_argument("--window", type=int, default=512)
    wt.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.what == "walkthrough":
        out = walkthrough(
            args.documents,
            args.questions,
            args.gguf,
            args.work,
            alias=args.alias,
            swap=args.swap,
            threads=args.threads,
            window=args.window,
        )
        print(json.dumps(out, indent=1, default=str) if args.json else _table(out))
        return 0 if "error" not in out else 1
    settings = Settings.from_env(os.environ)
    if args.what == "throughput":
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
        res, text = throughput(
            settings, args.documents, concurrency=levels, max_docs=args.max_docs, local=args.local
        )
    elif args.what == "rerank":
        res, text = rerank_latency(
            settings,
            args.documents,
            model_dir=args.model,
            queries=args.queries,
            max_docs=args.max_docs,
        )
    else:
        res, text = latency(
            settings,
            args.documents,
            queries=args.queries,
            max_docs=args.max_docs,
            questions=args.questions,
        )
    print(json.dumps(res, indent=1, default=str) if args.json else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
