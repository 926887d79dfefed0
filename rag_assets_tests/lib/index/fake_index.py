"""A fake index for plumbing tests: a deterministic hash embedder, a small Markdown corpus, and
one sync of a folder into a store (the real LanceDB, the real extractor and chunker)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from rag_assets.lib.index.embed import ModelSpec
from rag_assets.lib.index.indexer import sync_chunks
from rag_assets.lib.index.pipeline import extractor_suite_version
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import chunk_documents, strategy
from rag_assets.lib.ingest.extract import extract_folder

#: the chunking of the fake corpus, and the stamps of a table embedded by the hash embedder
STRAT = strategy("E", 300)
STAMPS = Stamps("test/fake", "rev", 8, True, STRAT.pipeline_version, "x-1")


class HashEmbedder:
    """Deterministic fake for plumbing tests: a text's vector is derived from its hash."""

    def __init__(self, dims: int = 8, fail_after: int | None = None, name: str = "fake"):
        self.spec = ModelSpec(f"test/{name}", Path("."), f"rev-{name}", dims)
        self.dims = dims
        self.batch_size = 16
        self.encoded: list[str] = []
        self.fail_after = fail_after

    def stamps(self, pipeline: str, extractor: str) -> Stamps:
        return Stamps(self.spec.model_id, self.spec.revision, self.dims, True, pipeline, extractor)

    def encode(self, texts, progress=None):
        if self.fail_after is not None and len(self.encoded) >= self.fail_after:
            raise RuntimeError("simulated crash while embedding")
        self.encoded.extend(texts)
        out = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).normal(size=self.dims).astype(np.float32)
            out.append(v / np.linalg.norm(v))
        if progress is not None:  # Embedder.encode's progress hook (issue 31)
            progress(len(texts))
        return np.stack(out) if out else np.zeros((0, self.dims), np.float32)


def corpus(root: Path, n: int = 5) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        paras = "\n\n".join(
            f"Paragraph {j} of document {i} talks about topic {i * 10 + j}. " * 4 for j in range(6)
        )
        (root / f"doc{i}.md").write_text(f"# Document {i}\n\n## Part\n\n{paras}\n")
    return root


def sync(store, emb, root, **kw):
    docs = extract_folder(root).documents
    strat = strategy("E", 300)
    chunks = chunk_documents(docs, strat)
    stamps = emb.stamps(strat.pipeline_version, extractor_suite_version())
    store.sync_documents([d for d in docs if d.ok], {d.document_id for d in docs if not d.ok})
    return sync_chunks(store, stamps, chunks, docs, emb, **kw), chunks, stamps


_corpus, _sync = corpus, sync  # the names the test files use
