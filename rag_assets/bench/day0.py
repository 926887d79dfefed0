"""Day-0 refusal across folders (issue 53): does a folder with no question set refuse what it
does not answer, and answer what it does?

``rag-assets bench --day0 [--day0-root DIR] [--json]`` (or ``python -m rag_assets.bench.day0
[ROOT] [--folders a,b]``). For every folder of :mod:`rag_assets.bench.day0_folders` (assembled
from this machine's Debian manuals and ``../shared``; one whose sources are absent is skipped
with the reason):

1. its **day-0 index**: the folder indexed with the default model, chunked as ``rag-assets
   index`` does (strategy E, 512), the base table a first run publishes (before any adaptation);
2. its **day-0 cut**: what ``refusal_threshold`` publishes with no question set and no model
   (:func:`~rag_assets.lib.evaluate.calibrate.choose_day0_cut` on the shipped questions about
   other topics); beside it, the **hand cut**: what the folder's own hand-written set calibrates
   (:func:`~rag_assets.lib.evaluate.calibrate.choose_cut` at ``RAG_MAX_BLUFF_RATE``), and, for
   the record, the rule before issue 53 (the everyday list's 10 % cut, bounded by corpus
   sentences asked with their own document held out when those separate);
3. each index is asked its **own** questions (answered with the needle among the kept sources),
   its own hand-written **near** misses, and everything **off-topic**: every other folder's
   questions (both phrasings) and near misses, and 150 held-out unrelated questions
   (``day0_data/unrelated_test.txt``, none of them in the shipped sets).

Own questions and near misses go through the gate as ``refusal_threshold`` sees them (the
hybrid retriever's first four hits); an off-topic question is answered iff its nearest chunk is
under the cut (the nearest chunk is always retrieved). The goal (issue 53): at day 0, off-topic
answered at most 5 % on every folder, and own questions answered within 15 % of what the hand
cut answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag_assets.bench import day0_folders
from rag_assets.lib.evaluate import calibrate, questions_gen
from rag_assets.lib.evaluate.day0 import day0_cache_dir, other_topics_distances
from rag_assets.lib.evaluate.evaluate import _dists, evaluate_needles
from rag_assets.lib.evaluate.questions import load_needle_set
from rag_assets.lib.index.embed import Embedder, resolve_model
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.ingest.chunk import strategy as chunk_strategy
from rag_assets.lib.query.cite import MAX_SOURCES
from rag_assets.lib.query.retrieve import Index

#: Where the questions about other topics keep their vectors: the per-user folder the graph uses.
VECTORS = day0_cache_dir()
#: The goal of issue 53, per folder.
MAX_OFF_TOPIC = 0.05
MIN_OWN_RATIO = 0.85


@dataclass(frozen=True)
class FolderSpec:
    """A folder to measure: its documents and its hand-written question set."""

    name: str
    documents: Path
    questions: Path


def prepare(root: Path, names: Sequence[str] | None = None) -> tuple[list[FolderSpec], dict]:
    """Assemble the registry's folders (or ``names``) under ``root``: (the folders, {name: why
    it was skipped})."""
    specs, skipped = [], {}
    for name in names or list(day0_folders.FOLDERS):
        try:
            docs = day0_folders.assemble(name, root / "documents")
            qdir = day0_folders.question_set(name, root / "questions")
        except (day0_folders.FolderUnavailable, day0_folders.SourceChanged) as e:
            skipped[name] = str(e)
            continue
        specs.append(FolderSpec(name, docs, qdir))
    return specs, skipped


def run(
    specs: Sequence[FolderSpec],
    root: Path,
    unrelated: Sequence[str],
    embedder: Any = None,
    max_bluff_rate: float = calibrate.DEFAULT_MAX_BLUFF_RATE,
    before: bool = True,
) -> dict[str, Any]:
    """Measure every folder of ``specs`` (indexes under ``root/indexes``, reused when there);
    ``before``: also the rule before issue 53, for the record (371 searches a folder)."""
    embedder = embedder or Embedder(resolve_model(None), batch_size=16)
    sets = {s.name: load_needle_set(s.questions) for s in specs}
    asked: dict[str, list[str]] = {  # what each folder contributes to the others' off-topic
        name: [q.text for qq in qs.questions for q in qq.query_list()]
        + [o.query for o in qs.out_of_domain]
        for name, qs in sets.items()
    }
    vectors = {
        name: np.asarray(embedder.encode_queries(texts), dtype=np.float32)
        for name, texts in {**asked, "unrelated": list(unrelated)}.items()
    }
    folders: list[dict[str, Any]] = []
    for spec in specs:
        built = index_folder(
            spec.documents, root / "indexes" / spec.name, chunk_strategy("E", 512), embedder
        )
        store = IndexStore(root / "indexes" / spec.name)
        index = Index(store, built.entry, embedder, None)
        _, refusal = evaluate_needles(index, sets[spec.name], ("hybrid",))
        if refusal is None:
            raise ValueError(f"{spec.name}: no question of its set is in its documents")
        own, ood = refusal.answerable, refusal.ood
        near = [q for q in ood if q.kind == "near"]
        off = np.concatenate(
            [index.nearest_distances(v) for n, v in vectors.items() if n != spec.name]
        )
        cuts = {
            "day-0": calibrate.choose_day0_cut(
                other_topics_distances(index, VECTORS), max_bluff_rate
            ),
            "hand": calibrate.choose_cut(calibrate.sweep(own, ood), max_bluff_rate=max_bluff_rate),
        }
        if before:
            cuts["before"] = _rule_before(index, max_bluff_rate)
        rows: dict[str, dict[str, Any]] = {}
        for label, choice in cuts.items():
            at = calibrate.sweep(own, near or ood, cuts=[choice.cut])[0]
            rows[label] = {
                "cut": choice.cut,
                "own": at.answered_correct,
                "own_any": at.answered_correct + at.answered_wrong,
                "near": at.bluffs_near + at.bluffs_unrelated,
                "off_topic": int((off < choice.cut).sum()),
                "reason": choice.reason,
            }
        day0, hand = rows["day-0"], rows["hand"]
        folders.append(
            {
                "name": spec.name,
                "licence": day0_folders.FOLDERS[spec.name].licence
                if spec.name in day0_folders.FOLDERS
                else "",
                "documents": len(index.documents),
                "chunks": built.entry.rows,
                "own_questions": len(own),
                "near_questions": len(near),
                "off_topic_questions": int(len(off)),
                "cuts": rows,
                "own_ratio": day0["own"] / hand["own"] if hand["own"] else None,
                "off_topic_share": day0["off_topic"] / len(off) if len(off) else 0.0,
            }
        )
    for f in folders:
        f["meets_goal"] = f["off_topic_share"] <= MAX_OFF_TOPIC and (
            f["own_ratio"] is None or f["own_ratio"] >= MIN_OWN_RATIO
        )
    return {
        "model": embedder.stamps("", "").model,
        "max_bluff_rate": max_bluff_rate,
        "unrelated_questions": len(unrelated),
        "folders": folders,
    }


def _rule_before(index: Index, max_bluff_rate: float) -> calibrate.Choice:
    """The ``unrelated-only`` cut before issue 53, for the record: the largest cut answering at
    most ``max_bluff_rate`` of the shipped everyday questions, lowered to the one bounding 150
    corpus sentences asked with their own document held out when that one exists."""
    shipped = questions_gen.unrelated_questions()
    index.embedder.prefetch_queries(shipped)  # one batch, not a forward pass each
    everyday = [
        calibrate.QueryDistances(
            f"u{i}", _dists(index.search(q, "hybrid", k=MAX_SOURCES)), frozenset(), "unrelated"
        )
        for i, q in enumerate(shipped)
    ]
    un = calibrate.choose_unrelated_cut(everyday, max_bluff_rate)
    docs = {
        d: {"text": r["text"], "title": r.get("title", ""), "headings": []}
        for d, r in index.documents.items()
    }
    pool = questions_gen.candidate_needles(docs)
    if len(pool) < 150:
        seen = {c.text for c in pool}
        for doc_id, d in sorted(docs.items()):
            for _, line in questions_gen.prose_lines(d["text"]):
                for _, s in questions_gen.sentences(line):
                    s = s.strip()
                    if len(s.split()) >= 4 and s not in seen:
                        seen.add(s)
                        pool.append(questions_gen.Needle(doc_id, s, 0, "", ""))
    held_out = []
    picked = questions_gen.sample_needles(pool, 150, 0)
    index.embedder.prefetch_queries([c.text for c in picked])
    for i, c in enumerate(picked):
        hits = index.search(c.text, "hybrid", k=10 * MAX_SOURCES)
        other = [h for h in hits if h.document_id != c.document][:MAX_SOURCES]
        if other:
            held_out.append(calibrate.QueryDistances(f"s{i}", _dists(other), frozenset(), "near"))
    if len(held_out) < calibrate.MIN_OOD_QUESTIONS:
        return un
    sq = calibrate.choose_unrelated_cut(held_out, max_bluff_rate)
    return sq if sq.satisfied and sq.cut < un.cut else un


def markdown(report: dict[str, Any], skipped: dict[str, str] | None = None) -> str:
    """The table of docs/measurements.md: per folder, the day-0 cut beside the hand cut."""
    lines = [
        f"model {report['model']}, RAG_MAX_BLUFF_RATE {report['max_bluff_rate']:g}; off-topic: "
        f"the other folders' questions and near misses and {report['unrelated_questions']} "
        "held-out unrelated questions",
        "",
        "| folder | docs | chunks | day-0 cut | own answered | near answered | off-topic "
        "answered | hand cut | own | near | off-topic | own, day-0 / hand | before: cut, "
        "off-topic |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in report["folders"]:
        d, h = f["cuts"]["day-0"], f["cuts"]["hand"]
        b = f["cuts"].get("before", {"cut": float("nan"), "off_topic": 0})
        n, m, o = f["own_questions"], f["near_questions"], f["off_topic_questions"]
        ratio = f"{f['own_ratio']:.2f}" if f["own_ratio"] is not None else "-"
        lines.append(
            f"| {f['name']} | {f['documents']} | {f['chunks']} | **{d['cut']:.3f}** | "
            f"{d['own']}/{n} | {d['near']}/{m} | **{d['off_topic']}/{o} "
            f"({d['off_topic'] / o:.1%})** | {h['cut']:.3f} | {h['own']}/{n} | {h['near']}/{m} "
            f"| {h['off_topic']}/{o} ({h['off_topic'] / o:.1%}) | {ratio} | {b['cut']:.3f}, "
            f"{b['off_topic']}/{o} ({b['off_topic'] / o:.1%}) |"
        )
    met = sum(1 for f in report["folders"] if f["meets_goal"])
    lines += [
        "",
        f"goal (off-topic <= {MAX_OFF_TOPIC:.0%}, own >= {MIN_OWN_RATIO:.0%} of the hand cut's):"
        f" {met} of {len(report['folders'])} folders",
    ]
    for name, why in (skipped or {}).items():
        lines.append(f"skipped {name}: {why}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag_assets.bench.day0", description=__doc__)
    ap.add_argument("root", type=Path, nargs="?", default=Path("~/.cache/rag-assets/bench-day0"))
    ap.add_argument("--folders", default="", help="comma-separated names (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out, text = bench(args.root, [n for n in args.folders.split(",") if n])
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


def bench(root: Path, names: Sequence[str] | None = None) -> tuple[dict[str, Any], str]:
    """Assemble, index and measure (``rag-assets bench --day0``): (the report, its table)."""
    root = Path(root).expanduser()
    specs, skipped = prepare(root, names)
    if not specs:
        raise SystemExit("no folder could be assembled: " + "; ".join(skipped.values()))
    report = run(specs, root, day0_folders.unrelated_test())
    report["skipped"] = skipped
    return report, markdown(report, skipped)


if __name__ == "__main__":
    sys.exit(main())
