"""The reviewed-traffic set in the graph's store (issue 33), on a local directory and on a real
S3 server: written where the index is (``evaluation/traffic``: files, or ``_rag_files`` rows),
read back for the evaluation, removed after a purge; the sensor's view of the reviews."""

from __future__ import annotations

import logging

import dagster as dg

from rag_assets.defs.questions import DECISION
from rag_assets.defs.traffic import build_reviews_sensor
from rag_assets.defs.traffic_set import forget_derived, traffic_choice, traffic_copy
from rag_assets.lib.evaluate import traffic
from rag_assets.lib.evaluate.questions import load_needle_set
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import QueryLog
from rag_assets_tests.lib.evaluate.test_traffic import TEXTS, add


def _reviews(log: QueryLog) -> None:
    for i in range(traffic.MIN_ANSWERABLE):
        add(
            log,
            f"go back {i}",
            "answered",
            quote="Run the rollback command",
            document="a.md",
            seq=i,
        )
    for i in range(traffic.MIN_OUT_OF_DOMAIN):
        add(log, f"elsewhere {i}", "should_refuse", seq=100 + i)


def test_the_traffic_set_lives_in_the_store_and_goes_with_a_purge(index_uri):
    store = IndexStore(index_uri)
    log = QueryLog(store)
    assert traffic_choice(store, TEXTS, None, logging.getLogger()) == (None, {})
    _reviews(log)
    decision, progress = traffic_choice(store, TEXTS, None, logging.getLogger())
    assert decision is not None and decision.source == "traffic" and progress["ready"]
    assert decision.traffic["digest"] == log.reviews_digest()
    assert store.file_names("evaluation/traffic") == [
        "evaluation/traffic/out_of_domain.jsonl",
        "evaluation/traffic/questions.jsonl",
        "evaluation/traffic/state.json",
    ]
    folder = traffic_copy(store) if store.remote else store.file_path("evaluation/traffic")
    qset = load_needle_set(folder)
    assert len(qset.queries()) == traffic.MIN_ANSWERABLE
    assert len(qset.out_of_domain) == traffic.MIN_OUT_OF_DOMAIN
    assert forget_derived(store) and store.file_names("evaluation/traffic") == []


def test_the_sensor_asks_for_an_evaluation_only_when_the_reviews_changed(index_uri, tmp_path):
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets_tests.lib.index.fake_index import HashEmbedder, _corpus

    sensor = build_reviews_sensor(index_uri)
    ctx = dg.build_sensor_context()
    if not store_exists(index_uri):
        assert isinstance(sensor(ctx), dg.SkipReason)  # nothing there: nothing created either
        assert not store_exists(index_uri)
    index_folder(_corpus(tmp_path / "docs", n=1), index_uri, strategy("E", 300), HashEmbedder())
    store = IndexStore(index_uri)
    assert isinstance(sensor(ctx), dg.SkipReason)  # no reviews
    log = QueryLog(store)
    _reviews(log)
    req = sensor(ctx)
    assert isinstance(req, dg.RunRequest) and req.run_key.startswith("reviews-")
    decision, _ = traffic_choice(store, TEXTS, None, logging.getLogger())  # as eval_questions
    import json

    store.write_file(DECISION, json.dumps(decision.to_dict()))
    assert isinstance(sensor(ctx), dg.SkipReason)  # the evaluation read every review
    add(log, "one more", "right_refusal", seq=500)
    req2 = sensor(ctx)
    assert isinstance(req2, dg.RunRequest) and req2.run_key != req.run_key


def store_exists(uri: str) -> bool:
    from pathlib import Path

    return "://" in uri or Path(uri).exists()
