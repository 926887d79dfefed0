"""``rag-assets bench --scale N``: the index at 100 k / 1 M synthetic chunks (issues 13, 23).

Per size: a LanceDB table of synthetic chunks (:func:`synthetic_chunks`), the query side's dense
search (exact below ``ANN_MIN_ROWS``, the IVF-SQ index above) with recall@10 against a numpy
brute force, the lexical index the product builds at that size (bm25s, or LanceDB's native one
from ``NATIVE_FTS_MIN_ROWS``), and the process's peak memory.
"""

from __future__ import annotations

import functools
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


def _peak_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def run_scale_bench(
    sizes: list[int], settings: Settings, n_queries: int = SCALE_QUERIES
) -> tuple[dict[str, Any], str]:
    """Per size: a LanceDB table of synthetic chunks, the query side's dense search (exact
    below ``ANN_MIN_ROWS``, the IVF-SQ index above), recall@10 against exact search, BM25
    build/size/query, and the process's peak memory so far (sizes run smallest first)."""
    import lancedb
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

    dims = configured_model(settings).dims
    rows_out: list[dict[str, Any]] = []
    for n in sorted(set(sizes)):
        if n < 100:
            raise ValueError(f"--scale {n}: give at least 100 chunks")
        t0 = time.perf_counter()

        def log(what: str, n: int = n, t0: float = t0) -> None:  # progress on stderr
            print(f"[scale {n}] {what} at {time.perf_counter() - t0:.0f} s", file=sys.stderr)

        with tempfile.TemporaryDirectory(prefix="rag-scale-") as tmp:
            db = lancedb.connect(tmp)
            schema = pa.schema(
                [
                    ("chunk_id", pa.string()),
                    ("text", pa.string()),
                    ("vector", pa.list_(pa.float32(), dims)),
                ]
            )
            tbl = db.create_table("chunks", schema=schema)
            native = n >= lexical.NATIVE_FTS_MIN_ROWS  # the product's lexical index at n rows
            texts: list[str] = []  # bm25s needs them in memory; the native index reads the table
            ids: list[str] = []
            parts = []
            t = time.perf_counter()
            for start in range(0, n, SCALE_WRITE_BATCH):
                b_ids, b_texts, b_vecs = synthetic_chunks(
                    min(SCALE_WRITE_BATCH, n - start), dims, n, start=start
                )
                flat = pa.array(b_vecs.reshape(-1), type=pa.float32())
                tbl.add(
                    pa.table(
                        {
                            "chunk_id": b_ids,
                            "text": b_texts,
                            "vector": pa.FixedSizeListArray.from_arrays(flat, dims),
                        },
                        schema=schema,
                    )
                )
                ids += b_ids
                texts += [] if native else b_texts
                parts.append(b_vecs)
                del flat
            matrix = np.concatenate(parts)
            del parts
            write_s = time.perf_counter() - t
            log("table written")
            q_ids, q_texts, q_vecs = synthetic_chunks(n_queries + 5, dims, n, start=n)
            q_texts = [" ".join(x.split()[:6]) for x in q_texts]  # query-length texts
            truth = []
            for q in q_vecs[5:]:
                sims = matrix @ q
                truth.append({ids[j] for j in np.argpartition(-sims, 10)[:10]})
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
                bm25_mb = _index_mb(Path(tmp) / "chunks.lance", idx.index_uuid if idx else "")
            else:
                bm25 = BM25Index.build(ids, texts)
                log("bm25 built")
                bm25_build_s = time.perf_counter() - t
                bm25_dir = Path(tmp) / "bm25"
                bm25.save(bm25_dir)
                bm25_mb = sum(p.stat().st_size for p in bm25_dir.iterdir()) / 2**20
            bm25_ms = []
            for i, qt in enumerate(q_texts):
                t = time.perf_counter()
                bm25.search(qt, 50)
                if i >= 5:
                    bm25_ms.append((time.perf_counter() - t) * 1000)
            del bm25, texts, ids
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
                }
            )
    out = {"dims": dims, "ann_min_rows": ANN_MIN_ROWS, "scale": rows_out}
    return out, _scale_text(out)


def _index_mb(table_dir: Path, uuid: str) -> float:
    """Size on disk of one LanceDB index (``_indices/<uuid>``) of a local table."""
    folder = table_dir / "_indices" / uuid
    if not uuid or not folder.is_dir():
        return 0.0
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def _scale_text(o: dict[str, Any]) -> str:
    lines = [
        f"synthetic chunks, {o['dims']} dims; ANN above {o['ann_min_rows']} rows, exact below",
        f"{'chunks':>9} {'index':>7} {'build_s':>8} {'p50_ms':>7} {'p95_ms':>7} {'exact_p50':>9} "
        f"{'recall@10':>9} {'lexical':>7} {'bm25_p50':>8} {'bm25_s':>7} {'bm25_MB':>7} "
        f"{'peak_MB':>8}",
    ]
    for r in o["scale"]:
        lines.append(
            f"{r['chunks']:>9} {r['index_type']:>7} {r['build_s']:>8} {r['p50_ms']:>7} "
            f"{r['p95_ms']:>7} {r['exact_p50_ms']:>9} {r['recall@10']:>9} "
            f"{r.get('lexical', 'bm25s'):>7} {r['bm25_p50_ms']:>8} {r['bm25_build_s']:>7} "
            f"{r['bm25_mb']:>7} {r['peak_mb']:>8}"
        )
    return "\n".join(lines)
