# mypy: disable-error-code="union-attr,index"
"""Issue 42: nothing between runs on a worker's disk. With ``RAG_INDEX_URI`` on a bucket (a moto
S3 server, authentication on, the credentials only in ``AWS_*``) the extracted documents, the
chunk Parquet and the batch plan are objects under ``<index>/_rag_work/``, written and read by
the artefacts' IO manager; so is the sources' state (issue 41: each source's last good
observation, a Git source's commit). Every run and step below starts with an empty
``RAG_WORK_DIR`` of its own (the one before it wiped), and the published table is the one a
single run, or a local index with a kept working folder, publishes."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import dagster as dg
import pytest

from rag_assets.defs.backfill import BACKFILL_JOB, BATCHES, PLAN_JOB, default_backfill_definitions
from rag_assets.defs.build import build_definitions
from rag_assets.defs.run import materialize_graph
from rag_assets.lib.index.artefacts import ARTEFACTS_DIR, Artefacts
from rag_assets.lib.index.pipeline import chunks_file, index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.ingest.chunk import chunk_documents
from rag_assets.lib.ingest.extract import extract_folder
from rag_assets.serve.status import status_report
from rag_assets_tests.helpers import graph_settings
from rag_assets_tests.source_servers import commit_files, s3_client
from rag_assets_tests.test_backfill import STRAT, assert_same_table
from rag_assets_tests.test_backfill import _docs as _notes

QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def _objects(aws: dict[str, str], prefix: str) -> set[str]:
    """The object keys under ``prefix`` of bucket ``rag``, read with boto3 (not the product)."""
    pages = s3_client(aws).get_paginator("list_objects_v2").paginate(Bucket="rag", Prefix=prefix)
    return {o["Key"][len(prefix) :] for page in pages for o in page.get("Contents", [])}


@pytest.mark.slow
def test_every_run_starts_with_an_empty_work_dir_and_publishes_the_same_table(
    tmp_path, real_embedder, s3_env
):
    root = _notes(tmp_path / "docs", n=6)
    uri = f"s3://rag/{tmp_path.name}"
    base = replace(
        graph_settings(tmp_path, root, uri), chunk_target=STRAT.target, backfill_batch_rows=3
    )

    def on(name: str):  # a worker: the shared settings, its own empty working folder
        for old in tmp_path.glob("w[0-9]"):  # the previous run's is wiped
            shutil.rmtree(old)
        work = tmp_path / name / "work"
        work.mkdir(parents=True)
        return replace(base, work_dir=str(work))

    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        # 1. the first run: every artefact is an object in the bucket, none in the work dir
        first = materialize_graph(on("w1"), progress=False, instance=instance)
        assert first.success, first.error
        keys = _objects(s3_env, f"{tmp_path.name}/{ARTEFACTS_DIR}/")
        want = {"extracted/documents.parquet", "extracted/manifest.json"}
        assert want | {chunks_file(STRAT.pipeline_version)} <= keys
        w1 = tmp_path / "w1" / "work"
        assert not (w1 / "extracted").exists() and not (w1 / "chunks").exists()
        docs = extract_folder(root).documents
        stored = Artefacts(uri, tmp_path / "elsewhere")  # any machine reads them back
        assert stored.chunks(STRAT.pipeline_version) == chunk_documents(docs, STRAT)
        assert [d.document_id for d in stored.documents()] == [d.document_id for d in docs]
        published = IndexStore(uri).published()

        # 2. an unchanged re-run on an empty work dir: the previous extraction comes from the
        # bucket (every document reused), nothing is embedded, the pointer does not move
        again = materialize_graph(on("w2"), progress=False, instance=instance)
        assert again.success, again.error
        assert again.metadata["extracted_documents"]["reused"] == len(docs)
        assert again.metadata["chunk_embeddings"]["embedded"] == 0
        assert IndexStore(uri).published() == published

        # 3. an edit, re-indexed on an empty work dir: the table equals a single local run's
        (root / "note1.md").write_text("# Note 1\n\nA new text about harbours and kites.\n")
        third = materialize_graph(on("w3"), progress=False, instance=instance)
        assert third.success, third.error
        single = index_folder(root, tmp_path / "single", STRAT, real_embedder).entry
        pub = IndexStore(uri).published()
        assert pub.table == single.table and pub.version != published.version
        assert_same_table(IndexStore(tmp_path / "single"), single, IndexStore(uri), pub)

        # 4. the backfill's steps, each on an empty work dir: the plan step, then one batch run
        # reading the plan, chunks and documents the plan step's machine wrote
        s4 = on("w4")
        defs = dg.Definitions.merge(build_definitions(s4), default_backfill_definitions(s4))
        planned = defs.resolve_job_def(PLAN_JOB).execute_in_process(
            instance=instance, run_config=QUIET
        )
        assert planned.success
        plan = Artefacts(uri, tmp_path / "elsewhere").plan(STRAT.pipeline_version)
        assert plan and [b.key for b in plan] == instance.get_dynamic_partitions(BATCHES.name)
        s5 = on("w5")
        defs = dg.Definitions.merge(build_definitions(s5), default_backfill_definitions(s5))
        batch = defs.resolve_job_def(BACKFILL_JOB).execute_in_process(
            instance=instance, run_config=QUIET, partition_key=plan[0].key
        )
        assert batch.success
        meta = batch.asset_materializations_for_node("embedding_batch")[0].metadata
        assert meta["commits"].value == 0 and meta["embedded"].value == 0  # stored already
    assert not list((tmp_path / "w5").rglob("*.parquet"))


@pytest.mark.slow
def test_sources_keep_their_state_in_the_bucket_and_every_run_starts_empty(
    tmp_path, real_embedder, s3_env
):
    """A Git repository and a folder in one sources file, indexed into an S3 index, each run on
    an empty work dir: the sources' state is an object beside the other artefacts and no work
    dir holds it; the second run reads only the edited file and names the commits it went
    between (the last one came from the bucket); ``status`` on a third empty folder shows the
    commit; the table equals a local index's built with one kept work dir."""
    repo = tmp_path / "repo"
    text = "# {0}\n\nThe {0} runbook: restart the {1} after a failed deploy.\n"
    c1 = commit_files(repo, {"a.md": text.format("Gateway", "proxy"),
                             "ops/b.md": text.format("Queue", "broker")}, "one")  # fmt: skip
    folder = _notes(tmp_path / "notes", n=3)
    sources = tmp_path / "sources.toml"
    sources.write_text(
        f'[[source]]\nname = "repo"\nlocation = "git+file://{repo}@main"\n\n'
        f'[[source]]\nname = "notes"\nlocation = "{folder}"\n'
    )
    uri = f"s3://rag/{tmp_path.name}"
    base = replace(
        graph_settings(tmp_path, tmp_path / "no-folder", uri),
        sources=str(sources),
        chunk_target=STRAT.target,
    )

    def on(name: str):  # a worker: the shared settings, its own empty working folder
        for old in tmp_path.glob("w[0-9]"):
            shutil.rmtree(old)
        work = tmp_path / name / "work"
        work.mkdir(parents=True)
        return replace(base, work_dir=str(work))

    def lines(outcome) -> list[str]:
        meta = outcome.metadata["extracted_documents"]
        notes = [n for r in meta["sources"] for n in r.get("notes", [])]
        return list(meta["source_lines"]) + notes

    state_key = f"{tmp_path.name}/{ARTEFACTS_DIR}/sources/state.json"
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        first = materialize_graph(on("w1"), progress=False, instance=instance)
        assert first.success, first.error
        assert "sources/state.json" in _objects(s3_env, f"{tmp_path.name}/{ARTEFACTS_DIR}/")
        assert not list((tmp_path / "w1").rglob("state.json"))  # in the bucket only
        state = json.loads(s3_client(s3_env).get_object(Bucket="rag", Key=state_key)["Body"].read())
        assert state["repo"]["commit"] == c1 and state["notes"]["last_good"]

        c2 = commit_files(repo, {"ops/b.md": text.format("Queue", "scheduler")}, "edit")
        second = materialize_graph(on("w2"), progress=False, instance=instance)
        assert second.success, second.error
        said = lines(second)
        assert "source repo: 2 listed, 1 read, 1 unchanged, 0 deleted" in said, said
        assert "source notes: 3 listed, 0 read, 3 unchanged, 0 deleted" in said, said
        assert f"commit {c1[:12]}..{c2[:12]}: 1 modified" in said, said  # c1: the bucket's
        assert not list((tmp_path / "w2").rglob("state.json"))

    shown = status_report(replace(base, work_dir=str(tmp_path / "w3" / "work")))["sources"]
    assert any(ln.startswith("source repo (git ") and f"commit {c2[:12]}" in ln for ln in shown)
    assert any(ln.startswith("source notes (folder ") and ": ok" in ln for ln in shown), shown

    # the same sources into a local index with one kept work dir: the same table
    local = replace(base, index_uri=str(tmp_path / "local"), work_dir=str(tmp_path / "lw"))
    assert materialize_graph(local, progress=False).success
    want = IndexStore(local.index_uri).published()
    assert_same_table(
        IndexStore(local.index_uri), want, IndexStore(uri), IndexStore(uri).published()
    )
