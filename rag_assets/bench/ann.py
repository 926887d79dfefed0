"""``python -m rag_assets.bench.ann``: ANN recall and latency per probe setting (issue 23).

Two corpora, each written to a real LanceDB table with the product's IVF-SQ index
(:func:`~rag_assets.lib.index.ann.ensure_vector_index`, partitions as the product sizes them):

- ``--rows N``: N synthetic clustered unit vectors (:func:`synthetic_vectors`, the vectors
  ``bench --scale`` writes), queries from the same generator;
- ``--real BEIR_DIR …``: the real all-MiniLM-L6-v2 vectors of BEIR corpora (title + text, as
  ``eval --beir`` indexes them), grown to ``--real-rows`` by noise-perturbed copies (each copy
  ``normalize(v + ε)``, ``ε ~ N(0, σ²/dims)``, :data:`COPY_NOISE`), queries = the sets' own
  queries embedded with the query prompt; beside them a synthetic table of the same size.

For each ``nprobes`` × ``refine_factor`` setting: recall@10 against a numpy brute force over all
vectors (exact cosine), p50 / p95 ms per query (after warm-up). The rule that picks the shipped
setting is in :mod:`rag_assets.lib.index.ann`: the fewest probes whose recall@10 is ≥ 0.95, then
the smallest refine factor at that recall.

    python -m rag_assets.bench.ann --rows 1000000 --dir /tmp/ann1m
    python -m rag_assets.bench.ann --real ../shared/beir/scifact ../shared/beir/nfcorpus \\
        --real-rows 100000 --dir /tmp/annreal
    python -m rag_assets.bench.ann --write-peak 1000000 --dir /tmp/annwrite   # peak RSS

``--write-peak N`` measures only the index's write side at N rows (:func:`write_peak`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

K = 10
QUERIES = 50
WARMUP = 5
COPY_NOISE = 0.5
"""σ of the perturbation that makes copies of a real vector (cosine of a copy to its original
≈ 1 / sqrt(1 + σ²) ≈ 0.89: near duplicates, as re-chunked or lightly edited passages are)."""
WRITE_BATCH = 50_000


def synthetic_vectors(n: int, dims: int, total: int, start: int = 0, seed: int = 0) -> np.ndarray:
    """The vectors of :func:`~rag_assets.bench.scale.synthetic_chunks` (same arguments, same
    values), without making the texts: at 1 M rows those are most of the generator's time."""
    from rag_assets.bench.scale import SCALE_NOISE, SCALE_ROWS_PER_TOPIC

    topics = max(1, total // SCALE_ROWS_PER_TOPIC)
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((topics, dims)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    rng = np.random.default_rng(seed + 1 + start)
    topic = rng.integers(0, topics, size=n)
    vecs = centers[topic] + rng.standard_normal((n, dims)).astype(np.float32) * (
        SCALE_NOISE / np.sqrt(dims)
    )
    out: np.ndarray = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    return out


def _log(msg: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def _write_table(db: Any, name: str, vecs: np.ndarray) -> Any:
    import pyarrow as pa

    dims = vecs.shape[1]
    schema = pa.schema([("chunk_id", pa.string()), ("vector", pa.list_(pa.float32(), dims))])
    if name in db.list_tables().tables:
        tbl = db.open_table(name)
        if tbl.count_rows() == len(vecs):
            return tbl
        db.drop_table(name)
    tbl = db.create_table(name, schema=schema)
    for s in range(0, len(vecs), WRITE_BATCH):
        part = vecs[s : s + WRITE_BATCH]
        flat = pa.array(part.reshape(-1), type=pa.float32())
        tbl.add(
            pa.table(
                {
                    "chunk_id": [f"c{i:08d}" for i in range(s, s + len(part))],
                    "vector": pa.FixedSizeListArray.from_arrays(flat, dims),
                },
                schema=schema,
            )
        )
    return tbl


def sweep(
    tbl: Any,
    vecs: np.ndarray,
    queries: np.ndarray,
    probes: list[int],
    refines: list[int],
) -> list[dict[str, Any]]:
    """recall@K and latency of every (nprobes, refine_factor) on ``tbl`` (holding ``vecs``)."""
    sims = queries @ vecs.T  # exact cosine: all vectors are unit length
    truth = [set(np.argsort(-row, kind="stable")[:K].tolist()) for row in sims]
    out = []
    for nprobes in probes:
        for refine in refines:
            ms: list[float] = []
            recall: list[float] = []
            for i, q in enumerate(np.concatenate([queries[:WARMUP], queries])):
                t = time.perf_counter()
                res = (
                    tbl.search(q, vector_column_name="vector")
                    .distance_type("cosine")
                    .nprobes(nprobes)
                    .refine_factor(refine)
                    .select(["chunk_id"])
                    .limit(K)
                    .to_arrow()
                )
                if i < WARMUP:
                    continue
                ms.append((time.perf_counter() - t) * 1000)
                got = {int(c[1:]) for c in res["chunk_id"].to_pylist()}
                recall.append(len(got & truth[i - WARMUP]) / K)
            s = sorted(ms)
            out.append(
                {
                    "nprobes": nprobes,
                    "refine_factor": refine,
                    f"recall@{K}": round(float(np.mean(recall)), 4),
                    "p50_ms": round(statistics.median(s), 1),
                    "p95_ms": round(s[min(len(s) - 1, int(0.95 * len(s)))], 1),
                }
            )
    return out


def _indexed(db: Any, name: str, vecs: np.ndarray, t0: float) -> tuple[Any, int, float]:
    from rag_assets.lib.index.ann import ensure_vector_index, index_params

    tbl = _write_table(db, name, vecs)
    _log(f"{name}: {tbl.count_rows()} rows written", t0)
    t = time.perf_counter()
    built = ensure_vector_index(tbl, min_rows=1)
    build_s = round(time.perf_counter() - t, 1) if built else 0.0
    _log(f"{name}: index {'built' if built else 'kept'} ({build_s} s)", t0)
    return tbl, index_params(len(vecs), vecs.shape[1])["num_partitions"], build_s


def run_synthetic(rows: int, folder: Path, probes: list[int], refines: list[int]) -> dict[str, Any]:
    import lancedb

    t0 = time.perf_counter()
    parts = [synthetic_vectors(min(WRITE_BATCH, rows - s), 384, rows, s) for s in
             range(0, rows, WRITE_BATCH)]  # fmt: skip
    vecs = np.concatenate(parts).astype(np.float32)
    queries = synthetic_vectors(QUERIES, 384, rows, rows).astype(np.float32)
    tbl, partitions, build_s = _indexed(lancedb.connect(folder), f"syn_{rows}", vecs, t0)
    rows_out = sweep(tbl, vecs, queries, _clip(probes, partitions), refines)
    return {"corpus": "synthetic", "rows": rows, "partitions": partitions,
            "index_build_s": build_s, "settings": rows_out}  # fmt: skip


def _beir_texts(folder: Path) -> tuple[list[str], list[str]]:
    with gzip.open(folder / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    queries = [json.loads(line)["text"] for line in (folder / "queries.jsonl").open()]
    return [f"{d.get('title', '')}\n{d['text']}".strip() for d in docs], queries


def run_real(
    beir: list[Path], rows: int, folder: Path, probes: list[int], refines: list[int]
) -> list[dict[str, Any]]:
    import lancedb

    from rag_assets.lib.index.embed import Embedder, resolve_model

    t0 = time.perf_counter()
    cache = folder / "minilm-vectors.npz"
    if cache.exists():
        data = np.load(cache)
        base, qv = data["docs"], data["queries"]
    else:
        emb = Embedder(resolve_model(None), batch_size=32)
        texts: list[str] = []
        qtexts: list[str] = []
        for b in beir:
            d, q = _beir_texts(b)
            texts += d
            qtexts += q[: QUERIES // len(beir) + 1]
        _log(f"embedding {len(texts)} BEIR passages with all-MiniLM-L6-v2", t0)
        base = np.asarray(emb.encode(texts), dtype=np.float32)
        qv = np.asarray(emb.encode_queries(qtexts), dtype=np.float32)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(cache, docs=base, queries=qv)
    rng = np.random.default_rng(0)
    copies = [base]
    while sum(len(c) for c in copies) < rows:
        c = base + rng.standard_normal(base.shape).astype(np.float32) * (
            COPY_NOISE / np.sqrt(base.shape[1])
        )
        copies.append(c / np.linalg.norm(c, axis=1, keepdims=True))
    vecs = np.concatenate(copies)[:rows].astype(np.float32)
    queries = qv[:QUERIES]
    db = lancedb.connect(folder)
    out = []
    tbl, partitions, build_s = _indexed(db, f"real_{rows}", vecs, t0)
    settings = sweep(tbl, vecs, queries, _clip(probes, partitions), refines)
    name = f"real MiniLM ({len(base)} BEIR passages + copies)"
    out.append({"corpus": name, "rows": rows, "partitions": partitions,
                "index_build_s": build_s, "settings": settings})  # fmt: skip
    syn = np.concatenate([synthetic_vectors(min(WRITE_BATCH, rows - s), 384, rows, s) for s in
                          range(0, rows, WRITE_BATCH)]).astype(np.float32)  # fmt: skip
    sq = synthetic_vectors(QUERIES, 384, rows, rows).astype(np.float32)
    tbl, partitions, build_s = _indexed(db, f"syn_{rows}", syn, t0)
    settings = sweep(tbl, syn, sq, _clip(probes, partitions), refines)
    out.append({"corpus": "synthetic", "rows": rows, "partitions": partitions,
                "index_build_s": build_s, "settings": settings})  # fmt: skip
    return out


def write_peak(rows: int, folder: Path) -> dict[str, Any]:
    """The index's write side at ``rows`` chunks, in this process: the chunk table written in
    batches (id, text, vector, as ``sync_chunks`` writes it), then the IVF-SQ index and the
    lexical index the product builds at that size (``ensure_vector_index``,
    ``ensure_fts_index``); seconds per step and the process's peak RSS after each. Not in it:
    the embedding itself (batches, streamed) and the pipeline's chunk objects."""
    import lancedb
    import pyarrow as pa

    from rag_assets.bench.scale import SCALE_WRITE_BATCH, synthetic_chunks
    from rag_assets.lib.index.ann import ensure_vector_index
    from rag_assets.lib.index.lexical import NATIVE_FTS_MIN_ROWS, ensure_fts_index

    dims = 384
    schema = pa.schema([("chunk_id", pa.string()), ("text", pa.string()),
                        ("vector", pa.list_(pa.float32(), dims))])  # fmt: skip
    out: dict[str, Any] = {"rows": rows, "lexical": "native" if rows >= NATIVE_FTS_MIN_ROWS
                           else "bm25s (not built here)"}  # fmt: skip
    t = time.perf_counter()
    tbl = lancedb.connect(folder).create_table("chunks", schema=schema, mode="overwrite")
    for start in range(0, rows, SCALE_WRITE_BATCH):
        ids, texts, vecs = synthetic_chunks(min(SCALE_WRITE_BATCH, rows - start), dims, rows, start)
        flat = pa.array(vecs.reshape(-1), type=pa.float32())
        vector = pa.FixedSizeListArray.from_arrays(flat, dims)
        tbl.add(pa.table({"chunk_id": ids, "text": texts, "vector": vector}, schema=schema))
    out["write_s"], out["peak_mb_after_write"] = round(time.perf_counter() - t, 1), _peak_mb()
    t = time.perf_counter()
    ensure_vector_index(tbl)
    out["ann_s"], out["peak_mb_after_ann"] = round(time.perf_counter() - t, 1), _peak_mb()
    t = time.perf_counter()
    ensure_fts_index(tbl)
    out["fts_s"], out["peak_mb_after_fts"] = round(time.perf_counter() - t, 1), _peak_mb()
    return out


def _peak_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def _clip(probes: list[int], partitions: int) -> list[int]:
    return sorted({min(p, partitions) for p in probes})


def _text(results: list[dict[str, Any]]) -> str:
    lines = [f"{'corpus':44} {'rows':>8} {'parts':>5} {'nprobes':>7} {'refine':>6} "
             f"{'recall@10':>9} {'p50 ms':>7} {'p95 ms':>7}"]  # fmt: skip
    for r in results:
        for s in r["settings"]:
            lines.append(
                f"{r['corpus'][:44]:44} {r['rows']:>8} {r['partitions']:>5} {s['nprobes']:>7} "
                f"{s['refine_factor']:>6} {s['recall@10']:>9} {s['p50_ms']:>7} {s['p95_ms']:>7}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rag_assets.bench.ann", description=__doc__)
    p.add_argument("--rows", type=int, help="synthetic table of this many vectors")
    p.add_argument("--real", nargs="+", type=Path, help="BEIR folders for real vectors")
    p.add_argument("--real-rows", type=int, default=100_000)
    p.add_argument("--dir", type=Path, required=True, help="LanceDB folder (tables are reused)")
    p.add_argument("--nprobes", type=int, nargs="+", default=[20, 30, 40, 60, 80, 123])
    p.add_argument("--refine", type=int, nargs="+", default=[10, 30])
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--write-peak", type=int, metavar="N",
                   help="only the write side at N rows: seconds and peak RSS")  # fmt: skip
    args = p.parse_args(argv)
    if args.write_peak:
        print(json.dumps(write_peak(args.write_peak, args.dir), indent=2))
        return 0
    results: list[dict[str, Any]] = []
    if args.rows:
        results.append(run_synthetic(args.rows, args.dir, args.nprobes, args.refine))
    if args.real:
        results += run_real(args.real, args.real_rows, args.dir, args.nprobes, args.refine)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(_text(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
