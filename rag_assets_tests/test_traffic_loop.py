"""Issue 33 end to end on the real thing (real model, real Dagster instance, real LanceDB): a
folder with no question set serves traffic; each query gets the verdict its truth implies; the
graph then calibrates on the reviewed traffic (``evaluation_source: traffic``), the sensor
follows new reviews and ignores an unchanged log, the observed log's figures and the drift
check react to a burst of off-topic questions, the content-gap report lists them, the replay
compares a candidate with what users were shown, an adapted encoder (``RAG_ADAPT=on``, issue
44) is replayed with its own model and publishes, and no question leaves the index store."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest

from rag_assets.commands.traffic import replay_command
from rag_assets.defs import adapt as adapt_defs
from rag_assets.defs.build import build_definitions
from rag_assets.defs.run import materialize_graph
from rag_assets.defs.traffic import build_reviews_sensor, replay_candidate
from rag_assets.defs.traffic_set import GAPS_MD, QUERY_LOG_KEY
from rag_assets.lib.evaluate.questions import load_needle_set
from rag_assets.lib.evaluate.questions_gen import unrelated_questions
from rag_assets.lib.index.adapt import Recipe
from rag_assets.lib.index.adapted import is_adapted, read_record
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import QueryLog
from rag_assets.serve.service import Service
from rag_assets.serve.status import status_report
from rag_assets.settings import Settings
from rag_assets_tests.helpers import SAMPLE_DOCS, SAMPLE_EVAL

pytestmark = pytest.mark.slow

MARK = "zqxj"  # in no document and no shipped list: shows where a question text went


def _traffic() -> list[tuple[str, dict | None]]:
    """course/ticket phrasings of the sample set's needles and its out-of-domain questions,
    interleaved (a steady mix), each with its truth (the question row, or None)."""
    qset = load_needle_set(SAMPLE_EVAL)
    inside = [(q.queries[p], q) for q in qset.questions for p in sorted(q.queries)]
    outside = [(o.query, None) for o in qset.out_of_domain]
    out = []
    for i in range(max(len(inside), len(outside))):
        out += inside[i : i + 1] + outside[i : i + 1]
    return [(text, q) for text, q in out]


def _verdict(answer: dict, truth) -> dict:
    """The verdict the truth implies ("missed" with the needle when it was not cited)."""
    if truth is None:
        return {"verdict": "right_refusal" if answer["no_answer"] else "should_refuse"}
    for c in answer["citations"]:
        if truth.needle in c["quote"]:
            return {"verdict": "answered", "source": c["index"]}
    return {"verdict": "missed", "document": truth.document, "quote": truth.needle}


def _observe(settings: Settings, instance) -> tuple[dict, dg.AssetCheckEvaluation]:
    """Observe query_log and run its drift check (what the cron does), through Dagster."""
    defs = build_definitions(settings)
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection={QUERY_LOG_KEY},
        asset_check_selection={dg.AssetCheckKey(QUERY_LOG_KEY, "query_log_drift")},
    )
    res = job.execute_in_process(instance=instance)
    assert res.success
    (obs,) = res.get_asset_observation_events()
    meta = {
        k: getattr(v, "value", v)
        for k, v in obs.asset_observation_data.asset_observation.metadata.items()
    }
    (check,) = res.get_asset_check_evaluations()
    return meta, check


def _files_with(root: Path, text: str) -> list[str]:
    needle = text.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_reviewed_traffic_calibrates_the_gate_and_the_log_is_watched(
    tmp_path, second_model_dir, monkeypatch
):
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE_DOCS, docs)
    (tmp_path / "no-questions").mkdir()
    settings = Settings(
        adapt="off",  # the tests' default (conftest); issue 44's auto is tested on its own
        documents_dir=str(docs),
        index_uri=str(tmp_path / "index"),
        work_dir=str(tmp_path / "work"),
        eval_dir=str(tmp_path / "no-questions"),
        recall_floor=0.0,
        query_encoder="torch",
    )
    store = IndexStore(settings.index_uri)
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        # 1. no question set: the model-free cut
        out = materialize_graph(settings, progress=False, instance=instance)
        assert out.success, out.error
        first = store.published()
        assert first.evaluation_source == "unrelated-only"
        sensor = build_reviews_sensor(settings.index_uri)
        assert isinstance(sensor(dg.build_sensor_context()), dg.SkipReason)  # no log yet

        # 2. traffic through the service, each query judged as its truth says
        service = Service.open(settings)
        traffic = _traffic()
        asked = []
        for text, truth in traffic:
            _, answer = service.ask(text, interface="http/ask")
            asked.append((answer, truth))
        marked = service.ask(f"{MARK} how many moons does Jupiter have?")[1]
        for answer, truth in asked:
            body = {"query_id": answer["query_id"], **_verdict(answer, truth)}
            service.log.feedback(body, service.index().documents, caller=None, interface="http")
        service.log.close()
        log = QueryLog(store)
        assert log.count() == len(traffic) + 1 and len(log.reviews()) == len(traffic)
        calibration = status_report(settings)["query_log"]["calibration"]
        assert calibration["ready"] and calibration["needed"] == {
            "answerable": 0,
            "out_of_domain": 0,
        }

        # 3. the sensor sees reviews the evaluation has not read; the graph calibrates on them
        req = sensor(dg.build_sensor_context())
        assert isinstance(req, dg.RunRequest) and QUERY_LOG_KEY in req.asset_selection
        out = materialize_graph(settings, progress=False, instance=instance)
        assert out.success, out.error
        pub = store.published()
        assert pub.evaluation_source == "traffic" and pub.threshold_source == "calibrated"
        assert pub.evaluation_counts["queries"] + pub.evaluation_counts["dropped"] == 24
        assert pub.evaluation_counts["near"] + pub.evaluation_counts["unrelated"] == 22
        report = status_report(settings)
        assert report["published"]["evaluation_source"] == "traffic"
        assert isinstance(sensor(dg.build_sensor_context()), dg.SkipReason)  # read: nothing new
        before_digest = log.reviews_digest()
        log_entry = log.entries()[-1]  # the marked question, unreviewed so far
        service2 = Service.open(settings)
        service2.log.feedback(
            {"query_id": log_entry["id"], "verdict": "right_refusal"}
            if marked["no_answer"]
            else {"query_id": log_entry["id"], "verdict": "should_refuse"},
            service2.index().documents,
            caller=None,
            interface="http",
        )
        req2 = sensor(dg.build_sensor_context())
        assert isinstance(req2, dg.RunRequest) and req2.run_key != req.run_key
        assert log.reviews_digest() != before_digest

        # 4. the observed log: figures, and the drift check steady, then after a burst
        for text, _ in traffic + traffic[: 120 - 2 * len(traffic) - 1]:
            service2.ask(text)
        service2.log.writer.flush(30)
        meta, check = _observe(settings, instance)
        assert meta["entries"] == 120 and meta["queries_last_24h"] == 120
        assert 0 < meta["refusal_rate_24h"] < 1 and meta["latency_ms_p50_24h"] > 0
        assert meta["nearest_distance_p10_24h"] <= meta["nearest_distance_p90_24h"]
        assert meta["reviewed"] == len(traffic) + 1
        assert check.passed, check.metadata  # four steady windows
        burst = unrelated_questions()[:30]
        for text in burst:
            service2.ask(text)
        service2.log.close()
        meta, check = _observe(settings, instance)
        assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
        assert "up from" in check.metadata["reasons"].value
        assert meta["refusal_rate_24h"] > 0

        # 5. content gaps: the refused questions, grouped, in a file of the store
        out = materialize_graph(settings, progress=False, instance=instance)
        assert out.success, out.error
        gaps = store.read_text(GAPS_MD)
        assert gaps is not None and burst[0] in gaps and "Asked" in gaps
        assert "questions" in out.metadata["content_gaps"]

        # 6. replay on the candidate: the same table and fusion agree with what users saw
        rep, where = replay_candidate(store, service2.index().embedder, None, "rrf", force=True)
        assert rep is not None and rep["top4_agreement"] == 1.0 and rep["top1_same"] == 1.0
        cut = rep["candidate"]["cut"]
        reviewed = log.reviews()
        shown: dict[str, dict] = {}  # per question: its reviewed answer, else its newest
        for e in log.entries():
            key = " ".join(e["question"].lower().split())
            if e["decision"] and (key not in shown or shown[key]["id"] not in reviewed):
                shown[key] = e
        # the oracle: the same table and retriever give the same hits, so an ask answers now
        # iff its nearest hit is under the candidate's cut
        assert rep["flips"]["refused_to_answered"] == sum(
            e["decision"] == "refused" and e["nearest_distance"] < cut for e in shown.values()
        )
        assert rep["flips"]["answered_to_refused"] == sum(
            e["decision"] == "answered" and e["nearest_distance"] >= cut for e in shown.values()
        )
        assert rep["reviewed"]["answerable"] > 0 and "hit@4" in rep["tests"]
        assert MARK not in json.dumps(rep)  # figures and ids only

        # 7a. issue 44: RAG_ADAPT=on on this index (reviewed traffic): the adapted table is
        # replayed with its own model, not the base one (a StampMismatch before), and publishes
        # (the recipe's real loop at a test's size, as in test_adapt_graph.py)
        tiny = Recipe(batch_size=4, train_max_length=64, lr=1e-4)
        monkeypatch.setattr(adapt_defs, "BASE_RECIPE", tiny)
        adapted = replace(settings, adapt="on", adapt_steps=3, embed_threads=1)
        out = materialize_graph(adapted, progress=False, instance=instance)
        assert out.success, out.error
        assert ("not_worse_on_traffic", True, "ERROR") in out.checks
        assert out.check_metadata["not_worse_on_traffic"]["questions"] > 0
        record = read_record(store)
        now = store.published()
        assert record is not None and record.proposed, record and record.reason
        sep = record.self_retrieval["separation"]  # the graph measures it against the 221
        assert sep["adapted"]["unrelated"] == 221
        assert sep["adapted"]["answered"] >= sep["base"]["answered"]
        assert (now.stamps.model, now.stamps.revision) == (record.model_id, record.revision)
        assert now.evaluation_source == "traffic" and not out.preceded_by  # one run
        # `rag-assets replay --candidate`: the adapted table and the base one, each with its model
        base_table = store.rollback_stack()[-2]
        assert not is_adapted(base_table.stamps.model)
        for entry in (now, base_table):
            text = replay_command(adapted, settings.index_uri, f"{entry.table}@{entry.version}",
                                  None, True)  # fmt: skip
            assert json.loads(text)["questions"] > 0

        # 7b. a model change: the blocking replay check runs before the new table publishes
        before = store.published()
        upgrade = replace(settings, embedding_model=str(second_model_dir))
        out = materialize_graph(upgrade, progress=False, instance=instance)
        names = {n: ok for n, ok, _ in out.checks}
        assert "not_worse_on_traffic" in names, out.checks
        replay_meta = out.check_metadata["not_worse_on_traffic"]
        assert replay_meta["questions"] > 0 and "top-4 agreement" in replay_meta["replay"]
        assert (store.published().table != before.table) == names["not_worse_on_traffic"]

        # 8. the questions never left the index store
        assert _files_with(tmp_path / "index", MARK)  # the log has it
        reviewed = [traffic[0][0], traffic[1][0]]  # a needle's phrasing, an out-of-domain one
        assert all(_files_with(tmp_path / "index", q) for q in reviewed)  # the traffic set
        for outside in (tmp_path / "work", tmp_path / "home"):
            for text in (MARK, burst[0], *reviewed):
                assert _files_with(outside, text) == [], (outside, text)
