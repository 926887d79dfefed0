"""Dense search at scale (issue 13): exact search below :data:`ANN_MIN_ROWS`, an IVF-SQ index
with exact re-ranking above it.

Below the threshold every query scans all vectors (``bypass_vector_index``): exact, and at that
size no slower than an index. Above it the write side builds (or rebuilds) an IVF-SQ index on
the ``vector`` column and the query side probes it, re-ranking the candidates with the stored
full vectors (``refine_factor``), so the distances a hit carries are exact.

Why IVF-SQ and these parameters (``rag-assets bench --scale``, README "Scaling out"):

- IVF-SQ needs no codebook training: 8-bit scalar codes (``dims`` bytes a vector, a quarter of
  the float32 copy). IVF-PQ's codebook training dominated its build here: 448 s at 30 k rows
  against 6.3 s for IVF-SQ, the same rows and queries on 2 shared, busy cores, both at
  recall@10 1.0 over 30 queries; at 100 k rows IVF-PQ took 681 s. HNSW variants add a graph
  per partition on top: larger and slower to build on CPUs.
- ``num_partitions = rows / ANN_PARTITION_ROWS`` (LanceDB's own ``target_partition_size``;
  its older ``sqrt(rows)`` rule makes k-means cost grow with rows squared).
- ``nprobes = max(ANN_MIN_NPROBES, ceil(partitions / ANN_PROBE_DIVISOR))`` partitions probed
  per query and ``refine_factor = ANN_REFINE_FACTOR``: ``k * 10`` candidates re-ranked exactly.
  The rule that picked it: the fewest probes whose recall@10 is at least 0.95 at 1 M rows, then
  the smallest refine factor there (``python -m rag_assets.bench.ann``, docs/measurements.md):
  at 1 M synthetic clustered vectors (123 partitions) 20 probes gave 0.894, 30 gave 0.942, 40
  gave 0.974 (p50 16 ms against 12 ms), 60 gave 0.992; refine 30 changed nothing over 10. On the
  real MiniLM vectors of BEIR SciFact + NFCorpus (grown to 100 k by perturbed copies, 13
  partitions) recall at a given share of partitions probed was within 0.03 of the synthetic one
  from a quarter of the partitions up, and lower below it (0.49 against 0.62 with one probe).
  At 100 k rows (13 partitions) every partition is probed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rag_assets.lib.index.due import index_due

#: Rows from which a table gets an ANN index and queries use it. An exact LanceDB scan costs one
#: pass over every vector per query: ``bench --scale`` on 2 shared, busy cores measured ~40 ms
#: (mostly per-query overhead) up to 10 k rows, 260 ms at 50 k and 1.1 s at 100 k, against
#: 96 ms for the IVF-SQ index at 100 k; below 50 k a scan costs little and needs no index build
#: per re-index.
ANN_MIN_ROWS = 50_000
ANN_INDEX_TYPE = "IVF_SQ"
ANN_PARTITION_ROWS = 8192  # rows per IVF partition (LanceDB's default target_partition_size)
ANN_MIN_NPROBES = 20  # partitions probed at least (LanceDB's own default)
ANN_PROBE_DIVISOR = 3  # and a third of the partitions above that (1 M rows: 41 of 123)
ANN_REFINE_FACTOR = 10  # candidates re-ranked with full vectors: k * this
ANN_REINDEX_FRACTION = 0.1  # rebuild when more than this share of rows is not in the index
VECTOR_COLUMN = "vector"


def index_params(rows: int, dims: int) -> dict[str, int]:
    """IVF-SQ parameters for a table of ``rows`` vectors of ``dims`` (see the module doc)."""
    return {"num_partitions": max(1, math.ceil(rows / ANN_PARTITION_ROWS))}


def nprobes_for(partitions: int) -> int:
    """Partitions a query probes in an index of ``partitions`` (see the module doc)."""
    return max(ANN_MIN_NPROBES, math.ceil(partitions / ANN_PROBE_DIVISOR))


def vector_index(tbl: Any) -> Any | None:
    """The ANN index on the vector column of ``tbl``, or None."""
    for idx in tbl.list_indices():
        if VECTOR_COLUMN in list(idx.columns) and idx.index_type.upper().startswith("IVF"):
            return idx
    return None


def ensure_vector_index(tbl: Any, min_rows: int | None = None) -> dict[str, Any] | None:
    """Build the IVF-SQ index when ``tbl`` has ``min_rows`` rows or more and has none, or when
    more than :data:`ANN_REINDEX_FRACTION` of its rows are outside it; a new table version.
    Returns what was built (None when nothing was needed)."""
    least = ANN_MIN_ROWS if min_rows is None else min_rows
    rows = index_due(tbl, vector_index(tbl), least, ANN_REINDEX_FRACTION)
    if not rows:
        return None
    from lancedb.index import IvfSq

    dims = int(tbl.schema.field(VECTOR_COLUMN).type.list_size)
    params = index_params(rows, dims)
    config = IvfSq(distance_type="cosine", num_partitions=params["num_partitions"])
    tbl.create_index(VECTOR_COLUMN, config=config, replace=True)
    return {"index_type": ANN_INDEX_TYPE, "rows": rows, **params}


def dense_search(
    tbl: Any,
    qvec: np.ndarray,
    k: int,
    *,
    ann: bool,
    partitions: int = 0,
    where: str | None = None,
    share: float = 1.0,
) -> list[tuple[str, float]]:
    """Top ``k`` ``(chunk_id, cosine distance)``, distance ascending then id: exact unless
    ``ann`` (then the IVF index, ``partitions`` of it known, with exact re-ranking). ``where``
    (issue 34: a metadata filter, the caller's groups) is a prefilter: applied before the
    nearest neighbours are chosen, on the scan and in the index alike. ``share`` (issue 40):
    the fraction of rows ``where`` matches; the index probes more partitions the smaller it
    is (:func:`filtered_nprobes`)."""
    q = tbl.search(qvec, vector_column_name=VECTOR_COLUMN).distance_type("cosine")
    if where:
        q = q.where(where, prefilter=True)
    if ann:
        q = q.nprobes(filtered_nprobes(partitions, share)).refine_factor(ANN_REFINE_FACTOR)
    else:
        q = q.bypass_vector_index()
    res = q.select(["chunk_id", "_distance"]).limit(k).to_arrow()
    pairs = zip(res["chunk_id"].to_pylist(), res["_distance"].to_pylist(), strict=True)
    return sorted(((c, float(d)) for c, d in pairs), key=lambda x: (x[1], x[0]))


def filtered_nprobes(partitions: int, share: float = 1.0) -> int:
    """Partitions probed for a prefiltered search matching ``share`` of the rows: the matching
    nearest neighbours of a filter that does not follow the vectors lie farther out than the
    unfiltered ones, so :func:`nprobes_for` is divided by ``sqrt(share)`` (at most all of
    them). At 1 M synthetic rows, 41 of 123 partitions held recall@10 at 0.932 under a 10 %
    filter and 0.973 under 50 %; all 123 gave 1.0 at 65 ms (docs/measurements.md, issue 40)."""
    base = nprobes_for(partitions)
    if share >= 1.0 or share <= 0.0:
        return base
    return int(min(max(partitions, base), math.ceil(base / math.sqrt(share))))


FILTER_EXACT_MAX_ROWS = 20_000
"""A prefiltered dense search over at most this many matching rows scans them exactly instead
of probing the index (issue 40: 1 M rows, a 1 % filter: 10,000 rows scanned in 28.5 ms at recall
1.0, where 41 of 123 partitions gave 0.57 in 29.7 ms)."""


def search_mode(tbl: Any, rows: int, min_rows: int | None = None) -> tuple[bool, int]:
    """(use the ANN index?, its partitions): only at ``min_rows`` rows or more, and only when
    the table version has an index (a version written before it was built scans)."""
    if rows < (ANN_MIN_ROWS if min_rows is None else min_rows):
        return False, 0
    idx = vector_index(tbl)
    if idx is None:
        return False, 0
    stats = tbl.index_stats(idx.name)  # the index was trained on its rows' partition count
    indexed = int(stats.num_indexed_rows) if stats is not None else rows
    return True, index_params(max(1, indexed), 8)["num_partitions"]
