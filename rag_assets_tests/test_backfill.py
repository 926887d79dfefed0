# mypy: disable-error-code="union-attr,index,arg-type"
"""The fan-out backfill (issue 13) equals the single run: several Dagster runs on a real
(on-disk) instance, one per dynamic partition, with the packaged MiniLM, give the same table as
``index_folder`` (same chunk ids and texts, vectors within 1e-6); the completing step refuses
while a batch is missing, and evaluation + publish follow it in the backfill code location."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pytest

from rag_assets.defs.artefacts import ARTEFACTS, ArtefactIOManager
from rag_assets.defs.backfill import BATCHES, backfill_definitions, build_backfill_assets
from rag_assets.defs.resources import DocumentsFolder, EmbeddingModel, LanceIndex
from rag_assets.lib.index.backfill import plan_batches
from rag_assets.lib.index.pipeline import (
    extractor_suite_version,
    index_folder,
    save_chunks,
    save_documents,
)
from rag_assets.lib.index.store import IndexStore, scan, vectors
from rag_assets.lib.ingest.chunk import chunk_documents
from rag_assets.lib.ingest.chunk import strategy as chunk_strategy
from rag_assets.lib.ingest.extract import extract_folder

STRAT = chunk_strategy("E", 200)


def _docs(root: Path, n: int = 7) -> Path:
    root.mkdir(parents=True)
    for i in range(n):
        paras = "\n\n".join(
            f"Section {j} of note {i}: lanterns, rivers and {['tea', 'maps', 'bells'][j % 3]} "
            f"in the year {1900 + 10 * i + j}." for j in range(1 + i % 3)
        )  # fmt: skip
        (root / f"note{i}.md").write_text(f"# Note {i}\n\n{paras}\n")
    return root


def assert_same_table(want_store: IndexStore, want: Any, got_store: IndexStore, got: Any) -> None:
    """The two table versions hold the same chunk ids and texts, vectors within 1e-6."""
    a = _table(want_store, want.table, want.version)
    b = _table(got_store, got.table, got.version)
    assert sorted(b) == sorted(a)  # same chunk ids
    assert all(b[c][0] == a[c][0] for c in a)  # same embedded texts
    diff = max(float(np.abs(b[c][1] - a[c][1]).max()) for c in a)
    print(f"{len(a)} chunks; max |vector difference| {diff:.2e}")
    assert diff <= 1e-6


def _table(store: IndexStore, table: str, version: int) -> dict[str, tuple[str, np.ndarray]]:
    rows = scan(store.open_table(table, version), ["chunk_id", "content_hash", "vector"])
    vecs = vectors(rows["vector"], 384)
    return {
        cid: (h, vecs[i])
        for i, (cid, h) in enumerate(
            zip(rows["chunk_id"].to_pylist(), rows["content_hash"].to_pylist(), strict=True)
        )
    }


def test_plan_is_whole_documents_with_content_derived_keys(tmp_path):
    docs = extract_folder(_docs(tmp_path / "docs")).documents
    chunks = chunk_documents(docs, STRAT)
    plan = plan_batches(docs, chunks, batch_rows=3)
    assert plan == plan_batches(list(reversed(docs)), chunks, batch_rows=3)  # deterministic
    ids = [d for b in plan for d in b.document_ids]
    assert ids == sorted(d.document_id for d in docs)  # every document once, in id order
    assert sum(b.rows for b in plan) == len(chunks) and len(plan) > 1
    assert len({b.key for b in plan}) == len(plan)


@pytest.mark.slow
def test_fan_out_equals_the_single_run(tmp_path, real_embedder):
    root = _docs(tmp_path / "docs")
    single = index_folder(root, tmp_path / "single", STRAT, real_embedder, publish=False).entry

    work, uri = tmp_path / "work", tmp_path / "fanout"
    extracted = extract_folder(root).documents
    save_documents(work, extracted)
    save_chunks(work, STRAT.pipeline_version, chunk_documents(extracted, STRAT))
    stamps = real_embedder.stamps(STRAT.pipeline_version, extractor_suite_version())
    plan_asset, batch_asset, final_asset = build_backfill_assets(stamps, STRAT, "keep", 2)
    # the artefacts written above, as the assets that made them (issue 42: their IO manager)
    made = [
        dg.AssetSpec(k).with_io_manager_key(ARTEFACTS) for k in ("extracted_documents", "chunks")
    ]
    assets = [*made, plan_asset, batch_asset, final_asset]
    resources = {
        "documents": DocumentsFolder(path=str(root), work_dir=str(work)),
        "embedding_model": EmbeddingModel(),  # the packaged MiniLM, as real_embedder
        "lance_index": LanceIndex(uri=str(uri)),
        # issue 42: the artefacts (here the work dir's, as the files above) reach the assets as
        # inputs through their IO manager
        ARTEFACTS: ArtefactIOManager(
            index_uri=str(uri), work_dir=str(work), pipeline=STRAT.pipeline_version
        ),
    }
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:

        def run(asset, partition_key=None, raise_on_error=True):  # type: ignore[no-untyped-def]
            return dg.materialize(
                assets,
                selection=[asset],
                partition_key=partition_key,
                resources=resources,
                instance=instance,
                raise_on_error=raise_on_error,
            )

        assert run(plan_asset).success
        keys = instance.get_dynamic_partitions(BATCHES.name)
        assert len(keys) >= 3  # several batches: several runs
        assert run(batch_asset, keys[0]).success
        early = run(final_asset, raise_on_error=False)  # not all batches are stored yet
        assert not early.success
        failure = next(e for e in early.all_events if e.is_step_failure)
        assert f"{len(keys) - 1} of {len(keys)} batches are not stored yet" in str(
            failure.step_failure_data.error.message
        )
        for key in keys[1:]:
            assert run(batch_asset, key).success
        again = run(batch_asset, keys[0])  # a retried batch writes nothing
        meta = again.asset_materializations_for_node(batch_asset.op.name)[0].metadata
        assert meta["commits"].value == 0 and meta["embedded"].value == 0
        assert run(final_asset).success
        runs = instance.get_runs()
        assert len(runs) == len(keys) + 4

    store = IndexStore(uri)
    staged = store.staging()
    assert staged.table == single.table and staged.rows == single.rows
    assert_same_table(IndexStore(tmp_path / "single"), single, store, staged)
    assert store.has_bm25(staged.table, staged.version)
    assert store.manifest(staged)["chunks_over_window"] == 0


@pytest.mark.slow  # builds two Dagster graphs: ~7 s here
def test_backfill_code_location_loads_with_evaluation_after_it(tmp_path):
    from rag_assets.settings import Settings

    settings = Settings.from_env({"RAG_INDEX_URI": str(tmp_path / "idx")})
    defs = backfill_definitions(settings)
    graph = defs.resolve_asset_graph()
    names = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"backfill_plan", "embedding_batch", "backfill_embeddings"} <= names
    assert {"retrieval_eval", "published_index"} <= names and "chunk_embeddings" not in names
    upstream = graph.get(dg.AssetKey("retrieval_eval")).parent_keys
    assert dg.AssetKey("backfill_embeddings") in upstream
