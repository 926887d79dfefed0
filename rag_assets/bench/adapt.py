"""Measure the adapted encoder (issue 32): what it gains, what it costs, and what the step cap
costs in quality. Every training goes through the product's own code
(:mod:`rag_assets.lib.index.adapt`, :func:`rag_assets.lib.index.adapted.trained_folder`) and is
cached in ``WORK/adapt-cache/<key>`` (key = base model, recipe, pairs hash, seed), so a killed
or repeated run resumes; every evaluation is the product's own (``evaluate_needles``,
``evaluate_beir``, the calibrated refusal gate), on indexes cached in ``WORK/eval-cache``.

    python -m rag_assets.bench.adapt needles --documents ../shared/corpus/course \\
        --questions ../shared/eval/course-dev --work /tmp/adapt --out runs/adapt-course
    python -m rag_assets.bench.adapt beir --beir ../shared/beir/scifact --work /tmp/adapt \\
        --out runs/adapt-scifact
    python -m rag_assets.bench.adapt cost --documents ../shared/corpus/course --work /tmp/adapt \\
        --scale 10000,100000
    python -m rag_assets.bench.adapt cap --documents ../shared/corpus/course --work /tmp/adapt \\
        --steps 25,50,100,200

- ``needles``: adapt on the folder's chunks (no question used), then dense and hybrid
  R@1/R@4/R@20/MRR and answered-with-the-needle at the calibrated cut (≤ 10 % bluffs) for the
  base and the adapted model, in one run, with paired sign tests (hit@4, reciprocal rank,
  answered); ``OUT/base.json`` and ``OUT/adapted.json`` are ``rag-assets eval --json`` documents
  (``python -m rag_assets.bench.compare paired`` reads them).
- ``beir``: adapt on a BEIR corpus alone (its documents, no query), then nDCG@10 on its test
  queries, base and adapted, per-query nDCG kept, and the paired sign test.
- ``cost``: the training of the folder in a child process (its wall time and peak memory,
  ``ru_maxrss``; trained afresh, never from the cache), then for each ``--scale`` N a child
  that builds the pairs of N synthetic chunks (the folder's chunks, copied with every sentence
  made unique) and trains ``--probe-steps`` steps: seconds per step and peak memory at that
  size; the full training's time is projected from the product's step budget at that size (one
  epoch, at least 100, at most the cap; ``--steps`` sets the folder's training only) and
  without the cap.
- ``cap``: held-out self-retrieval MRR after each step count on one folder: what stopping at
  the cap costs where the uncapped training is affordable.
- ``train``: one training (what the children of ``cost`` run), as JSON.

``--device`` is ``RAG_DEVICE`` (``cuda`` trains on a GPU); ``--threads`` torch's threads while
training (default 2, the probe's). Nothing here is imported by the product.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rag_assets.lib.index.adapt import Recipe

DEFAULT_THREADS = 2
PROBE_STEPS = 5


def corpus_chunks(documents: Path, strategy_name: str = "E", target: int = 512) -> list[Any]:
    """The folder's chunks exactly as the graph makes them."""
    from rag_assets.lib.ingest.chunk import chunk_documents, strategy
    from rag_assets.lib.ingest.extract import extract_folder

    docs = extract_folder(documents).documents
    return chunk_documents([d for d in docs if d.ok], strategy(strategy_name, target))


def adapt(
    chunks: list[Any],
    work: Path,
    recipe: Recipe,
    *,
    device: str = "auto",
    threads: int = DEFAULT_THREADS,
    model: str | None = None,
    measure: bool = True,
) -> dict[str, Any]:
    """Train (or reuse the cached training of) ``chunks`` with ``recipe``; with ``measure`` the
    held-out self-retrieval MRR of the base and the adapted model. Returns a JSON-able dict."""
    from rag_assets.lib.evaluate.questions_gen import unrelated_questions
    from rag_assets.lib.index.adapt import build_pairs, held_out_measures
    from rag_assets.lib.index.adapted import ADAPTED_MARK, adaptation_key, trained_folder
    from rag_assets.lib.index.embed import Embedder, resolve_device, resolve_model

    base = resolve_model(model)
    torch_device = resolve_device(device)
    t = time.perf_counter()
    pairs = build_pairs(chunks, recipe)
    pairs_s = time.perf_counter() - t
    key = adaptation_key(base, recipe, pairs)
    model_id = f"{base.model_id}{ADAPTED_MARK}{key[:10]}"
    provenance = {
        "base_model": base.model_id,
        "base_revision": base.revision,
        "recipe": recipe.stamp,
        "recipe_params": recipe.params(),
        "pairs_hash": pairs.digest,
        "seed": recipe.seed,
        "key": key,
        "model_id": model_id,
        "counts": pairs.counts(),
        "steps": recipe.steps_for(len(pairs.pairs)),
    }
    folder, training, cached = trained_folder(
        base, pairs, recipe, work, model_id, provenance, torch_device, threads, _log
    )
    out: dict[str, Any] = {
        "chunks": len(chunks),
        **pairs.counts(),
        "pairs_seconds": round(pairs_s, 2),
        "steps": training.steps,
        "steps_per_epoch": -(-len(pairs.pairs) // recipe.batch_size),
        "train_seconds": training.seconds,
        "seconds_per_step": round(training.seconds / max(1, training.steps), 3),
        "final_loss": training.final_loss,
        "mean_loss": round(training.mean_loss, 4),
        "device": training.device,
        "threads": training.threads,
        "cached": cached,
        "folder": str(folder),
        "key": key,
        "recipe": recipe.stamp,
    }
    if measure and pairs.held_out:
        ordered = sorted(chunks, key=lambda c: c.chunk_id)
        for name, path in (("base", base.path), ("adapted", folder)):
            spec = resolve_model(str(path))
            emb = Embedder(spec, batch_size=16, threads=threads, device=device)
            sr, sep = held_out_measures(emb, ordered, pairs.held_out, unrelated_questions())
            out[f"self_mrr_{name}"] = round(sr.mrr, 4)
            if sep is not None:  # issue 44: what the gate's separation check compares
                out[f"separation_{name}"] = round(sep.answered, 4)
    return out


def _log(message: str) -> None:
    print(f"[adapt] {message}", file=sys.stderr, flush=True)


def needles(
    documents: Path,
    questions: Path,
    work: Path,
    out: Path,
    recipe: Recipe,
    *,
    device: str = "auto",
    threads: int = DEFAULT_THREADS,
    max_bluff_rate: float = 0.10,
) -> tuple[dict[str, Any], str]:
    """Adapt on ``documents``, then evaluate base and adapted on ``questions`` (see module)."""
    from rag_assets.bench.compare import paired
    from rag_assets.lib.evaluate import metrics
    from rag_assets.lib.evaluate.evaluate import evaluate_needles
    from rag_assets.lib.evaluate.questions import load_needle_set
    from rag_assets.lib.index.embed import Embedder, resolve_model
    from rag_assets.lib.index.pipeline import digest, index_folder
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.ingest.extract import scan_folder
    from rag_assets.lib.query.retrieve import Index

    trained = adapt(corpus_chunks(documents), work, recipe, device=device, threads=threads)
    qset = load_needle_set(questions)
    root = work / "eval-cache" / digest(scan_folder(documents))
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for name, path in (("base", None), ("adapted", trained["folder"])):
        emb = Embedder(resolve_model(path), batch_size=16, threads=threads, device=device)
        built = index_folder(documents, root, strategy("E"), emb, publish=False)
        index = Index(IndexStore(root), built.entry, emb, None)
        res, _ = evaluate_needles(
            index, qset, ["dense", "bm25", "hybrid"], strategy="E", max_bluff_rate=max_bluff_rate
        )
        res["adaptation"] = trained if name == "adapted" else None
        (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
        results[name] = res
    tests = {}
    for ret in ("dense", "hybrid"):
        rows, _ = paired([f"{out}/base.json:{ret}", f"{out}/adapted.json:{ret}"])
        tests[f"{ret} hit@4"] = rows[1]
        a, b = results["adapted"]["retrievers"][ret]["ranks"], results["base"]["retrievers"][ret]
        rr_a = {q: 1 / r if r else 0.0 for q, r in a.items()}
        rr_b = {q: 1 / r if r else 0.0 for q, r in b["ranks"].items()}
        qs = sorted(rr_a)
        t = metrics.sign_test([rr_a[q] > rr_b[q] for q in qs], [rr_a[q] < rr_b[q] for q in qs])
        tests[f"{ret} reciprocal rank"] = {"wins": t.wins, "losses": t.losses, "p": t.p}
    if all(results[n].get("refusal") for n in results):
        rows, _ = paired([f"{out}/base.json:refusal", f"{out}/adapted.json:refusal"])
        tests["answered at the cut"] = rows[1]
    summary = {"training": trained, "tests": tests, "out": str(out)}
    return summary, _needles_table(results, trained, tests)


def _needles_table(results: dict[str, Any], trained: dict[str, Any], tests: dict[str, Any]) -> str:
    def r(res: dict[str, Any], ret: str) -> str:
        x = res["retrievers"][ret]
        vals = [x[f"recall@{k}"]["value"] for k in (1, 4, 20)] + [x["mrr"]]
        return " / ".join(f"{v:.3f}" for v in vals)

    lines = [
        f"adapted: {trained['pairs']} pairs, {trained['steps']} steps, "
        f"{trained['train_seconds']:.0f} s on {trained['device']} ({trained['threads']} threads);"
        f" held-out self-MRR {trained.get('self_mrr_base', float('nan')):.3f} → "
        f"{trained.get('self_mrr_adapted', float('nan')):.3f}",
        "",
        "| | dense R@1 / R@4 / R@20 / MRR | hybrid R@1 / R@4 / R@20 / MRR | answered at the cut |",
        "|---|---|---|---|",
    ]
    for name, res in results.items():
        ref = res.get("refusal") or {}
        answerable = ref.get("answered", 0) + ref.get("answered_wrong", 0)
        answerable += ref.get("refused_answerable", 0)
        answered = (
            f"{ref['answered']}/{answerable} at {ref['bluffs']}/{ref['out_of_domain']} bluffs "
            f"(cut {ref['threshold']:.3f})"
            if ref
            else "no out-of-domain set"
        )
        lines.append(f"| {name} | {r(res, 'dense')} | {r(res, 'hybrid')} | {answered} |")
    lines += ["", "| paired (adapted vs base) | wins | losses | p |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['wins']} | {v['losses']} | {v['p']:.3g} |" for k, v in tests.items()]
    return "\n".join(lines)


def beir(
    folder: Path,
    work: Path,
    out: Path,
    recipe: Recipe,
    *,
    device: str = "auto",
    threads: int = DEFAULT_THREADS,
    retrievers: tuple[str, ...] = ("dense", "hybrid"),
) -> tuple[dict[str, Any], str]:
    """Adapt on a BEIR corpus alone (no query), then nDCG@10 base vs adapted (see module)."""
    from rag_assets.bench.compare import paired
    from rag_assets.lib.evaluate.beir import beir_documents, run_beir, whole_chunks
    from rag_assets.lib.evaluate.questions import load_beir
    from rag_assets.lib.index.embed import Embedder, resolve_model

    corpus = load_beir(folder).corpus
    chunks = whole_chunks(beir_documents(corpus))  # what the BEIR evaluation embeds
    trained = adapt(chunks, work, recipe, device=device, threads=threads)
    out.mkdir(parents=True, exist_ok=True)
    scores: dict[str, dict[str, float]] = {}
    for name, path in (("base", None), ("adapted", trained["folder"])):
        emb = Embedder(resolve_model(path), batch_size=16, threads=threads, device=device)
        res, _ = run_beir(folder, work / "eval-cache", emb, None, list(retrievers), None)
        res["adaptation"] = trained if name == "adapted" else None
        (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
        scores[name] = {r: res["retrievers"][r]["ndcg@10"] for r in retrievers}
    tests = {}
    for ret in retrievers:
        rows, _ = paired([f"{out}/base.json:{ret}", f"{out}/adapted.json:{ret}"])
        tests[ret] = rows[1]
    lines = [
        f"BEIR {folder.name}, adapted on its corpus alone: {trained['pairs']} pairs, "
        f"{trained['steps']} steps, {trained['train_seconds']:.0f} s on {trained['device']}",
        "",
        "| retriever | nDCG@10 base | nDCG@10 adapted | queries better | worse | p |",
        "|---|---|---|---|---|---|",
    ]
    for ret in retrievers:
        t = tests[ret]
        lines.append(
            f"| {ret} | {scores['base'][ret]:.4f} | {scores['adapted'][ret]:.4f} | {t['wins']} "
            f"| {t['losses']} | {t['p']:.3g} |"
        )
    return {"training": trained, "ndcg@10": scores, "tests": tests}, "\n".join(lines)


def synthetic_copies(chunks: list[Any], n: int) -> list[Any]:
    """``n`` chunks from the corpus's, copy ``k`` of each with every sentence made unique (the
    number ``k`` put before its final stop), so the pairs scale with the corpus."""
    from rag_assets.lib.types import Chunk, sha256_text

    out = []
    for i in range(n):
        c = chunks[i % len(chunks)]
        k = i // len(chunks)
        content = c.content if k == 0 else re.sub(r"([.!?])(?=\s|$)", f" {k}\\1", c.content)
        header = c.text[: len(c.text) - len(c.content)] if c.text.endswith(c.content) else ""
        cid = sha256_text(f"{c.chunk_id}|{k}")[:32]
        out.append(Chunk(cid, f"{c.document_id}#{k}", c.section, 0, len(content), content,
                         header + content))  # fmt: skip
    return out


def _child(args: list[str]) -> dict[str, Any]:
    """Run ``python -m rag_assets.bench.adapt ARGS --json`` in a child process; its JSON with
    the wall time and that child's own peak resident memory (``ru_maxrss`` from ``wait4``)."""
    import os
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rag_assets.bench.adapt", *args, "--json"],
            stdout=out,
            stderr=err,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            last = err.read().decode(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"child {args[0]} failed: {last}")
        result = dict(json.loads(out.read().decode()))
    result["peak_rss_mb"] = round(usage.ru_maxrss / 1024, 1)  # KiB on Linux
    result["wall_seconds"] = round(wall, 1)
    return result


def cost(
    documents: Path,
    work: Path,
    recipe: Recipe,
    scales: list[int],
    *,
    probe_steps: int = PROBE_STEPS,
    device: str = "auto",
    threads: int = DEFAULT_THREADS,
    full: bool = True,
) -> tuple[dict[str, Any], str]:
    """Training time and peak memory on the folder, and at each scale (see module). Each child
    trains afresh in ``WORK/cost`` (emptied first): a cached training would measure nothing."""
    import shutil

    fresh = work / "cost"
    common = ["--work", str(fresh), "--device", device, "--threads", str(threads)]
    rows: list[dict[str, Any]] = []
    corpus = len(corpus_chunks(documents))
    if full:
        shutil.rmtree(fresh, ignore_errors=True)
        r = _child(["train", "--documents", str(documents), *common, *_recipe_args(recipe)])
        rows.append({"what": f"the folder ({corpus} chunks), full training", **r})
    for n in sorted(scales):
        probe = replace(recipe, steps=probe_steps, max_epochs=float(probe_steps))  # timed as is
        args = ["train", "--documents", str(documents), "--synthetic", str(n), "--no-measure"]
        shutil.rmtree(fresh, ignore_errors=True)
        r = _child([*args, *common, *_recipe_args(probe)])
        pairs = int(r["pairs"])
        steps = replace(recipe, steps=0).steps_for(pairs)  # the product's budget at this size
        epoch = -(-pairs // recipe.batch_size)
        uncapped = replace(recipe, steps=0, max_steps=10**9).steps_for(pairs)
        rows.append(
            {
                "what": f"{n} synthetic chunks, {probe_steps} steps timed",
                **r,
                "budget_steps": steps,
                "uncapped_steps": uncapped,
                "epochs_trained": round(steps / max(1, epoch), 3),
                "projected_train_minutes": round(steps * r["seconds_per_step"] / 60, 1),
                "projected_uncapped_minutes": round(uncapped * r["seconds_per_step"] / 60, 1),
            }
        )
    lines = [
        f"adapt cost: {recipe.stamp} (cap {recipe.max_steps} steps), {threads} threads, "
        f"device {device}",
        "",
        "| corpus | pairs | steps per epoch | s/step | steps (budget) | training min "
        "| uncapped min | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        budget_steps = r.get("budget_steps", r["steps"])
        minutes = r.get("projected_train_minutes", round(r["train_seconds"] / 60, 1))
        lines.append(
            f"| {r['what']} | {r['pairs']} | {r['steps_per_epoch']} | {r['seconds_per_step']} "
            f"| {budget_steps} | {minutes} | {r.get('projected_uncapped_minutes', minutes)} "
            f"| {r['peak_rss_mb']} |"
        )
    return {"rows": rows}, "\n".join(lines)


def cap(
    documents: Path,
    work: Path,
    recipe: Recipe,
    steps: list[int],
    *,
    device: str = "auto",
    threads: int = DEFAULT_THREADS,
) -> tuple[dict[str, Any], str]:
    """Held-out self-retrieval MRR after each step count (see module)."""
    chunks = corpus_chunks(documents)
    rows = []
    for n in sorted(steps):
        exact = replace(recipe, steps=n, max_steps=max(n, recipe.max_steps), max_epochs=float(n))
        r = adapt(chunks, work, exact, device=device, threads=threads)  # past the epoch bound
        rows.append({"steps": n, "epochs": round(n / max(1, r["steps_per_epoch"]), 3), **r})
    lines = [
        f"the step cap's cost in quality on {documents} ({len(chunks)} chunks)",
        "",
        "| steps | epochs | held-out self-MRR base | adapted | train s |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['steps']} | {r['epochs']} | {r.get('self_mrr_base', float('nan')):.3f} "
        f"| {r.get('self_mrr_adapted', float('nan')):.3f} | {r['train_seconds']:.0f} |"
        for r in rows
    ]
    return {"rows": rows}, "\n".join(lines)


def _recipe_args(recipe: Recipe) -> list[str]:
    return ["--steps", str(recipe.steps), "--max-steps", str(recipe.max_steps),
            "--seed", str(recipe.seed)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag_assets.bench.adapt", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    parsers = {
        "needles": sub.add_parser("needles", help="course-dev / pdf-dev: base beside adapted"),
        "beir": sub.add_parser("beir", help="a BEIR set: nDCG@10 base beside adapted"),
        "cost": sub.add_parser("cost", help="training time and peak memory, scaled"),
        "cap": sub.add_parser("cap", help="held-out self-MRR after each step count"),
        "train": sub.add_parser("train", help="one training, as JSON"),
    }
    for name, p in parsers.items():
        p.add_argument("--work", type=Path, required=True, help="caches: trainings, indexes")
        p.add_argument("--device", default="auto", help="RAG_DEVICE: auto, cpu, cuda, cuda:N")
        p.add_argument("--threads", type=int, default=DEFAULT_THREADS)
        p.add_argument("--max-steps", type=int, default=Recipe().max_steps, help="the cap")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--json", action="store_true")
        if name != "cap":
            p.add_argument("--steps", type=int, default=0, help="0 = one epoch, at least 100")
        if name != "beir":
            p.add_argument("--documents", type=Path, required=True)
    parsers["needles"].add_argument("--questions", type=Path, required=True)
    parsers["needles"].add_argument("--out", type=Path, required=True)
    parsers["beir"].add_argument("--beir", type=Path, required=True, help="a BEIR folder")
    parsers["beir"].add_argument("--out", type=Path, required=True)
    parsers["cost"].add_argument("--scale", default="10000,100000", help="synthetic chunks")
    parsers["cost"].add_argument("--probe-steps", type=int, default=PROBE_STEPS)
    parsers["cost"].add_argument("--no-full", action="store_true", help="skip the folder's run")
    parsers["cap"].add_argument("--steps", default="25,50,100,200", help="step counts")
    parsers["train"].add_argument("--synthetic", type=int, default=0, help="N synthetic chunks")
    parsers["train"].add_argument("--no-measure", action="store_true", help="no held-out MRR")
    args = ap.parse_args(argv)
    steps = 0 if args.cmd == "cap" else args.steps
    recipe = replace(Recipe(), steps=steps, max_steps=args.max_steps, seed=args.seed)
    run = {"device": args.device, "threads": args.threads}
    try:
        if args.cmd == "needles":
            out, text = needles(args.documents, args.questions, args.work, args.out, recipe, **run)
        elif args.cmd == "beir":
            out, text = beir(args.beir, args.work, args.out, recipe, **run)
        elif args.cmd == "cost":
            scales = [int(x) for x in args.scale.split(",") if x.strip()]
            full = not args.no_full
            out, text = cost(
                args.documents, args.work, recipe, scales, probe_steps=args.probe_steps, full=full,
                **run,
            )  # fmt: skip
        elif args.cmd == "cap":
            counts = [int(x) for x in args.steps.split(",") if x.strip()]
            out, text = cap(args.documents, args.work, recipe, counts, **run)
        else:
            chunks = corpus_chunks(args.documents)
            if args.synthetic:
                chunks = synthetic_copies(chunks, args.synthetic)
            out = adapt(chunks, args.work, recipe, measure=not args.no_measure, **run)
            text = json.dumps(out, indent=1)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1, default=str) if args.json else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
