"""Reliability cases through the real ``rag-assets`` command (subprocesses) on the sample corpus:
the publish pointer (damaged, modes, re-index over it, rollback stack), a symbolic link leaving
the documents folder, ``status`` that reports the index it is asked about without a model, and
generation endpoint credentials that never reach stderr.

One module index built through Dagster (``index``), one more ``index`` run in the last test;
cases that damage the index work on copies of it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from rag_assets_tests.helpers import (
    REPO,
    SAMPLE_DOCS,
    SAMPLE_EVAL,
    cli_here,
    index_env,
    run_cli,
    serving_in_thread,
)

pytestmark = pytest.mark.slow

SECRET = "outside-secret-hostname-93c1"
PASSWORD = "pw-Very-Secret-77"
API_KEY = "sk-cli-test-key-5f3e"
QUESTION = "How do I roll back to the previous embedding model?"


def _run(
    args: list[str],
    env: dict[str, str],
    check: bool = True,
    cwd: Path = REPO,
    process: bool = False,
) -> subprocess.CompletedProcess:
    """``rag-assets ARGS`` with a service account's usual umask: in this process, or with
    ``process`` as a process of its own (what must never reach its stderr)."""
    run = run_cli if process else cli_here
    return run(env, *args, check=check, cwd=cwd, umask=0o022)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sample corpus plus ``hostname.txt -> <outside>/hostname``, indexed by the CLI."""
    root = tmp_path_factory.mktemp("reliability")
    (root / "outside").mkdir()
    (root / "outside" / "hostname").write_text(f"{SECRET}\n")
    docs = root / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    os.symlink(root / "outside" / "hostname", docs / "hostname.txt")
    env = index_env(root, docs, eval_dir=SAMPLE_EVAL, dagster=False)
    proc = _run(["index", "--quiet"], env)
    assert "published:" in proc.stdout
    return root, env


def _copy(built, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root, env = built
    shutil.copytree(root / "index", tmp_path / "index", symlinks=True)
    return tmp_path / "index", {**env, "RAG_INDEX_URI": str(tmp_path / "index")}


def test_a_link_leaving_the_folder_is_skipped_and_never_quoted(built):
    root, env = built
    st = json.loads(_run(["status", "--json"], env).stdout)
    skipped = {d["document"]: d["reason"] for d in st["documents"]["skipped"]}
    assert "symbolic link leaves the documents folder" in skipped["hostname.txt"]
    assert "hostname.txt" not in {d["document"] for d in st["documents"]["failed"]}
    from rag_assets.lib.index.store import IndexStore, scan

    store = IndexStore(root / "index")
    pub = store.published()
    assert pub is not None
    rows = scan(store.open_table(pub.table, pub.version), ["document_id", "text"])
    assert "hostname.txt" not in set(rows["document_id"].to_pylist())
    assert not any(SECRET in t for t in rows["text"].to_pylist())
    assert "hostname.txt" not in store.canonical_texts(pub.documents_version)


def test_pointer_files_have_the_mode_of_the_rest_of_the_index(built):
    root, _ = built
    index = root / "index"
    data_modes = {stat.S_IMODE(p.stat().st_mode) for p in index.rglob("*.lance") if p.is_file()}
    assert data_modes == {0o644}
    for name in ("published.json", "staging.json", "published-history.jsonl"):
        assert stat.S_IMODE((index / name).stat().st_mode) == 0o644, name


def test_status_reports_the_index_asked_about_and_needs_no_model(built, tmp_path):
    """From another directory, with another corpus' manifest in RAG_WORK_DIR and a model path
    that does not exist: the index's own 8 ok / 1 failed / 1 skipped, and its window count."""
    from rag_assets.lib.index.pipeline import save_documents
    from rag_assets.lib.ingest.extract import extract_folder

    root, env = built
    other = tmp_path / "other-docs"
    other.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (other / name).write_text(f"# {name}\n\nAnother corpus.\n")
    save_documents(tmp_path / "work", extract_folder(other).documents)  # what its index leaves
    env = {
        **env,
        "RAG_WORK_DIR": str(tmp_path / "work"),
        "RAG_EMBEDDING_MODEL": str(tmp_path / "no-such-model"),
    }
    env.pop("RAG_INDEX_URI")
    st = json.loads(
        _run(["status", "--index", str(root / "index"), "--json"], env, cwd=tmp_path).stdout
    )
    docs = st["documents"]
    assert docs["ok"] == 8 and [f["document"] for f in docs["failed"]] == ["broken-scan.pdf"]
    assert [s["document"] for s in docs["skipped"]] == ["hostname.txt"]
    assert st["chunks_over_window"] == 0 and st["published"]["rows"] > 0
    text = _run(["status", "--index", str(root / "index")], env, cwd=tmp_path).stdout
    assert "documents: 8 ok, 1 failed, 1 skipped" in text and "rollback stack" in text


def test_a_truncated_pointer_is_named_and_queries_go_on(built, tmp_path):
    index, env = _copy(built, tmp_path)
    pointer = index / "published.json"
    pointer.write_bytes(pointer.read_bytes()[:200])
    asked = _run(["ask", QUESTION], env)
    assert asked.stdout.startswith("[1] ")
    assert str(pointer) in asked.stderr and "damaged" in asked.stderr
    assert f"rag-assets rollback --index {index} --to chunks_" in asked.stderr
    st = json.loads(_run(["status", "--json"], env).stdout)
    assert st["published"]["table"].startswith("chunks_")


def test_a_damaged_pointer_without_history_is_refused_with_the_repair_command(built, tmp_path):
    index, env = _copy(built, tmp_path)
    (index / "published-history.jsonl").unlink()
    (index / "published.json").write_bytes(b"\x00\x01garbage")
    for args in (["ask", QUESTION], ["status"]):
        proc = _run(args, env, check=False)
        assert proc.returncode == 1, args
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rag-assets: error: ")
        assert str(index / "published.json") in lines[0]
        assert f"`rag-assets index --index {index}`" in lines[0]


def test_generation_credentials_never_reach_stderr(built):
    from rag_assets_tests.lib.query.test_generate import ChatServer

    _, env = built
    env = {k: v for k, v in env.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env["no_proxy"] = "127.0.0.1"
    with serving_in_thread(ChatServer()) as srv:
        port = srv.server_address[1]
        ok = _run(
            ["ask", QUESTION],
            {**env, "RAG_LLM_URL": f"http://127.0.0.1:{port}/ok", "RAG_LLM_API_KEY": API_KEY},
            process=True,
        )
        assert srv.requests and srv.requests[0]["headers"]["Authorization"] == f"Bearer {API_KEY}"
        bad = _run(
            ["ask", QUESTION],
            {
                **env,
                "RAG_LLM_URL": f"http://llm:{PASSWORD}@127.0.0.1:{port}/500",
                "RAG_LLM_API_KEY": API_KEY,
            },
            check=False,
            process=True,
        )
    assert bad.returncode == 1 and "HTTP 500" in bad.stderr
    assert "RAG_LLM_URL=http://***@127.0.0.1" in bad.stderr
    for proc in (ok, bad):
        assert PASSWORD not in proc.stderr + proc.stdout
        assert API_KEY not in proc.stderr + proc.stdout


def test_index_publishes_over_a_damaged_pointer_and_rollback_walks_back(built):
    """Last: re-indexes the module index (one edited document) over a truncated pointer."""
    root, env = built
    index = root / "index"
    first = json.loads((index / "published.json").read_text())
    with (root / "documents" / "06-operations-runbook.md").open("a") as f:
        f.write("\n\nA paragraph added to make a second table version.\n")
    (index / "published.json").write_text('{"table": "chunks_')  # torn
    proc = _run(["index", "--quiet"], env)
    second = json.loads((index / "published.json").read_text())
    assert second["version"] > first["version"], proc.stdout
    st = json.loads(_run(["status", "--json"], env).stdout)
    assert [(e["version"], e["current"]) for e in st["rollback_stack"]] == [
        (second["version"], True),
        (first["version"], False),
    ]
    assert [e["index_version"] for e in st["rollback_stack"]] == [2, 1]  # issue 39
    assert f"{second['table']} version 2 (" in proc.stdout
    back = _run(["rollback"], env).stdout
    assert f"published: version 1 ({first['table']}, threshold" in back  # issue 51: one number
    again = _run(["rollback"], env, check=False)  # no toggling back to the newer version
    assert again.returncode == 1 and "nothing to roll back to" in again.stderr
    fwd = _run(["rollback", "--to", "2"], env).stdout  # the index's own version, as status says
    assert f"published: version 2 ({second['table']}, threshold" in fwd
    text = _run(["status"], env).stdout
    assert f"* version 2  {second['table']}  rows=" in text
    assert f"  version 1  {first['table']}  rows=" in text
    assert f"published: {second['table']} version 2  rows=" in text  # a rollback makes none
    assert f"@{second['version']}" not in text and "version=" not in text  # LanceDB's: --json


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """An existing, empty index directory on a read-only bind mount (root's ``chmod`` is no
    barrier, a read-only file system is); skipped where mounting is not permitted."""
    src, mnt = tmp_path / "src", tmp_path / "ro"
    (src / "index").mkdir(parents=True)
    mnt.mkdir()
    ok = subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True)
    if ok.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {ok.stderr.decode(errors='replace').strip()}")
    try:
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)], capture_output=True)
        if ro.returncode != 0:
            pytest.skip(f"cannot remount read-only: {ro.stderr.decode(errors='replace').strip()}")
        yield mnt / "index"
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_read_only_index_directory_fails_with_its_root_cause_in_one_line(built, read_only_dir):
    _, env = built
    proc = _run(["index", "--quiet", "--index", str(read_only_dir)], env, False, process=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Read-only file system" in out, out
    assert "Error occurred while executing op" not in out
    assert "Traceback" not in out
    cause = [line for line in out.splitlines() if "Read-only file system" in line]
    assert len(cause) == 1, out
