"""``rag-assets bench``: speed measured side by side in one run, reported as ratios.

The machines are noisy (2 shared cores), so every figure that matters is a ratio of two
things timed in the same process a moment apart, never an absolute threshold.
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings


def run_bench(
    documents: Path, n_queries: int, settings: Settings, questions: Path | None = None
) -> tuple[dict[str, Any], str]:
    from rag_assets.lib.index.embed import Embedder, configured_model
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.ingest.chunk import chunk_documents
    from rag_assets.lib.ingest.chunk import strategy as chunk_strategy
    from rag_assets.lib.ingest.extract import extract_folder
    from rag_assets.lib.query.rerank import load_reranker
    from rag_assets.lib.query.retrieve import Index

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
        from rag_assets.lib.evaluate.questions import load_needle_set

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


SERVE_ENCODERS = ("torch", "onnx", "onnx-int8")
"""Query encoders (``RAG_QUERY_ENCODER``) ``bench --serve`` times side by side, round by round."""


def run_serve_bench(
    settings: Settings,
    n_queries: int = 30,
    questions: Path | None = None,
    encoders: tuple[str, ...] = SERVE_ENCODERS,
    workers: int = 1,
    query_logs: tuple[str, ...] = (),
    observe: tuple[str, ...] = (),
) -> tuple[dict[str, Any], str]:
    """p50/p95 of ``/search`` and ``/ask`` over real HTTP (one ``rag-assets serve`` subprocess
    per query encoder) at 1 and 20 concurrent clients, beside the same calls in-process. The
    encoders take turns round by round with the same queries, so load drifts hit both alike.

    ``query_logs`` (issue 33, ``--query-log on,off``): the configured encoder alone, once per
    ``RAG_QUERY_LOG`` value, side by side: what recording every query costs. The entries the
    bench itself wrote are purged from the index's log afterwards.

    ``observe`` (issue 52, ``--observe on,off``): the configured encoder alone, with metrics and
    tracing on (``RAG_METRICS=on``, spans exported over OTLP/HTTP to a sink the bench runs) and
    off (``RAG_METRICS=off``, no ``OTEL_*`` endpoint), side by side: what observing costs."""
    import os
    import subprocess
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace

    from rag_assets.serve.service import Service

    variants: dict[str, tuple[str, str]] = {e: (e, settings.query_log) for e in encoders}
    if query_logs:  # the variants are the log's states, with the configured encoder
        variants = {f"log-{s}": (settings.query_encoder, s) for s in query_logs}
    if observe:  # issue 52: the variants are metrics + tracing on and off
        variants = {f"observe-{s}": (settings.query_encoder, settings.query_log) for s in observe}
    sink = _OtlpSink() if "on" in observe else None
    encoders = tuple(variants)
    started_ns = time.time_ns()
    services = {
        e: Service.open(replace(settings, query_encoder=enc, query_log=log))
        for e, (enc, log) in variants.items()
    }
    index = services[encoders[0]].index()
    # distinct queries for every timed request (the embedder caches repeated queries), the
    # question set's first, then the first sentences of chunks; every encoder gets the same ones
    pool = _queries(index, n_queries, questions) + _queries(index, 10**6, None)
    queries = list(dict.fromkeys(pool))
    # issue 40: one mix for every phase (in-process, 1 client, 20 clients): in set order the
    # in-process rounds got the short questions and HTTP the longer chunk sentences, whose
    # encoding alone made HTTP look 14 ms slower
    random.Random(0).shuffle(queries)
    cursor = {e: 0 for e in encoders}

    def take(encoder: str, n: int) -> list[str]:
        start = cursor[encoder]
        cursor[encoder] += n
        return [queries[(start + i) % len(queries)] for i in range(n)]

    out: dict[str, Any] = {
        "index": settings.index_uri,
        "table": index.published.table,
        "version": index.published.version,
        "queries": len(queries),
        "distinct_queries": len(queries),
        "encoders": list(encoders),
        "workers": workers,
    }
    names = ("search", "ask")

    def call(service: Service, name: str, q: str) -> None:
        if name == "search":
            service.logged_search(q, "hybrid", 20)  # recorded when the log is on (issue 33)
        else:
            service.ask(q)

    inproc: dict[str, Any] = {e: {} for e in encoders}
    cite_ms: dict[str, list[float]] = {e: [] for e in encoders}  # of each timed in-process ask
    for name in names:
        for e in encoders:
            for q in take(e, 5):
                call(services[e], name, q)
        timed: dict[str, list[float]] = {e: [] for e in encoders}
        for _ in range(SERVE_REQUESTS):  # one request per encoder in turn
            for e in encoders:
                q = take(e, 1)[0]
                t = time.perf_counter()
                call(services[e], name, q)
                timed[e].append((time.perf_counter() - t) * 1000)
                if name == "ask":
                    cite_ms[e].append(services[e].index().timings.stages.get("cite", 0.0))
        for e in encoders:
            inproc[e][name] = _pcts(timed[e])
    for e in encoders:  # the gate + quotes + locators + pinpoint spans inside each ask
        inproc[e]["ask_cite"] = _pcts(cite_ms[e])
    out["in_process"] = inproc
    for service in services.values():
        if service.log is not None:
            service.log.close()
    services.clear()  # the servers below load their own models

    headers = {"Authorization": f"Bearer {settings.api_token}"} if settings.api_token else {}
    procs: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
    try:
        for e in encoders:
            port = _free_port()
            enc, log = variants[e]
            env = dict(
                os.environ,
                RAG_INDEX_URI=settings.index_uri,
                RAG_QUERY_ENCODER=enc,
                RAG_QUERY_LOG=log,
            )
            if e.startswith("observe-"):
                env = _observe_env(env, e.removeprefix("observe-"), sink)
            cmd = [sys.executable, "-m", "rag_assets.cli", "serve", "--port", str(port)]
            cmd += ["--workers", str(workers)] if workers > 1 else []
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            procs[e] = (f"http://127.0.0.1:{port}", proc)
        for url, proc in procs.values():
            _wait_healthy(url, proc)
        http: dict[str, Any] = {e: {} for e in encoders}
        for clients in SERVE_CLIENTS:
            for name in names:
                n = SERVE_REQUESTS + 5 if clients == 1 else clients * SERVE_PER_CLIENT
                for e in encoders:
                    cpu0, t0 = _cpu_s(procs[e][1].pid), time.perf_counter()
                    mine0 = time.process_time()  # the load generator's own CPU (all threads)
                    r = _http_round(
                        procs[e][0], name, take(e, n), clients, headers, ThreadPoolExecutor
                    )
                    wall, cpu = time.perf_counter() - t0, _cpu_s(procs[e][1].pid) - cpu0
                    client = time.process_time() - mine0
                    http[e][f"{name}@{clients}"] = {**r, **_throughput(r["n"], wall, cpu, client)}
        out["http"] = http
        if "observe-on" in procs:  # what the observed service recorded and exported
            out["observed"] = _observed(procs["observe-on"][0], headers)
    finally:
        for _, proc in procs.values():
            proc.terminate()
        for _, proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if sink is not None:
            sink.close()
            out.setdefault("observed", {})["otlp_exports"] = sink.received
    if any(log_enabled_value(log) for _, log in variants.values()):
        out["log_entries_purged"] = _purge_bench_entries(settings.index_uri, started_ns, queries)
    return out, _serve_text(out)


def _observe_env(env: dict[str, str], mode: str, sink: _OtlpSink | None) -> dict[str, str]:
    """``env`` for ``bench --serve --observe``'s server: metrics and traces ``on``, metrics
    alone (``metrics``) or neither (``off``)."""
    out = {k: v for k, v in env.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    out["RAG_METRICS"] = "off" if mode == "off" else "on"
    if mode == "on" and sink is not None:
        out["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.url
    return out


def _observed(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """Requests the observed server counted (``/metrics``: proof that it was on)."""
    import httpx

    text = httpx.get(f"{url}/metrics", headers=headers, timeout=30).text
    counted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rag_requests_total{")
    )
    return {"requests_counted": int(counted)}


class _OtlpSink:
    """An OTLP/HTTP endpoint that takes whatever is exported (``bench --serve --observe``): the
    exporter does its real work; the bench counts the requests and bytes it got."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        sink = self
        self.received = {"requests": 0, "bytes": 0}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                n = len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                sink.received["requests"] += 1
                sink.received["bytes"] += n
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def log_enabled_value(value: str) -> bool:
    return value.strip().lower() not in ("off", "0", "false", "no")


def _purge_bench_entries(index_uri: str, since_ns: int, queries: list[str]) -> int:
    """Remove the query log entries this bench wrote (its own questions, since it started):
    timing traffic is not what users asked."""
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.index.store.querylog import QueryLog

    log = QueryLog(IndexStore(index_uri))
    if not log.exists():
        return 0
    mine = {q.strip() for q in queries}
    ids = [
        e["id"]
        for e in log.entries(f"at_ns >= {int(since_ns)}", columns=["id", "question"])
        if e["question"] in mine
    ]
    return log.purge(ids=ids)[0] if ids else 0


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process and its children (``--workers``) have used so
    far, from ``/proc`` (0 elsewhere)."""
    import os

    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):  # itself, or a child
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _throughput(n: int, wall_s: float, cpu_s: float, client_s: float = 0.0) -> dict[str, Any]:
    """Requests/s of a round beside what the CPU allows: cores / server CPU-seconds per
    request (issue 20: throughput at 20 clients should be within 1.3x of that). The load
    generator runs on the same cores: ``client_s`` (its CPU-seconds over the round) is taken
    off the cores for the second figure, what the CPU left to the server allows."""
    import os

    cores = os.cpu_count() or 1
    per = cpu_s / n if n else 0.0
    allowed = cores / per if per else 0.0
    left = max(0.0, cores - client_s / wall_s) if wall_s else float(cores)
    left_allowed = left / per if per else 0.0
    rps = n / wall_s if wall_s else 0.0
    return {
        "requests_per_s": round(rps, 1),
        "cpu_ms_per_request": round(per * 1000, 2),
        "cpu_allows_per_s": round(allowed, 1),
        "allowed_over_achieved": round(allowed / rps, 2) if rps else None,
        "client_cpu_ms_per_request": round(client_s / n * 1000, 2) if n else 0.0,
        "cpu_left_allows_per_s": round(left_allowed, 1),
        "left_over_achieved": round(left_allowed / rps, 2) if rps else None,
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: Any, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"rag-assets serve exited {proc.returncode}: {err[-500:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"rag-assets serve did not become healthy within {timeout} s")
        time.sleep(0.3)


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
        f"({o['distinct_queries']} distinct queries, none timed twice per encoder while they "
        "last; encoders take turns round by round)",
        f"{'endpoint':10} {'encoder':11} {'where':11} {'clients':>7} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'n':>5} errors {'req/s':>7} {'cpu ms/req':>10} {'cpu allows/s':>12} "
        f"{'client ms/req':>13} {'left allows/s':>13}",
    ]
    for name in ("search", "ask"):
        for e in o["encoders"]:
            ip = o["in_process"][e][name]
            lines.append(
                f"/{name:9} {e:11} {'in-process':11} {1:>7} {ip['p50_ms']:>8} {ip['p95_ms']:>8} "
                f"{ip['n']:>5} -"
            )
        for clients in SERVE_CLIENTS:
            for e in o["encoders"]:
                h = o["http"][e][f"{name}@{clients}"]
                lines.append(
                    f"/{name:9} {e:11} {'HTTP':11} {clients:>7} {h['p50_ms']:>8} "
                    f"{h['p95_ms']:>8} {h['n']:>5} {h['errors']:>6} "
                    f"{h.get('requests_per_s', '-'):>7} {h.get('cpu_ms_per_request', '-'):>10} "
                    f"{h.get('cpu_allows_per_s', '-'):>12} "
                    f"{h.get('client_cpu_ms_per_request', '-'):>13} "
                    f"{h.get('cpu_left_allows_per_s', '-'):>13}"
                )
    if "observed" in o:  # issue 52
        lines.append(f"observe-on: {o['observed']} (metrics counted, traces exported)")
    for e in o["encoders"]:
        c = o["in_process"][e].get("ask_cite")
        if c:
            lines.append(
                f"  of which in each /ask ({e}): cite = gate, quotes, locators and pinpoint spans "
                f"(issue 21): p50 {c['p50_ms']} ms, p95 {c['p95_ms']} ms"
            )
    return "\n".join(lines)


# -- bench encoders: what another query encoder does to rankings ------------------------------
AGREEMENT_DEPTHS = (4, 20)
"""Top-k depths whose overlap ``encoders`` reports (the ask context is 4 deep, search 20)."""


def run_encoder_agreement(
    settings: Settings, questions: Path, encoders: tuple[str, ...] = ("onnx", "onnx-int8")
) -> tuple[dict[str, Any], str]:
    """Every query of a needle set (both phrasings, and the out-of-domain ones) through dense
    and hybrid with torch query vectors and with each ONNX encoder's, on the same published
    table (documents embedded by torch): top-4/top-20 overlap, recall@4, MRR@20, refusals at the
    table's cut, query-vector cosine, and the embedding time of each, side by side."""
    from rag_assets.lib.evaluate.metrics import needle_rank, normalize_ws
    from rag_assets.lib.evaluate.questions import load_needle_set
    from rag_assets.lib.index.embed import Embedder, configured_model
    from rag_assets.lib.index.onnx_encoder import OnnxQueryEncoder
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.query.fusion import parse_fusion
    from rag_assets.lib.query.retrieve import Index

    store = IndexStore(settings.index_uri)
    pub = store.published()
    if pub is None:
        raise FileNotFoundError(f"nothing is published in {settings.index_uri} (--index)")
    spec = configured_model(settings)
    threads = settings.embed_threads or 1
    embedders = {"torch": Embedder(spec, threads=threads)}
    for e in encoders:
        onnx = OnnxQueryEncoder(spec, settings.work_dir, threads, e)
        onnx.ensure(embedders["torch"])
        embedders[e] = Embedder(spec, threads=threads, query_encoder=onnx)
    fusion = parse_fusion(settings.fusion)
    cut = settings.cut_override  # RAG_DISTANCE_CUT, else the table's calibrated cut
    indexes = {
        e: Index(store, pub, emb, distance_cut=cut, fusion=fusion) for e, emb in embedders.items()
    }
    qset = load_needle_set(questions)
    needles = {q.id: q.needle for q in qset.questions}
    items: list[tuple[str, str | None, str]]
    items = [(q.phrasing, q.question_id, q.text) for q in qset.queries()]
    items += [("out_of_domain", None, o.query) for o in qset.out_of_domain]
    cut = indexes["torch"].distance_cut

    embed_ms: dict[str, list[float]] = {e: [] for e in embedders}
    vecs: dict[str, list[Any]] = {e: [] for e in embedders}
    for _, _, text in items:  # embed every query once per encoder, in turn (timed)
        for e, emb in embedders.items():
            t = time.perf_counter()
            vecs[e].append(emb.encode_query(text))
            embed_ms[e].append((time.perf_counter() - t) * 1000)
    runs: dict[tuple[str, str], list[list[Any]]] = {}
    for e, index in indexes.items():
        for retriever in ("dense", "hybrid"):
            runs[(e, retriever)] = [index.search(text, retriever, k=20) for _, _, text in items]

    def rank(hits: list[Any], qid: str | None) -> int | None:
        if qid is None:
            return None
        needle = needles[qid]
        r = needle_rank([h.content for h in hits], needle)
        if r is None:  # whitespace-collapsed match, as the evaluation allows
            r = needle_rank([normalize_ws(h.content) for h in hits], normalize_ws(needle))
        return r

    groups = ("course", "ticket", "out_of_domain")
    out: dict[str, Any] = {
        "index": settings.index_uri,
        "table": pub.table,
        "version": pub.version,
        "questions": str(questions),
        "fusion": settings.fusion,
        "cut": cut,
        "queries": {g: sum(1 for p, _, _ in items if p == g) for g in groups},
        "embed_p50_ms": {e: round(statistics.median(v), 2) for e, v in embed_ms.items()},
        "encoders": {},
    }
    for e in encoders:
        cos = [float(a @ b) for a, b in zip(vecs["torch"], vecs[e], strict=True)]
        res: dict[str, Any] = {
            "query_cosine_min": round(min(cos), 5),
            "query_cosine_mean": round(statistics.fmean(cos), 5),
        }
        for retriever in ("dense", "hybrid"):
            base, other = runs[("torch", retriever)], runs[(e, retriever)]
            per: dict[str, Any] = {}
            for g in groups:
                idx = [i for i, (p, _, _) in enumerate(items) if p == g]
                row: dict[str, Any] = {}
                for k in AGREEMENT_DEPTHS:
                    ov = [
                        len({h.chunk_id for h in base[i][:k]} & {h.chunk_id for h in other[i][:k]})
                        / k
                        for i in idx
                    ]
                    row[f"overlap@{k}"] = round(statistics.fmean(ov), 4)
                    row[f"same_top{k}_order"] = sum(
                        [h.chunk_id for h in base[i][:k]] == [h.chunk_id for h in other[i][:k]]
                        for i in idx
                    )
                row["refusal_agree"] = sum(
                    (base[i][0].cosine_distance >= cut) == (other[i][0].cosine_distance >= cut)
                    for i in idx
                )
                if g != "out_of_domain":
                    for name, hits in (("torch", base), (e, other)):
                        ranks = [rank(hits[i], items[i][1]) for i in idx]
                        row[f"recall@4[{name}]"] = round(
                            sum(1 for r in ranks if r is not None and r <= 4) / len(idx), 4
                        )
                        row[f"mrr@20[{name}]"] = round(
                            statistics.fmean([1 / r if r else 0.0 for r in ranks]), 4
                        )
                per[g] = row
            res[retriever] = per
        out["encoders"][e] = res
    return out, _agreement_text(out)


def _agreement_text(o: dict[str, Any]) -> str:
    lines = [
        f"{o['table']} @ v{o['version']}, {o['questions']} "
        f"({o['queries']['course']} course + {o['queries']['ticket']} ticket + "
        f"{o['queries']['out_of_domain']} out-of-domain), fusion {o['fusion']}, cut {o['cut']}",
        "query embedding p50 ms: " + ", ".join(f"{e} {ms}" for e, ms in o["embed_p50_ms"].items()),
    ]
    for e, res in o["encoders"].items():
        lines.append(
            f"{e} vs torch: query cosine min {res['query_cosine_min']}, "
            f"mean {res['query_cosine_mean']}"
        )
        lines.append(
            "| retriever | phrasing | overlap@4 | overlap@20 | same top-4 | R@4 torch / "
            f"{e} | MRR@20 torch / {e} | refusal agrees |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for retriever in ("dense", "hybrid"):
            for g, row in res[retriever].items():
                n = o["queries"][g]
                r4 = (
                    f"{row['recall@4[torch]']} / {row[f'recall@4[{e}]']}"
                    if g != "out_of_domain"
                    else "–"
                )
                mrr = (
                    f"{row['mrr@20[torch]']} / {row[f'mrr@20[{e}]']}"
                    if g != "out_of_domain"
                    else "–"
                )
                lines.append(
                    f"| {retriever} | {g} | {row['overlap@4']} | {row['overlap@20']} | "
                    f"{row['same_top4_order']}/{n} | {r4} | {mrr} | {row['refusal_agree']}/{n} |"
                )
    return "\n".join(lines)


def run_search_path(
    settings: Settings, questions: Path | None, n: int = 400
) -> tuple[dict[str, Any], str]:
    """Issue 40: where an in-process ``/search`` (``Service.logged_search``, hybrid, k=20) goes,
    stage by stage, over ``n`` distinct queries (shuffled as :func:`run_serve_bench`'s), with
    the citing caches (:func:`~rag_assets.lib.query.cite._stems`, ``_file_uri``) in and out
    of the same process, query by query (who goes first alternates; the uncached side's query
    ends in ``?``, so neither hits the query-vector cache)."""
    from dataclasses import replace

    from rag_assets.lib.query import cite
    from rag_assets.serve.service import Service

    service = Service.open(replace(settings, query_log="off"))
    index = service.index()
    queries = list(dict.fromkeys(_queries(index, 64, questions) + _queries(index, 10**6, None)))
    random.Random(0).shuffle(queries)
    sides = {
        "cached": (cite._stems, cite._file_uri),
        "uncached": (cite._stems.__wrapped__, cite._file_uri.__wrapped__),
    }
    total: dict[str, list[float]] = {k: [] for k in sides}
    stages: dict[str, list[float]] = {}
    try:
        for i, q in enumerate((queries * 2)[: n + 5]):
            for name in list(sides) if i % 2 else list(reversed(sides)):
                cite._stems, cite._file_uri = sides[name]  # type: ignore[assignment]
                t = time.perf_counter()
                idx, _, _ = service.logged_search(q + ("" if name == "cached" else "?"), "hybrid")
                if i < 5:
                    continue
                total[name].append((time.perf_counter() - t) * 1000)
                if name == "cached":
                    for stage, ms in idx.timings.stages.items():
                        stages.setdefault(stage, []).append(ms)
    finally:
        cite._stems, cite._file_uri = sides["cached"]  # type: ignore[assignment]
    out: dict[str, Any] = {
        "index": settings.index_uri,
        "queries": len(total["cached"]),
        "search_ms": {k: _pcts(v) for k, v in total.items()},
        "stages_p50_ms": {k: round(statistics.median(v), 2) for k, v in stages.items()},
    }
    rest = out["search_ms"]["cached"]["p50_ms"] - sum(out["stages_p50_ms"].values())
    out["stages_p50_ms"]["citing, JSON (the rest)"] = round(rest, 2)
    lines = [f"{out['queries']} distinct queries, in-process /search (hybrid, k=20)", ""]
    lines += [f"  {k:28} {v:7.2f} ms p50" for k, v in out["stages_p50_ms"].items()]
    for k, v in out["search_ms"].items():
        lines.append(f"  whole, citing caches {k:7} {v['p50_ms']:7.2f} ms p50, {v['p95_ms']} p95")
    return out, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m rag_assets.bench.speed encoders --index URI --questions DIR [--encoders …]``;
    ``python -m rag_assets.bench.speed path --index URI [--questions DIR]``."""
    import argparse
    import json
    import os

    p = argparse.ArgumentParser(prog="python -m rag_assets.bench.speed")
    sub = p.add_subparsers(dest="what", required=True)
    e = sub.add_parser("encoders", help="rankings with ONNX query vectors vs torch")
    e.add_argument("--index", default=None)
    e.add_argument("--questions", type=Path, required=True)
    e.add_argument("--encoders", default="onnx,onnx-int8")
    e.add_argument("--json", action="store_true")
    pa = sub.add_parser("path", help="where an in-process /search goes, stage by stage")
    pa.add_argument("--index", default=None)
    pa.add_argument("--questions", type=Path, default=None)
    pa.add_argument("--queries", type=int, default=400)
    pa.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    settings = Settings.from_env(os.environ)
    if args.index:
        settings = settings.with_index(args.index)
    if args.what == "path":
        out, text = run_search_path(settings, args.questions, args.queries)
        print(json.dumps(out, indent=2) if args.json else text)
        return 0
    out, text = run_encoder_agreement(
        settings, args.questions, tuple(x.strip() for x in args.encoders.split(",") if x.strip())
    )
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
