"""Reciprocal rank fusion of several rankings (e.g. BM25 and dense retrieval).

Cormack, Clarke & Büttcher, "Reciprocal Rank Fusion outperforms Condorcet and individual
Rank Learning Methods", SIGIR 2009: ``RRF(d) = Σ_r 1 / (k + r(d))`` over the rankings ``r``
that contain ``d``, with 1-based ranks and ``k = 60`` (the paper's constant, fixed during a
pilot study and used unchanged in all its experiments).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

RRF_K = 60  # Cormack, Clarke & Büttcher, SIGIR 2009


def rrf(
    rankings: Sequence[Sequence[str]], k: int = RRF_K, top: int | None = None
) -> list[tuple[str, float]]:
    """Fuse ``rankings`` (ids, best first) into ``(id, score)`` pairs, best first.

    ``score = Σ 1/(k + rank)`` over the rankings holding the id, ranks 1-based. Ties are broken
    by the id's best (smallest) rank in any single ranking, then by id ascending, so the result
    does not depend on dict or set order. An id repeated within one ranking counts only at its
    first (best) position there. ``top`` keeps the first ``top`` results (all when None).
    """
    if k < 0:
        raise ValueError(f"rrf: k must be >= 0, got {k}")
    if top is not None and top < 0:
        raise ValueError(f"rrf: top must be >= 0, got {top}")
    ranks: dict[str, list[int]] = {}
    for ranking in rankings:
        if isinstance(ranking, str):
            raise TypeError("rrf: each ranking must be a sequence of ids, not a string")
        seen: set[str] = set()
        for rank, doc_id in enumerate(ranking, start=1):
            if doc_id in seen:
                continue
            seen.add(doc_id)
            ranks.setdefault(doc_id, []).append(rank)
    # fsum is exactly rounded, so equal multisets of ranks give bit-equal scores (exact ties)
    # whatever the order of the rankings
    score = {d: math.fsum(1.0 / (k + r) for r in rs) for d, rs in ranks.items()}
    fused = sorted(score.items(), key=lambda item: (-item[1], min(ranks[item[0]]), item[0]))
    return fused if top is None else fused[:top]
