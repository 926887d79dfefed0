"""Does a calibration transfer? Gates calibrated on one question source, scored on another.

``python -m rag_assets.bench.transfer --documents DIR --questions HAND [--generated NAME=DIR …]
[--ood-from DIR] [--fusions rrf,rrf:dense=4] [--index-root ROOT] [--json OUT]``

For one corpus and each fusion, the index is built once (``index_folder``, reused when it is
there). Each calibration source picks a cut the way ``refusal_threshold`` would:

- ``hand-written``: the hand-written set itself (its needles and its out-of-domain questions);
- ``generated:NAME``: a set written by a model (``rag-assets questions`` or the ``eval_questions``
  asset) with its own near-miss and unrelated questions;
- ``unrelated-only``: what the product does with no question set and no model
  (:func:`~rag_assets.lib.evaluate.calibrate.choose_day0_cut`: the shipped questions about other
  topics, issue 53), beside the shipped everyday questions alone;
- ``default``: the fixed 0.675.

Every cut is then scored on the **hand-written** questions: answerable queries answered with the
needle among the kept sources, and bluffs on the hand-written out-of-domain questions (or, for a
set without them, on those of ``--ood-from``). Recall@4 per phrasing is reported on each set, so
one can see whether a generated set ranks configurations in the same order as the hand-written one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_assets.lib.evaluate import calibrate
from rag_assets.lib.evaluate.day0 import day0_cache_dir, other_topics_distances
from rag_assets.lib.evaluate.evaluate import _dists, evaluate_needles
from rag_assets.lib.evaluate.questions import NeedleSet, load_needle_set
from rag_assets.lib.evaluate.questions_gen import unrelated_questions
from rag_assets.lib.index.embed import Embedder, resolve_model
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.ingest.chunk import strategy as chunk_strategy
from rag_assets.lib.query.cite import DEFAULT_DISTANCE_CUT, MAX_SOURCES
from rag_assets.lib.query.fusion import parse_fusion
from rag_assets.lib.query.retrieve import Index


def build_index(documents: Path, root: Path, embedder: Embedder) -> tuple[IndexStore, Any]:
    """The corpus indexed once under ``root`` (reused: the build is incremental by hash)."""
    built = index_folder(documents, root, chunk_strategy("E", 512), embedder)
    return IndexStore(root), built.entry


def ood_distances(index: Index, queries: Sequence[str], retriever: str) -> list[Any]:
    """The shipped unrelated questions as the gate sees them (distances in retrieval order)."""
    out = []
    for i, q in enumerate(queries):
        hits = index.search(q, retriever, k=MAX_SOURCES)
        out.append(calibrate.QueryDistances(f"u{i:03d}", _dists(hits), frozenset(), "unrelated"))
    return out


def recall_at_4(result: dict[str, Any], retriever: str = "hybrid") -> dict[str, float]:
    """Recall@4 of one retriever per phrasing (query ids end in ``/course`` / ``/ticket``)."""
    ranks = result["retrievers"][retriever]["ranks"]
    out: dict[str, float] = {}
    for phrasing in sorted({qid.rpartition("/")[2] for qid in ranks}):
        rs = [r for qid, r in ranks.items() if qid.endswith("/" + phrasing)]
        out[phrasing] = sum(1 for r in rs if r is not None and r <= 4) / len(rs)
    rs = list(ranks.values())
    out["all"] = sum(1 for r in rs if r is not None and r <= 4) / len(rs)
    return out


def run(
    documents: Path,
    hand: Path,
    generated: dict[str, Path],
    fusions: Sequence[str],
    index_root: Path,
    ood_from: Path | None,
    max_bluff_rate: float = calibrate.DEFAULT_MAX_BLUFF_RATE,
) -> dict[str, Any]:
    embedder = Embedder(resolve_model(None), batch_size=16)
    store, entry = build_index(documents, index_root, embedder)
    hand_set = load_needle_set(hand)
    if not hand_set.out_of_domain and ood_from is not None:
        hand_set = NeedleSet(hand_set.questions, load_needle_set(ood_from).out_of_domain)
    sets = {"hand-written": hand_set} | {
        f"generated:{k}": load_needle_set(v) for k, v in generated.items()
    }
    shipped = unrelated_questions()
    report: dict[str, Any] = {"documents": str(documents), "chunks": entry.rows, "fusions": {}}
    for fusion in fusions:
        index = Index(store, entry, embedder, None, None, parse_fusion(fusion))
        retriever = "hybrid"
        results = {
            name: evaluate_needles(
                index, qs, ("dense", "bm25", "hybrid"), max_bluff_rate=max_bluff_rate
            )
            for name, qs in sets.items()
        }
        hand_result, hand_refusal = results["hand-written"]
        assert hand_refusal is not None, "the hand-written set needs out-of-domain questions"
        unrelated = ood_distances(index, shipped, retriever)
        cuts: dict[str, dict[str, Any]] = {}
        un = calibrate.choose_unrelated_cut(unrelated, max_bluff_rate=max_bluff_rate)
        other = other_topics_distances(index, day0_cache_dir())
        mf = calibrate.choose_day0_cut(other, max_bluff_rate)
        for name, (_, refusal) in results.items():
            enough = refusal is not None and len(refusal.ood) >= calibrate.MIN_OOD_QUESTIONS
            n_ood = len(refusal.ood) if refusal is not None else 0
            if name == "hand-written":
                cuts[name] = {"cut": refusal.choice.cut if refusal else mf.cut, "ood": n_ood}
                continue
            # what refusal_threshold does with a generated set: its own cut when it has enough
            # out-of-domain questions, never above the model-free bound
            own = refusal.choice.cut if enough and refusal is not None else None
            cuts[f"{name} alone"] = {"cut": own if own is not None else mf.cut, "ood": n_ood}
            cuts[name] = {"cut": min(own, mf.cut) if own is not None else mf.cut, "ood": n_ood}
        cuts["unrelated list alone"] = {"cut": un.cut, "ood": len(unrelated)}
        cuts["unrelated-only (day-0)"] = {
            "cut": mf.cut,
            "ood": len(other),
            "reason": mf.reason,
        }
        cuts["default"] = {"cut": DEFAULT_DISTANCE_CUT, "ood": 0}
        for row in cuts.values():
            scored = calibrate.sweep(
                hand_refusal.answerable, hand_refusal.ood, cuts=[row["cut"]], keep=MAX_SOURCES
            )[0]
            row |= {
                "answered_with_needle": scored.answered_correct,
                "answered_wrong": scored.answered_wrong,
                "answerable": scored.n_answerable,
                "bluffs": scored.bluffs_near + scored.bluffs_unrelated,
                "bluffs_near": scored.bluffs_near,
                "out_of_domain": scored.n_near + scored.n_unrelated,
            }
        report["fusions"][fusion] = {
            "cuts": cuts,
            "recall@4": {name: recall_at_4(res) for name, (res, _) in results.items()},
            "unrelated_min_distance": sorted(min(q.distances) for q in unrelated),
        }
    return report


def markdown(report: dict[str, Any]) -> str:
    lines = [f"{report['documents']} ({report['chunks']} chunks)", ""]
    for fusion, r in report["fusions"].items():
        lines += [
            f"**{fusion}**, gate scored on the hand-written questions",
            "",
            "| calibrated on | OOD used | cut | answered with the needle | wrong | bluffs |",
            "|---|---|---|---|---|---|",
        ]
        for name, c in r["cuts"].items():
            lines.append(
                f"| {name} | {c['ood']} | {c['cut']:.3f} | {c['answered_with_needle']}/"
                f"{c['answerable']} | {c['answered_wrong']} | {c['bluffs']}/{c['out_of_domain']} |"
            )
        lines += ["", "| set | recall@4 (hybrid) by phrasing |", "|---|---|"]
        for name, rec in r["recall@4"].items():
            lines.append(f"| {name} | " + ", ".join(f"{k} {v:.3f}" for k, v in rec.items()) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag_assets.bench.transfer", description=__doc__)
    ap.add_argument("--documents", type=Path, required=True)
    ap.add_argument("--questions", type=Path, required=True, help="the hand-written set")
    ap.add_argument("--generated", action="append", default=[], help="NAME=DIR (repeatable)")
    ap.add_argument("--ood-from", type=Path, default=None)
    ap.add_argument("--fusions", default="rrf,rrf:dense=4")
    ap.add_argument("--index-root", type=Path, required=True)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    generated = dict(g.split("=", 1) for g in args.generated)
    report = run(
        args.documents,
        args.questions,
        {k: Path(v) for k, v in generated.items()},
        args.fusions.split(","),
        args.index_root,
        args.ood_from,
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
