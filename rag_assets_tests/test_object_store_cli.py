# mypy: disable-error-code="union-attr,index,arg-type"
"""The product's query entry points on object storage (issue 23): `status`, `search`, `ask`,
`rollback`, `compact`, `serve` and `mcp` with ``RAG_INDEX_URI=s3://…`` against a real S3 server
(moto in server mode, in its own process, with authentication on), the credentials only in the
object store's own environment variables. And the bad settings: a bucket that does not exist,
wrong credentials, an unreachable endpoint each fail in one line naming the URI and the settings,
never the secret, while a service on the good settings keeps serving its published version."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from rag_assets_tests.helpers import (
    SAMPLE_DOCS,
    cli_here,
    free_port,
    run_cli,
    stop_process,
    wait_healthy,
)
from rag_assets_tests.s3_server import storage_options

boto3 = pytest.importorskip("boto3", reason="boto3 (installed with moto[server]) is missing")
pytest.importorskip("moto.server", reason="moto[server] is not installed (dev extra)")

pytestmark = pytest.mark.slow  # a real S3 server, the real model, subprocesses

REGION = "us-east-1"
URI = "s3://rag/sample"
CLI = [sys.executable, "-m", "rag_assets.cli"]


@pytest.fixture(scope="module")
def s3_auth(s3_server) -> dict[str, str]:
    return s3_server


@pytest.fixture(scope="module")
def s3_index(s3_auth, real_embedder, tmp_path_factory) -> dict[str, Any]:
    """The sample corpus indexed twice onto the bucket (an edit between), with the real model,
    through the Python API; returns the environment a query process needs and the docs."""
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.ingest.chunk import strategy

    root = tmp_path_factory.mktemp("s3cli")
    docs = root / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    store = IndexStore(URI, storage_options=storage_options(s3_auth))
    first = index_folder(docs, store, strategy("E"), real_embedder).entry
    with (docs / "01-overview.md").open("a", encoding="utf-8") as f:
        f.write("\n\n## Lighthouse keepers\n\nThe zebrafish lighthouse is kept by Ada Lovelace.\n")
    second = index_folder(docs, store, strategy("E"), real_embedder).entry
    assert second.version > first.version
    cwd = root / "cwd"
    cwd.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAG_", "AWS_")) and k.lower() not in ("http_proxy", "https_proxy")
    }
    env |= s3_auth | {"RAG_INDEX_URI": URI, "RAG_WORK_DIR": str(root / "work")}
    env |= {"DAGSTER_HOME": str(root / "dagster"), "HF_HUB_OFFLINE": "1", "no_proxy": "127.0.0.1"}
    env["RAG_ADAPT"] = "off"  # the tests' default (conftest): issue 44's auto is tested apart
    return {"env": env, "cwd": cwd, "first": first, "second": second, "root": root}


def _run(
    args: list[str], env: dict[str, str], cwd: Path, process: bool = False
) -> subprocess.CompletedProcess[str]:
    """``rag-assets ARGS`` in this process (its entry point), or as a process of its own."""
    if process:
        return run_cli(env, *args, cwd=cwd, check=False, timeout=600)
    return cli_here(env, *args, cwd=cwd, check=False)


def _serve(env: dict[str, str], log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([*CLI, "serve", "--port", str(port)], env=env,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log, 180)
    return url, proc


QUESTION = "Who keeps the zebrafish lighthouse?"


def test_query_commands_serve_and_mcp_on_object_storage(s3_index) -> None:
    env, cwd, second = s3_index["env"], s3_index["cwd"], s3_index["second"]
    status = _run(["status", "--json"], env, cwd)
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["published"]["version"] == second.version and st["published"]["table"]
    assert URI in status.stdout or st.get("index") == URI

    found = _run(["search", QUESTION, "--json"], env, cwd)
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)
    hits = hits["hits"] if isinstance(hits, dict) else hits
    assert hits[0]["document_id"] == "01-overview.md" and "url" in hits[0]
    asked = _run(["ask", QUESTION, "--json"], env, cwd)
    assert asked.returncode == 0, asked.stderr
    cit = json.loads(asked.stdout)["citations"][0]
    assert "Ada Lovelace" in cit["span"]["text"] and cit["document_id"] == "01-overview.md"

    url, proc = _serve(env, s3_index["root"] / "serve.log")
    try:
        served = httpx.get(f"{url}/search", params={"q": QUESTION, "k": 3}, timeout=120).json()
        assert served[0]["chunk_id"] == hits[0]["chunk_id"]
        ask = httpx.post(f"{url}/ask", json={"question": QUESTION}, timeout=120).json()
        assert ask["citations"][0]["span"]["text"] == cit["span"]["text"]
    finally:
        stop_process(proc)

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "rag_assets.cli", "mcp"],
                                   env=env, cwd=str(cwd))  # fmt: skip

    async def mcp_search() -> Any:
        async with Client(params, read_timeout_seconds=180) as client:
            return await client.call_tool("search", {"query": QUESTION, "k": 3})

    got = anyio.run(mcp_search).structured_content
    got = got["result"] if isinstance(got, dict) else got
    assert got[0]["chunk_id"] == hits[0]["chunk_id"]

    back = _run(["rollback"], env, cwd)
    assert back.returncode == 0, back.stderr
    now = json.loads(_run(["status", "--json"], env, cwd).stdout)["published"]
    assert now["version"] == s3_index["first"].version
    compact = _run(["compact"], env, cwd)
    assert compact.returncode == 0, compact.stderr
    old = json.loads(_run(["search", QUESTION, "--json"], env, cwd).stdout)
    old = old["hits"] if isinstance(old, dict) else old
    assert not any("Lovelace" in h.get("quote", h.get("content", "")) for h in old)
    # issue 51: TABLE@V names LanceDB's version (`--to N` is the index's own version N)
    assert _run(["rollback", "--to", f"{second.table}@{second.version}"], env, cwd).returncode == 0
    assert list(cwd.iterdir()) == []  # nothing written beside the bucket into the folder


BAD = {
    "missing bucket": ({"RAG_INDEX_URI": "s3://no-such-bucket/sample"}, "bucket does not exist"),
    "wrong secret": ({"AWS_SECRET_ACCESS_KEY": "wrong-secret-0123"}, "refused the credentials"),
    "no endpoint": ({"AWS_ENDPOINT": "http://127.0.0.1:9"}, "endpoint cannot be reached"),
}


@pytest.fixture(scope="module")
def s3_served(s3_index) -> Iterator[str]:
    """One service on the bucket's index for every bad-settings case: it must keep serving."""
    url, proc = _serve(s3_index["env"], s3_index["root"] / "serve-bad-settings.log")
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_object_store_settings_fail_in_one_line_and_the_service_keeps_serving(
    s3_index, s3_served, case: str
) -> None:
    """Each command in this process, and ``status`` once more as a process of its own: what
    reaches a real process's stderr (the object store's own output included) is one line."""
    env, cwd, url = s3_index["env"], s3_index["cwd"], s3_served
    change, reason = BAD[case]
    bad = env | change
    before = httpx.get(f"{url}/search", params={"q": QUESTION, "k": 3}, timeout=120).json()
    commands = (["status"], ["search", QUESTION], ["ask", QUESTION], ["rollback"])
    runs = [(args, _run(args, bad, cwd)) for args in (*commands, ["index", "--quiet"])]
    runs.append((["status"], _run(["status"], bad, cwd, process=True)))
    for args, r in runs:  # index too: it fails before Dagster starts
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, (args, r.stderr)
        assert reason in lines[0] and "RAG_INDEX_URI" in lines[0], lines[0]
        assert bad["RAG_INDEX_URI"] in lines[0] and "AWS_SECRET_ACCESS_KEY" in lines[0]
        assert bad["AWS_SECRET_ACCESS_KEY"] not in r.stderr + r.stdout
        assert env["AWS_SECRET_ACCESS_KEY"] not in r.stderr + r.stdout
    after = httpx.get(f"{url}/search", params={"q": QUESTION, "k": 3}, timeout=120).json()
    assert after == before  # the published version keeps serving
    status = json.loads(_run(["status", "--json"], env, cwd).stdout)
    assert status["published"]["version"] == s3_index["second"].version  # nothing moved


def test_a_damaged_query_log_on_object_storage_is_reported_and_never_blocks(s3_index) -> None:
    """Issue 43 on object storage: a log table cannot be renamed there, so a damaged one is
    reported in one line (what to do) and left as it is; `status`, `log list` and
    `rag-assets index` go on, and the new document is published."""
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.index.store.querylog import QueryLog
    from rag_assets_tests.helpers import SAMPLE_EVAL
    from rag_assets_tests.s3_server import BUCKET, object_keys

    env, cwd, root = s3_index["env"], s3_index["cwd"], s3_index["root"]
    aws = {k: v for k, v in env.items() if k.startswith("AWS_")}
    log = QueryLog(IndexStore(URI, storage_options=storage_options(aws)))
    log.add_entries([{"id": "0" * 22, "at": "z", "at_ns": 1, "question": "q0"}])
    log.add_entries([{"id": "1" * 22, "at": "z", "at_ns": 2, "question": "q1"}])
    # its data files go (the module's service may log its own queries meanwhile: all of them,
    # so the damage does not depend on which append wrote which file)
    data = sorted(object_keys(aws, "sample/_rag_queries.lance/data/"))
    assert data
    s3 = boto3.client("s3", endpoint_url=aws["AWS_ENDPOINT"], region_name=aws["AWS_REGION"],
                      aws_access_key_id=aws["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=aws["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    for key in data:
        s3.delete_object(Bucket=BUCKET, Key=key)

    def one_line(r: subprocess.CompletedProcess[str]) -> str:
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "query log" in ln]
        assert len(lines) == 1, r.stdout + r.stderr
        assert ".cargo" not in r.stderr and ".rs:" not in r.stderr and "Traceback" not in r.stderr
        assert "cannot be read" in lines[0] and "on object storage it is not moved" in lines[0]
        return lines[0]

    status = _run(["status"], env, cwd)
    assert status.returncode == 0, status.stderr
    one_line(status)
    listed = _run(["log", "list"], env, cwd)
    assert listed.returncode == 1 and not listed.stdout  # nothing to list: the line says why
    one_line(listed)
    docs = root / "documents"
    (docs / "99-damaged-log.md").write_text("# Kingfisher\n\nThe kingfisher rota is on Fridays.\n")
    genv = env | {"RAG_DOCUMENTS_DIR": str(docs), "RAG_EVAL_DIR": str(SAMPLE_EVAL)}
    before = json.loads(_run(["status", "--json"], env, cwd).stdout)["published"]["version"]
    run = _run(["index", "--quiet"], genv, cwd)
    assert run.returncode == 0, run.stderr + run.stdout
    assert "PIPELINE FAILED" not in run.stdout + run.stderr
    after = json.loads(_run(["status", "--json"], env, cwd).stdout)["published"]
    assert after["version"] > before
    found = json.loads(_run(["search", "kingfisher rota", "--json"], env, cwd).stdout)
    found = found["hits"] if isinstance(found, dict) else found
    assert found[0]["document_id"] == "99-damaged-log.md"
    assert data[0] not in object_keys(aws, "sample/_rag_queries.lance/")  # left as it was
