"""Which LanceDB mechanism holds a filtered search's recall (issue 40).

    python -m rag_assets.bench.filtered --rows 1000000 --dir DIR [--queries 40] [--json]

On :func:`~rag_assets.bench.scale.synthetic_chunks` (the ``bench --scale`` corpus: the product's
chunk schema, ``sel=p1/p10/p50`` on 1 / 10 / 50 % of the documents, access group ``g10`` on 10 %),
written once into ``DIR`` with the IVF-SQ and label indexes the product builds, each filter is
searched five ways: the index probing the product's unfiltered ``nprobes``, twice that, every
partition, the exact prefiltered scan, and the product's own choice (:func:`dense_search` with the
filter's share, after :data:`~rag_assets.lib.index.ann.FILTER_EXACT_MAX_ROWS`); recall@10 against
the exact filtered answer (numpy over the matching rows) and p50 ms. Then the cost of reading 20
hits' rows by id without and with a ``BTREE`` on ``chunk_id``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rag_assets.bench.scale import (
    SCALE_FILTERS,
    SCALE_TABLE,
    SCALE_TOKEN,
    SCALE_WRITE_BATCH,
    _batch_table,
    _bench_stamps,
    _truths,
    synthetic_chunks,
)

DIMS = 384


def run_filtered_bench(rows: int, folder: Path, queries: int = 40) -> tuple[dict[str, Any], str]:
    """See the module docstring; the table in ``folder`` is reused when it is there."""
    import numpy as np
    from lancedb.index import LabelList

    from rag_assets.lib.index import ann
    from rag_assets.lib.index.metadata import column_index, ensure_filter_indexes
    from rag_assets.lib.index.store import IndexStore, chunk_schema
    from rag_assets.lib.index.store.schema import sql_in

    store = IndexStore(str(folder))
    if SCALE_TABLE not in store.table_names():
        tbl = store.db.create_table(SCALE_TABLE, schema=chunk_schema(_bench_stamps(DIMS)))
        for start in range(0, rows, SCALE_WRITE_BATCH):
            ids, texts, vecs = synthetic_chunks(
                min(SCALE_WRITE_BATCH, rows - start), DIMS, rows, start=start
            )
            tbl.add(_batch_table(ids, texts, vecs, start, DIMS, _bench_stamps(DIMS)))
        ann.ensure_vector_index(tbl, min_rows=1)
        for idx in ("meta", "access"):  # the label indexes alone: the BTREE is timed below
            tbl.create_index(idx, config=LabelList(), replace=True)
    tbl = store.db.open_table(SCALE_TABLE)
    all_ids: list[str] = []
    parts = []
    for start in range(0, rows, SCALE_WRITE_BATCH):
        ids, _, vecs = synthetic_chunks(min(SCALE_WRITE_BATCH, rows - start), DIMS, rows, start)
        all_ids += ids
        parts.append(vecs)
    matrix = np.concatenate(parts)
    q_vecs = synthetic_chunks(queries, DIMS, rows, start=rows)[2]
    _, truth = _truths(matrix, q_vecs, all_ids)
    del matrix
    vindex = ann.vector_index(tbl)
    assert vindex is not None, f"no vector index on {folder}: remove the folder and run again"
    stats = tbl.index_stats(vindex.name)
    partitions = ann.index_params(int(stats.num_indexed_rows), DIMS)["num_partitions"]
    base = ann.nprobes_for(partitions)
    wheres = {label: f"array_has_any(meta, ['{f}'])" for label, f in SCALE_FILTERS.items()}
    wheres[SCALE_TOKEN[0]] = f"array_has_any(access, ['public', '{SCALE_TOKEN[1]}'])"

    def probe(where: str, n: int) -> Any:
        def f(q: Any) -> list[str]:
            r = (
                tbl.search(q, vector_column_name="vector")
                .distance_type("cosine")
                .where(where, prefilter=True)
                .nprobes(n)
                .refine_factor(ann.ANN_REFINE_FACTOR)
                .select(["chunk_id"])
                .limit(10)
                .to_arrow()
            )
            return list(r["chunk_id"].to_pylist())

        return f

    def product(where: str, matching: int) -> Any:
        exact = matching <= ann.FILTER_EXACT_MAX_ROWS
        share = matching / rows

        def f(q: Any) -> list[str]:
            hits = ann.dense_search(
                tbl, q, 10, ann=not exact, partitions=partitions, where=where, share=share
            )
            return [c for c, _ in hits]

        return f

    def timed(label: str, fn: Any) -> dict[str, float]:
        ms, rec = [], []
        for i, q in enumerate(q_vecs):
            t = time.perf_counter()
            got = fn(q)
            ms.append((time.perf_counter() - t) * 1000)
            rec.append(len(set(got) & set(truth[label][i])) / 10)
        return {
            "recall@10": round(float(np.mean(rec)), 3),
            "p50_ms": round(statistics.median(ms), 1),
        }

    out: dict[str, Any] = {"rows": rows, "partitions": partitions, "nprobes": base, "filters": {}}
    for label, where in wheres.items():
        matching = int(tbl.count_rows(where))
        out["filters"][label] = {
            "matching_rows": matching,
            f"probe {base}": timed(label, probe(where, base)),
            f"probe {2 * base}": timed(label, probe(where, 2 * base)),
            f"probe all {partitions}": timed(label, probe(where, partitions)),
            "exact scan": timed(
                label,
                lambda q, w=where: [c for c, _ in ann.dense_search(tbl, q, 10, ann=False, where=w)],
            ),
            "product": timed(label, product(where, matching)),
        }
        print(f"[filtered] {label} done", file=sys.stderr)
    some = all_ids[7 :: max(1, rows // 20)][:20]

    def fetch() -> float:
        t = time.perf_counter()
        tbl.search().where(sql_in("chunk_id", some)).select(["chunk_id", "vector"]).limit(
            100
        ).to_arrow()
        return (time.perf_counter() - t) * 1000

    if column_index(tbl, "chunk_id", "btree") is None:
        out["fetch_20_ms_without_btree"] = round(statistics.median(fetch() for _ in range(7)), 1)
    ensure_filter_indexes(tbl, min_rows=1)
    out["fetch_20_ms_with_btree"] = round(statistics.median(fetch() for _ in range(7)), 1)
    return out, _text(out)


def _text(o: dict[str, Any]) -> str:
    lines = [f"{o['rows']} rows, {o['partitions']} partitions; recall@10 / p50 ms", ""]
    for label, f in o["filters"].items():
        cells = ", ".join(
            f"{k} {v['recall@10']} / {v['p50_ms']}" for k, v in f.items() if isinstance(v, dict)
        )
        lines.append(f"{label:>9} ({f['matching_rows']} rows): {cells}")
    if "fetch_20_ms_without_btree" in o:
        lines.append(f"20 rows by id: {o['fetch_20_ms_without_btree']} ms without a BTREE")
    lines.append(f"20 rows by id: {o['fetch_20_ms_with_btree']} ms with it")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rag_assets.bench.filtered")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dir", type=Path, required=True, help="where the table is (re)used")
    p.add_argument("--queries", type=int, default=40)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out, text = run_filtered_bench(args.rows, args.dir, args.queries)
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
