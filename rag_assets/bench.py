"""``rag-assets bench``: speed measured side by side in one run, reported as ratios.

The machines are noisy (2 shared cores), so every figure that matters is a ratio of two
things timed in the same process a moment apart, never an absolute threshold.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings


def run_bench(
    documents: Path, n_queries: int, settings: Settings, questions: Path | None = None
) -> tuple[dict[str, Any], str]:
    from rag_assets.lib.chunk import chunk_documents
    from rag_assets.lib.chunk import strategy as chunk_strategy
    from rag_assets.lib.embed import Embedder, resolve_model
    from rag_assets.lib.extract import extract_folder
    from rag_assets.lib.pipeline import index_folder
    from rag_assets.lib.rerank import load_reranker
    from rag_assets.lib.retrieve import Index
    from rag_assets.lib.store import IndexStore

    strat = chunk_strategy(settings.chunk_strategy, settings.chunk_target)
    embedder = Embedder(
        resolve_model(settings.embedding_model or None),
        batch_size=settings.embed_batch_size,
        threads=settings.embed_threads or None,
    )
    model = embedder.model  # load once, outside every timing
    out: dict[str, Any] = {"documents": str(documents), "strategy": strat.pipeline_version}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "docs"
        shutil.copytree(documents, corpus)
        texts = [c.text for c in chunk_documents(extract_folder(corpus).documents, strat)]
        out["chunks"] = len(texts)

        def plain_encode() -> float:
            t = time.perf_counter()
            model.encode(texts, batch_size=embedder.batch_size, normalize_embeddings=True)
            return time.perf_counter() - t

        # encode / build / encode: the build is compared with the mean of its neighbours
        enc1 = plain_encode()
        t = time.perf_counter()
        built = index_folder(corpus, Path(tmp) / "index", strat, embedder)
        build = time.perf_counter() - t
        enc2 = plain_encode()
        encode = (enc1 + enc2) / 2
        out["full_build_s"] = round(build, 3)
        out["plain_encode_s"] = round(encode, 3)
        out["build_over_encode"] = round(build / encode, 3)
        out["chunks_per_s"] = round(len(texts) / build, 1)
        out["embedded_first_run"] = built.sync.embedded

        t = time.perf_counter()
        again = index_folder(corpus, Path(tmp) / "index", strat, embedder)
        out["unchanged_rerun_s"] = round(time.perf_counter() - t, 3)
        out["embedded_unchanged_rerun"] = again.sync.embedded

        first = sorted(p for p in corpus.rglob("*.md"))[:1]
        if first:
            with first[0].open("a", encoding="utf-8") as f:
                f.write("\n\nA paragraph added by the benchmark to change this document.\n")
            touched = index_folder(corpus, Path(tmp) / "index", strat, embedder)
            out["touched_document"] = first[0].name
            out["touched_document_chunks"] = sum(
                1 for c in touched.chunks if c.document_id == first[0].name
            )
            out["embedded_after_touch"] = touched.sync.embedded
            out["rows_rewritten_after_touch"] = touched.sync.embedded + touched.sync.reused

        index = Index(
            IndexStore(Path(tmp) / "index"),
            IndexStore(Path(tmp) / "index").published() or touched.entry,
            embedder,
            load_reranker(settings.rerank_model or None),
        )
        queries = _queries(index, n_queries, questions)
        stages: dict[str, list[float]] = {}
        for retriever in ["hybrid"] + (["rerank"] if index.reranker else []):
            for q in queries:
                index.search(q, retriever, k=20)
                for stage, ms in index.timings.stages.items():
                    stages.setdefault(f"{retriever}:{stage}", []).append(ms)
        out["query_p50_ms"] = {k: round(statistics.median(v), 2) for k, v in stages.items()}
        out["queries"] = len(queries)
    return out, _text(out)


def _queries(index: Any, n: int, questions: Path | None) -> list[str]:
    """A question set's queries (in-domain and out-of-domain), else the first sentence of
    evenly spaced chunks: realistic lengths, deterministic."""
    if questions is not None:
        from rag_assets.lib.questions import load_needle_set

        qset = load_needle_set(questions)
        return [q.text for q in qset.queries()] + [o.query for o in qset.out_of_domain]
    contents = sorted(index.chunk_contents())
    step = max(1, len(contents) // max(1, n))
    return [c.split(". ")[0][:200] for c in contents[::step][:n]]


def _text(o: dict[str, Any]) -> str:
    lines = [
        f"corpus {o['documents']}: {o['chunks']} chunks ({o['strategy']})",
        f"full build {o['full_build_s']} s = {o['build_over_encode']}x a plain "
        f"SentenceTransformer.encode of the same texts ({o['plain_encode_s']} s, mean of one run "
        f"before and one after); {o['chunks_per_s']} chunks/s",
        f"unchanged re-run: {o['unchanged_rerun_s']} s, embedded {o['embedded_unchanged_rerun']}",
    ]
    if "touched_document" in o:
        lines.append(
            f"one document edited ({o['touched_document']}, {o['touched_document_chunks']} "
            f"chunks): embedded {o['embedded_after_touch']}"
        )
    lines.append(f"query stages, p50 over {o['queries']} queries (ms):")
    lines += [f"  {k:18} {v}" for k, v in o["query_p50_ms"].items()]
    return "\n".join(lines)
