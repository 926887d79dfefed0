"""Issue 19 end to end: a user's own folder through the real graph (real Dagster instance, real
model, real LanceDB), first with no questions and no model (unrelated-only), then with a model
endpoint (a real HTTP server whose replies a function decides: generated), an edit (only its
needles re-asked), an endpoint that fails (the last set kept), and a reviewed export."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest

from rag_assets.defs.run import materialize_graph
from rag_assets.lib.index.store import IndexStore
from rag_assets.serve.status import status_report
from rag_assets.settings import Settings
from rag_assets_tests.lib.fake_llm import fake_llm, user_text

DOCS = {
    "faq.md": "# Visitor FAQ\n\n## Tickets\n\nAdults pay eleven euros for a day ticket at the "
    "desk.\n\nChildren under twelve enter for free with an adult.\n\n## Hours\n\n"
    "The museum opens at ten in the morning and closes at six in the evening.\n",
    "wrecks.md": "# Shipwrecks\n\nThe bell of the Aurora hangs in the entrance hall since 1923.\n\n"
    "Divers found the second anchor of the Aurora near the northern reef in 1961.\n",
    "handbook.md": "# Staff handbook\n\n## Keys\n\nThe night guard keeps the master keys in the "
    "locked cabinet by the loading door.\n\nEvery volunteer signs the visitor log before the "
    "first tour of the day starts.\n",
    "garden.md": "# Museum garden\n\nThe herb garden behind the cafe grows thyme, sage and "
    "rosemary for the kitchen.\n\nVolunteers water the beds every evening during July and "
    "August.\n",
    "talks.md": "# Evening talks\n\nA curator gives a talk about the harbour history on the "
    "first Friday of every month.\n\nSeats for the talks are free but must be booked a week "
    "ahead.\n",
    "shop.md": "# Museum shop\n\nThe shop sells postcards, maps of the old harbour and model ships "
    "made by local carpenters.\n\nMembers get ten percent off everything in the shop.\n",
}


def _writer(body):
    text = user_text(body)
    if "Sentence:" in text:
        return "COURSE: What does the documentation say about it?\nTICKET: quick q pls", None
    if "Sections:" in text:
        title = re.search(r"Title: (.*)", text).group(1)
        s = body.get("seed", 0)
        k = f"{title.split('.')[0]}{s}"
        return (
            f"TERM: Zeppelin{k} | QUESTION: Is there a Zeppelin{k} tour?\n"
            f"TERM: Quokka{k} | QUESTION: Can I book the Quokka{k} room?\n"
            f"TERM: Harbour | QUESTION: Is the Harbour open?"  # named by the corpus: rejected
        ), None
    return "No", {"Yes": 0.05, "No": 0.95}


def _settings(tmp: Path, docs: Path, uri: str, **kw) -> Settings:
    return Settings(
        adapt="off",  # the tests' default (conftest); issue 44's auto is tested on its own
        documents_dir=str(docs),
        index_uri=uri,
        work_dir=str(tmp / "work"),
        eval_dir=str(tmp / "no-questions"),
        recall_floor=0.0,
        **kw,
    )


def _published(uri: str) -> dict:
    entry = IndexStore(uri).published(strict=False)
    assert entry is not None
    return entry.to_dict()


def _asks(seen: list) -> int:
    return sum(1 for b in seen if "Sentence:" in user_text(b))


@pytest.mark.slow
def test_own_folder_unrelated_only_then_generated_then_edited_then_reviewed(
    tmp_path, second_model_dir, index_uri
):
    docs = tmp_path / "my-docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        # 1. no question set, no model: a calibrated cut all the same, from the unrelated list
        settings = _settings(tmp_path, docs, index_uri)
        out = materialize_graph(settings, progress=False, instance=instance)
        assert out.success, out.error
        pub = _published(index_uri)
        assert pub["threshold_source"] == "unrelated-only"
        assert pub["evaluation_source"] == "unrelated-only"
        assert pub["threshold"] != 0.675
        assert any(n == "recall_at_20_above_floor" and ok for n, ok, _ in out.checks)
        assert status_report(settings)["published"]["evaluation_source"] == "unrelated-only"
        th = instance.get_latest_materialization_event(dg.AssetKey("refusal_threshold"))
        assert th.asset_materialization.metadata["cut_source"].value == "unrelated-only"

        with fake_llm(_writer, served="fake-model") as (url, seen):
            # 2. a model endpoint: the set is written and calibrates the cut
            s2 = replace(settings, llm_url=url + "/v1")
            out = materialize_graph(s2, progress=False, instance=instance)
            assert out.success, out.error
            pub = _published(index_uri)
            assert pub["evaluation_source"] == "generated (model fake-model)", pub
            assert pub["threshold_source"] == "calibrated" and pub["evaluation"] == "evaluated"
            counts = pub["evaluation_counts"]
            assert counts["questions"] >= 8 and counts["near"] + counts["unrelated"] >= 20
            eq = instance.get_latest_materialization_event(dg.AssetKey("eval_questions"))
            meta = eq.asset_materialization.metadata
            assert meta["source"].value.startswith("generated") and "preview" in meta
            assert meta["cost/llm_calls"].value > 0
            first = _asks(seen)

            # 3. an edit: only the edited document's needles are asked again
            (docs / "shop.md").write_text(
                DOCS["shop.md"].replace("Members get ten percent", "Members now get twenty percent")
            )
            out = materialize_graph(s2, progress=False, instance=instance)
            assert out.success, out.error
            again = _asks(seen) - first
            assert 1 <= again <= 2, again  # the changed sentence (+ at most a boundary one)

            # 4. the endpoint fails: the last good set stays, and says so
            s3 = replace(settings, llm_url="http://127.0.0.1:9/v1")
            (docs / "garden.md").write_text(
                DOCS["garden.md"] + "\nA new bench stands by the pond.\n"
            )
            out = materialize_graph(s3, progress=False, instance=instance)
            assert out.success, out.error
            assert _published(index_uri)["evaluation_source"] == "generated (model fake-model)"
            eq = instance.get_latest_materialization_event(dg.AssetKey("eval_questions"))
            assert "kept the last generated set" in eq.asset_materialization.metadata["notes"].value

        # 5. a person exports the set, strikes a row and points RAG_EVAL_DIR at it: reviewed
        from rag_assets.cli import main

        review = tmp_path / "review"
        assert main(["questions", "--export", str(review), "--index", settings.index_uri]) == 0
        lines = (review / "questions.jsonl").read_text().splitlines()
        (review / "questions.jsonl").write_text("\n".join(lines[1:]) + "\n")
        out = materialize_graph(
            replace(settings, eval_dir=str(review)), progress=False, instance=instance
        )
        assert out.success, out.error
        pub = _published(index_uri)
        assert pub["evaluation_source"] == "reviewed"
        assert pub["evaluation_counts"]["questions"] == len(lines) - 1

        # 6. a model upgrade is compared with the published table on the same questions
        before = pub["table"]
        s6 = replace(settings, eval_dir=str(review), embedding_model=str(second_model_dir))
        out = materialize_graph(s6, progress=False, instance=instance)
        key = dg.AssetCheckKey(dg.AssetKey("retrieval_eval"), "not_worse_than_published")
        check = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        meta = check.event.dagster_event.event_specific_data.metadata
        assert "| published |" in meta["table"].value and "hit@4/p" in meta
        passed = check.event.dagster_event.event_specific_data.passed
        assert (_published(index_uri)["table"] != before) == passed


def test_the_sensor_finishes_an_unfinished_generated_set_once_per_progress(index_uri):
    from rag_assets.defs.questions import DECISION, build_continuation_sensor
    from rag_assets.lib.evaluate.question_source import Decision

    sensor = build_continuation_sensor(index_uri)
    ctx = dg.build_sensor_context()
    assert isinstance(sensor(ctx), dg.SkipReason)  # nothing written yet
    store = IndexStore(index_uri)  # a file under evaluation/, or a _rag_files row on s3://
    unfinished = Decision("generated", "x", {"questions": 5, "near": 0}, "m", complete=False)
    store.write_file(DECISION, json.dumps(unfinished.to_dict()))
    req = sensor(ctx)
    assert isinstance(req, dg.RunRequest) and req.run_key == "questions-5-near-0"
    store.write_file(
        DECISION, json.dumps(Decision("generated", "x", {"questions": 32}, "m").to_dict())
    )
    assert isinstance(sensor(ctx), dg.SkipReason)
