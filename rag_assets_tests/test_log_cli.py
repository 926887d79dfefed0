"""``rag-assets log list|purge|gaps`` and the query log in ``status`` (issue 33): what they
print, and one line for every bad input with the log left as it was."""

from __future__ import annotations

import json

import pytest

from rag_assets.cli import main
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import QueryLog
from rag_assets.lib.ingest.chunk import strategy
from rag_assets_tests.lib.evaluate.test_traffic import add
from rag_assets_tests.lib.index.test_indexer import HashEmbedder, _corpus

pytestmark = pytest.mark.slow  # CLI runs over a real LanceDB index


@pytest.fixture
def logged(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index_folder(_corpus(tmp_path / "docs", n=1), index, strategy("E", 300), HashEmbedder())
    log = QueryLog(IndexStore(index))
    ids = {
        "old": add(log, "an old refused question", "right_refusal", seq=1),
        "kept": add(log, "how to roll back", "wrong", seq=2, decision="answered"),
    }
    log.add_entries([{"id": "u" * 22, "at": "z", "at_ns": 9 * 10**18, "question": "newest one"}])
    for var in ("RAG_QUERY_LOG", "RAG_INDEX_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAG_INDEX_URI", str(index))
    return index, ids


def test_log_list_and_status(logged, capsys):
    index, ids = logged
    assert main(["log", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "newest one" in lines[0] and "right_refusal" in lines[-1] and len(lines) == 3
    assert main(["log", "list", "--unreviewed", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["question"] for r in rows] == ["newest one"]
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "query log: 3 entries; reviewed traffic: 0 answerable and 1 out-of-domain" in out
    assert "20 more answered/missed and 19 more should_refuse/right_refusal" in out
    assert main(["status", "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["query_log"]
    assert q["entries"] == 3 and q["calibration"]["needed"] == {
        "answerable": 20,
        "out_of_domain": 19,
    }


def test_log_purge_by_id_and_date(logged, capsys):
    index, ids = logged
    assert main(["log", "purge", "--id", ids["old"]]) == 0
    assert "purged 1 entries and 1 verdicts" in capsys.readouterr().out
    assert main(["log", "purge", "--before", "2026-01-01"]) == 0  # at_ns=2: 1970
    assert "purged 1 entries and 1 verdicts" in capsys.readouterr().out
    assert [e["question"] for e in QueryLog(IndexStore(index)).entries()] == ["newest one"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["log", "purge"], "log purge needs --before DATE or --id ID"),
        (["log", "purge", "--before", "last week"], "--before 'last week': give a date such as"),
        (["log", "purge", "--before", "2026-02-30"], "not a real date or time"),
        (["log", "purge", "--id", "../../etc/passwd"], "is not a query id"),
        (["log", "list", "--limit", "0"], "--limit must be >= 1"),
        (["log"], "log needs a command: list, purge or gaps"),
        (["review", "--limit", "-1"], "--limit must be >= 0"),
    ],
)
def test_bad_log_commands_are_one_line_and_change_nothing(logged, capsys, argv, needle):
    index, _ = logged
    before = QueryLog(IndexStore(index)).entries()
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert QueryLog(IndexStore(index)).entries() == before


def test_a_bad_log_setting_is_one_line(logged, capsys, monkeypatch):
    monkeypatch.setenv("RAG_QUERY_LOG", "sometimes")
    assert main(["status"]) == 1
    assert "RAG_QUERY_LOG='sometimes': not one of on, off" in capsys.readouterr().err
    monkeypatch.setenv("RAG_QUERY_LOG", "on")
    monkeypatch.setenv("RAG_QUERY_LOG_DAYS", "-3")
    assert main(["status"]) == 1
    assert "RAG_QUERY_LOG_DAYS='-3'" in capsys.readouterr().err


def test_log_commands_never_create_an_index(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAG_INDEX_URI", str(tmp_path / "nowhere"))
    assert main(["log", "list"]) == 1
    assert "no index at" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()


def test_log_gaps_groups_the_refused_questions(logged, capsys, monkeypatch):
    monkeypatch.setenv("RAG_QUERY_ENCODER", "torch")
    assert main(["log", "gaps", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["groups"][0]["example"] == "an old refused question"
    assert "embeddings" in out["grouped_by"]


def test_bench_serve_query_log_flag_and_its_cleanup(logged, capsys):
    """`bench --serve --query-log on,off` times the log's cost; it takes on/off only, and the
    entries the bench wrote (its questions, since it started) are purged afterwards."""
    from rag_assets.bench.speed import _purge_bench_entries

    assert main(["bench", "--serve", "--query-log", "sometimes"]) == 1
    assert "--query-log 'sometimes': give on, off or on,off" in capsys.readouterr().err
    index, _ = logged
    log = QueryLog(IndexStore(index))
    add(log, "bench question", "wrong", seq=5, decision="answered")  # at_ns 5: before the bench
    log.add_entries(
        [{"id": "b" * 22, "at": "z", "at_ns": 8 * 10**18, "question": "bench question"}]
    )
    assert _purge_bench_entries(str(index), 7 * 10**18, ["bench question ", "other"]) == 1
    left = [e["question"] for e in log.entries()]
    assert left.count("bench question") == 1 and "newest one" in left
