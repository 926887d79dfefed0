"""Retrieval evaluation of an index against a needle set or a BEIR set, without any generator.

``evaluate_needles`` answers every query with every retriever, scores needle ranks, destroyed
answers, paired sign tests and the refusal sweep, and returns one JSON-ready dict (the shape
``rag-assets eval --json`` prints). ``evaluate_beir`` scores nDCG@10 and recall@100.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_assets.lib.evaluate import calibrate, metrics
from rag_assets.lib.evaluate.questions import BeirSet, NeedleSet, check_needles
from rag_assets.lib.query.cite import MAX_SOURCES
from rag_assets.lib.query.retrieve import RERANK_DEPTH, Index
from rag_assets.lib.types import Hit, normalize_ws

TOP_K = 20  # ranks scored for recall@k and MRR
PAIRED_K = 4  # the gate keeps at most 4 sources: compare systems at that depth
BEIR_DEPTH = 100  # documents per query scored for BEIR (recall@100)


@dataclass
class Refusal:
    """Inputs and outcome of the threshold sweep for one retriever."""

    retriever: str
    answerable: list[calibrate.QueryDistances]
    ood: list[calibrate.QueryDistances]
    rows: list[calibrate.SweepRow]
    choice: calibrate.Choice
    # the answer check (RAG_ANSWER_CHECK=llm): query id -> {rank: P(yes)}, and its joint choice
    judge_scores: dict[str, dict[int, float]] | None = None
    joint_rows: list[calibrate.JointRow] | None = None
    joint: calibrate.JointChoice | None = None
    joint_outcomes: dict[str, dict[str, str]] | None = None  # per query, at the joint choice


def default_retriever(index: Index) -> str:
    """What ``ask`` uses: rerank when a cross-encoder is configured, else hybrid."""
    return "rerank" if index.reranker is not None else "hybrid"


def evaluate_needles(
    index: Index,
    qset: NeedleSet,
    retrievers: Sequence[str] = ("dense", "bm25", "hybrid", "rerank"),
    *,
    strategy: str = "",
    max_bluff_rate: float = calibrate.DEFAULT_MAX_BLUFF_RATE,
    operating_cut: float | None = None,
) -> tuple[dict[str, Any], Refusal | None]:
    """Score every retriever on every query; sweep refusal cuts for the default retriever."""
    notes: list[str] = []
    if "rerank" in retrievers and index.reranker is None:
        retrievers = [r for r in retrievers if r != "rerank"]
        notes.append("rerank: no model configured")
    docs = index.documents
    pdf_docs = {d for d, r in docs.items() if r["kind"] == "pdf"}
    texts = {d: r["text"] for d, r in docs.items()}
    collapse = {q.id: _doc_of(q.document, docs) in pdf_docs for q in qset.questions}
    broken = check_needles(
        [q for q in qset.questions if not collapse[q.id]], texts, collapse_ws=False
    ) + check_needles([q for q in qset.questions if collapse[q.id]], texts, collapse_ws=True)
    broken_ids = {b.question_id for b in broken}
    questions = [q for q in qset.questions if q.id not in broken_ids]
    contents = index.chunk_contents()
    lost = set()
    for flag in (False, True):  # one scan of the joined chunks per match rule
        group = [q for q in questions if collapse[q.id] == flag]
        gone = set(metrics.destroyed([q.needle for q in group], contents, collapse_ws=flag))
        lost |= {q.id for q in group if q.needle in gone}
    destroyed = [q.id for q in questions if q.id in lost]
    queries = [(q, qq) for q in questions for qq in q.query_list()]
    if not queries:  # nothing to score: say why instead of computing metrics over nothing
        notes.append(
            f"no valid questions: {len(broken)} of {len(qset.questions)} needles are not in "
            "this corpus (is the question set meant for these documents?)"
        )
        retrievers = []
    runs: dict[str, dict[str, list[Hit]]] = {}
    out_retrievers: dict[str, Any] = {}
    for name in retrievers:
        depth = max(TOP_K, RERANK_DEPTH)
        runs[name] = {qq.query_id: index.search(qq.text, name, k=depth) for _, qq in queries}
        ranks = {
            qq.query_id: metrics.needle_rank(
                [h.content for h in runs[name][qq.query_id][:TOP_K]], q.needle, collapse[q.id]
            )
            for q, qq in queries
        }
        summary = metrics.summarise(ranks)
        summary["ranks"] = ranks
        out_retrievers[name] = summary
    paired = (
        metrics.paired_table({n: r["ranks"] for n, r in out_retrievers.items()}, k=PAIRED_K)
        if queries
        else []
    )
    refusal = None
    result_refusal: dict[str, Any] | None = None
    main = default_retriever(index)
    if main in runs and qset.out_of_domain:
        refusal = _refusal(index, main, runs[main], queries, qset, collapse, max_bluff_rate)
        cut = operating_cut if operating_cut is not None else refusal.choice.cut
        row = calibrate.sweep(refusal.answerable, refusal.ood, cuts=[cut], keep=MAX_SOURCES)[0]
        result_refusal = {
            "retriever": main,
            "threshold": cut,
            "policy": "given" if operating_cut is not None else refusal.choice.policy,
            "reason": refusal.choice.reason if operating_cut is None else "operating cut given",
            "answered": row.answered_correct,
            "answered_wrong": row.answered_wrong,
            "refused_answerable": row.refused_answerable,
            "bluffs": row.bluffs_near + row.bluffs_unrelated,
            "bluffs_near": row.bluffs_near,
            "bluffs_unrelated": row.bluffs_unrelated,
            "out_of_domain": row.n_near + row.n_unrelated,
            "gate": "distance",
            # per query, at this cut: what `compare paired FILE.json:refusal` tests pairwise
            "outcomes": calibrate.outcomes(refusal.answerable, refusal.ood, cut, MAX_SOURCES),
        }
        if getattr(index, "judge", None) is not None:
            _judge_refusal(index, refusal, main, runs[main], qset, max_bluff_rate, operating_cut)
            distance_outcomes = result_refusal["outcomes"]
            result_refusal.update(judge_summary(refusal))
            result_refusal["outcomes"] = refusal.joint_outcomes  # the two-stage gate's
            result_refusal["distance_only"]["outcomes"] = distance_outcomes
    result = {
        "documents": len(docs),
        "chunks": len(contents),
        "strategy": strategy,
        "model": index.published.stamps.model,
        "table": index.published.table,
        "needles": len(questions),
        "destroyed": len(destroyed),
        "destroyed_ids": destroyed,
        "broken_questions": [b.__dict__ for b in broken],
        "retrievers": out_retrievers,
        "paired": paired,
        "refusal": result_refusal,
        "notes": notes,
    }
    return result, refusal


def _refusal(
    index: Index,
    retriever: str,
    run: dict[str, list[Hit]],
    queries: list[Any],
    qset: NeedleSet,
    collapse: dict[str, bool],
    max_bluff_rate: float,
) -> Refusal:
    norm = normalize_ws
    answerable = []
    for q, qq in queries:
        hits = run[qq.query_id][:RERANK_DEPTH]
        needle = norm(q.needle) if collapse[q.id] else q.needle
        correct = {
            i
            for i, h in enumerate(hits, start=1)
            if needle in (norm(h.content) if collapse[q.id] else h.content)
        }
        answerable.append(calibrate.QueryDistances(qq.query_id, _dists(hits), frozenset(correct)))
    ood = [
        calibrate.QueryDistances(
            o.id, _dists(index.search(o.query, retriever, k=RERANK_DEPTH)), kind=o.kind
        )
        for o in qset.out_of_domain
    ]
    rows = calibrate.sweep(answerable, ood, keep=MAX_SOURCES)
    choice = calibrate.choose_cut(rows, max_bluff_rate=max_bluff_rate)
    return Refusal(retriever, answerable, ood, rows, choice)


def joint_cuts(distance_cut: float) -> list[float]:
    """Distance cuts the two-stage sweep tries: the distance-only cut and looser ones up to 1.0
    in steps of 0.01 (the judge only adds refusals, so the pair loosens the distance cut)."""
    n = max(0, math.floor(round((1.0 - distance_cut) / 0.01, 6)))
    return sorted({round(distance_cut + 0.01 * i, 3) for i in range(n + 1)} | {distance_cut})


def _judge_refusal(
    index: Index,
    refusal: Refusal,
    retriever: str,
    run: dict[str, list[Hit]],
    qset: NeedleSet,
    max_bluff_rate: float,
    operating_cut: float | None,
) -> None:
    """Score every source the distance gate can keep with the judge, then sweep both cuts."""
    judge = index.judge
    cuts = [operating_cut] if operating_cut is not None else joint_cuts(refusal.choice.cut)
    text = {o.id: o.query for o in qset.out_of_domain}
    queries_text = {qq.query_id: qq.text for q in qset.questions for qq in q.query_list()}
    hits = dict(run)
    for o in qset.out_of_domain:
        hits[o.id] = index.search(o.query, retriever, k=RERANK_DEPTH)
    text.update(queries_text)
    scores: dict[str, dict[int, float]] = {}
    every = [*refusal.answerable, *refusal.ood]
    for qid, ranks in calibrate.needed_ranks(every, cuts, MAX_SOURCES, judge.sources).items():
        scores[qid] = {
            r: judge.scores(text[qid], [hits[qid][r - 1].text])[0] for r in sorted(ranks)
        }
    answerable = [
        calibrate.JudgedQuery(q, scores[q.query_id], judge.sources) for q in refusal.answerable
    ]
    ood = [calibrate.JudgedQuery(q, scores[q.query_id], judge.sources) for q in refusal.ood]
    refusal.judge_scores = scores
    refusal.joint_rows = calibrate.joint_sweep(answerable, ood, cuts, keep=MAX_SOURCES)
    refusal.joint = calibrate.choose_joint(refusal.joint_rows, max_bluff_rate)
    cut, judge_cut = refusal.joint.cut, refusal.joint.judge_cut

    def gate(jq: calibrate.JudgedQuery) -> str:
        kept = jq.query.kept_ranks(cut, MAX_SOURCES)
        score = jq.judge_score(cut, MAX_SOURCES)
        if not kept or score is None or score < judge_cut:
            return "refused"  # by the distance gate, or by the judge
        if jq.query.kind != "answerable":
            return "bluff"
        return "correct" if jq.query.correct_ranks.intersection(kept) else "wrong"

    refusal.joint_outcomes = {
        "answerable": {jq.query.query_id: gate(jq) for jq in answerable},
        "out_of_domain": {jq.query.query_id: gate(jq) for jq in ood},
    }


def judge_summary(refusal: Refusal) -> dict[str, Any]:
    """The ``refusal`` fields of the two-stage gate (keys of the distance-only object kept)."""
    assert refusal.joint is not None and refusal.joint_rows is not None
    j, row = refusal.joint, refusal.joint.row
    return {
        "gate": "distance+judge",
        "threshold": j.cut,
        "judge_cut": j.judge_cut,
        "policy": j.policy,
        "reason": j.reason,
        "answered": row.answered_correct,
        "answered_wrong": row.answered_wrong,
        "refused_answerable": row.refused_distance + row.refused_judge,
        "refused_by_distance": row.refused_distance,
        "refused_by_judge": row.refused_judge,
        "bluffs": row.bluffs_near + row.bluffs_unrelated,
        "bluffs_near": row.bluffs_near,
        "bluffs_unrelated": row.bluffs_unrelated,
        "out_of_domain": row.n_near + row.n_unrelated,
        "distance_only": {
            "threshold": refusal.choice.cut,
            "answered": refusal.choice.row.answered_correct,
            "bluffs": refusal.choice.row.bluffs_near + refusal.choice.row.bluffs_unrelated,
        },
        "curve": [r.to_dict() for r in calibrate.judge_curve(refusal.joint_rows, j.cut)],
    }


def _dists(hits: Sequence[Hit]) -> tuple[float, ...]:
    return tuple(float(h.cosine_distance if h.cosine_distance is not None else 2.0) for h in hits)


def _doc_of(name: str, docs: dict[str, Any]) -> str | None:
    if name in docs:
        return name
    ends = [d for d in docs if d.endswith("/" + name)]
    return ends[0] if len(ends) == 1 else None


def evaluate_beir(
    index: Index, beir: BeirSet, retrievers: Sequence[str] = ("dense", "bm25", "hybrid")
) -> dict[str, Any]:
    """nDCG@10 and recall@100 per retriever; a document scores as its best chunk."""
    out: dict[str, Any] = {}
    for name in retrievers:
        if name == "rerank" and index.reranker is None:
            out[name] = {"note": "rerank: no model configured"}
            continue
        runs: dict[str, list[str]] = {}
        for qid in beir.qrels:
            # deeper than 100 hits, so that with chunking 100 distinct documents remain
            hits = index.search(beir.queries[qid], name, k=BEIR_DEPTH * 3)
            seen: dict[str, None] = {}
            for h in hits:  # a document scores as its best chunk, in rank order
                seen.setdefault(h.document_id, None)
            runs[qid] = list(seen)[:BEIR_DEPTH]
        out[name] = metrics.beir_scores(runs, beir.qrels)
        # per-query nDCG@10, kept so that runs can be compared by paired tests (issue 8)
        out[name]["per_query_ndcg@10"] = {
            q: round(metrics.ndcg_at_k(runs.get(q, []), beir.qrels[q], 10), 6) for q in beir.qrels
        }
    return {"retrievers": out}


def _dropped_line(broken: list[dict[str, Any]]) -> list[str]:
    """Issue 31: the questions left out because their needle is not in their document, named
    (``rag-assets questions --check DIR`` shows each one's nearest text)."""
    if not broken:
        return []
    names = ", ".join(f"{b['question_id']} ({b['document']})" for b in broken)
    return [
        f"{len(broken)} question(s) dropped, needle not found in its document: {names}; "
        "`rag-assets questions --check DIR` shows the nearest text"
    ]


def markdown_tables(result: dict[str, Any]) -> str:
    """Recall/MRR table with Wilson intervals, then the paired sign tests, as Markdown."""
    lines = [
        f"{result['needles']} needles, {result['destroyed']} destroyed by chunking; "
        f"{result['chunks']} chunks ({result['strategy'] or 'strategy ?'}, {result['model']})",
        *_dropped_line(result.get("broken_questions") or []),
        "",
        "| retriever | R@1 | R@4 | R@8 | R@20 | MRR | course R@4 | ticket R@4 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["retrievers"].items():
        cells = [_fmt(r[f"recall@{k}"]) for k in (1, 4, 8, 20)]
        groups = r.get("groups", {})
        by = [_fmt(groups[g]["recall@4"]) if g in groups else "-" for g in ("course", "ticket")]
        lines.append(f"| {name} | {' | '.join(cells)} | {r['mrr']:.3f} | {' | '.join(by)} |")
    if result["paired"]:
        lines += [
            "",
            "| a | b | k | a only | b only | p (exact sign test) |",
            "|---|---|---|---|---|---|",
        ]
        for p in result["paired"]:
            lines.append(
                f"| {p['a']} | {p['b']} | {p['k']} | {p['wins']} | {p['losses']} | {p['p']:.3g} |"
            )
    ref = result.get("refusal")
    if ref:
        lines += [
            "",
            f"refusal ({ref['retriever']}, cut {ref['threshold']:.3f}, {ref['policy']}): "
            f"answered correctly {ref['answered']}, answered wrongly {ref['answered_wrong']}, "
            f"refused answerable {ref['refused_answerable']}; bluffs {ref['bluffs']}/"
            f"{ref['out_of_domain']} out-of-domain ({ref['bluffs_near']} near, "
            f"{ref['bluffs_unrelated']} unrelated)",
        ]
    for note in result.get("notes", []):
        lines += ["", note]
    return "\n".join(lines)


def ablation(
    results: dict[str, dict[str, Any]], baseline: str = "E"
) -> tuple[list[dict[str, Any]], str]:
    """Paired sign tests (hit@4) of each strategy against ``baseline`` per retriever, and a
    Markdown summary: chunks, destroyed answers and recall@4 per strategy and retriever."""
    retrievers = list(next(iter(results.values()))["retrievers"])
    paired: list[dict[str, Any]] = []
    if baseline in results:
        for r in retrievers:
            systems = {n: res["retrievers"][r]["ranks"] for n, res in results.items()}
            paired += [
                {**row, "retriever": r} for row in metrics.paired_table(systems, PAIRED_K, baseline)
            ]
    lines = [
        "| strategy | chunks | destroyed | " + " | ".join(f"{r} R@4" for r in retrievers) + " |",
        "|---|---|---|" + "---|" * len(retrievers),
    ]
    for name, res in results.items():
        cells = [_fmt(res["retrievers"][r]["recall@4"]) for r in retrievers]
        lines.append(
            f"| {name} | {res['chunks']} | {res['destroyed']} | " + " | ".join(cells) + " |"
        )
    if paired:
        lines += [
            "",
            f"each strategy vs {baseline}, hit@{PAIRED_K}, exact two-sided sign test:",
            "",
            "| retriever | strategy | wins | losses | p |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {p['retriever']} | {p['a']} | {p['wins']} | {p['losses']} | {p['p']:.3g} |"
            for p in paired
        ]
    return paired, "\n".join(lines)


def _fmt(cell: dict[str, Any]) -> str:
    lo, hi = cell["ci95"]
    return f"{cell['value']:.3f} [{lo:.2f}, {hi:.2f}]"


def plot_refusal(
    answerable: Sequence[calibrate.QueryDistances],
    ood: Sequence[calibrate.QueryDistances],
    cut: float,
    path: Path,
) -> Path:
    """PNG of the decisive distance per query (answerable vs out-of-domain) and the cut."""
    return calibrate.plot_distributions(
        calibrate.best_distances(answerable), calibrate.best_distances(ood), cut, path
    )


#: The upgrade gate refuses a new table that is worse than the published one at this level.
UPGRADE_ALPHA = 0.05


def compare_to_published(new: dict[str, Any], old: dict[str, Any], k: int = 4) -> dict[str, Any]:
    """Paired comparison of two evaluations on the same questions (a model upgrade against the
    table it would replace): sign tests on hit@``k`` of the default retriever and on "answered
    with the needle" at each table's own calibrated cut. ``worse`` is True when either test
    says the new table loses significantly (p < :data:`UPGRADE_ALPHA`, more losses than wins);
    ``table`` puts the two side by side (Markdown)."""
    main = "rerank" if "rerank" in new["retrievers"] else "hybrid"
    a, b = new["retrievers"][main]["ranks"], old["retrievers"].get(main, {}).get("ranks", {})
    ids = sorted(set(a) & set(b))
    hit = metrics.sign_test(
        [a[q] is not None and a[q] <= k for q in ids], [b[q] is not None and b[q] <= k for q in ids]
    )
    tests = {f"hit@{k}": hit}
    na = ((new.get("refusal") or {}).get("outcomes") or {}).get("answerable", {})
    oa = ((old.get("refusal") or {}).get("outcomes") or {}).get("answerable", {})
    both = sorted(set(na) & set(oa))
    if both:
        tests["answered_with_needle"] = metrics.sign_test(
            [na[q] == "correct" for q in both], [oa[q] == "correct" for q in both]
        )
    worse = [n for n, t in tests.items() if t.p < UPGRADE_ALPHA and t.losses > t.wins]

    def row(name: str, r: dict[str, Any]) -> str:
        s = r["retrievers"][main]
        ref = r.get("refusal") or {}
        return (
            f"| {name} | {r.get('model', '')} | {s['recall@1']['value']:.3f} | "
            f"{s['recall@4']['value']:.3f} | {s['recall@20']['value']:.3f} | {s['mrr']:.3f} | "
            f"{ref.get('answered', '–')} | {ref.get('bluffs', '–')} |"
        )

    table = "\n".join(
        [
            "| table | model | R@1 | R@4 | R@20 | MRR | answered with the needle | bluffs |",
            "|---|---|---|---|---|---|---|---|",
            row("published", old),
            row("new", new),
            "",
            "| paired test (new vs published) | wins | losses | p |",
            "|---|---|---|---|",
            *[f"| {n} | {t.wins} | {t.losses} | {t.p:.3g} |" for n, t in tests.items()],
        ]
    )
    return {
        "queries": len(ids),
        "tests": {n: t._asdict() for n, t in tests.items()},
        "worse": worse,
        "table": table,
    }
