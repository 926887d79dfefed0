"""Issue 32 through the Dagster graph, on the real model, a real instance and a real LanceDB
index (local and on the S3 server): ``RAG_ADAPT=on`` trains ``adapted_encoder``, the base
model's table is published first, the adapted one follows through the evaluation gate and is
one ``rollback`` away; a new adapted model makes exactly ``chunk_embeddings`` stale; a model
that does not beat its base is not proposed; every query path follows the published table's
model; ``rag-assets adapt`` and ``status`` say what happened."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.data_version import CachingStaleStatusResolver
from dagster._core.loader import LoadingContextForTest

from rag_assets.defs import adapt as adapt_defs
from rag_assets.defs.build import build_definitions
from rag_assets.defs.run import materialize_graph, run_adapt
from rag_assets.lib.index.adapt import Recipe
from rag_assets.lib.index.adapted import LOCAL_MODELS, is_adapted, read_record
from rag_assets.lib.index.onnx_encoder import follow_published, query_embedder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.query.retrieve import Index, PublishedIndex
from rag_assets.serve.status import status_report
from rag_assets.settings import Settings
from rag_assets_tests.helpers import SAMPLE_EVAL, graph_settings

pytestmark = pytest.mark.slow  # real model, real training, Dagster runs

ASSETS = [
    "adapted_encoder",
    "chunks",
    "chunk_embeddings",
    "retrieval_eval",
    "refusal_threshold",
    "published_index",
]
QUESTION = "How do I roll back to the previous embedding model?"


@pytest.fixture
def tiny(monkeypatch):
    """The recipe's real loop at a test's size: 4 pairs a batch, 64 word-pieces, lr 1e-4."""
    monkeypatch.setattr(
        adapt_defs, "BASE_RECIPE", Recipe(batch_size=4, train_max_length=64, lr=1e-4)
    )


def _settings(tmp: Path, docs: Path, uri: str = "", **kw) -> Settings:
    values = {"adapt": "on", "adapt_steps": 3, "embed_threads": 1, **kw}
    return graph_settings(tmp, docs, uri, **values)


def _stale(defs: dg.Definitions, instance: dg.DagsterInstance) -> set[str]:
    resolver = CachingStaleStatusResolver(
        instance, defs.resolve_asset_graph(), LoadingContextForTest(instance)
    )
    return {k for k in ASSETS if resolver.get_status(dg.AssetKey(k)).name != "FRESH"}


def test_adapt_publishes_base_then_adapted_through_the_gate_and_queries_follow(
    tmp_path, sample_docs, index_uri, tiny, monkeypatch
):
    """Locally with no RAG_ADAPT at all (issue 44: ``auto``, the default), on S3 with ``on``."""
    auto = not index_uri.startswith("s3://")
    s = _settings(tmp_path, sample_docs, index_uri, adapt="auto" if auto else "on")
    assert (s.adapt == Settings().adapt) == auto  # the default is auto
    instance = dg.DagsterInstance.ephemeral()
    outcome = materialize_graph(s, progress=False, instance=instance)
    assert outcome.success, outcome.error
    store = IndexStore(index_uri)
    record = read_record(store)
    assert record is not None and record.proposed, record and record.reason
    # a new index: the base model's table was published first, in a run of its own
    assert "embeddings are written with: sentence-transformers/all-MiniLM-L6-v2\n" in (
        outcome.preceded_by + "\n"
    )
    assert "nothing is published yet" in outcome.preceded_by
    # auto trains only after that publish (the first answers never wait for a training); on
    # trains before it and embeds the base model first
    second = outcome.summary()[len(outcome.preceded_by) :]
    assert ("3 steps in" in outcome.preceded_by, "3 steps in" in second) == (not auto, auto)
    pub = store.published()
    assert pub is not None and (pub.stamps.model, pub.stamps.revision) == (
        record.model_id,
        record.revision,
    )
    stack = store.rollback_stack()
    assert len(stack) == 2 and not is_adapted(stack[0].stamps.model)
    # the adapted table passed the gate against the base one, on the same questions
    assert ("not_worse_than_published", True, "ERROR") in outcome.checks
    report = json.loads(store.read_text(f"evaluation/{pub.table}@{pub.version}.json") or "{}")
    assert report["upgrade"] is not None  # compared with the published base table
    assert report["adaptation"]["this_table_adapted"] is True
    ev = outcome.metadata["retrieval_eval"]
    assert ev["adaptation/self_mrr_adapted"] > ev["adaptation/self_mrr_base"]
    assert "held-out self-retrieval MRR" in ev["results"]
    ad = outcome.metadata["adapted_encoder"]
    assert ad["embedding_model"] == record.model_id and ad["pairs"] > 0
    assert len(ad["loss_curve"]) == ad["steps"] == 3 and ad["train_seconds"] > 0
    assert outcome.metadata["chunk_embeddings"]["stamps"]["model"] == record.model_id
    assert _stale(build_definitions(s), instance) == set()

    # every query path: the ONNX query encoder (CLI, service, MCP, bench) is the adapted
    # model's export, made once and cached under its revision
    embedder, kind = query_embedder(s)
    assert kind == "onnx" and embedder.spec.model_id == record.model_id
    assert embedder.query_encoder.manifest["revision"] == record.revision
    monkeypatch.setenv("RAG_WORK_DIR", s.work_dir)
    index = Index.open(index_uri)  # the Python API
    assert index.embedder.spec.revision == record.revision and index.search(QUESTION, "dense")
    if index_uri.startswith("s3://"):  # _rag_files rows, materialised once for loading
        assert (Path(s.work_dir) / LOCAL_MODELS / record.revision / "modules.json").is_file()
    # a long-running service follows the pointer: rollback brings the base model back
    holder = PublishedIndex(index_uri, embedder=embedder, embedder_for=follow_published(s))
    assert holder.current().embedder is embedder
    store.rollback()
    base_index = holder.current()
    assert not is_adapted(base_index.embedder.spec.model_id)
    assert base_index.search(QUESTION, "dense", k=1)
    adaptation = status_report(s)["adaptation"]
    assert adaptation["enabled"] and adaptation["policy"] == "changed:0.2"
    assert adaptation["mode"] == ("auto" if auto else "on")
    assert adaptation["published_model_adapted"] is False
    assert adaptation["serving"].startswith("the base model: the adapted model was proposed")
    assert adaptation["last_training"]["revision"] == record.revision
    assert adaptation["changed_since_training"] == 0.0


def test_a_new_adapted_model_makes_exactly_the_embeddings_stale(tmp_path, sample_docs, tiny):
    s = _settings(tmp_path, sample_docs)
    defs = build_definitions(s)
    instance = dg.DagsterInstance.ephemeral()
    job = defs.resolve_job_def("index_job")
    assert job.execute_in_process(instance=instance).success  # base published, model proposed
    assert _stale(defs, instance) == set()
    record = read_record(IndexStore(s.index_uri))
    assert record is not None and record.proposed
    # adapted_encoder again (policy: kept), now with a published table to gate against: its
    # data version is the adapted model, and exactly the embeddings are stale, as for a model
    # change (test_defs.py)
    res = dg.materialize(
        list(defs.assets or []),
        instance=instance,
        resources=defs.resources,
        selection=dg.AssetSelection.assets("adapted_encoder"),
    )
    assert res.success
    assert _stale(defs, instance) == {"chunk_embeddings"}
    assert job.execute_in_process(instance=instance).success
    assert _stale(defs, instance) == set()
    pub = IndexStore(s.index_uri).published()
    assert pub is not None and pub.stamps.model == record.model_id
    # a forced retrain of the same pairs gives the same model: nothing downstream is stale
    ok, md, _ = run_adapt(s, force=True, instance=instance)
    assert ok and md["trained"] == 1 and md["revision"] == record.revision
    assert _stale(defs, instance) == set()


def test_a_model_that_does_not_beat_its_base_is_not_proposed(tmp_path, sample_docs, monkeypatch):
    monkeypatch.setattr(
        adapt_defs, "BASE_RECIPE", Recipe(batch_size=4, train_max_length=64, lr=0.0)
    )
    s = _settings(tmp_path, sample_docs, adapt_steps=1)
    outcome = materialize_graph(s, progress=False, instance=dg.DagsterInstance.ephemeral())
    assert outcome.success and not outcome.preceded_by
    ad = outcome.metadata["adapted_encoder"]
    assert ad["status"] == "not proposed" and "does not beat its base" in ad["reason"]
    assert ad["self_mrr/base"] == ad["self_mrr/adapted"]
    assert ad["reason"] in adapt_defs.summary(ad, None)  # issue 43: the why, not only in --json
    pub = IndexStore(s.index_uri).published()
    assert pub is not None and not is_adapted(pub.stamps.model)  # the base model embeds
    assert outcome.metadata["retrieval_eval"]["adaptation/status"] == "not proposed"


def test_rag_assets_adapt_and_status_commands(tmp_path, sample_docs, tiny, monkeypatch, capsys):
    from rag_assets.cli import main

    for k in ("RAG_ADAPT_STEPS", "RAG_EMBEDDING_MODEL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RAG_ADAPT", "off")  # `adapt` trains all the same (issue 44: auto apart)
    monkeypatch.setenv("RAG_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("RAG_EVAL_DIR", str(SAMPLE_EVAL))
    monkeypatch.setenv("RAG_EMBED_THREADS", "1")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir()
    index = str(tmp_path / "index")
    args = ["adapt", "--documents", str(sample_docs), "--index", index, "--steps", "2"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "adapted encoder: no adapted model yet" in out
    # issue 44: off a terminal, timed lines as `index` prints them, the training's among them
    assert "adapt: chunk " in err and "adapt: adapt " in err
    assert "training 1/2 steps (loss " in err and "training 2/2 steps (loss " in err
    assert "2 steps in" in out and "RAG_ADAPT is off" in out
    assert main([*args, "--json"]) == 0  # the policy keeps it: nothing trained
    md = json.loads(capsys.readouterr().out)
    assert md["trained"] == 0 and "kept" in md["decision"] and "loss_plot" not in md
    assert main(["status", "--index", index]) == 0  # nothing published yet, a training done
    out = capsys.readouterr().out
    assert "published: nothing yet" in out and "last training: " in out
    assert main(["index", "--documents", str(sample_docs), "--index", index, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["status", "--index", index]) == 0
    out = capsys.readouterr().out
    assert "adapted encoder: off (RAG_ADAPT); retrain policy changed:0.2" in out
    assert "published table adapted: no" in out
    monkeypatch.setenv("RAG_ADAPT", "on")  # issue 51: this shell's, not the index's
    assert main(["status", "--index", index, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["adaptation"]
    assert report["mode"] == "off" and not report["enabled"]  # as declared by `index`
    assert report["last_training"]["steps"] == 2
    assert main(["adapt", "--index", index, "--steps", "-1"]) == 1
    assert "--steps -1" in capsys.readouterr().err
    monkeypatch.setenv("RAG_ADAPT", "maybe")
    assert main(["adapt", "--index", index]) == 1
    assert "RAG_ADAPT='maybe': not one of on, off" in capsys.readouterr().err
    monkeypatch.setenv("RAG_ADAPT", "on")
    monkeypatch.setenv("RAG_ADAPT_RETRAIN", "weekly")
    assert main(["adapt", "--index", index]) == 1
    assert "RAG_ADAPT_RETRAIN='weekly'" in capsys.readouterr().err
    assert main(["status", "--index", index]) == 0  # issue 51: the declared policy, and why
    out = capsys.readouterr().out
    assert "retrain policy changed:0.2" in out and "adaptation: off, set at the first build" in out
    assert "not taken: RAG_ADAPT_RETRAIN='weekly' from this environment" in out
