"""Retrieval metrics: needle ranks, recall@k, MRR, Wilson intervals, paired sign tests, BEIR.

Pure functions, no Dagster. A *rank* is the 1-based rank of the first correct result for
one query, or ``None`` when no returned result was correct (a miss). Correctness for the
needle sets follows ``shared/eval/README.md``: a result is correct when its quoted content
contains the needle whole (exact, case-sensitive); with ``collapse_ws`` both sides first
have every whitespace run collapsed to one space and are stripped (the PDF-set rule).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from scipy.stats import binomtest

from rag_assets.lib.types import normalize_ws

#: Cut-offs reported for the needle sets (shared/eval/README.md: k = 1, 4, 8 and 20).
DEFAULT_KS: tuple[int, ...] = (1, 4, 8, 20)
#: MRR counts a first correct result only up to this rank (the deepest reported k).
DEFAULT_MRR_CUTOFF = 20
#: Joins chunk contents in :func:`destroyed`; a needle holding it is rejected.
_SENTINEL = "\x00"


class SignTest(NamedTuple):
    """Exact two-sided sign test over the discordant pairs of two systems.

    ``wins``: queries only system *a* got right; ``losses``: only *b*; ``p``: two-sided
    binomial p-value of ``wins`` out of ``wins + losses`` at 0.5 (1.0 with no discordant pair).
    """

    wins: int
    losses: int
    p: float


def recall_at_k(ranks: Sequence[int | None], k: int) -> float:
    """Fraction of queries whose first correct result is at rank ``k`` or better."""
    _check_ranks(ranks)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return sum(1 for r in ranks if r is not None and r <= k) / len(ranks)


def mrr(ranks: Sequence[int | None], cutoff: int = DEFAULT_MRR_CUTOFF) -> float:
    """Mean reciprocal rank: mean of 1/r, counting 0 for a miss or a rank beyond ``cutoff``."""
    _check_ranks(ranks)
    return sum(1.0 / r for r in ranks if r is not None and r <= cutoff) / len(ranks)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (scipy's ``proportion_ci``).

    Returns ``(0.0, 1.0)`` for ``n == 0`` (no evidence either way).
    """
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return (0.0, 1.0)
    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def sign_test(a_hits: Sequence[bool], b_hits: Sequence[bool]) -> SignTest:
    """Paired exact sign test: does system *a* get right the queries *b* misses, or vice versa?

    ``a_hits[i]`` and ``b_hits[i]`` say whether each system answered query ``i``.
    """
    if len(a_hits) != len(b_hits):
        raise ValueError(f"paired lists differ in length: {len(a_hits)} vs {len(b_hits)}")
    wins = sum(1 for a, b in zip(a_hits, b_hits, strict=True) if a and not b)
    losses = sum(1 for a, b in zip(a_hits, b_hits, strict=True) if b and not a)
    if wins + losses == 0:
        return SignTest(0, 0, 1.0)
    p = float(binomtest(wins, wins + losses, 0.5, alternative="two-sided").pvalue)
    return SignTest(wins, losses, min(1.0, p))


def summarise(
    ranks_by_query: Mapping[str, int | None],
    ks: Sequence[int] = DEFAULT_KS,
    groups: Mapping[str, str] | None = None,
    mrr_cutoff: int = DEFAULT_MRR_CUTOFF,
) -> dict[str, Any]:
    """JSON-ready recall@k (with Wilson 95 % interval) and MRR, overall and per group.

    ``groups`` maps query id to a group name. With ``None`` the group is the phrasing after
    the last ``/`` of the query id (``"d01/course"`` -> ``"course"``) when every id has one,
    else there are no groups; pass ``{}`` to suppress groups. Output::

        {"n": 64, "recall@1": {"value": .5, "ci95": [lo, hi], "n": 64, "hits": 32}, ...,
         "mrr": .61, "groups": {"course": {...same keys...}, "ticket": {...}}}
    """
    if groups is None:
        ids = list(ranks_by_query)
        groups = {q: q.rsplit("/", 1)[1] for q in ids} if all("/" in q for q in ids) else {}
    out = _summary(list(ranks_by_query.values()), ks, mrr_cutoff)
    if groups:
        missing = sorted(set(ranks_by_query) - set(groups))
        if missing:
            raise ValueError(f"queries without a group: {missing[:5]}")
        members: dict[str, list[int | None]] = {}
        for qid in sorted(ranks_by_query):
            members.setdefault(groups[qid], []).append(ranks_by_query[qid])
        out["groups"] = {g: _summary(members[g], ks, mrr_cutoff) for g in sorted(members)}
    return out


def paired_table(
    systems: Mapping[str, Mapping[str, int | None]], k: int, baseline: str | None = None
) -> list[dict[str, Any]]:
    """Sign tests of hit@k between systems: every pair (in the given order), or each vs baseline.

    Each row ``{"a", "b", "k", "wins", "losses", "p"}``; ``wins`` counts queries only ``a``
    answered within ``k``. With a baseline, ``b`` is the baseline. All systems must have
    answered the same query ids.
    """
    names = list(systems)
    if baseline is not None and baseline not in systems:
        raise ValueError(f"baseline {baseline!r} is not one of {names}")
    query_ids = sorted(systems[names[0]]) if names else []
    for name in names:
        if sorted(systems[name]) != query_ids:
            raise ValueError(f"system {name!r} answered a different set of queries")
    if baseline is None:
        pairs = list(itertools.combinations(names, 2))
    else:
        pairs = [(name, baseline) for name in names if name != baseline]
    rows = []
    for a, b in pairs:
        a_hits = [_hit(systems[a][q], k) for q in query_ids]
        b_hits = [_hit(systems[b][q], k) for q in query_ids]
        test = sign_test(a_hits, b_hits)
        rows.append({"a": a, "b": b, "k": k, "wins": test.wins, "losses": test.losses, "p": test.p})
    return rows


def ndcg_at_k(ranked_doc_ids: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """nDCG@k as pytrec_eval/BEIR compute it: gain = relevance grade, discount log2(rank + 1).

    The ideal ranking is all judged documents by grade; grades <= 0 give no gain. 0.0 when
    no document is relevant.
    """
    _check_unique(ranked_doc_ids)
    dcg = sum(max(qrels.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked_doc_ids[:k]))
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k_docs(
    ranked_doc_ids: Sequence[str], qrels: Mapping[str, int], k: int = 100
) -> float:
    """|relevant (grade > 0) in the top k| / |relevant|; 0.0 when no document is relevant."""
    _check_unique(ranked_doc_ids)
    relevant = {d for d, g in qrels.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked_doc_ids[:k])) / len(relevant)


def beir_scores(
    runs: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    ndcg_k: int = 10,
    recall_k: int = 100,
) -> dict[str, float]:
    """Mean nDCG@ndcg_k and recall@recall_k over every query in ``qrels`` (missing run = empty)."""
    if not qrels:
        raise ValueError("no judged queries")
    ndcg = [ndcg_at_k(runs.get(q, []), qrels[q], ndcg_k) for q in qrels]
    rec = [recall_at_k_docs(runs.get(q, []), qrels[q], recall_k) for q in qrels]
    return {
        f"ndcg@{ndcg_k}": sum(ndcg) / len(ndcg),
        f"recall@{recall_k}": sum(rec) / len(rec),
        "queries": len(qrels),
    }


def needle_rank(hit_contents: Sequence[str], needle: str, collapse_ws: bool = False) -> int | None:
    """1-based rank of the first hit whose content contains ``needle`` whole, else None."""
    if collapse_ws:
        needle = normalize_ws(needle)
    _check_needle(needle)
    for rank, content in enumerate(hit_contents, start=1):
        if needle in (normalize_ws(content) if collapse_ws else content):
            return rank
    return None


def destroyed(
    needles: Iterable[str], chunk_contents: Iterable[str], collapse_ws: bool = False
) -> list[str]:
    """Needles (in input order) that no chunk content contains whole.

    The chunk contents are joined with a NUL sentinel that no needle may hold, so a match
    in the joined text cannot span two chunks; one substring scan per needle.
    """
    norm = normalize_ws if collapse_ws else (lambda s: s)
    haystack = _SENTINEL.join(norm(c) for c in chunk_contents)
    out = []
    for needle in needles:
        n = norm(needle)
        _check_needle(n)
        if n not in haystack:
            out.append(needle)
    return out


def _summary(ranks: Sequence[int | None], ks: Sequence[int], mrr_cutoff: int) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(ranks)}
    for k in ks:
        hits = sum(1 for r in ranks if r is not None and r <= k)
        lo, hi = wilson_interval(hits, len(ranks))
        out[f"recall@{k}"] = {
            "value": recall_at_k(ranks, k),
            "ci95": [lo, hi],
            "n": len(ranks),
            "hits": hits,
        }
    out["mrr"] = mrr(ranks, mrr_cutoff)
    return out


def _hit(rank: int | None, k: int) -> bool:
    return rank is not None and rank <= k


def _check_ranks(ranks: Sequence[int | None]) -> None:
    if len(ranks) == 0:
        raise ValueError("no queries: a metric over zero queries is undefined")
    bad = [r for r in ranks if r is not None and (isinstance(r, bool) or r < 1)]
    if bad:
        raise ValueError(f"ranks are 1-based or None, got {bad[:5]}")


def _check_unique(ranked_doc_ids: Sequence[str]) -> None:
    if len(set(ranked_doc_ids)) != len(ranked_doc_ids):
        raise ValueError("ranked document ids contain duplicates; deduplicate (keep first) first")


def _check_needle(needle: str) -> None:
    if not needle:
        raise ValueError("empty needle")
    if _SENTINEL in needle:
        raise ValueError("needle contains a NUL character")
