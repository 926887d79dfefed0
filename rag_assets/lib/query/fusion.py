"""Reciprocal rank fusion of several rankings (e.g. BM25 and dense retrieval).

Cormack, Clarke & Büttcher, "Reciprocal Rank Fusion outperforms Condorcet and individual
Rank Learning Methods", SIGIR 2009: ``RRF(d) = Σ_r 1 / (k + r(d))`` over the rankings ``r``
that contain ``d``, with 1-based ranks and ``k = 60`` (the paper's constant, fixed during a
pilot study and used unchanged in all its experiments).

``RAG_FUSION`` chooses how the hybrid retriever combines dense and BM25 (``parse_fusion``):
``rrf`` (default: unweighted, k = 60, each side 50 deep), ``rrf:dense=2`` (weighted RRF: a side's
terms are multiplied by its weight, ``w / (k + rank)``, as in weighted/CombRRF variants),
``rrf:dense=2,bm25=1,k=60,depth=50`` (all options), or ``dense`` / ``bm25`` (one side only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

RRF_K = 60  # Cormack, Clarke & Büttcher, SIGIR 2009
FUSION_DEPTH = 50  # per-retriever candidates fed into fusion (the seed's CANDIDATE_DEPTH)
SIDES = ("dense", "bm25")
FUSION_SETTING = "RAG_FUSION"


@dataclass(frozen=True)
class Fusion:
    """How hybrid retrieval combines the dense and BM25 rankings."""

    method: str = "rrf"  # "rrf", or "dense" / "bm25" for one side alone
    weights: Mapping[str, float] = field(default_factory=lambda: {"dense": 1.0, "bm25": 1.0})
    k: int = RRF_K
    depth: int = FUSION_DEPTH

    @property
    def label(self) -> str:
        """Canonical text of this choice (parse_fusion(label) == self)."""
        if self.method != "rrf":
            return self.method
        opts = [f"{s}={self.weights[s]:g}" for s in SIDES if self.weights[s] != 1.0]
        opts += [f"k={self.k}"] if self.k != RRF_K else []
        opts += [f"depth={self.depth}"] if self.depth != FUSION_DEPTH else []
        return "rrf" + (":" + ",".join(opts) if opts else "")

    def fuse(self, dense: Sequence[str], bm25: Sequence[str]) -> list[tuple[str, float]]:
        """The fused ``(id, score)`` list, best first (one side alone: its own order, with
        RRF scores so that ties and scales behave the same)."""
        if self.method == "dense":
            return rrf([dense], k=self.k)
        if self.method == "bm25":
            return rrf([bm25], k=self.k)
        return rrf(
            [dense[: self.depth], bm25[: self.depth]],
            k=self.k,
            weights=[self.weights["dense"], self.weights["bm25"]],
        )


def parse_fusion(spec: str | None) -> Fusion:
    """``RAG_FUSION`` text to a ``Fusion``; a bad value raises one line naming the setting."""
    text = (spec or "rrf").strip().lower()
    method, _, opts = text.partition(":")
    if method in SIDES and not opts:
        return Fusion(method=method)
    if method != "rrf":
        raise ValueError(
            f"{FUSION_SETTING}={spec!r}: use rrf, rrf:dense=2 (weights, k=, depth=), dense or bm25"
        )
    weights = {"dense": 1.0, "bm25": 1.0}
    k, depth = RRF_K, FUSION_DEPTH
    for part in filter(None, (p.strip() for p in opts.split(","))):
        name, eq, value = part.partition("=")
        try:
            if not eq:
                raise ValueError
            if name in SIDES:
                weights[name] = float(value)
                if not (weights[name] >= 0 and math.isfinite(weights[name])):
                    raise ValueError
            elif name == "k":
                k = int(value)
                if k < 0:
                    raise ValueError
            elif name == "depth":
                depth = int(value)
                if depth < 1:
                    raise ValueError
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{FUSION_SETTING}={spec!r}: {part!r} is not one of dense=W, bm25=W (W >= 0), "
                "k=N (N >= 0), depth=N (N >= 1)"
            ) from None
    return Fusion(method="rrf", weights=weights, k=k, depth=depth)


def rrf(
    rankings: Sequence[Sequence[str]],
    k: int = RRF_K,
    top: int | None = None,
    weights: Sequence[float] | None = None,
) -> list[tuple[str, float]]:
    """Fuse ``rankings`` (ids, best first) into ``(id, score)`` pairs, best first.

    ``score = Σ w_r/(k + rank)`` over the rankings holding the id, ranks 1-based, ``w_r`` = 1
    unless ``weights`` (one per ranking) are given. Ties are broken
    by the id's best (smallest) rank in any single ranking, then by id ascending, so the result
    does not depend on dict or set order. An id repeated within one ranking counts only at its
    first (best) position there. ``top`` keeps the first ``top`` results (all when None).
    """
    if k < 0:
        raise ValueError(f"rrf: k must be >= 0, got {k}")
    if top is not None and top < 0:
        raise ValueError(f"rrf: top must be >= 0, got {top}")
    if weights is not None and len(weights) != len(rankings):
        raise ValueError(f"rrf: {len(weights)} weights for {len(rankings)} rankings")
    ws = [1.0] * len(rankings) if weights is None else [float(w) for w in weights]
    ranks: dict[str, list[int]] = {}
    terms: dict[str, list[float]] = {}
    for w, ranking in zip(ws, rankings, strict=True):
        if isinstance(ranking, str):
            raise TypeError("rrf: each ranking must be a sequence of ids, not a string")
        seen: set[str] = set()
        for rank, doc_id in enumerate(ranking, start=1):
            if doc_id in seen:
                continue
            seen.add(doc_id)
            ranks.setdefault(doc_id, []).append(rank)
            terms.setdefault(doc_id, []).append(w / (k + rank))
    # fsum is exactly rounded, so equal multisets of terms give bit-equal scores (exact ties)
    # whatever the order of the rankings
    score = {d: math.fsum(ts) for d, ts in terms.items()}
    fused = sorted(score.items(), key=lambda item: (-item[1], min(ranks[item[0]]), item[0]))
    return fused if top is None else fused[:top]
