"""Compare runs across models and fusion choices, and measure encoder cost side by side.

``rag-assets eval --json`` keeps per-query needle ranks (and, for BEIR, per-query nDCG@10), so two
runs over the same question set can be compared query by query even when they were made with
different models or ``RAG_FUSION`` settings::

    python -m rag_assets.bench.compare paired BASE.json:hybrid OTHER.json:dense ...

prints each system against the first (exact two-sided sign test on hit@4 for needle sets, on
per-query nDCG@10 for BEIR: a query counts as a win when it is strictly better).
``FILE.json:refusal`` compares the calibrated gates instead: answerable questions answered with
the needle (win = answered correctly where the baseline was not) and, beside it, the bluffs on
out-of-domain questions (fewer = refused where the baseline bluffed), each with its sign test.

    python -m rag_assets.bench.compare fusions --documents DIR --questions DIR --out DIR \
        --fusions rrf,rrf:dense=2,rrf:depth=20

builds (or reuses, from the same cache as ``rag-assets eval``) one index with the configured
model (RAG_EMBEDDING_MODEL, RAG_EMBED_DIMS, prompts), loads the model once, and writes one eval
JSON per fusion choice (``OUT/<fusion>.json``; dense and BM25 are scored in the first only).
``--beir DIR`` does the same for a BEIR set (per-query nDCG@10 kept).

    python -m rag_assets.bench.compare cost --documents DIR MODEL_DIR [MODEL_DIR ...]

encodes the same chunks with each model in turn (interleaved rounds, so that a busy machine
slows them alike) and reports chunks/s, the window and word-pieces per chunk. "" or
``minilm`` = the packaged all-MiniLM-L6-v2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_assets.lib.evaluate import metrics

PAIRED_K = 4  # hit@4, as the eval's own paired table (the gate keeps at most 4 sources)
COST_SAMPLE = 96  # chunks encoded per model per round: enough for a stable rate, cheap on 2 cores
COST_ROUNDS = 2


def load_system(spec: str) -> tuple[str, dict[str, Any], str]:
    """``FILE.json:retriever`` → (label, per-query values, kind "needle" | "beir")."""
    path, _, retriever = spec.rpartition(":")
    if not path:
        raise ValueError(f"{spec!r}: expected FILE.json:retriever, e.g. run.json:hybrid")
    data = json.loads(Path(path).read_text())
    if retriever == "refusal":  # the calibrated gate's per-query outcomes
        ref = data.get("refusal") or {}
        if "outcomes" not in ref:
            raise ValueError(f"{path} has no per-query refusal outcomes (re-run the eval --json)")
        o = ref["outcomes"]
        values = {q: v for q, v in o["answerable"].items()}
        values.update({f"ood:{q}": v for q, v in o["out_of_domain"].items()})
        return f"{Path(path).stem}:refusal", values, "refusal"
    rets = data.get("retrievers", {})
    if retriever not in rets:
        raise ValueError(f"{path} has no retriever {retriever!r} (it has {sorted(rets)})")
    r = rets[retriever]
    label = f"{Path(path).stem}:{retriever}"
    if "ranks" in r:
        return label, dict(r["ranks"]), "needle"
    if "per_query_ndcg@10" in r:
        return label, dict(r["per_query_ndcg@10"]), "beir"
    raise ValueError(f"{spec}: no per-query ranks or nDCG in it (re-run the eval with --json)")


def paired(specs: Sequence[str], k: int = PAIRED_K) -> tuple[list[dict[str, Any]], str]:
    """Every system against the first: the mean metric, wins/losses and the sign test's p."""
    systems = [load_system(s) for s in specs]
    kinds = {kind for _, _, kind in systems}
    if len(kinds) != 1:
        raise ValueError("cannot compare different kinds of run (needle ranks, BEIR nDCG, refusal)")
    kind = kinds.pop()
    base_label, base, _ = systems[0]
    rows: list[dict[str, Any]] = []
    for label, values, _ in systems:
        if sorted(values) != sorted(base):
            raise ValueError(f"{label} answered other queries than {base_label}")
        qids = sorted(base)
        if kind == "refusal":  # answerable: answered with the needle; out-of-domain: bluffed
            ans = [q for q in qids if not q.startswith("ood:")]
            ood = [q for q in qids if q.startswith("ood:")]
            a = [values[q] == "correct" for q in ans]
            b = [base[q] == "correct" for q in ans]
            mean = sum(a) / len(a) if a else 0.0
            bluff = metrics.sign_test(
                [base[q] == "bluff" and values[q] != "bluff" for q in ood],
                [values[q] == "bluff" and base[q] != "bluff" for q in ood],
            )
            extra = {
                "bluffs": sum(values[q] == "bluff" for q in ood),
                "out_of_domain": len(ood),
                "bluff_wins": bluff.wins,
                "bluff_losses": bluff.losses,
                "bluff_p": bluff.p,
            }
        elif kind == "needle":
            a = [values[q] is not None and values[q] <= k for q in qids]
            b = [base[q] is not None and base[q] <= k for q in qids]
            mean = sum(a) / len(a)
        else:
            a = [values[q] > base[q] for q in qids]
            b = [values[q] < base[q] for q in qids]
            mean = statistics.fmean(values[q] for q in qids)
        test = metrics.sign_test(a, b)
        rows.append(
            {
                "system": label,
                "baseline": base_label,
                "metric": {"needle": f"hit@{k}", "beir": "ndcg@10"}.get(kind, "answered"),
                "mean": round(mean, 4),
                "wins": test.wins,
                "losses": test.losses,
                "p": test.p,
                "queries": len(qids),
                **(extra if kind == "refusal" else {}),
            }
        )
    metric = rows[0]["metric"] if rows else ""
    lines = [
        f"paired vs {base_label} ({metric}, exact two-sided sign test)",
        "",
        f"| system | {metric} | wins | losses | p |",
        "|---|---|---|---|---|",
    ]
    if kind == "refusal":
        lines[2] = "| system | answered | wins | losses | p | bluffs | fewer | more | p |"
        lines[3] = "|---|---|---|---|---|---|---|---|---|"
        lines += [
            f"| {r['system']} | {r['mean']:.3f} | {r['wins']} | {r['losses']} | {r['p']:.3g} "
            f"| {r['bluffs']}/{r['out_of_domain']} | {r['bluff_wins']} | {r['bluff_losses']} "
            f"| {r['bluff_p']:.3g} |"
            for r in rows
        ]
        return rows, "\n".join(lines)
    lines += [
        f"| {r['system']} | {r['mean']:.3f} | {r['wins']} | {r['losses']} | {r['p']:.3g} |"
        for r in rows
    ]
    return rows, "\n".join(lines)


def cost(
    documents: Path,
    models: Sequence[str],
    *,
    strategy_name: str = "E",
    target: int = 512,
    sample: int = COST_SAMPLE,
    rounds: int = COST_ROUNDS,
    batch_size: int = 16,
    threads: int | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """chunks/s of each model on the same ``sample`` chunks (every n-th chunk of the corpus),
    median over ``rounds`` interleaved rounds; plus window and word-pieces per chunk."""
    from rag_assets.lib.index.embed import Embedder, resolve_model
    from rag_assets.lib.ingest.chunk import chunk_documents, strategy
    from rag_assets.lib.ingest.extract import extract_folder

    chunks = chunk_documents(extract_folder(documents).documents, strategy(strategy_name, target))
    step = max(1, len(chunks) // sample)
    texts = [c.text for c in chunks[::step][:sample]]
    all_texts = [c.text for c in chunks]
    embs = []
    for m in models:
        spec = resolve_model(None if m in ("", "minilm") else m)
        e = Embedder(spec, batch_size=batch_size, threads=threads)
        _ = e.model  # loading is not part of the rate
        e.encode(texts[:4])  # warm-up
        embs.append(e)
    times: list[list[float]] = [[] for _ in embs]
    for _ in range(rounds):
        for i, e in enumerate(embs):
            t = time.perf_counter()
            e.encode(texts)
            times[i].append(time.perf_counter() - t)
    rows: list[dict[str, Any]] = []
    for e, ts in zip(embs, times, strict=True):
        counts = e.token_counts(all_texts, e.spec.document_prompt)
        rate = len(texts) / statistics.median(ts)
        rows.append(
            {
                "model": e.spec.model_id,
                "dims": e.spec.dims,
                "chunks_per_s": round(rate, 2),
                "window": e.max_seq_length,
                "wordpieces_p50": int(statistics.median(counts)),
                "wordpieces_max": max(counts),
                "chunks_over_window": sum(n > e.max_seq_length for n in counts),
                "corpus_chunks": len(all_texts),
                "est_corpus_s": round(len(all_texts) / rate, 1),
            }
        )
    base = rows[0]["chunks_per_s"] if rows else 1.0
    lines = [
        f"{len(texts)} of {len(all_texts)} chunks ({strategy_name}, target {target}), "
        f"median of {rounds} interleaved rounds, batch {batch_size}",
        "",
        "| model | dims | chunks/s | vs first | window | word-pieces p50 / max | over window "
        "| corpus est. s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['dims']} | {r['chunks_per_s']} | {r['chunks_per_s'] / base:.2f}x "
        f"| {r['window']} | {r['wordpieces_p50']} / {r['wordpieces_max']} "
        f"| {r['chunks_over_window']} | {r['est_corpus_s']} |"
        for r in rows
    ]
    return rows, "\n".join(lines)


def fusions(
    settings: Any,
    specs: Sequence[str],
    out: Path,
    *,
    documents: Path | None = None,
    questions: Path | None = None,
    beir: Path | None = None,
    cache: Path | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """One eval JSON per fusion choice over one index and one loaded model (see module doc)."""
    from rag_assets.lib.evaluate.evaluate import evaluate_beir, evaluate_needles
    from rag_assets.lib.evaluate.questions import load_beir, load_needle_set
    from rag_assets.lib.index.endpoint import configured_embedder
    from rag_assets.lib.index.pipeline import digest, index_folder
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.ingest.extract import scan_folder
    from rag_assets.lib.query.fusion import parse_fusion
    from rag_assets.lib.query.retrieve import Index

    choices = [parse_fusion(f) for f in specs]  # a bad one fails before any work
    embedder = configured_embedder(settings)  # issue 35: RAG_EMBED_URL: the model server's
    cache = cache or Path(settings.work_dir) / "eval-cache"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if beir is not None:
        from rag_assets.lib.evaluate.beir import WHOLE_PIPELINE, beir_documents, whole_chunks
        from rag_assets.lib.index.pipeline import embed_chunks

        bset = load_beir(beir)
        docs = beir_documents(bset.corpus)
        store = IndexStore(Path(cache) / f"beir-{beir.name}-{digest(sorted(bset.corpus))[:12]}")
        stamps = embedder.stamps(WHOLE_PIPELINE, "beir-1")
        _, entry = embed_chunks(store, stamps, whole_chunks(docs), docs, embedder)
    else:
        if documents is None or questions is None:
            raise ValueError("fusions: give --documents and --questions, or --beir")
        qset = load_needle_set(questions)
        strat = strategy(settings.chunk_strategy, settings.chunk_target)
        root = Path(cache) / digest(scan_folder(documents))
        built = index_folder(documents, root, strat, embedder, publish=False)
        store, entry = IndexStore(root), built.entry
    build_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    for i, fusion in enumerate(choices):
        index = Index(store, entry, embedder, None, settings.cut_override, fusion)
        retrievers = ["dense", "bm25", "hybrid"] if i == 0 else ["hybrid"]
        t = time.perf_counter()
        if beir is not None:
            res = evaluate_beir(index, bset, retrievers)
        else:
            res, _ = evaluate_needles(
                index, qset, retrievers, max_bluff_rate=settings.max_bluff_rate
            )
        res.update(
            {
                "fusion": fusion.label,
                "model": entry.stamps.model,
                "stamps": entry.stamps.as_dict(),
                "table": entry.table,
                "build_s": round(build_s, 1),
                "eval_s": round(time.perf_counter() - t, 1),
            }
        )
        name = re.sub(r"[^A-Za-z0-9]+", "_", fusion.label).strip("_")
        path = out / f"{name}.json"
        path.write_text(json.dumps(res, indent=1, default=str))
        h = res["retrievers"]["hybrid"]
        rows.append(
            {
                "fusion": fusion.label,
                "file": str(path),
                "hybrid": h["ndcg@10"] if beir is not None else h["recall@4"]["value"],
            }
        )
    metric = "nDCG@10" if beir is not None else "R@4"
    lines = [f"| fusion | hybrid {metric} | file |", "|---|---|---|"]
    lines += [f"| {r['fusion']} | {r['hybrid']:.3f} | {r['file']} |" for r in rows]
    return rows, "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag_assets.bench.compare", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("paired", help="sign tests of runs against the first")
    p.add_argument("systems", nargs="+", help="FILE.json:retriever (first = baseline)")
    p.add_argument("--json", action="store_true")
    f = sub.add_parser("fusions", help="one index, one eval JSON per RAG_FUSION choice")
    f.add_argument("--documents", type=Path)
    f.add_argument("--questions", type=Path)
    f.add_argument("--beir", type=Path)
    f.add_argument("--fusions", default="rrf,rrf:dense=2,rrf:dense=3,rrf:depth=20")
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--cache", type=Path)
    f.add_argument("--json", action="store_true")
    c = sub.add_parser("cost", help="chunks/s per model on the same chunks")
    c.add_argument("--documents", type=Path, required=True)
    c.add_argument("models", nargs="+", help="local model directories (minilm = packaged)")
    c.add_argument("--strategy", default="E")
    c.add_argument("--target", type=int, default=512)
    c.add_argument("--sample", type=int, default=COST_SAMPLE)
    c.add_argument("--rounds", type=int, default=COST_ROUNDS)
    c.add_argument("--threads", type=int, default=0)
    c.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "paired":
            rows, text = paired(args.systems)
        elif args.cmd == "fusions":
            from rag_assets.settings import Settings

            rows, text = fusions(
                Settings.from_env(os.environ),
                _split_fusions(args.fusions),
                args.out,
                documents=args.documents,
                questions=args.questions,
                beir=args.beir,
                cache=args.cache,
            )
        else:
            rows, text = cost(
                args.documents,
                args.models,
                strategy_name=args.strategy,
                target=args.target,
                sample=args.sample,
                rounds=args.rounds,
                threads=args.threads or None,
            )
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else text)
    return 0


def _split_fusions(text: str) -> list[str]:
    """ "rrf,rrf:dense=2,bm25=0.5,dense" → ["rrf", "rrf:dense=2,bm25=0.5", "dense"]: a part
    with "=" but no ":" continues the previous choice's options."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" in part and ":" not in part and out:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
