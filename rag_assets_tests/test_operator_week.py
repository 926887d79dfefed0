"""Issue 22, an operator's week on their own folder: index, edit, delete, re-add, another
folder. Real model, real LanceDB directory, a real (SQLite) Dagster instance; the CLI part runs
``rag-assets`` as a subprocess with a fresh ``DAGSTER_HOME``.

What is checked: the summary's new / changed / unchanged / removed documents and chunks (and
the same figures in the Dagster metadata read back from the instance), vectors of a re-added
document reused from the table's history, check lines that say blocking / non-blocking, the
refusal-cut line without the repeated note, ``chunk_questions`` absent when expansion is off,
the index remembering its folder (a run from another folder refused in one line, forced with
the setting), the code location reading that folder, and ``status`` listing the documents."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest

from rag_assets.defs.build import given_in, resolve_source
from rag_assets.defs.run import Outcome, materialize_graph
from rag_assets.lib.index.pipeline import recorded_source
from rag_assets.lib.index.store import IndexStore
from rag_assets.settings import Settings
from rag_assets_tests.helpers import REPO, cli_here, run_cli

pytestmark = pytest.mark.slow

NOTES = 5


def _write_notes(folder: Path, n: int, topic: str = "widget") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, n + 1):
        name = f"note{i}.md" if topic == "widget" else f"{topic}{i}.md"
        (folder / name).write_text(
            f"# {topic.title()} note {i}\n\nThis note explains how {topic} {i} is configured and "
            f"why its setting number {i} matters to operators on call.\n\n## Details\n\n"
            f"{topic.title()} {i} listens on port 80{i} and keeps its files under "
            f"/var/lib/{topic}{i}; restart it with the {topic}{i} service unit.\n"
        )
    return folder


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    """Four runs of index_job on one instance: first index, one edit, one delete, re-add."""
    root = tmp_path_factory.mktemp("week")
    docs = _write_notes(root / "docs", NOTES)
    settings = Settings(
        adapt="off",  # the tests' default (conftest); issue 44's auto is tested on its own
        documents_dir=str(docs),
        index_uri=str(root / "index"),
        work_dir=str(root / "work"),
        eval_dir=str(root / "no-questions"),  # an own folder: published unevaluated
    )
    home = root / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        runs: dict[str, Outcome] = {}
        meta: dict[str, dict] = {}

        def run(name: str, s: Settings = settings) -> Outcome:
            out = materialize_graph(s, progress=False, instance=instance)
            runs[name] = out
            ev = instance.get_latest_materialization_event(dg.AssetKey("chunk_embeddings"))
            meta[name] = {
                k: getattr(v, "value", v) for k, v in ev.asset_materialization.metadata.items()
            }
            return out

        run("first")
        note2 = docs / "note2.md"
        note2.write_text(note2.read_text() + "\nWidget 2 also has a backup port 9002.\n")
        run("edit")
        note4 = docs / "note4.md"
        kept = note4.read_text()
        note4.unlink()
        run("delete")
        note4.write_text(kept)
        run("readd")
        yield {"root": root, "docs": docs, "settings": settings, "instance": instance,
               "runs": runs, "meta": meta, "run": run}  # fmt: skip


def test_every_run_succeeds_and_publishes(week):
    for name, out in week["runs"].items():
        assert out.success, f"{name}: {out.error}"
        assert out.published is not None


def test_summary_says_new_changed_unchanged_removed(week):
    runs, meta = week["runs"], week["meta"]
    first = runs["first"].summary()
    assert f"documents: {NOTES} ({NOTES} ok, 0 partial, 0 skipped, 0 failed); {NOTES} new, " \
        "0 changed, 0 unchanged, 0 removed" in first  # fmt: skip
    edit = runs["edit"].summary()
    assert "; 0 new, 1 changed, 4 unchanged, 0 removed" in edit
    m = meta["edit"]
    line = next(x for x in edit.splitlines() if x.startswith("chunks: "))
    # issue 31: by text (an edit shifts the later chunk ids of its document, not their texts)
    assert ": 1 document changed: " in line and " new, " not in line
    assert line.endswith(f"; {m['chunks_in_unchanged_documents']} unchanged")
    assert m["changed_documents_reembedded"] == m["embedded"] >= 1
    assert m["chunks_unchanged"] >= 1 and m["chunks_new"] + m["chunks_changed"] >= 1
    assert "reused" not in next(x for x in edit.splitlines() if x.startswith("documents: "))
    delete = runs["delete"].summary()
    assert f"documents: {NOTES - 1} ({NOTES - 1} ok" in delete
    assert "; 0 new, 0 changed, 4 unchanged, 1 removed" in delete
    # the Dagster metadata, read back from the instance, says the same
    assert (meta["delete"]["documents_deleted"], meta["delete"]["documents_unchanged"]) == (1, 4)
    assert meta["delete"]["chunks_removed"] >= 1 and meta["delete"]["embedded"] == 0


def test_readded_document_reuses_its_vectors_from_the_history(week):
    m = week["meta"]["readd"]
    assert m["documents_new"] == 1 and m["documents_unchanged"] == NOTES - 1
    assert m["embedded"] == 0  # nothing sent to the encoder
    assert m["reused_from_history"] == m["reused"] == m["chunks_new"] >= 1
    text = week["runs"]["readd"].summary()
    many = "vector from an earlier table version" if m["reused"] == 1 else (
        "vectors from earlier table versions"
    )  # fmt: skip
    assert f"embedded: 0 texts ({m['reused']} {many}); " in text


def test_check_lines_say_blocking_or_non_blocking(week):
    text = week["runs"]["first"].summary()
    checks = [x for x in text.splitlines() if x.startswith("check ")]
    assert "check index_matches_chunks: passed (blocking)" in checks
    assert "check all_documents_extracted: passed (non-blocking)" in checks
    assert not any("(ERROR)" in x or "(WARN)" in x for x in checks)
    # the blocking set is Dagster's own: read from the graph's check specs
    assert "index_matches_chunks" in week["runs"]["first"].blocking
    assert "all_documents_extracted" not in week["runs"]["first"].blocking


def test_refusal_cut_line_says_its_source_and_note_once(week):
    text = week["runs"]["first"].summary()
    cut = next(x for x in text.splitlines() if x.startswith("refusal cut: "))
    value, label = re.match(r"refusal cut: (\d\.\d{3}) \(([^)]*)\)", cut).groups()
    parts = [p.strip() for p in label.split(",")]
    assert len(parts) == len(set(parts))  # "(default)", never "(default, default)"
    assert not any(x.startswith("**") for x in text.splitlines())  # plain lines, no Markdown
    for note in (x for x in text.splitlines() if x.startswith("evaluation: UNEVALUATED: ")):
        assert note.split(": ", 2)[2] not in cut  # the note is on the evaluation line only


def test_chunk_questions_is_not_materialised_with_expansion_off(week):
    instance = week["instance"]
    assert instance.get_latest_materialization_event(dg.AssetKey("chunk_questions")) is None
    run = instance.get_run_by_id(week["runs"]["first"].run_id)
    steps = {
        s.key for s in instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id).steps
    }
    assert "chunk_questions" not in steps and "chunk_embeddings" in steps


def test_code_location_reads_the_folder_the_index_records(week):
    settings = week["settings"]
    assert recorded_source(IndexStore(settings.index_uri)).documents == str(week["docs"].resolve())
    env = {"RAG_INDEX_URI": settings.index_uri, "RAG_WORK_DIR": settings.work_dir}
    resolved = resolve_source(Settings.from_env(env), given_in(env))
    assert resolved.documents_dir == str(week["docs"].resolve())
    assert resolved.chunk_strategy == "E"
    other = {**env, "RAG_DOCUMENTS_DIR": "/somewhere/else"}  # what is set stays set
    assert (
        resolve_source(Settings.from_env(other), given_in(other)).documents_dir == "/somewhere/else"
    )
    # the code location itself (definitions.py) resolves the same way
    code = (
        "import json, rag_assets.definitions as d;"
        "print(json.dumps(d.defs.resources['documents'].path))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={k: v for k, v in {**os.environ, **env}.items() if k != "RAG_DOCUMENTS_DIR"},
        capture_output=True, text=True, timeout=300, cwd=REPO, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout.strip().splitlines()[-1]) == str(week["docs"].resolve())


def test_another_folder_is_refused_in_one_line_then_forced(week):
    settings, root = week["settings"], week["root"]
    other = _write_notes(root / "other", 2, topic="gadget")
    before = IndexStore(settings.index_uri).published()
    refused = week["run"]("other", replace(settings, documents_dir=str(other)))
    assert not refused.success and refused.failed_stage == "chunk_embeddings"
    line = refused.error or ""
    assert "\n" not in line and str(week["docs"].resolve()) in line and str(other.resolve()) in line
    assert line.startswith(f"index {settings.index_uri} is built from ")  # no exception class
    assert "--force-folder" in line and "RAG_FORCE_FOLDER=1" in line
    store = IndexStore(settings.index_uri)
    assert store.published() == before  # nothing published, still queryable as it was
    assert recorded_source(store).documents == str(week["docs"].resolve())
    forced = week["run"]("forced", replace(settings, documents_dir=str(other), force_folder="1"))
    assert forced.success, forced.error
    assert forced.tags.get("rag/force-folder") == "1"
    store = IndexStore(settings.index_uri)
    assert recorded_source(store).documents == str(other.resolve())
    assert f"folder: {other.resolve()} (strategy E)" in forced.summary()
    assert "; 2 new, 0 changed, 0 unchanged, 5 removed" in forced.summary()


def _cli(
    args: list[str], env: dict[str, str], process: bool = False
) -> subprocess.CompletedProcess:
    """``rag-assets ARGS`` in this process, or as a process of its own where its stderr (what
    Dagster and the libraries print) is the point."""
    if process:
        return run_cli(env, *args, check=False)
    return cli_here(env, *args, check=False)


def test_cli_first_index_is_quiet_refuses_another_folder_and_status_lists_documents(tmp_path):
    docs = _write_notes(tmp_path / "docs", 3)
    (tmp_path / "docs" / "empty.md").write_text("")  # a document that fails: listed with why
    home = tmp_path / "dagster_home"  # a fresh DAGSTER_HOME without dagster.yaml
    home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "RAG_INDEX_URI": str(tmp_path / "index"),
        "RAG_WORK_DIR": str(tmp_path / "work"),
        "RAG_EVAL_DIR": str(tmp_path / "no-questions"),
    }
    for var in ("RAG_DOCUMENTS_DIR", "RAG_FORCE_FOLDER", "RAG_DEBUG", "RAG_CHUNK_STRATEGY"):
        env.pop(var, None)
    first = _cli(["index", "--documents", str(docs)], env, process=True)  # stderr: no terminal
    assert first.returncode == 0, first.stdout + first.stderr
    assert "stage/s" not in first.stderr  # no progress-bar frames in a log
    assert "\nevaluation: unrelated-only: " in first.stdout
    assert not any(x.startswith("**") for x in first.stdout.splitlines())
    assert "No dagster instance configuration file" not in first.stderr
    assert "Telemetry" not in first.stderr and "usage statistics" not in first.stderr
    assert (home / "dagster.yaml").is_file()
    assert "check index_matches_chunks: passed (blocking)" in first.stdout
    # another folder into the same index: one line naming both folders and the flag
    other = _write_notes(tmp_path / "other", 1, topic="gadget")
    refused = _cli(["index", "--documents", str(other), "--quiet"], env)
    assert refused.returncode == 1 and refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rag-assets: error: index ")
    assert str(docs.resolve()) in lines[0] and str(other.resolve()) in lines[0]
    assert "--force-folder" in lines[0]
    # status lists every document with its state, its chunks and its reason
    status = _cli(["status"], env)
    assert status.returncode == 0, status.stderr
    out = status.stdout
    assert f"built from: {docs.resolve()} (strategy E)" in out
    rows = [x.split() for x in out.splitlines() if x.startswith("  ok ") or "FAILED" in x]
    assert {r[2] for r in rows if r[0] == "ok"} == {"note1.md", "note2.md", "note3.md"}
    assert all(int(r[1]) >= 1 for r in rows if r[0] == "ok")
    failed = next(x for x in out.splitlines() if x.strip().startswith("FAILED"))
    assert "empty.md:" in failed
    assert "(newest first; 1 history entry)" in out  # one publish so far
    report = json.loads(_cli(["status", "--json"], env).stdout)
    listed = {r["document"]: r for r in report["documents"]["list"]}
    assert set(listed) == {"note1.md", "note2.md", "note3.md", "empty.md"}
    assert listed["empty.md"]["state"] == "failed" and listed["empty.md"]["reason"]
    assert listed["empty.md"]["chunks"] == 0 and listed["note1.md"]["chunks"] >= 1
    assert report["source"]["documents"] == str(docs.resolve())
