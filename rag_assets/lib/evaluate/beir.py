"""BEIR evaluation: documents scored whole (title + " " + text, as MTEB embeds them) by
default; with a chunk strategy a document scores as its best chunk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_assets.lib.types import Chunk, ExtractedDocument, sha256_text

WHOLE_PIPELINE = "whole1"  # one chunk per document, no header


def beir_documents(corpus: dict[str, tuple[str, str]]) -> list[ExtractedDocument]:
    docs = []
    for doc_id, (title, text) in sorted(corpus.items()):
        full = f"{title} {text}".strip() if title else text.strip()
        docs.append(
            ExtractedDocument(
                document_id=doc_id,
                path=doc_id,
                kind="text",
                status="ok",
                reason=None,
                extractor="beir",
                extractor_version="beir-1",
                source_hash=sha256_text(full),
                title=title,
                text=full,
            )
        )
    return docs


def whole_chunks(docs: list[ExtractedDocument]) -> list[Chunk]:
    return [
        Chunk(
            chunk_id=sha256_text(f"{d.document_id}|{WHOLE_PIPELINE}")[:32],
            document_id=d.document_id,
            section=d.title,
            start=0,
            end=len(d.text),
            content=d.text,
            text=d.text,
        )
        for d in docs
    ]


def run_beir(
    folder: Path,
    cache: str | Path,
    embedder: Any,
    reranker: Any,
    retrievers: list[str],
    strategy: str | None,
    fusion: Any = None,
) -> tuple[dict[str, Any], str]:
    from rag_assets.lib.evaluate.evaluate import evaluate_beir
    from rag_assets.lib.evaluate.questions import load_beir
    from rag_assets.lib.index.pipeline import digest, embed_chunks
    from rag_assets.lib.index.store import IndexStore, join_uri
    from rag_assets.lib.ingest.chunk import chunk_documents
    from rag_assets.lib.ingest.chunk import strategy as chunk_strategy
    from rag_assets.lib.query.retrieve import Index

    beir = load_beir(folder)
    docs = beir_documents(beir.corpus)
    if strategy:
        strat = chunk_strategy(strategy.upper())
        chunks, pipeline = chunk_documents(docs, strat), strat.pipeline_version
    else:
        chunks, pipeline = whole_chunks(docs), WHOLE_PIPELINE
    store = IndexStore(join_uri(cache, f"beir-{folder.name}-{digest(sorted(beir.corpus))[:12]}"))
    stamps = embedder.stamps(pipeline, "beir-1")
    _, entry = embed_chunks(store, stamps, chunks, docs, embedder)
    index = Index(store, entry, embedder, reranker, fusion=fusion)
    result = evaluate_beir(index, beir, retrievers)
    result.update(
        {
            "dataset": folder.name,
            "documents": len(docs),
            "chunks": len(chunks),
            "pipeline": pipeline,
            "model": stamps.model,
            "fusion": index.fusion.label,
            "query_prompt": stamps.query_prompt,
            "document_prompt": stamps.document_prompt,
            "dims": stamps.dims,
            "queries": len(beir.qrels),
        }
    )
    lines = [
        f"BEIR {folder.name}: {len(docs)} documents, {len(chunks)} chunks ({pipeline}), "
        f"{len(beir.qrels)} queries, {stamps.model}",
        "",
        "| retriever | nDCG@10 | recall@100 |",
        "|---|---|---|",
    ]
    for name, r in result["retrievers"].items():
        if "note" in r:
            lines.append(f"| {name} | {r['note']} | |")
        else:
            lines.append(f"| {name} | {r['ndcg@10']:.4f} | {r['recall@100']:.4f} |")
    return result, "\n".join(lines)
