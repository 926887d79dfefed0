"""LanceDB's native full-text index against the bm25s oracle (issue 23, item 3).

``python -m rag_assets.bench.fts [--dataset course-dev|scifact|nfcorpus ...] [--scale N ...]``

Quality, per dataset: the bm25s index of :mod:`rag_assets.lib.index.lexical` (the oracle: the
design's tokenizer and Lucene BM25) and LanceDB's inverted index (``create_fts_index``, Lance's
own, stored with the table) built on the same chunk texts, in two configurations:

* ``lance-plain``: tokens as close to the oracle's as Lance's options allow (simple tokenizer,
  lower case, no stemming, no stop words, no ASCII folding);
* ``lance-default``: LanceDB's defaults (English stemming and stop words, ASCII folding).

For each: rank agreement with the oracle (mean overlap of the top 10, top-1 agreement), hit@10
(a relevant chunk in the top 10) and recall@10 (share of the relevant chunks in the top 10),
and the paired sign test of hit@10 against the oracle's. Scale: build seconds and the peak RSS
of a fresh process that builds each index over N synthetic chunks (``bench --scale``'s corpus),
with the query p50 over 50 queries; each build runs in its own child process so the peaks do not
mix. Prints a Markdown table and writes JSON (``--out``). Nothing in the product imports this.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_assets.lib.index.lexical import NATIVE_FTS_CONFIG

SHARED = Path(__file__).resolve().parents[3] / "shared"
K = 10  # the cut for agreement, hit and recall
SCALE_QUERIES = 50  # queries timed per scale build
CONFIGS: dict[str, dict[str, Any]] = {
    "lance-plain": NATIVE_FTS_CONFIG,  # the configuration the product would use
    "lance-default": {},
}


def lance_fts(
    db_dir: Path, ids: Sequence[str], texts: Sequence[str], config: dict[str, Any]
) -> Any:
    """A LanceDB table of ``chunk_id``/``text`` with the native FTS index on ``text``."""
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(str(db_dir))
    tbl = db.create_table(
        "chunks",
        pa.table({"chunk_id": list(ids), "text": list(texts)}),
        mode="overwrite",
    )
    tbl.create_fts_index("text", replace=True, **config)
    return tbl


def fts_search(tbl: Any, query: str, k: int = K) -> list[str]:
    rows = tbl.search(query, query_type="fts").select(["chunk_id", "_score"]).limit(k).to_list()
    return [str(r["chunk_id"]) for r in rows]


def compare(
    ids: Sequence[str],
    texts: Sequence[str],
    queries: dict[str, str],
    relevant: dict[str, set[str]],
    workdir: Path,
) -> dict[str, Any]:
    """Oracle vs each Lance configuration on one dataset (see the module docstring)."""
    from rag_assets.lib.evaluate.metrics import sign_test
    from rag_assets.lib.index.lexical import BM25Index

    oracle = BM25Index.build(ids, texts)
    qids = sorted(queries)
    top = {q: [i for i, _ in oracle.search(queries[q], K)] for q in qids}
    out: dict[str, Any] = {"chunks": len(ids), "queries": len(qids), "engines": {}}
    out["engines"]["bm25s"] = _quality(top, top, relevant, qids, None)
    for name, config in CONFIGS.items():
        tbl = lance_fts(workdir / name, ids, texts, config)
        got = {q: fts_search(tbl, queries[q]) for q in qids}
        out["engines"][name] = _quality(got, top, relevant, qids, sign_test)
    return out


def _quality(
    got: dict[str, list[str]],
    oracle: dict[str, list[str]],
    relevant: dict[str, set[str]],
    qids: list[str],
    sign_test: Any,
) -> dict[str, Any]:
    hits = [bool(set(got[q]) & relevant[q]) for q in qids]
    oracle_hits = [bool(set(oracle[q]) & relevant[q]) for q in qids]
    res: dict[str, Any] = {
        "overlap@10": statistics.fmean(_overlap(got[q], oracle[q]) for q in qids),
        "top1_agree": statistics.fmean(
            (got[q][:1] == oracle[q][:1]) if oracle[q] else (not got[q]) for q in qids
        ),
        "hit@10": statistics.fmean(hits),
        "recall@10": statistics.fmean(
            len(set(got[q]) & relevant[q]) / len(relevant[q]) for q in qids
        ),
    }
    if sign_test is not None:
        st = sign_test(hits, oracle_hits)
        res["sign_test"] = {"wins": st.wins, "losses": st.losses, "p": round(st.p, 4)}
    return res


def _overlap(a: list[str], b: list[str]) -> float:
    """Shared share of two top lists (of the longer one: a query matching 3 chunks in both
    engines agrees fully); 1.0 when both are empty."""
    return len(set(a) & set(b)) / max(len(a), len(b)) if (a or b) else 1.0


def course_dev() -> tuple[list[str], list[str], dict[str, str], dict[str, set[str]]]:
    """The course corpus chunked with the default strategy (E, 512); a query's relevant chunks
    are those overlapping its needle's span in its document (both phrasings are queries)."""
    from rag_assets.lib.ingest.chunk import chunk_documents, strategy
    from rag_assets.lib.ingest.extract import extract_folder

    docs = extract_folder(SHARED / "corpus" / "course").documents
    chunks = chunk_documents(docs, strategy("E", 512))
    by_path = {Path(d.path).name: d for d in docs}
    queries, relevant = {}, {}
    for line in (SHARED / "eval" / "course-dev" / "questions.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        doc = by_path.get(q["document"])
        pos = doc.text.find(q["needle"]) if doc else -1
        if doc is None or pos < 0:
            continue
        end = pos + len(q["needle"])
        rel = {
            c.chunk_id
            for c in chunks
            if c.document_id == doc.document_id and c.start < end and c.end > pos
        }
        for phrasing, text in sorted(q["queries"].items()):
            queries[f"{q['id']}/{phrasing}"] = text
            relevant[f"{q['id']}/{phrasing}"] = rel
    return [c.chunk_id for c in chunks], [c.text for c in chunks], queries, relevant


def beir(name: str) -> tuple[list[str], list[str], dict[str, str], dict[str, set[str]]]:
    """A BEIR set, documents whole (title + text) as the BEIR evaluation scores them."""
    from rag_assets.lib.evaluate.beir import beir_documents
    from rag_assets.lib.evaluate.questions import load_beir

    data = load_beir(SHARED / "beir" / name)
    docs = beir_documents(data.corpus)
    relevant = {q: {d for d, g in rels.items() if g > 0} for q, rels in data.qrels.items()}
    queries = {q: t for q, t in data.queries.items() if relevant.get(q)}
    return [d.document_id for d in docs], [d.text for d in docs], queries, relevant


def scale_child(engine: str, n: int) -> dict[str, Any]:
    """Build one index over ``n`` synthetic chunks in this (fresh) process; its timings and
        peak RSS (``base_mb``: the peak before the build, i.e. the corpus for bm25s, which holds it
    whole, and the batch-wise table write for LanceDB, which never holds it whole)."""
    from rag_assets.bench.scale import SCALE_WRITE_BATCH, synthetic_chunks

    with tempfile.TemporaryDirectory(prefix="fts-bench-") as tmp:
        if engine == "bm25s":  # bm25s indexes a list in memory: the corpus is held whole
            from rag_assets.lib.index.lexical import BM25Index

            ids, texts, _ = synthetic_chunks(n, 8, n)
            queries = [" ".join(t.split()[:6]) for t in texts[:SCALE_QUERIES]]
            base = _peak_mb()
            t0 = time.perf_counter()
            index = BM25Index.build(ids, texts)
            build = time.perf_counter() - t0
            search: Any = lambda q: index.search(q, K)  # noqa: E731
        else:  # the table is written in batches, as the indexer writes it; then the index
            tbl, queries = _lance_table(Path(tmp), n, SCALE_WRITE_BATCH, synthetic_chunks)
            base = _peak_mb()
            t0 = time.perf_counter()
            tbl.create_fts_index("text", replace=True, **CONFIGS[engine])
            build = time.perf_counter() - t0
            search = lambda q: fts_search(tbl, q)  # noqa: E731
        lat = []
        for q in queries:
            t1 = time.perf_counter()
            search(q)
            lat.append((time.perf_counter() - t1) * 1000)
    return {
        "engine": engine,
        "n": n,
        "build_s": round(build, 2),
        "peak_mb": _peak_mb(),
        "base_mb": base,
        "query_p50_ms": round(statistics.median(lat), 2),
    }


def _lance_table(db_dir: Path, n: int, batch: int, make: Any) -> tuple[Any, list[str]]:
    """A ``chunk_id``/``text`` table of ``n`` synthetic chunks added ``batch`` at a time (the
    corpus is never whole in memory); and the scale queries (six words of the first chunks)."""
    import lancedb
    import pyarrow as pa

    tbl = None
    queries: list[str] = []
    for start in range(0, n, batch):
        ids, texts, _ = make(min(batch, n - start), 8, n, start)
        queries = queries or [" ".join(t.split()[:6]) for t in texts[:SCALE_QUERIES]]
        part = pa.table({"chunk_id": ids, "text": texts})
        if tbl is None:
            tbl = lancedb.connect(str(db_dir)).create_table("chunks", part, mode="overwrite")
        else:
            tbl.add(part)
    return tbl, queries


def _peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def scale(n: int, engines: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for engine in engines:
        cmd = [sys.executable, "-m", "rag_assets.bench.fts", "--child", engine, str(n)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def markdown(quality: dict[str, Any], scales: list[dict[str, Any]]) -> str:
    lines = [
        "| dataset | engine | overlap@10 | top-1 agree | hit@10 | recall@10 | sign test vs bm25s |",
        "|---|---|---|---|---|---|---|",
    ]
    for ds, res in quality.items():
        for name, m in res["engines"].items():
            st = m.get("sign_test")
            sign = f"+{st['wins']}/-{st['losses']}, p={st['p']}" if st else "oracle"
            lines.append(
                f"| {ds} ({res['queries']} q, {res['chunks']} chunks) | {name} | "
                f"{m['overlap@10']:.3f} | {m['top1_agree']:.3f} | {m['hit@10']:.3f} | "
                f"{m['recall@10']:.3f} | {sign} |"
            )
    if scales:
        lines += ["", "| chunks | engine | build s | peak MB (corpus alone) | query p50 ms |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for s in scales:
            lines.append(
                f"| {s['n']:,} | {s['engine']} | {s['build_s']} | {s['peak_mb']} "
                f"({s['base_mb']}) | {s['query_p50_ms']} |"
            )
    return "\n".join(lines)


DATASETS = {
    "course-dev": course_dev,
    "scifact": lambda: beir("scifact"),
    "nfcorpus": lambda: beir("nfcorpus"),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rag_assets.bench.fts", description=__doc__)
    p.add_argument("--dataset", action="append", choices=sorted(DATASETS), default=None)
    p.add_argument("--scale", action="append", type=int, default=[], help="synthetic chunks")
    p.add_argument("--engine", action="append", default=None, help="bm25s, lance-plain, ...")
    p.add_argument("--out", type=Path, default=None, help="write the JSON here")
    p.add_argument("--child", nargs=2, metavar=("ENGINE", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(scale_child(args.child[0], int(args.child[1]))))
        return 0
    quality = {}
    with tempfile.TemporaryDirectory(prefix="fts-bench-") as tmp:
        for ds in args.dataset if args.dataset is not None else ["course-dev", "scifact"]:
            ids, texts, queries, relevant = DATASETS[ds]()
            quality[ds] = compare(ids, texts, queries, relevant, Path(tmp) / ds)
    engines = args.engine or ["bm25s", *CONFIGS]
    scales = [row for n in sorted(args.scale) for row in scale(n, engines)]
    result = {"quality": quality, "scale": scales}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(markdown(quality, scales))
    return 0


if __name__ == "__main__":
    sys.exit(main())
