"""``rag-assets bench --scale N``: the index at 100 k / 1 M synthetic chunks (issues 13, 23, 34).

Per size: a published index of synthetic chunks (:func:`synthetic_chunks`, the product's chunk
schema with its metadata columns, a documents table of :data:`SCALE_CHUNKS_PER_DOC` chunks per
document, the pointer), the query side's dense search (exact below ``ANN_MIN_ROWS``, the IVF-SQ
index above) with recall@10 against a numpy brute force, the lexical index the product builds at
that size (bm25s, or LanceDB's native one from ``NATIVE_FTS_MIN_ROWS``), and the harness's peak
memory.

Issue 34: then a **separate serving process** (:func:`serving_child`, ``python -m
rag_assets.bench.scale --serve-child``) opens the published version with the product's
:class:`~rag_assets.lib.query.retrieve.Index` (non-resident from ``RESIDENT_MAX_ROWS``), and runs
the queries unfiltered and under two metadata filters, one matching 1 % of the documents and
one 50 % (:data:`SCALE_FILTERS`): recall@10 of the filtered dense search against the exact
filtered answer (the harness's numpy brute force over the matching rows only), p50/p95, the hits
returned (k whenever k rows match), the filtered BM25's hits and p50, and the serving process's
own peak memory, apart from the harness's vectors and oracle.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rag_assets.bench.speed import _pcts
from rag_assets.settings import Settings

SCALE_QUERIES = 100
"""Queries timed per size by ``bench --scale`` (after 5 warm-up queries)."""

SCALE_EXACT_QUERIES = 20
"""Of those, how many also time LanceDB's exact scan (seconds each at 1 M rows); recall@10 is
against a numpy brute force over all vectors, checked to agree with the scan on these."""

SCALE_WORDS_PER_CHUNK = 60  # about a 300-token chunk's distinct words
SCALE_ROWS_PER_TOPIC = 100  # synthetic "documents": vectors and words shared by 100 chunks
SCALE_NOISE = 0.8  # spread of a chunk's vector around its topic's (cosine to it ~0.78)
SCALE_WRITE_BATCH = 50_000  # rows per LanceDB commit while filling the table
SCALE_CHUNKS_PER_DOC = 10  # synthetic documents of 10 chunks (100 k documents at 1 M rows)
SCALE_FILTERS = {"1%": "sel=p1", "10%": "sel=p10", "50%": "sel=p50"}
"""The filters the serving child times: ``sel=p1`` on every 100th document (1 % of the rows),
``sel=p10`` on every 10th, ``sel=p50`` on every other one (50 %); documents, not topics, so a
filter is independent of where a vector lies."""
SCALE_TOKEN = ("token10%", "g10")
"""Issue 40: a group token that sees 10 % of the documents (those with ``doc % 10 == 3``, access
``g10``; the others are ``staff``'s), timed as the service scopes such a token."""
SCALE_TABLE = "chunks_scale"
SERVE_CHILD_TIMEOUT_S = 3600


def synthetic_chunks(
    n: int, dims: int, total: int, start: int = 0, seed: int = 0
) -> tuple[list[str], list[str], Any]:
    """Chunks ``start`` to ``start + n`` of a synthetic corpus of ``total``: ids, texts and unit
    vectors (float32, ``(n, dims)``), deterministic; chunks past ``total`` make queries.

    Real embeddings are clustered, uniformly random ones are not (and make any IVF index look
    worse than it is): each chunk belongs to a topic of :data:`SCALE_ROWS_PER_TOPIC` chunks, its
    vector is the topic's plus Gaussian noise, and a third of its words are the topic's."""
    import numpy as np

    topics = max(1, total // SCALE_ROWS_PER_TOPIC)
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((topics, dims)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    vocab = _vocabulary(30_000, seed)
    topic_words = rng.integers(0, len(vocab), size=(topics, 20))
    rng = np.random.default_rng(seed + 1 + start)
    topic = rng.integers(0, topics, size=n)
    vecs = centers[topic] + rng.standard_normal((n, dims)).astype(np.float32) * (
        SCALE_NOISE / np.sqrt(dims)
    )
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    w = SCALE_WORDS_PER_CHUNK
    common = np.minimum(rng.zipf(1.3, size=(n, w - w // 3)) - 1, len(vocab) - 1)
    own = topic_words[topic][:, rng.integers(0, 20, size=w // 3)]
    words = np.concatenate([own, common], axis=1)
    texts = [" ".join(vocab[j] for j in row) for row in words.tolist()]
    ids = [f"syn{start + i:08d}" for i in range(n)]
    return ids, texts, vecs


@functools.lru_cache(maxsize=4)
def _vocabulary(n: int, seed: int) -> list[str]:
    """``n`` distinct pronounceable pseudo-words (two to four syllables), in a fixed order."""
    import numpy as np

    syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    rng = np.random.default_rng(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        lengths = rng.integers(2, 5, size=n)
        picks = rng.integers(0, len(syllables), size=(n, 4)).tolist()
        for k, row in zip(lengths.tolist(), picks, strict=True):
            out.setdefault("".join(syllables[i] for i in row[:k]))
    return list(out)[:n]


def _selected(doc: int) -> list[str]:
    """The ``sel`` values of synthetic document ``doc`` (see :data:`SCALE_FILTERS`)."""
    return ["p1"] * (doc % 100 == 0) + ["p10"] * (doc % 10 == 0) + ["p50"] * (doc % 2 == 0)


def _access(doc: int) -> list[str]:
    """The access groups of synthetic document ``doc`` (see :data:`SCALE_TOKEN`)."""
    return [SCALE_TOKEN[1]] if doc % 10 == 3 else ["staff"]


def _bench_stamps(dims: int) -> Any:
    from rag_assets.lib.index.versioning import Stamps

    return Stamps("bench/synthetic", "synthetic-1", dims, True, "bench-scale", "bench")


def _batch_table(
    ids: list[str], texts: list[str], vecs: Any, start: int, dims: int, stamps: Any
) -> Any:
    """Rows of the product's chunk schema (metadata columns included) for one batch."""
    import pyarrow as pa

    from rag_assets.lib.index.store import chunk_schema

    n = len(ids)
    docs = [(start + i) // SCALE_CHUNKS_PER_DOC for i in range(n)]
    names = [f"doc{d:07d}.md" for d in docs]
    sel = [_selected(d) for d in docs]
    meta = [
        [f"document={name}", "format=markdown", *(f"sel={v}" for v in vs)]
        for name, vs in zip(names, sel, strict=True)
    ]
    cols: dict[str, Any] = {
        "chunk_id": ids,
        "document_id": names,
        "document_title": names,
        "document_kind": ["markdown"] * n,
        "content_hash": [hashlib.sha256(t.encode()).hexdigest() for t in texts],
        "text": texts,
        "content": texts,
        "section": [""] * n,
        "from": [0] * n,
        "to": [len(t) for t in texts],
        "page": [None] * n,
        "model": [stamps.model] * n,
        "model_revision": [stamps.revision] * n,
        "dims": [dims] * n,
        "normalized": [True] * n,
        "pipeline_version": [stamps.pipeline] * n,
        "extractor_version": [stamps.extractor] * n,
        "vector": pa.FixedSizeListArray.from_arrays(
            pa.array(vecs.reshape(-1), type=pa.float32()), dims
        ),
        "meta": meta,
        "access": [_access(d) for d in docs],
        "size": [len(t) for t in texts],
        "modified": ["2025-01-01T00:00:00Z"] * n,
        "meta_hash": [""] * n,
    }
    return pa.table(cols, schema=chunk_schema(stamps))


def _document_rows(ids: list[str], texts: list[str], start: int) -> list[dict[str, Any]]:
    """One documents-table row per synthetic document of a batch (its chunks' texts joined)."""

    by_doc: dict[int, list[str]] = {}
    for i, t in enumerate(texts):
        by_doc.setdefault((start + i) // SCALE_CHUNKS_PER_DOC, []).append(t)
    rows = []
    for d, parts in by_doc.items():
        name = f"doc{d:07d}.md"
        md = {"document": [name], "folder": [], "format": ["markdown"], "sel": _selected(d)}
        rows.append(
            {
                "document_id": name,
                "path": f"/synthetic/{name}",
                "kind": "markdown",
                "title": name,
                "extractor": "bench",
                "extractor_version": "bench",
                "source_hash": "",
                "text_hash": "",
                "text": "\n\n".join(parts),
                "page_starts": [],
                "headings_json": "[]",
                "locators_json": "[]",
                "metadata_json": json.dumps(md),
                "access": _access(d),
                "meta_hash": "",
            }
        )
    return rows


def _truths(matrix: Any, q_vecs: Any, ids: list[str]) -> tuple[list[set[str]], dict[str, Any]]:
    """The exact top 10 ids of each query over every row, and (issue 34) over the rows each of
    :data:`SCALE_FILTERS` matches: one similarity pass per query, the filters as masks (no copy
    of the matrix)."""
    import numpy as np

    docs = np.arange(len(ids)) // SCALE_CHUNKS_PER_DOC
    masks = {
        "1%": docs % 100 == 0,
        "10%": docs % 10 == 0,
        "50%": docs % 2 == 0,
        SCALE_TOKEN[0]: docs % 10 == 3,
    }
    truth: list[set[str]] = []
    filtered: dict[str, list[list[str]]] = {label: [] for label in masks}
    for q in q_vecs:
        sims = matrix @ q
        truth.append({ids[j] for j in np.argpartition(-sims, 10)[:10]})
        for label, mask in masks.items():
            masked = np.where(mask, sims, -np.inf)
            k = min(10, int(mask.sum()))
            best = np.argpartition(-masked, k - 1)[:k] if k else np.zeros(0, dtype=np.int64)
            filtered[label].append([ids[j] for j in best.tolist()])
    return truth, filtered


def _peak_mb() -> float:
    """This process's peak resident memory (MB): ``VmHWM`` (its own address space's high-water
    mark: a child started by a large harness does not inherit the harness's figure, as
    ``ru_maxrss`` does across fork and exec on Linux), else ``ru_maxrss``."""
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def run_scale_bench(
    sizes: list[int], settings: Settings, n_queries: int = SCALE_QUERIES
) -> tuple[dict[str, Any], str]:
    """Per size: a LanceDB table of synthetic chunks, the query side's dense search (exact
    below ``ANN_MIN_ROWS``, the IVF-SQ index above), recall@10 against exact search, BM25
    build/size/query, and the process's peak memory so far (sizes run smallest first)."""
    import numpy as np
    import pyarrow as pa

    from rag_assets.lib.index import lexical
    from rag_assets.lib.index.ann import (
        ANN_MIN_ROWS,
        dense_search,
        ensure_vector_index,
        nprobes_for,
        search_mode,
    )
    from rag_assets.lib.index.embed import configured_model
    from rag_assets.lib.index.lexical import BM25Index, NativeFTS
    from rag_assets.lib.index.metadata import ensure_filter_indexes
    from rag_assets.lib.index.store import (
        DOCUMENT_SCHEMA,
        IndexStore,
        Published,
        chunk_schema,
        now_iso,
    )

    dims = configured_model(settings).dims
    rows_out: list[dict[str, Any]] = []
    for n in sorted(set(sizes)):
        if n < 100:
            raise ValueError(f"--scale {n}: give at least 100 chunks")
        t0 = time.perf_counter()

        def log(what: str, n: int = n, t0: float = t0) -> None:  # progress on stderr
            print(f"[scale {n}] {what} at {time.perf_counter() - t0:.0f} s", file=sys.stderr)

        with tempfile.TemporaryDirectory(prefix="rag-scale-") as tmp:
            store = IndexStore(tmp)
            stamps = _bench_stamps(dims)
            tbl = store.db.create_table(SCALE_TABLE, schema=chunk_schema(stamps))
            docs_tbl = store.documents_table()
            native = n >= lexical.NATIVE_FTS_MIN_ROWS  # the product's lexical index at n rows
            texts: list[str] = []  # bm25s needs them in memory; the native index reads the table
            ids: list[str] = []
            parts = []
            t = time.perf_counter()
            for start in range(0, n, SCALE_WRITE_BATCH):
                b_ids, b_texts, b_vecs = synthetic_chunks(
                    min(SCALE_WRITE_BATCH, n - start), dims, n, start=start
                )
                tbl.add(_batch_table(b_ids, b_texts, b_vecs, start, dims, stamps))
                docs_tbl.add(
                    pa.Table.from_pylist(
                        _document_rows(b_ids, b_texts, start), schema=DOCUMENT_SCHEMA
                    )
                )
                ids += b_ids
                texts += [] if native else b_texts
                parts.append(b_vecs)
            matrix = np.concatenate(parts)
            del parts
            write_s = time.perf_counter() - t
            log("table written")
            q_ids, q_texts, q_vecs = synthetic_chunks(n_queries + 5, dims, n, start=n)
            q_texts = [" ".join(x.split()[:6]) for x in q_texts]  # query-length texts
            truth, filtered_truth = _truths(matrix, q_vecs[5:], ids)  # issue 34: filtered too
            del matrix
            exact_ms, agree = [], []
            for i, q in enumerate(q_vecs[: 5 + SCALE_EXACT_QUERIES]):
                t = time.perf_counter()
                hits = dense_search(tbl, q, 10, ann=False)
                if i >= 5:
                    exact_ms.append((time.perf_counter() - t) * 1000)
                    agree.append(len({c for c, _ in hits} & truth[i - 5]) / 10)
            log("exact search timed")
            t = time.perf_counter()
            built = ensure_vector_index(tbl)
            log("vector index built")
            build_s = time.perf_counter() - t
            ensure_filter_indexes(tbl)  # issue 34: LabelList on meta and access (50 k rows up)
            ann, partitions = search_mode(tbl, n)
            ms, recall = [], []
            for i, q in enumerate(q_vecs):
                t = time.perf_counter()
                hits = dense_search(tbl, q, 10, ann=ann, partitions=partitions)
                if i >= 5:
                    ms.append((time.perf_counter() - t) * 1000)
                    recall.append(len({c for c, _ in hits} & truth[i - 5]) / 10)
            log("index search timed")
            t = time.perf_counter()
            bm25: BM25Index | NativeFTS
            if native:  # as embed_chunks does at this size: LanceDB's index, a table version
                lexical.ensure_fts_index(tbl)
                bm25 = NativeFTS(tbl)
                log("native full-text index built")
                bm25_build_s = time.perf_counter() - t
                idx = lexical.fts_index(tbl)
                uuid = idx.index_uuid if idx else ""
                bm25_mb = _index_mb(Path(tmp) / f"{SCALE_TABLE}.lance", uuid)
            else:
                bm25 = BM25Index.build(ids, texts)
                log("bm25 built")
                bm25_build_s = time.perf_counter() - t
                version = int(tbl.version)  # the version the pointer will name
                bm25.stamps = {**stamps.as_dict(), "table": SCALE_TABLE, "version": version}
                store.save_bm25(bm25, SCALE_TABLE, version)
                folder = Path(store.bm25_location(SCALE_TABLE, version))
                bm25_mb = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
            bm25_ms = []
            for i, qt in enumerate(q_texts):
                t = time.perf_counter()
                bm25.search(qt, 50)
                if i >= 5:
                    bm25_ms.append((time.perf_counter() - t) * 1000)
            del bm25, texts, ids
            store.publish(  # what a service follows: the table version, its documents
                Published(
                    table=SCALE_TABLE,
                    version=int(tbl.version),
                    documents_version=int(docs_tbl.version),
                    stamps=stamps,
                    threshold=None,
                    threshold_policy=None,
                    rows=n,
                    published_at=now_iso(),
                )
            )
            served = _serve_in_child(tmp, q_texts, q_vecs, filtered_truth, truth, log)
            exact = _pcts(exact_ms)
            got = _pcts(ms)
            rows_out.append(
                {
                    "chunks": n,
                    "index_type": (built or {}).get("index_type", "exact") if ann else "exact",
                    "build_s": round(build_s, 2),
                    "p50_ms": got["p50_ms"],
                    "p95_ms": got["p95_ms"],
                    "recall@10": round(float(np.mean(recall)), 4),
                    "lexical": "native" if native else "bm25s",
                    "bm25_p50_ms": _pcts(bm25_ms)["p50_ms"],
                    "peak_mb": _peak_mb(),
                    "exact_p50_ms": exact["p50_ms"],
                    "exact_p95_ms": exact["p95_ms"],
                    "exact_vs_numpy": round(float(np.mean(agree)), 4),
                    "write_s": round(write_s, 2),
                    "bm25_build_s": round(bm25_build_s, 2),
                    "bm25_mb": round(bm25_mb, 1),
                    "index_params": {k: v for k, v in (built or {}).items() if k != "index_type"},
                    "nprobes": nprobes_for(partitions) if ann else 0,
                    "queries": len(ms),
                    "serve": served,  # issue 34: the serving process, filtered search
                }
            )
    out = {"dims": dims, "ann_min_rows": ANN_MIN_ROWS, "scale": rows_out}
    return out, _scale_text(out)


def _serve_in_child(
    index_dir: str,
    q_texts: list[str],
    q_vecs: Any,
    filtered_truth: dict[str, list[list[str]]],
    truth: list[set[str]],
    log: Any,
) -> dict[str, Any]:
    """Run :func:`serving_child` in its own process (its peak memory is the service's)."""
    import numpy as np

    from rag_assets.lib.index import ann, lexical
    from rag_assets.lib.query import retrieve

    with tempfile.TemporaryDirectory(prefix="rag-scale-child-") as work:
        given = Path(work) / "queries.npz"
        np.savez(given, vectors=np.asarray(q_vecs, dtype=np.float32))
        (Path(work) / "queries.json").write_text(
            json.dumps(
                {
                    "texts": q_texts,
                    "truth": {"all": [sorted(t) for t in truth], **filtered_truth},
                    # the harness's thresholds (a test lowers them), for the child to apply
                    "native_fts_min_rows": lexical.NATIVE_FTS_MIN_ROWS,
                    "resident_max_rows": retrieve.RESIDENT_MAX_ROWS,
                    "ann_min_rows": ann.ANN_MIN_ROWS,
                }
            )
        )
        out = Path(work) / "served.json"
        cmd = [sys.executable, "-m", "rag_assets.bench.scale", "--serve-child", index_dir, work]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=SERVE_CHILD_TIMEOUT_S, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the serving process failed: {proc.stderr.strip()[-2000:]}")
        log("serving process done")
        return dict(json.loads(out.read_text()))


class _VectorEmbedder:
    """The serving child's query encoder: the synthetic queries' own vectors, looked up by
    text (the corpus has no model; everything else is the product's query path)."""

    def __init__(self, stamps: Any, vectors: dict[str, Any]):
        self._stamps = stamps
        self._vectors = vectors
        self.dims = stamps.dims

    def stamps(self, pipeline: str, extractor: str) -> Any:
        from dataclasses import replace

        return replace(self._stamps, pipeline=pipeline, extractor=extractor)

    def encode_query(self, query: str) -> Any:
        return self._vectors[query].copy()


def serving_child(index_dir: str, work: str, k: int = 10) -> dict[str, Any]:
    """What a service does at this size, in this process alone: open the published version
    (``Index``), then dense and BM25 searches unfiltered and under each of
    :data:`SCALE_FILTERS`; recall@10 against the harness's exact (filtered) answers, p50/p95,
    hits returned, and this process's peak memory."""
    import numpy as np

    from rag_assets.lib.index import ann, lexical
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.query import retrieve
    from rag_assets.lib.query.filters import Filter, Scope
    from rag_assets.lib.query.retrieve import Index

    given = json.loads((Path(work) / "queries.json").read_text())
    lexical.NATIVE_FTS_MIN_ROWS = int(given["native_fts_min_rows"])
    retrieve.RESIDENT_MAX_ROWS = int(given["resident_max_rows"])
    ann.ANN_MIN_ROWS = int(given["ann_min_rows"])
    vecs = np.load(Path(work) / "queries.npz")["vectors"]
    # each query's own text: the synthetic texts of one topic share their first words (the
    # suffix is no word of the corpus, so BM25 and the native index skip it)
    texts = [f"{t} q{i}x" for i, t in enumerate(given["texts"])]
    store = IndexStore(index_dir)
    pub = store.published()
    assert pub is not None
    t = time.perf_counter()
    embedder: Any = _VectorEmbedder(pub.stamps, dict(zip(texts, vecs, strict=True)))
    index = Index(store, pub, embedder)
    open_s = time.perf_counter() - t
    out: dict[str, Any] = {
        "open_s": round(open_s, 2),
        "open_peak_mb": _peak_mb(),
        "resident": index.resident,
    }
    scopes = {"all": None, **{p: Scope(Filter.parse([f])) for p, f in SCALE_FILTERS.items()}}
    scopes[SCALE_TOKEN[0]] = Scope(groups=frozenset({SCALE_TOKEN[1]}))  # issue 40
    for label, scope in scopes.items():
        plan = index.plan(scope)
        matching = plan.count if plan is not None else pub.rows
        ms, recall, hits_n, bm25_ms, bm25_n = [], [], [], [], []
        for i, text in enumerate(texts):
            t = time.perf_counter()
            hits = index.search(text, "dense", k=k, scope=scope)
            dt = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            worded = index.search(text, "bm25", k=k, scope=scope)
            bt = (time.perf_counter() - t) * 1000
            if i < 5:
                continue  # warm-up
            ms.append(dt)
            bm25_ms.append(bt)
            hits_n.append(len(hits))
            bm25_n.append(len(worded))
            want = set(given["truth"][label][i - 5])
            recall.append(len({h.chunk_id for h in hits} & want) / max(1, min(k, len(want))))
        got = _pcts(ms)
        out[label] = {
            "matching_rows": int(matching),
            "recall@10": round(float(np.mean(recall)), 4),
            "p50_ms": got["p50_ms"],
            "p95_ms": got["p95_ms"],
            "hits_min": int(min(hits_n)),
            "hits_mean": round(float(np.mean(hits_n)), 2),
            "k_when_k_match": float(np.mean([h == min(k, matching) for h in hits_n])),
            "bm25_p50_ms": _pcts(bm25_ms)["p50_ms"],
            "bm25_hits_mean": round(float(np.mean(bm25_n)), 2),
            "queries": len(ms),
        }
    out["peak_mb"] = _peak_mb()
    return out


if __name__ == "__main__":  # the serving child: python -m rag_assets.bench.scale --serve-child
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-child":
        result = serving_child(sys.argv[2], sys.argv[3])
        (Path(sys.argv[3]) / "served.json").write_text(json.dumps(result))
    else:
        sys.exit("usage: python -m rag_assets.bench.scale --serve-child INDEX_DIR WORK_DIR")


def _index_mb(table_dir: Path, uuid: str) -> float:
    """Size on disk of one LanceDB index (``_indices/<uuid>``) of a local table."""
    folder = table_dir / "_indices" / uuid
    if not uuid or not folder.is_dir():
        return 0.0
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def _scale_text(o: dict[str, Any]) -> str:
    lines = _harness_lines(o)
    lines += [
        "",
        "the serving process (Index, as a service opens it) per filter: recall@10 against the "
        "exact filtered answer, latency, hits returned (k = 10), its own peak memory",
        f"{'chunks':>9} {'filter':>6} {'matching':>9} {'recall@10':>9} {'p50_ms':>7} "
        f"{'p95_ms':>7} {'hits_min':>8} {'k_ok':>5} {'bm25_p50':>8} {'bm25_hits':>9} "
        f"{'serve_MB':>8}",
    ]
    for r in o["scale"]:
        s = r.get("serve") or {}
        for label in ("all", *SCALE_FILTERS, SCALE_TOKEN[0]):
            f = s.get(label)
            if not f:
                continue
            lines.append(
                f"{r['chunks']:>9} {label:>6} {f['matching_rows']:>9} {f['recall@10']:>9} "
                f"{f['p50_ms']:>7} {f['p95_ms']:>7} {f['hits_min']:>8} "
                f"{f['k_when_k_match']:>5} {f['bm25_p50_ms']:>8} {f['bm25_hits_mean']:>9} "
                f"{s['peak_mb']:>8}"
            )
    return "\n".join(lines)


def _harness_lines(o: dict[str, Any]) -> list[str]:
    lines = [
        f"synthetic chunks, {o['dims']} dims; ANN above {o['ann_min_rows']} rows, exact below",
        f"{'chunks':>9} {'index':>7} {'build_s':>8} {'p50_ms':>7} {'p95_ms':>7} {'exact_p50':>9} "
        f"{'recall@10':>9} {'lexical':>7} {'bm25_p50':>8} {'bm25_s':>7} {'bm25_MB':>7} "
        f"{'harness_MB':>10}",
    ]
    for r in o["scale"]:
        lines.append(
            f"{r['chunks']:>9} {r['index_type']:>7} {r['build_s']:>8} {r['p50_ms']:>7} "
            f"{r['p95_ms']:>7} {r['exact_p50_ms']:>9} {r['recall@10']:>9} "
            f"{r.get('lexical', 'bm25s'):>7} {r['bm25_p50_ms']:>8} {r['bm25_build_s']:>7} "
            f"{r['bm25_mb']:>7} {r['peak_mb']:>10}"
        )
    return lines
