"""Prompts and Matryoshka dims are stamps: with the real all-mpnet-base-v2 on the sample corpus,
they are written into the table (name, schema, published pointer) and the query side refuses an
embedder that disagrees, naming both."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from rag_assets.lib.index.embed import Embedder, resolve_model
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore, StampMismatch
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.retrieve import Index
from rag_assets_tests.helpers import SAMPLE_DOCS
from rag_assets_tests.llm_server import MPNET, model_file

# two of the sample documents keep the real 110 M-parameter encoder's work small
DOCS = ("03-versions-and-invalidation.md", "06-operations-runbook.md")


@pytest.mark.slow
def test_mpnet_stamps_prompts_and_dims_and_a_query_mismatch_is_refused(tmp_path):
    path = model_file(MPNET)
    docs = tmp_path / "documents"
    docs.mkdir()
    for name in DOCS:
        shutil.copy(SAMPLE_DOCS / name, docs / name)
    spec = resolve_model(str(path), dims=256, query_prompt="query: ", document_prompt="passage: ")
    emb = Embedder(spec)
    built = index_folder(docs, tmp_path / "index", strategy("E"), emb)
    stamps = built.entry.stamps
    assert (stamps.dims, stamps.query_prompt, stamps.document_prompt) == (
        256,
        "query: ",
        "passage: ",
    )
    store = IndexStore(tmp_path / "index")
    tbl = store.open_table(built.entry.table)
    assert Stamps.from_schema_metadata(tbl.schema.metadata) == stamps
    pub = store.published()
    assert pub is not None and pub.stamps == stamps  # the pointer carries the prompts too
    plain = Stamps(**{**stamps.as_dict(), "query_prompt": "", "document_prompt": ""})
    assert built.entry.table != plain.table_name  # another prompt is another table
    # the stored vectors are the document side: prompt prepended, truncated, unit length
    stored = tbl.to_arrow()
    first = stored.slice(0, 1).to_pylist()[0]
    vec = np.asarray(first["vector"], dtype=np.float32)
    assert vec.shape == (256,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-5
    assert np.allclose(vec, emb.encode([first["text"]])[0], atol=1e-4)

    index = Index.open(tmp_path / "index", embedder=emb)
    hits = index.search("How do I roll back to the previous embedding model?", "dense", k=3)
    assert hits and "roll" in " ".join(h.content.lower() for h in hits)

    # same weights, another query prompt: refused, naming both prompts
    other = Embedder(resolve_model(str(path), dims=256, document_prompt="passage: "))
    other.__dict__["model"] = emb.model
    with pytest.raises(StampMismatch, match=r"query_prompt: 'query: ' != ''"):
        Index.open(tmp_path / "index", embedder=other)
    # same prompts, the full 768 dims: refused, naming both sizes
    full = Embedder(resolve_model(str(path), query_prompt="query: ", document_prompt="passage: "))
    with pytest.raises(StampMismatch, match=r"dims: 256 != 768"):
        Index.open(tmp_path / "index", embedder=full)


@pytest.mark.slow  # builds the Dagster definitions three times
def test_a_prompt_or_dims_change_changes_only_the_embedding_assets_code_version(tmp_path):
    """Through the code location's own factory: RAG_QUERY_PROMPT, RAG_DOCUMENT_PROMPT and
    RAG_EMBED_DIMS move ``chunk_embeddings``' code version (so the UI shows it, and only it, as
    changed); extraction and chunking keep theirs; the resource builds the matching embedder."""
    from dataclasses import replace

    from rag_assets.defs.build import build_definitions, stamps_for
    from rag_assets.defs.resources import EmbeddingModel
    from rag_assets.settings import Settings

    base = Settings(documents_dir=str(tmp_path), index_uri=str(tmp_path / "i"))

    def versions(s: Settings) -> dict[str, str | None]:
        graph = build_definitions(s).resolve_asset_graph()
        return {
            k.to_user_string(): graph.get(k).code_version for k in graph.materializable_asset_keys
        }

    v0 = versions(base)
    for change in (
        {"query_prompt": "query: "},
        {"document_prompt": "passage: "},
        {"embed_dims": 128},
    ):
        s = replace(base, **change)
        v = versions(s)
        changed = {k for k in v0 if v0[k] != v[k]}
        assert changed == {"chunk_embeddings"}, change
        assert stamps_for(s).table_name != stamps_for(base).table_name
        resources = build_definitions(s).resources or {}
        res = resources["embedding_model"]
        assert isinstance(res, EmbeddingModel)
        spec = res.embedder().spec
        st = stamps_for(s)
        assert (spec.dims, spec.query_prompt, spec.document_prompt) == (
            st.dims,
            st.query_prompt,
            st.document_prompt,
        )
