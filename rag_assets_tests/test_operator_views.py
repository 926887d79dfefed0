"""Issue 30: what an operator reads, on real runs (``rag-assets`` through its entry point in
the test's process, a real LanceDB directory, a real Dagster instance; the run that is killed is
a process of its own): a brand-new index reports nothing "unchanged", a file name with a newline
stays on its ``status`` row, ``rollback --to`` checks the target opens before moving the
pointer, a document reused after ``--force-folder`` cites the new folder, and a run killed
(``kill -9``) between staging and publishing is published by the next run, whose summary
compares with what is published."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag_assets.lib.index.store import IndexStore
from rag_assets_tests.helpers import REPO, cli_here, copy_docs, index_env, line_starting

pytestmark = pytest.mark.slow

WALRUS = "The walrus gateway listens on port 4242 for every replication stream."


DOCS = "0[1-2]*.md"  # two sample documents


def test_a_new_index_reports_no_unchanged_and_status_keeps_one_row_per_file(tmp_path: Path):
    docs = copy_docs(tmp_path / "docs", DOCS)
    (docs / "notes\nsecond line.md").write_text("# Newline\n\n" + WALRUS + "\n")
    (docs / "headings-only.md").write_text("# Only a heading\n")  # partial, no chunks
    env = index_env(tmp_path, docs)
    summary = cli_here(env, "index", "--quiet").stdout
    assert line_starting(summary, "documents:").endswith("4 new, 0 changed, 0 unchanged, 0 removed")
    again = cli_here(env, "index", "--quiet").stdout  # and a re-run: everything unchanged
    assert line_starting(again, "documents:").endswith("0 new, 0 changed, 4 unchanged, 0 removed")
    status = cli_here(env, "status").stdout
    rows = [ln for ln in status.splitlines() if ln.startswith("  ") and ".md" in ln]
    assert any(r.rstrip().endswith("notes\\nsecond line.md") for r in rows), status
    assert not any(ln.startswith("second line") for ln in status.splitlines())
    listed = json.loads(cli_here(env, "status", "--json").stdout)["documents"]["list"]
    assert "notes\nsecond line.md" in [r["document"] for r in listed]  # JSON: the real name


def test_rollback_checks_the_target_opens_before_moving_the_pointer(tmp_path: Path):
    docs = copy_docs(tmp_path / "docs", DOCS)
    env = index_env(tmp_path, docs)
    cli_here(env, "index", "--quiet")
    with (docs / "01-pipeline-overview.md").open("a") as fh:
        fh.write("\n" + WALRUS + "\n")
    cli_here(env, "index", "--quiet")
    store = IndexStore(tmp_path / "index")
    now, before = store.rollback_stack()[-1], store.rollback_stack()[-2]
    bm25 = tmp_path / "index" / "bm25" / before.key
    aside = tmp_path / "bm25-aside"
    bm25.rename(aside)
    out = cli_here(env, "rollback", "--to", "1", check=False)  # issue 51: the index's version 1
    assert out.returncode == 1
    assert "cannot roll back to" in out.stderr and "BM25" in out.stderr
    assert "\n" not in out.stderr.strip()
    assert store.published().key == now.key  # the pointer did not move
    aside.rename(bm25)
    cli_here(env, "rollback", "--to", f"{before.table}@{before.version}")  # LanceDB's, by table
    assert store.published().key == before.key


def test_a_document_reused_after_force_folder_cites_the_new_folder(tmp_path: Path):
    old = copy_docs(tmp_path / "old", DOCS)
    env = index_env(tmp_path, old)
    cli_here(env, "index", "--quiet")
    new = tmp_path / "new"
    shutil.copytree(old, new)  # same bytes: every document is reused, not re-extracted
    shutil.rmtree(old)
    moved = index_env(tmp_path, new)
    cli_here(moved, "index", "--quiet", "--force-folder")
    hits = json.loads(cli_here(moved, "search", "pipeline overview", "--json", "-k", "3").stdout)
    assert hits and all(h["url"].startswith(new.resolve().as_uri() + "/") for h in hits), hits
    assert not any(str(old) in h["url"] for h in hits)


def test_a_run_killed_between_staging_and_publishing_is_published_by_the_next(tmp_path: Path):
    """The killed run stops inside ``publish`` (a wrapper halts there; the test kills it with
    SIGKILL). The cut is pinned, so the killed run's calibration looks exactly like the last
    published one: Dagster's data versions alone said nothing needed publishing."""
    docs = copy_docs(tmp_path / "docs", "0[1-3]*.md")
    env = index_env(tmp_path, docs, RAG_DISTANCE_CUT="0.6")
    cli_here(env, "index", "--quiet")
    store = IndexStore(tmp_path / "index")
    first = store.published()
    with (docs / "02-chunking-strategies.md").open("a") as fh:
        fh.write("\n" + WALRUS + "\n")
    marker = tmp_path / "in-publish"
    halt = (
        "import os, sys, time\n"
        "from rag_assets.lib.index.store import IndexStore\n"
        "def halt(self, *a, **k):\n"
        f"    open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(3600)\n"
        "IndexStore.publish = halt\n"
        "from rag_assets.cli import main\n"
        "sys.exit(main(['index', '--quiet']))\n"
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", halt], env=env, cwd=REPO, stdout=subprocess.DEVNULL
    )
    while not marker.exists():
        assert killed.poll() is None, "the run ended before it reached publish"
        time.sleep(0.2)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=60)
    staged = store.staging()
    assert staged.version != first.version and store.published().key == first.key
    summary = cli_here(env, "index", "--quiet").stdout
    assert line_starting(summary, "documents:").endswith("0 new, 1 changed, 2 unchanged, 0 removed")
    published = store.published()
    assert (published.table, published.version) == (staged.table, staged.version)
    published_line = line_starting(summary, "published:")  # issue 39: the index's 2nd version
    assert f"{staged.table} version 2 ({staged.rows} rows" in published_line
    hits = json.loads(
        cli_here(env, "search", "walrus gateway port 4242", "--retriever", "bm25", "--json").stdout
    )
    assert WALRUS in hits[0]["quote"]
