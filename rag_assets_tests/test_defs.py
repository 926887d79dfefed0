"""The Dagster graph on a real instance, the real model and a real LanceDB directory:
definitions load, a broken folder still materialises, and stale/fresh status is exact after a
model change, a re-embed, an edited document and an unchanged re-run."""

from __future__ import annotations

import datetime
import json
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.data_version import CachingStaleStatusResolver
from dagster._core.loader import LoadingContextForTest

from rag_assets.defs.build import build_definitions
from rag_assets.defs.run import materialize_graph
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.query.retrieve import Index
from rag_assets.serve.status import status_report
from rag_assets.settings import Settings
from rag_assets_tests.helpers import INDEX_ASSETS, graph_settings

# every test here materialises the graph with the real model (or loads the code location)
pytestmark = pytest.mark.slow

ASSETS = INDEX_ASSETS


def _settings(tmp: Path, docs: Path, model: str = "", uri: str = "") -> Settings:
    return graph_settings(tmp, docs, uri, embedding_model=model)


def _first_index(
    tmp: Path, docs: Path, uri: str
) -> tuple[dg.DagsterInstance, Settings, dg.Definitions]:
    """A first index of ``docs`` on an instance of its own: nothing stale after it."""
    instance = dg.DagsterInstance.ephemeral()
    s1 = _settings(tmp, docs, uri=uri)
    defs1 = build_definitions(s1)
    assert materialize_graph(s1, progress=False, instance=instance).success
    assert _stale(defs1, instance) == set()
    return instance, s1, defs1


def _published(uri: str) -> dict:
    entry = IndexStore(uri).published(strict=False)
    assert entry is not None
    return entry.to_dict()


def _status(defs: dg.Definitions, instance: dg.DagsterInstance) -> dict[str, str]:
    resolver = CachingStaleStatusResolver(
        instance, defs.resolve_asset_graph(), LoadingContextForTest(instance)
    )
    return {k: resolver.get_status(dg.AssetKey(k)).name for k in ASSETS}


def _stale(defs, instance) -> set[str]:
    return {k for k, v in _status(defs, instance).items() if v != "FRESH"}


def test_definitions_load_from_the_code_location():
    from rag_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys >= {"raw_documents", *ASSETS, "strategy_ablation"}
    emb = graph.get(dg.AssetKey("chunk_embeddings"))
    assert "model=sentence-transformers/all-MiniLM-L6-v2" in (emb.code_version or "")
    sensor = defs.resolve_sensor_def("rag_automation_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert defs.resolve_job_def("index_job") is not None


def test_an_object_storage_uri_builds_the_graph_without_a_local_s3_folder(tmp_path, monkeypatch):
    """Issue 23: the graph runs on s3:// (its files are rows, see test_graph_object_store.py);
    building the definitions reaches no network and makes no local "s3:" folder."""
    monkeypatch.chdir(tmp_path)
    settings = replace(Settings(), index_uri="s3://bucket/index", work_dir=str(tmp_path / "w"))
    defs = build_definitions(settings)
    assert defs.resolve_job_def("index_job") is not None
    assert not any(p.name.startswith("s3") for p in tmp_path.rglob("*"))


def test_broken_files_fail_alone_and_the_graph_materialises(tmp_path, sample_docs):
    (sample_docs / "empty.md").write_bytes(b"")
    (sample_docs / "image.md").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    (sample_docs / "corrupt.pdf").write_bytes(b"%PDF-1.7\n this is not a pdf body")
    settings = _settings(tmp_path, sample_docs)
    outcome = materialize_graph(settings, progress=False, instance=dg.DagsterInstance.ephemeral())
    assert outcome.success, outcome.error
    ext = outcome.metadata["extracted_documents"]
    assert ext["failed"] == 4  # the three above + the bundled broken-scan.pdf
    reasons = {r["document"]: r["reason"] for r in ext["failed_list"]}
    assert "empty" in reasons["empty.md"] and "binary" in reasons["image.md"]
    assert "PDF" in reasons["corrupt.pdf"]
    assert ("all_documents_extracted", False, "WARN") in outcome.checks
    assert ("index_matches_chunks", True, "ERROR") in outcome.checks
    assert (
        outcome.metadata["chunk_embeddings"]["dagster/row_count"]
        == (outcome.metadata["chunks"]["dagster/row_count"])
    )
    report = status_report(settings)
    assert report["published"]["rows"] == outcome.metadata["chunks"]["dagster/row_count"]
    assert {f["document"] for f in report["documents"]["failed"]} == set(reasons)
    index = Index.open(settings.index_uri)
    assert index.search("glossary", "bm25", k=3)
    cut = outcome.metadata["refusal_threshold"]["cut"]
    assert index.distance_cut == report["published"]["threshold"] == cut  # the calibrated cut


def test_staleness_after_model_change_reembed_edit_and_unchanged_rerun(
    tmp_path, sample_docs, second_model_dir, index_uri
):
    instance, s1, defs1 = _first_index(tmp_path, sample_docs, index_uri)
    published_before = _published(index_uri)

    # unchanged re-run: everything stays fresh (content-based data versions)
    assert materialize_graph(s1, progress=False, instance=instance).success
    assert _stale(defs1, instance) == set()

    # model change = code change: exactly the embedding asset is stale
    s2 = replace(s1, embedding_model=str(second_model_dir))
    defs2 = build_definitions(s2)
    assert _stale(defs2, instance) == {"chunk_embeddings"}

    # re-embed only: a new table; queries still use the old one; now exactly its children
    res = dg.materialize(
        list(defs2.assets or []),
        instance=instance,
        resources=defs2.resources,
        selection=dg.AssetSelection.assets("chunk_embeddings")
        | dg.AssetSelection.checks_for_assets("chunk_embeddings"),
    )
    assert res.success
    assert _stale(defs2, instance) == {"retrieval_eval"}
    still = _published(index_uri)
    assert still["table"] == published_before["table"]
    old = Index.open(s1.index_uri)  # the old model still answers from the old table
    assert old.search("rollback", "dense", k=1)

    # the rest of the graph: evaluation, threshold, publish switch to the new table
    assert materialize_graph(s2, progress=False, instance=instance).success
    assert _stale(defs2, instance) == set()
    now = _published(index_uri)
    assert now["table"] != published_before["table"]
    assert now["stamps"]["revision"] != published_before["stamps"]["revision"]
    assert Index.open(s2.index_uri, model=s2.embedding_model).search("rollback", "dense", k=1)

    # an edited document: nothing is noticed until the folder is observed; then extraction
    path = sample_docs / "05-evaluation.md"
    path.write_text(path.read_text() + "\n\nA new paragraph about paired sign tests.\n")
    assert _stale(defs2, instance) == set()
    dg.materialize(
        [*defs2.assets], instance=instance, resources=defs2.resources, selection=["raw_documents"]
    )
    assert _stale(defs2, instance) == {"extracted_documents"}
    outcome = materialize_graph(s2, progress=False, instance=instance)
    assert outcome.success and _stale(defs2, instance) == set()
    m = outcome.metadata["chunk_embeddings"]
    assert m["documents_written"] == 1 and 1 <= m["embedded"] <= 3


def test_automation_requests_exactly_what_a_model_change_needs(
    tmp_path, sample_docs, second_model_dir, index_uri
):
    instance, s1, defs1 = _first_index(tmp_path, sample_docs, index_uri)
    t = datetime.datetime.now()
    if t.minute >= 58:  # keep r1..r3 (t .. t+60 s) clear of the hourly cron tick
        t = (t + datetime.timedelta(hours=1)).replace(minute=0, second=5, microsecond=0)
    r1 = dg.evaluate_automation_conditions(defs=defs1, instance=instance, evaluation_time=t)
    r2 = dg.evaluate_automation_conditions(
        defs=defs1,
        instance=instance,
        cursor=r1.cursor,
        evaluation_time=t + datetime.timedelta(seconds=30),
    )
    assert r2.total_requested == 0
    defs2 = build_definitions(replace(s1, embedding_model=str(second_model_dir)))
    r3 = dg.evaluate_automation_conditions(
        defs=defs2,
        instance=instance,
        cursor=r2.cursor,
        evaluation_time=t + datetime.timedelta(seconds=60),
    )
    requested = {k for k in ASSETS if r3.get_num_requested(dg.AssetKey(k))}
    assert requested == {
        "chunk_embeddings",
        "retrieval_eval",
        "refusal_threshold",
        "published_index",
    }
    assert r3.get_num_requested(dg.AssetKey("strategy_ablation")) == 0  # on demand only
    assert r3.get_num_requested(dg.AssetKey("raw_documents")) == 0
    # scheduled re-indexing: once the cron tick (hourly by default) passes, the folder is observed
    r4 = dg.evaluate_automation_conditions(
        defs=defs2,
        instance=instance,
        cursor=r3.cursor,
        evaluation_time=t + datetime.timedelta(hours=1, minutes=1),
    )
    assert r4.get_num_requested(dg.AssetKey("raw_documents")) == 1


def test_a_failed_blocking_check_stops_publishing(tmp_path, sample_docs):
    settings = replace(_settings(tmp_path, sample_docs), recall_floor=1.01)
    outcome = materialize_graph(settings, progress=False, instance=dg.DagsterInstance.ephemeral())
    assert not outcome.success and outcome.failed_stage == "retrieval_eval"
    assert ("recall_at_20_above_floor", False, "ERROR") in outcome.checks
    assert not (tmp_path / "index" / "published.json").exists()
    with pytest.raises(FileNotFoundError):
        Index.open(settings.index_uri)


def test_strategy_ablation_on_demand(tmp_path, sample_docs):
    """A–F × retrievers on the sample set; destroyed answers and paired tests against E."""
    settings = _settings(tmp_path, sample_docs)
    instance = dg.DagsterInstance.ephemeral()
    assert materialize_graph(settings, progress=False, instance=instance).success
    defs = build_definitions(settings)
    res = dg.materialize(
        list(defs.assets or []),
        instance=instance,
        resources=defs.resources,
        selection=["strategy_ablation"],
    )
    assert res.success
    md = res.asset_materializations_for_node("strategy_ablation")[0].metadata["results"].value
    for name in "ABCDEF":
        assert f"| {name} |" in md
    assert "each strategy vs E" in md
    data = json.loads((tmp_path / "work" / "ablation" / "ablation.json").read_text())
    assert set(data) == set("ABCDEF")
    assert data["C"]["destroyed"] == data["E"]["destroyed"] == 0
    assert data["A"]["chunks"] != data["C"]["chunks"]


def test_an_empty_folder_fails_the_gate_with_a_reason_instead_of_crashing(tmp_path):
    docs = tmp_path / "empty"
    docs.mkdir()
    outcome = materialize_graph(
        _settings(tmp_path, docs), progress=False, instance=dg.DagsterInstance.ephemeral()
    )
    assert not outcome.success and outcome.failed_stage == "retrieval_eval"
    assert ("recall_at_20_above_floor", False, "ERROR") in outcome.checks
    assert outcome.metadata["chunk_embeddings"]["dagster/row_count"] == 0
    assert outcome.error is not None and "no chunks" in outcome.error
    assert "RAG_DOCUMENTS_DIR" in outcome.error
    assert not (tmp_path / "index" / "published.json").exists()
