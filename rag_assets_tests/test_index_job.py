"""`rag-assets index` as ONE tagged run of `index_job` on a real (sqlite) Dagster instance, the
real model and a real LanceDB directory: per-stage progress from the run's step events, numeric
metadata Dagster plots, an unchanged re-run that skips evaluation by data versions, and a folder
the question set does not belong to, which publishes with the *unrelated-only* cut."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest

from rag_assets.defs.build import build_definitions
from rag_assets.defs.run import STAGES, Outcome, materialize_graph, root_cause
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.query.cite import DEFAULT_DISTANCE_CUT
from rag_assets.lib.query.retrieve import Index
from rag_assets.serve.status import status_report
from rag_assets.settings import Settings
from rag_assets_tests.helpers import SAMPLE_EVAL, graph_settings


def _settings(
    tmp: Path, docs: Path, eval_dir: Path = SAMPLE_EVAL, uri: str | None = None
) -> Settings:
    return graph_settings(tmp, docs, uri, eval_dir)


@pytest.fixture
def instance(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as inst:
        yield inst


def _published(uri: str) -> dict:
    entry = IndexStore(uri).published(strict=False)
    assert entry is not None
    return entry.to_dict()


def _materializations(instance: dg.DagsterInstance, key: str) -> int:
    records = instance.fetch_materializations(dg.AssetKey(key), limit=100).records
    return len(records)


@pytest.mark.slow
def test_one_tagged_run_progress_numeric_metadata_and_unchanged_rerun(
    tmp_path, sample_docs, instance, index_uri
):
    settings = _settings(tmp_path, sample_docs, uri=index_uri)
    events: list[tuple[str, str]] = []
    outcome = materialize_graph(
        settings, progress=False, instance=instance, on_stage=lambda s, e: events.append((s, e))
    )
    assert outcome.success, outcome.error
    runs = instance.get_runs()
    assert len(runs) == 1  # one run, not one per stage
    run = runs[0]
    assert run.job_name == "index_job" and run.run_id == outcome.run_id
    assert run.tags["rag/documents"] == str(sample_docs.resolve())
    assert run.tags["rag/strategy"] == "E"
    assert run.tags["rag/model"] == "sentence-transformers/all-MiniLM-L6-v2"
    # the progress bar's events: every stage started and finished, in graph order
    started = [s for s, e in events if e == "STEP_START"]
    assert started == [label for label, _ in STAGES]
    assert [s for s, e in events if e == "STEP_SUCCESS"] == started

    # numeric metadata (plotted by Dagster across materialisations) beside the tables
    def meta(key: str) -> dict:
        ev = instance.get_latest_materialization_event(dg.AssetKey(key))
        return ev.asset_materialization.metadata

    ev = meta("retrieval_eval")
    for r in ("dense", "bm25", "hybrid"):
        for k in (1, 4, 8, 20):
            assert isinstance(ev[f"{r}/recall@{k}"], dg.FloatMetadataValue)
        assert 0 < ev[f"{r}/mrr"].value <= 1
    assert ev["evaluation"].value == "evaluated" and "results" in ev
    # issue 50: the answer verifier on this table's needles (originals kept, changes flagged)
    assert ev["verify/originals_supported"].value >= 0.9
    assert ev["verify/changed_flagged"].value >= 0.9
    for kind in ("changed_number", "negation", "swapped_term", "elsewhere"):
        if f"verify/{kind}_flagged" in ev:
            assert isinstance(ev[f"verify/{kind}_flagged"], dg.FloatMetadataValue)
            assert ev[f"verify/{kind}_flagged_of"].value >= 1
    th = meta("refusal_threshold")
    assert isinstance(th["cut"], dg.FloatMetadataValue) and th["cut_source"].value == "calibrated"
    for name in ("answered_correct", "refused_answerable", "bluffs"):
        assert isinstance(th[name], dg.IntMetadataValue)
    assert isinstance(meta("chunk_embeddings")["chunks_over_window"], dg.IntMetadataValue)
    assert meta("extracted_documents")["failed"].value == 1  # the bundled broken-scan.pdf
    published = _published(index_uri)
    assert published["evaluation"] == "evaluated"
    assert published["threshold_source"] == "calibrated"

    # unchanged re-run: ONE more run; evaluation, calibration and publish not re-run
    again = materialize_graph(settings, progress=False, instance=instance)
    assert again.success, again.error
    assert again.skipped == ["retrieval_eval", "refusal_threshold", "published_index"]
    assert len(instance.get_runs()) == 2
    assert _materializations(instance, "retrieval_eval") == 1
    assert _materializations(instance, "published_index") == 1
    assert _materializations(instance, "chunk_embeddings") == 2
    assert again.metadata["refusal_threshold"]["cut"] == th["cut"].value  # reported from the last
    assert "not re-run" in again.summary()
    assert _published(index_uri) == published

    # a changed question set is a changed input: evaluation runs again (and only then)
    qdir = tmp_path / "eval"
    shutil.copytree(SAMPLE_EVAL, qdir)
    lines = (qdir / "questions.jsonl").read_text().splitlines()
    (qdir / "questions.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    third = materialize_graph(
        replace(settings, eval_dir=str(qdir)), progress=False, instance=instance
    )
    assert third.success and third.skipped == []
    assert _materializations(instance, "retrieval_eval") == 2
    assert third.metadata["retrieval_eval"]["questions"] == len(lines) - 1


@pytest.mark.slow
def test_own_folder_with_a_foreign_question_set_is_calibrated_unrelated_only(tmp_path, instance):
    docs = tmp_path / "my-docs"
    docs.mkdir()
    (docs / "garden.md").write_text(
        "# Tomatoes\n\nWater tomatoes deeply twice a week and mulch the beds in July.\n"
    )
    (docs / "bread.md").write_text(
        "# Sourdough\n\nFeed the starter the night before; bake at 230 degrees for 40 minutes.\n"
    )
    settings = _settings(tmp_path, docs)  # the sample question set: not about these documents
    outcome = materialize_graph(settings, progress=False, instance=instance)
    assert outcome.success, outcome.error  # published, not failed at the recall gate
    assert ("recall_at_20_above_floor", True, "ERROR") in outcome.checks  # not measured: passed
    published = json.loads((tmp_path / "index" / "published.json").read_text())
    assert published["evaluation"] == "unrelated-only"
    note = published["evaluation_note"]
    assert "does not belong to this corpus" in note and "12 of 12" in note
    assert "RAG_EVAL_DIR" in note
    # never the bare default: the day-0 cut from the shipped questions about other topics
    assert published["threshold"] != DEFAULT_DISTANCE_CUT
    assert published["threshold_source"] == "unrelated-only"
    report = status_report(settings)
    assert report["published"]["evaluation_source"] == "unrelated-only"
    assert report["published"]["threshold_source"] == "unrelated-only"
    assert Index.open(settings.index_uri).search("sourdough starter", "bm25", k=1)
    # the UI: the assets say so in their metadata
    ev = instance.get_latest_materialization_event(dg.AssetKey("retrieval_eval"))
    assert ev.asset_materialization.metadata["evaluation"].value == "unrelated-only"
    eq = instance.get_latest_materialization_event(dg.AssetKey("eval_questions"))
    assert eq.asset_materialization.metadata["source"].value == "unrelated-only"
    # the blocking gate's state, as the UI reads it from the instance: passed, not Failed
    key = dg.AssetCheckKey(dg.AssetKey("retrieval_eval"), "recall_at_20_above_floor")
    check = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    assert check.status.value == "SUCCEEDED"  # AssetCheckExecutionRecordStatus
    assert check.event.dagster_event.event_specific_data.passed is True

    # no question set at all, and an override of the cut: both said where they came from
    s2 = replace(settings, eval_dir=str(tmp_path / "none"), distance_cut="0.6")
    outcome = materialize_graph(s2, progress=False, instance=instance)
    assert outcome.success, outcome.error
    published = json.loads((tmp_path / "index" / "published.json").read_text())
    assert published["evaluation"] == "unrelated-only"
    assert "no question set" in published["evaluation_note"]
    assert published["threshold"] == 0.6 and published["threshold_source"] == "override"


@pytest.mark.slow
def test_an_index_that_cannot_be_opened_names_its_root_cause_in_one_line(
    tmp_path, sample_docs, instance
):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the index directory should be")
    settings = replace(_settings(tmp_path, sample_docs), index_uri=str(blocker / "index"))
    outcome = materialize_graph(settings, progress=False, instance=instance)
    # the writer lease lives in the index (issue 25): the run fails before Dagster starts one
    assert not outcome.success and outcome.failed_stage == "index"
    assert outcome.error is not None and "\n" not in outcome.error
    assert outcome.error.startswith("Not a directory: ") and str(blocker) in outcome.error
    assert "Error occurred while executing" not in outcome.error
    assert len(instance.get_runs()) == 0


def test_root_cause_unwraps_dagster_error_chains():
    from dagster._utils.error import serializable_error_info_from_exc_info

    try:
        try:
            raise PermissionError(13, "Permission denied", "/srv/index/published.json")
        except PermissionError as exc:
            raise RuntimeError('Error occurred while executing op "chunk_embeddings"') from exc
    except RuntimeError:
        import sys

        info = serializable_error_info_from_exc_info(sys.exc_info())
    assert root_cause(info) == "Permission denied: '/srv/index/published.json'"


def test_every_asset_check_has_a_description(tmp_path):
    defs = build_definitions(_settings(tmp_path, tmp_path))
    graph = defs.resolve_asset_graph()
    keys = list(graph.asset_check_keys)
    assert {k.name for k in keys} >= {
        "all_documents_extracted",
        "chunks_within_encoder_window",
        "index_matches_chunks",
        "recall_at_20_above_floor",
    }
    for key in keys:
        spec = graph.get_check_spec(key)
        assert spec.description, f"{key.to_user_string()} has no description"


@pytest.mark.slow
def test_the_embedding_step_waits_for_the_index_writer_pool(tmp_path, sample_docs):
    """With ``concurrency: pools: default_limit: 1`` (docs/operations.md), a run's
    ``chunk_embeddings`` step waits while another run of the instance holds the
    ``rag_index_writer`` slot, writes nothing meanwhile, and runs once the slot is freed:
    Dagster's own pool on a real sqlite instance, not our lease."""
    import threading
    import time

    from rag_assets.defs.assets import INDEX_POOL

    home = tmp_path / "dagster_home"
    home.mkdir()
    overrides = {"concurrency": {"pools": {"default_limit": 1}}}
    with dg.instance_for_test(temp_dir=str(home), overrides=overrides) as inst:
        storage = inst.event_log_storage
        storage.initialize_concurrency_limit_to_default(INDEX_POOL)
        other = storage.claim_concurrency_slot(INDEX_POOL, "other-run", "chunk_embeddings")
        assert other.is_claimed  # another run of this instance is embedding
        done: dict[str, object] = {}
        run = threading.Thread(
            target=lambda: done.update(
                outcome=materialize_graph(
                    _settings(tmp_path, sample_docs), progress=False, instance=inst
                )
            )
        )
        run.start()
        blocked = ""
        for _ in range(3000):  # until the run reports the wait (or ends, which fails below)
            for r in inst.get_runs():
                for ev in inst.all_logs(r.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
                    if f"blocked by limit for pool {INDEX_POOL}" in (ev.message or ""):
                        blocked = ev.step_key or ""
            if blocked or not run.is_alive():
                break
            time.sleep(0.2)
        assert blocked == "chunk_embeddings", done
        assert _materializations(inst, "chunk_embeddings") == 0
        assert run.is_alive()
        storage.free_concurrency_slots_for_run("other-run")
        run.join(timeout=900)
        outcome = done["outcome"]
        assert isinstance(outcome, Outcome) and outcome.success, outcome
        assert _materializations(inst, "chunk_embeddings") == 1
