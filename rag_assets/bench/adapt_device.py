"""The adaptation measurements that need no index (issue 44), on a machine that has only torch and
sentence-transformers (a lent GPU machine): the step curve, the floor of automatic adaptation,
BEIR's nDCG@10 before and after, and the training's cost at 1k, 10k and 100k chunks.

    python -m rag_assets.bench.adapt_device prepare --out .devwork/adapt   # here: the bundle
    python -m rag_assets.bench.adapt_device run --bundle .devwork/adapt --out OUT --device cuda

``prepare`` writes what the other machine cannot make: the course and PDF corpora's chunks exactly
as the graph makes them (extraction needs pymupdf), their question sets, the two BEIR folders and
the base model with its weights in fp16 (the machine's working tree is limited to 64 MiB; ``run``
widens them back to fp32 before anything is trained, so the base differs from the packaged one
by fp16 rounding only). Every training goes through the product's own code
(:func:`rag_assets.bench.adapt.adapt`: the recipe, the pairs, the held-out self-retrieval and the
separation, the gate's :func:`~rag_assets.lib.index.adapted.decide`). Retrieval is dense and
exact (every chunk scored in numpy), so the figures are the dense retriever's, not hybrid's;
needles are ranked by the product's ``needle_rank`` in the top 20 chunks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from rag_assets.bench.adapt import adapt, synthetic_copies
from rag_assets.lib.index.adapt import Recipe

CORPORA = {"course": ("corpus/course", "eval/course-dev"), "pdf": ("corpus/pdf", "eval/pdf-dev")}
STEPS = [25, 50, 100, 200, 400]
SCALES = [1000, 10_000, 100_000]
TOP_K = 20


def prepare(shared: Path, out: Path) -> None:
    """The bundle ``run`` reads (see module)."""
    from rag_assets.bench.adapt import corpus_chunks
    from rag_assets.lib.index.embed import resolve_model

    out.mkdir(parents=True, exist_ok=True)
    for name, (docs, qs) in CORPORA.items():
        chunks = corpus_chunks(shared / docs)
        (out / f"{name}.chunks.json").write_text(json.dumps([asdict(c) for c in chunks]))
        shutil.copy(shared / qs / "questions.jsonl", out / f"{name}.questions.jsonl")
    for beir in ("scifact", "nfcorpus"):
        shutil.copytree(shared / "beir" / beir, out / "beir" / beir, dirs_exist_ok=True)
    base = Path(resolve_model(None).path)
    model = out / "model"
    shutil.copytree(base, model, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors"))
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(base / "model.safetensors"))
    save_file({k: v.to(torch.float16) for k, v in weights.items()}, str(model / "fp16.safetensors"))


def _model(bundle: Path) -> str:
    """The base model widened back to fp32 in a folder of its own."""
    import torch
    from safetensors.torch import load_file, save_file

    dest = Path("/tmp/adapt-device-model")
    if not (dest / "model.safetensors").is_file():
        shutil.copytree(bundle / "model", dest, dirs_exist_ok=True)
        half = load_file(str(dest / "fp16.safetensors"))
        wide = {k: v.to(torch.float32) for k, v in half.items()}
        save_file(wide, str(dest / "model.safetensors"))
        (dest / "fp16.safetensors").unlink()
    return str(dest)


def _chunks(path: Path) -> list[Any]:
    from rag_assets.lib.types import Chunk

    return [Chunk(**d) for d in json.loads(path.read_text())]


def _questions(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dense_needles(
    model: str, chunks: list[Any], questions: list[dict[str, Any]], device: str
) -> dict[str, float]:
    """Dense R@1/R@4/R@20 and MRR of the needle questions over ``chunks`` (exact search)."""
    from rag_assets.lib.evaluate.metrics import needle_rank
    from rag_assets.lib.index.embed import Embedder, resolve_model

    emb = Embedder(resolve_model(model), batch_size=64, device=device)
    corpus = emb.encode([c.text for c in chunks])
    asked = [(q, text) for q in questions for _, text in sorted(q["queries"].items())]
    if not asked:
        return {}
    scores = emb.encode_queries([t for _, t in asked]) @ corpus.T
    ranks = []
    for j, (q, _) in enumerate(asked):
        top = np.argsort(-scores[j], kind="stable")[:TOP_K]
        collapse = str(q["document"]).lower().endswith(".pdf")  # as PDF needles are written
        ranks.append(needle_rank([chunks[i].content for i in top], q["needle"], collapse))
    rr = [1 / r if r else 0.0 for r in ranks]
    out = {f"R@{k}": float(np.mean([bool(r and r <= k) for r in ranks])) for k in (1, 4, 20)}
    return out | {"MRR": float(np.mean(rr)), "queries": len(asked)}


def _train(
    chunks: list[Any], work: Path, recipe: Recipe, device: str, model: str
) -> dict[str, Any]:
    from rag_assets.lib.index.adapted import decide

    r = adapt(chunks, work, recipe, device=device, threads=4, model=model)
    if "self_mrr_base" in r:
        measured = {"base": {"mrr": r["self_mrr_base"]}, "adapted": {"mrr": r["self_mrr_adapted"]}}
        if "separation_base" in r:
            n = r["held_out"]
            measured["separation"] = {
                "base": {"answered": r["separation_base"], "held_out": n, "unrelated": 221},
                "adapted": {"answered": r["separation_adapted"], "held_out": n},
            }
        r["decision"] = decide(measured, bool(r["held_out"]))[0]
    return r


def run(bundle: Path, out: Path, device: str, parts: list[str]) -> dict[str, Any]:
    model = _model(bundle)
    work = Path("/tmp/adapt-device-work")
    results: dict[str, Any] = {"device": device, "started": time.strftime("%FT%TZ", time.gmtime())}
    if device.startswith("cuda"):
        import torch

        results["gpu"] = torch.cuda.get_device_name(0)
    course = _chunks(bundle / "course.chunks.json")
    course_q = _questions(bundle / "course.questions.jsonl")
    if "gpu-test" in parts:  # the suite's CUDA test, without its index imports
        from rag_assets.lib.index.adapt import build_pairs, train_encoder
        from rag_assets.lib.index.embed import resolve_model

        tiny = Recipe(steps=3, batch_size=4, train_max_length=64)
        t = train_encoder(resolve_model(model), build_pairs(course[:40], tiny), tiny,
                          work / "gpu-test", model_id="x@adapted-test", provenance={},
                          device=device)  # fmt: skip
        ok = t.device.startswith("cuda") and all(np.isfinite(t.loss_curve))
        results["gpu_test"] = {"ok": bool(ok), **t.as_dict()}
        _emit(results, out)
    if "steps" in parts:  # the step curve: what more training does, and why it is bounded
        base_q = dense_needles(model, course, course_q, device)
        rows = [{"steps": 0, "questions": base_q}]
        for n in STEPS:
            exact = replace(Recipe(), steps=n, max_steps=max(n, 500), max_epochs=float(n))
            r = _train(course, work, exact, device, model)
            r["questions"] = dense_needles(r["folder"], course, course_q, device)
            rows.append({"steps": n, **r})
            _emit(results | {"step_curve": rows}, out)
        results["step_curve"] = rows
    if "floor" in parts:  # automatic adaptation's floor: corpora of growing size
        rows = []
        for name in CORPORA:
            chunks = _chunks(bundle / f"{name}.chunks.json")
            qs = _questions(bundle / f"{name}.questions.jsonl")
            docs = sorted({c.document_id for c in chunks})
            for k in sorted({1, 2, 3, 4, 6, 8, len(docs)}):
                if k > len(docs):
                    continue
                keep = set(docs[:k])
                sub = [c for c in chunks if c.document_id in keep]
                sub_q = [q for q in qs if q["document"] in keep]
                r = _train(sub, work, Recipe(), device, model)
                r["questions_base"] = dense_needles(model, sub, sub_q, device)
                r["questions_adapted"] = dense_needles(r["folder"], sub, sub_q, device)
                rows.append({"corpus": name, "documents": k, **r})
                _emit(results | {"floor": rows}, out)
        results["floor"] = rows
    if "beir" in parts:
        results["beir"] = {}
        for name in ("scifact", "nfcorpus"):
            results["beir"][name] = beir_dense(bundle / "beir" / name, work, device, model)
            _emit(results, out)
    if "cost" in parts:
        results["cost"] = cost(course, work, device, model)
    _emit(results, out)
    return results


def beir_dense(folder: Path, work: Path, device: str, model: str) -> dict[str, Any]:
    """Adapt on the BEIR corpus alone, then dense nDCG@10 (exact) of its test queries."""
    from rag_assets.lib.evaluate.beir import beir_documents, whole_chunks
    from rag_assets.lib.evaluate.metrics import ndcg_at_k
    from rag_assets.lib.evaluate.questions import load_beir
    from rag_assets.lib.index.embed import Embedder, resolve_model

    beir = load_beir(folder)
    chunks = whole_chunks(beir_documents(beir.corpus))
    r = _train(chunks, work, Recipe(), device, model)
    ids = [c.document_id for c in chunks]
    qids = sorted(beir.qrels)
    per_query: dict[str, list[float]] = {}
    for name, path in (("base", model), ("adapted", r["folder"])):
        emb = Embedder(resolve_model(path), batch_size=128, device=device)
        corpus = emb.encode([c.text for c in chunks])
        scores = emb.encode_queries([beir.queries[q] for q in qids]) @ corpus.T
        per_query[name] = [
            ndcg_at_k([ids[i] for i in np.argsort(-scores[j], kind="stable")[:10]], beir.qrels[q])
            for j, q in enumerate(qids)
        ]
    b, a = np.array(per_query["base"]), np.array(per_query["adapted"])
    return r | {
        "ndcg@10_base": float(b.mean()),
        "ndcg@10_adapted": float(a.mean()),
        "queries_better": int((a > b).sum()),
        "queries_worse": int((a < b).sum()),
        "queries": len(qids),
    }


def cost(chunks: list[Any], work: Path, device: str, model: str) -> list[dict[str, Any]]:
    """Seconds per step and peak GPU memory of the product's recipe at each scale (5 steps
    timed after one of warm-up), and the training's projected time at the product's budget."""
    import torch

    from rag_assets.lib.index.adapt import build_pairs, train_encoder
    from rag_assets.lib.index.embed import resolve_model

    rows = []
    for n in SCALES:
        t0 = time.perf_counter()
        pairs = build_pairs(synthetic_copies(chunks, n), Recipe())
        pairs_s = time.perf_counter() - t0
        probe = replace(Recipe(), steps=6, max_epochs=6.0)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        stamps: list[float] = []
        train_encoder(resolve_model(model), pairs, probe, work / f"cost-{n}",
                      model_id="x@adapted-cost", provenance={}, device=device, threads=4,
                      progress=lambda *_, s=stamps: s.append(time.perf_counter()))  # fmt: skip
        per_step = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        budget = Recipe().steps_for(len(pairs.pairs))
        row = {
            "chunks": n,
            "pairs": len(pairs.pairs),
            "pairs_seconds": round(pairs_s, 1),
            "seconds_per_step": round(per_step, 4),
            "budget_steps": budget,
            "projected_train_seconds": round(budget * per_step, 1),
        }
        if device.startswith("cuda"):
            row["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
        rows.append(row)
        shutil.rmtree(work / f"cost-{n}", ignore_errors=True)
    return rows


def _emit(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    slim = json.loads(json.dumps(results, default=str))
    (out / "adapt_device.json").write_text(json.dumps(slim, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag_assets.bench.adapt_device")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    p.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--parts", default="gpu-test,steps,floor,beir,cost")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.shared, args.out)
        return 0
    res = run(args.bundle, args.out, args.device, args.parts.split(","))
    print(json.dumps(res, default=str)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
