# mypy: disable-error-code="union-attr,index,arg-type"
"""The Dagster graph on object storage through the product's own commands (issue 23):
``rag-assets index`` with ``RAG_INDEX_URI=s3://…`` against a real S3 server (moto, its own
process, authentication on, the credentials only in ``AWS_*``), the real model and a real
Dagster home. A first index is evaluated and calibrated on the bundled question set; an edit
re-indexes and publishes; a run killed with ``kill -9`` mid-embedding leaves the published
version serving (``serve``'s ``/search`` answers from it, ``status`` names it) and the next run
publishes; ``rollback`` walks back. Every file the graph writes is a ``_rag_files`` row in the
bucket: nothing lands in the working folder, and the index folder has no local twin."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from rag_assets.lib.index.store import IndexStore
from rag_assets_tests.helpers import (
    SAMPLE_DOCS,
    SAMPLE_EVAL,
    cli_here,
    free_port,
    stop_process,
    wait_healthy,
)
from rag_assets_tests.s3_server import object_keys, storage_options

pytestmark = pytest.mark.slow  # a real S3 server, the real model, subprocesses

URI = "s3://rag/graph"
CLI = [sys.executable, "-m", "rag_assets.cli"]
QUESTION = "Who keeps the zebrafish lighthouse?"


@pytest.fixture(scope="module")
def world(s3_server, tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("s3graph")
    docs = root / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    cwd = root / "cwd"
    cwd.mkdir()
    (root / "dagster").mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAG_", "AWS_")) and k.lower() not in ("http_proxy", "https_proxy")
    }
    env |= s3_server | {"no_proxy": "127.0.0.1", "HF_HUB_OFFLINE": "1", "RAG_ADAPT": "off"}
    env |= {
        "RAG_INDEX_URI": URI,
        "RAG_DOCUMENTS_DIR": str(docs),
        "RAG_WORK_DIR": str(root / "work"),
        "RAG_EVAL_DIR": str(SAMPLE_EVAL),
        "RAG_RECALL_FLOOR": "0.3",
        "DAGSTER_HOME": str(root / "dagster"),
        "RAG_LEASE_SECONDS": "3600",  # only the dead pid can free the killed run's lease
    }
    return {"env": env, "cwd": cwd, "docs": docs, "root": root, "aws": s3_server}


def _run(args: list[str], w: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``rag-assets ARGS`` through its entry point in this process (the run that is killed and
    the services are processes of their own)."""
    return cli_here(w["env"], *args, cwd=w["cwd"], check=False)


def _published(w: dict[str, Any]) -> dict[str, Any]:
    r = _run(["status", "--json"], w)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout)["published"])


def _store(w: dict[str, Any]) -> IndexStore:
    return IndexStore(URI, storage_options=storage_options(w["aws"]))


def _serve_search(w: dict[str, Any], log: Path) -> list[dict[str, Any]]:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([*CLI, "serve", "--port", str(port)], env=w["env"],
                                cwd=w["cwd"], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log, 180)
        hits = httpx.get(f"{url}/search", params={"q": QUESTION, "k": 5}, timeout=120).json()
        return list(hits)
    finally:
        stop_process(proc)


def test_the_graph_indexes_reindexes_survives_kill_9_and_rolls_back_on_s3(world) -> None:
    w = world
    first = _run(["index", "--quiet"], w)
    assert first.returncode == 0, first.stderr + first.stdout
    v1 = _published(w)
    assert v1["evaluation"] == "evaluated" and v1["threshold_source"] == "calibrated"
    store = _store(w)
    table_at = f"{v1['table']}@{v1['version']}"
    names = set(store.file_names("evaluation"))
    for suffix in ("json", "refusal.json", "threshold.json", "distances.png"):
        assert f"evaluation/{table_at}.{suffix}" in names, names
    assert "evaluation/questions.json" in names  # eval_questions' decision
    png = store.read_file(f"evaluation/{table_at}.distances.png")
    assert png is not None and png.startswith(b"\x89PNG")
    keys = object_keys(w["aws"], "graph/")
    assert any(k.startswith("graph/_rag_files.lance/") for k in keys)
    threshold = json.loads(store.read_text(f"evaluation/{table_at}.threshold.json"))
    assert threshold["cut"] == pytest.approx(v1["threshold"])
    # issue 51: the index's declaration is in the bucket, beside its pointer, for every machine
    declared = json.loads(store.read_text("declaration.json") or "{}")
    assert declared["settings"]["adapt"]["value"] == "off"
    assert declared["settings"]["documents_dir"]["value"] == str(w["docs"])

    # an edit: re-index, evaluate, publish the new table version
    with (w["docs"] / "01-overview.md").open("a", encoding="utf-8") as f:
        f.write("\n\n## Lighthouse keepers\n\nThe zebrafish lighthouse is kept by Ada Lovelace.\n")
    second = _run(["index", "--quiet"], w)
    assert second.returncode == 0, second.stderr + second.stdout
    v2 = _published(w)
    assert v2["version"] > v1["version"] and v2["evaluation"] == "evaluated"
    assert f"evaluation/{v2['table']}@{v2['version']}.threshold.json" in store.file_names(
        "evaluation"
    )

    # many new documents (two embedding batches of 256 chunks), then kill -9 once the first
    # batch is committed and before the second is
    for i in range(400):
        paras = "\n\n".join(
            f"Section {j} of harbour note {i}: ropes, tides and {['gulls', 'nets', 'buoys'][j % 3]}"
            f" logged in {1800 + i} by keeper {i * 7 + j}." for j in range(3)
        )  # fmt: skip
        (w["docs"] / f"harbour{i:03d}.md").write_text(f"# Harbour note {i}\n\n{paras}\n")
    before = store.open_table(v2["table"]).version
    proc = subprocess.Popen([*CLI, "index", "--quiet"], env=w["env"], cwd=w["cwd"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 600
    killed_at = None
    while proc.poll() is None and time.monotonic() < deadline:
        tbl = _store(w).open_table(v2["table"])
        if tbl.version > before:  # a batch of rows is in the table, the run is still embedding
            os.kill(proc.pid, signal.SIGKILL)
            killed_at, killed_rows = tbl.version, tbl.count_rows()
            break
        time.sleep(0.1)
    proc.wait(timeout=60)
    assert killed_at is not None, proc.stdout.read() if proc.stdout else ""
    assert _published(w)["version"] == v2["version"]  # the pointer did not move
    hits = _serve_search(w, w["root"] / "serve-killed.log")
    assert hits and hits[0]["document_id"] == "01-overview.md"
    assert not any(h["document_id"].startswith("harbour") for h in hits)

    third = _run(["index", "--quiet"], w)  # the dead pid's lease is taken over
    assert third.returncode == 0, third.stderr + third.stdout
    v3 = _published(w)
    assert v3["version"] > killed_at and v3["rows"] > killed_rows > v2["rows"]  # mid-embedding
    found = _run(["search", "harbour note 17 ropes tides", "--json"], w)
    assert found.returncode == 0, found.stderr
    top = json.loads(found.stdout)
    top = top["hits"] if isinstance(top, dict) else top
    assert top[0]["document_id"].startswith("harbour")

    back = _run(["rollback"], w)
    assert back.returncode == 0, back.stderr
    assert _published(w)["version"] == v2["version"]
    hits = _serve_search(w, w["root"] / "serve-rolled-back.log")
    assert hits[0]["document_id"] == "01-overview.md"
    assert not any(h["document_id"].startswith("harbour") for h in hits)

    # nothing beside the bucket: no local "s3:" folder, nothing in the working folder
    assert list(w["cwd"].iterdir()) == []
    assert not any(p.name.startswith("s3:") for p in w["root"].rglob("*"))


def test_eval_cache_on_object_storage_is_reused(world) -> None:
    """``rag-assets eval --cache s3://…``: the evaluation index is built in the bucket once and
    reused by the next run (nothing embedded), with the same figures."""
    w = world
    args = ["eval", "--cache", "s3://rag/eval-cache", "--documents", str(SAMPLE_DOCS)]
    args += ["--questions", str(SAMPLE_EVAL), "--json"]
    runs = []
    for _ in range(2):
        r = _run(args, w)
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout))
    first, again = runs
    assert first["index"]["uri"].startswith("s3://rag/eval-cache/")
    assert first["index"]["embedded"] > 0 and again["index"]["embedded"] == 0
    assert again["retrievers"] == first["retrievers"]
    assert any(k.startswith("eval-cache/") for k in object_keys(w["aws"], "eval-cache/"))
    assert list(w["cwd"].iterdir()) == []
