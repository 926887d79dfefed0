"""``rag-assets log list|purge|gaps`` and the query log in ``status`` (issue 33): what they
print, and one line for every bad input with the log left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_assets.cli import main
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import QueryLog
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.log import new_query_id
from rag_assets_tests.lib.evaluate.test_traffic import add
from rag_assets_tests.lib.index.fake_index import HashEmbedder, _corpus

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
    assert all(" admin " in ln for ln in lines)  # issue 43: who asked, in every view
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


def test_an_id_that_starts_with_a_dash_is_purged_and_new_ids_never_do(logged, capsys):
    """1 stored id in 64 starts with ``-`` (made before ids avoided it): ``--id -x…`` must not
    read as an option."""
    index, _ = logged
    log = QueryLog(IndexStore(index))
    log.add_entries([{"id": "-" + "d" * 21, "at": "z", "at_ns": 5, "question": "dash"}])
    assert main(["log", "purge", "--id", "-" + "d" * 21]) == 0
    assert "purged 1 entries" in capsys.readouterr().out
    assert "dash" not in [e["question"] for e in QueryLog(IndexStore(index)).entries()]
    assert not any(new_query_id().startswith("-") for _ in range(2000))  # 1 - (63/64)^2000 ≈ 1


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
    """`bench --serve --query-log on,off` times the log's cost; it takes on/off only
    (`--observe`: on, metrics, off), and the entries the bench wrote (its questions, since it
    started) are purged afterwards."""
    from rag_assets.bench.speed import _purge_bench_entries

    assert main(["bench", "--serve", "--query-log", "sometimes"]) == 1
    assert "--query-log 'sometimes': give one or more of on, off\n" in capsys.readouterr().err
    assert main(["bench", "--serve", "--observe", "on,traces"]) == 1  # issue 52: three states
    assert "--observe 'on,traces': give one or more of on, metrics, off" in capsys.readouterr().err
    index, _ = logged
    log = QueryLog(IndexStore(index))
    add(log, "bench question", "wrong", seq=5, decision="answered")  # at_ns 5: before the bench
    log.add_entries(
        [{"id": "b" * 22, "at": "z", "at_ns": 8 * 10**18, "question": "bench question"}]
    )
    assert _purge_bench_entries(str(index), 7 * 10**18, ["bench question ", "other"]) == 1
    left = [e["question"] for e in log.entries()]
    assert left.count("bench question") == 1 and "newest one" in left


def _damage(table: Path, how: str) -> None:
    """Break one log table as a disk or a careless hand does (issue 43)."""
    data = sorted((table / "data").glob("*.lance"))
    if how == "data file deleted":
        data[0].unlink()
    elif how == "data file garbled":
        raw = data[0].read_bytes()
        data[0].write_bytes(raw[: len(raw) // 2] + bytes(len(raw) - len(raw) // 2))
    else:  # the newest manifest cut short
        newest = max((table / "_versions").glob("*.manifest"), key=lambda p: p.stat().st_mtime)
        newest.write_bytes(newest.read_bytes()[:20])


@pytest.mark.parametrize("how", ["data file deleted", "data file garbled", "manifest truncated"])
def test_a_damaged_log_is_set_aside_in_one_line_and_started_afresh(logged, capfd, how):
    index, ids = logged
    _damage(index / "_rag_queries.lance", how)
    assert main(["status"]) == 0  # was a Rust error naming a cargo source path
    out, err = capfd.readouterr()
    warned = [ln for ln in err.splitlines() if "query log" in ln]
    assert len(warned) == 1 and "moved aside to _rag_queries.lance.damaged-" in warned[0], err
    assert ".cargo" not in err and ".rs:" not in err and "panicked" not in err.lower()
    assert "query log: " in out
    aside = list(index.glob("_rag_queries.lance.damaged-*"))
    assert len(aside) == 1 and (aside[0] / "_versions").is_dir()  # moved, not deleted
    for argv in (["log", "list"], ["log", "purge", "--id", ids["kept"]], ["compact"]):
        assert main(argv) == 0, argv
    assert main(["status"]) == 0
    out, err = capfd.readouterr()
    assert "damaged" not in err  # once set aside, nothing more to say
    assert "query log: 0 entries" in out  # a fresh log
    log = QueryLog(IndexStore(index))
    log.add_entries([{"id": "n" * 22, "at": "z", "at_ns": 1, "question": "after the damage"}])
    assert [e["question"] for e in log.entries()] == ["after the damage"]


def test_the_graph_observes_a_damaged_log_instead_of_failing(logged, tmp_path, capfd):
    """Issue 43: `rag-assets index` stopped at query_log (PIPELINE FAILED) on a damaged log; the
    observation (and its drift check) now sets it aside and goes on, so publishing never
    depends on the log."""
    import dagster as dg

    from rag_assets.settings import Settings
    from rag_assets_tests.test_traffic_loop import _observe

    index, _ = logged
    _damage(index / "_rag_queries.lance", "manifest truncated")
    settings = Settings.from_env({"RAG_INDEX_URI": str(index), "RAG_WORK_DIR": str(tmp_path / "w")})
    with dg.DagsterInstance.ephemeral() as instance:
        meta, check = _observe(settings, instance)
    assert meta["entries"] == 0 and check.passed
    err = capfd.readouterr().err
    assert err.count("moved aside to _rag_queries.lance.damaged-") == 1, err
